"""``cao db copy``: a SQLite store moved into an empty PostgreSQL database, exactly.

Every row of every table, in one transaction on the target: the counts are compared table by
table before it commits (a mismatch rolls it all back), and each id counter goes on from where the
file's stopped (an id is never handed out twice, also one of a row deleted before the copy). The
file is read in one read transaction (a consistent snapshot) and never written, beyond the
migrations any cao-server of this version would run at its start. A target that holds any row is
refused: nothing is merged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cao.errors import Conflict, InvalidInput
from cao.store import Store
from cao.store.schema import TABLES

BATCH = 500
try:
    import psycopg

    DRIVER_ROW_ERRORS: tuple[type[Exception], ...] = (psycopg.DataError, psycopg.IntegrityError, ValueError)
except ImportError:  # no PostgreSQL driver: Store(target) says so first
    DRIVER_ROW_ERRORS = (ValueError,)
# the store's own bookkeeping: each store keeps its own (the write count, the schema version)
SKIPPED = frozenset({"store_meta"})


def _tables() -> list[Any]:
    return [m.__table__ for m in TABLES if m.__table__.name not in SKIPPED]  # type: ignore[attr-defined]


def copy_store(source: Path, target_url: str, *, host: str) -> dict[str, Any]:
    """Copy the SQLite store at ``source`` into the empty PostgreSQL database ``target_url``; its
    terminals become host ``host``'s (the cao-server that will run them). Returns the counts."""
    if not source.is_file():
        raise InvalidInput(f"{source} is not a cao database file; give --from the path of cao.db")
    src = Store(source)
    try:
        dst = Store(target_url)
    except BaseException:
        src.close()
        raise
    try:
        return _copy(src, dst, host=host)
    finally:
        src.close()
        dst.close()


def _copy(src: Store, dst: Store, *, host: str) -> dict[str, Any]:
    tables = _tables()
    counts: dict[str, int] = {}
    with src._read() as read:
        read.execute("BEGIN")  # one snapshot of the file for every table
        try:
            with dst._write() as conn:
                for table in tables:
                    n = int(conn.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()[0])
                    if n:
                        raise Conflict(
                            f"the target database {dst.where} is not empty ({table.name} has {n} rows); "
                            "nothing was copied. Give an empty database: cao db copy never merges"
                        )
                for table in tables:
                    cols = [c.name for c in table.columns]
                    have = {str(r[1]) for r in read.execute(f"PRAGMA table_info({table.name})")}
                    missing = [c for c in cols if c not in have]
                    if missing:
                        raise InvalidInput(f"{src.where}: table {table.name} lacks {', '.join(missing)}")
                    marks = ", ".join("?" * len(cols))
                    insert = f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({marks})"
                    cursor = read.execute(f"SELECT {', '.join(cols)} FROM {table.name} ORDER BY rowid")
                    copied = 0
                    while rows := cursor.fetchmany(BATCH):
                        values = [tuple(r) for r in rows]
                        if table.name == "terminal":
                            at = cols.index("host")
                            values = [(*v[:at], v[at] or host, *v[at + 1 :]) for v in values]
                        try:
                            conn.executemany(insert, values)
                        except DRIVER_ROW_ERRORS as exc:  # a value the target refuses: name it, copy nothing
                            reason = " ".join(str(exc).split())[:200]
                            raise InvalidInput(
                                f"{table.name}: a row could not be copied ({reason}); nothing was copied "
                                "(the transaction was rolled back)"
                            ) from None
                        copied += len(values)
                    counts[table.name] = copied
                    if "id" in cols and _serial(conn, table.name):
                        _go_on_from(conn, read, table.name)
                for table in tables:  # what the target holds now, before it commits
                    got = int(conn.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()[0])
                    want = int(read.execute(f"SELECT COUNT(*) FROM {table.name}").fetchone()[0])
                    if got != want or got != counts[table.name]:
                        raise Conflict(
                            f"{table.name}: {want} rows in the file, {got} in the target; nothing was "
                            "copied (the transaction was rolled back)"
                        )
        finally:
            read.execute("ROLLBACK")
    return {"from": src.where, "to": dst.where, "host": host, "rows": counts, "total": sum(counts.values())}


def _serial(conn: Any, table: str) -> bool:
    row = conn.execute("SELECT pg_get_serial_sequence(?, 'id')", (table,)).fetchone()
    return row is not None and row[0] is not None


def _go_on_from(conn: Any, read: Any, table: str) -> None:
    """The target's id counter goes on after the file's (its AUTOINCREMENT counter included)."""
    top = int(read.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone()[0])
    row = read.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()
    if row is not None:
        top = max(top, int(row[0]))
    if top > 0:
        conn.execute("SELECT setval(pg_get_serial_sequence(?, 'id'), ?)", (table, top))
