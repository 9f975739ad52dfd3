"""The two database backends under the store: SQLite (a file, the default) and PostgreSQL (a server
several cao-servers share, docs/multi-host.md).

The store's SQL is written once, in the dialect both understand (``?`` placeholders, ``RETURNING``,
``ON CONFLICT``, ``IS DISTINCT FROM``). This module owns what differs: opening a connection, how a
write transaction begins and what it locks, the schema version's home, and which driver errors mean
"busy, nothing written, retry".

Write transactions. SQLite has one writer at a time (``BEGIN IMMEDIATE``), so every transaction
sees the others as if they ran one after another, and message ids follow commit order. PostgreSQL
runs writers side by side, so a transaction takes advisory locks that give it the same view:

- a transaction *keyed* by receivers (a send, a claim: the hot paths) takes the shared store lock
  and an exclusive lock per receiver (in sorted order): transactions about different receivers run
  at once, on any host; two about the same receiver run one after the other, so a receiver's ids
  still follow commit order (its queue order and its acknowledgement cursor count on that);
- any other write takes the store lock exclusively: it runs alone, as on SQLite.

Every lock is a transaction lock (released at commit or rollback, or when the connection dies),
and waiting for one is bounded by ``lock_timeout`` (the busy timeout): past it the write fails as
busy, with nothing written.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sqlite3
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cao.errors import InvalidInput, StoreBusy, StoreUnreachable

# advisory lock ids: the store lock, and (hashed) one per receiver; both in cao's own key space
STORE_LOCK = 0x63616F00  # "cao\0"
WAKE_CHANNEL = "cao_wake"  # LISTEN/NOTIFY: receivers whose mail may be due (base.notify_wake)


def redact(url: str) -> str:
    """A database URL as it may be shown: the password replaced (logs, errors, ``cao info``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "postgresql://…"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and location.split(":", 1)[0] in ("postgresql", "postgres")


class Row(tuple[Any, ...]):
    """A PostgreSQL row that reads like ``sqlite3.Row``: by index, by column name, ``keys()``."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    desc = cursor.description
    if desc is None:
        return None
    names = {d.name: i for i, d in enumerate(desc)}
    return lambda values: Row(values, names)


_NAMED = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")
# the one SQLite spelling with no common form: a text's size in bytes
_OCTETS = re.compile(r"length\(CAST\((\w+) AS BLOB\)\)")


@lru_cache(maxsize=4096)
def to_pyformat(sql: str, named: bool = False) -> str:
    """``?`` (or ``:name``) placeholders as psycopg's ``%s`` (``%(name)s``), a literal ``%``
    doubled; quoted text untouched."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(sql):
        ch = sql[i]
        if quote is not None:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?" and not named:
            out.append("%s")
        elif ch == ":" and named and sql.startswith("::", i):
            out.append("::")  # a cast, not a name
            i += 2
            continue
        elif ch == ":" and named and (m := _NAMED.match(sql, i)):
            out.append(f"%({m.group(1)})s")
            i = m.end()
            continue
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
        i += 1
    return _OCTETS.sub(r"octet_length(\1)", "".join(out))


class PgConnection:
    """A psycopg connection with the slice of the ``sqlite3.Connection`` interface the store uses:
    ``execute``/``executemany`` with ``?`` placeholders, rows by name or index, ``in_transaction``.

    Parameters are bound client-side (psycopg's ``ClientCursor``: quoted by libpq), so a parameter
    takes the type its place in the statement gives it, as in SQLite."""

    def __init__(self, raw: Any):
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        cur = self.raw.cursor()
        if isinstance(params, Mapping):
            cur.execute(to_pyformat(sql, True), dict(params))
        else:
            cur.execute(to_pyformat(sql), tuple(params) if params else None)
        return cur

    def executemany(self, sql: str, rows: Any) -> Any:
        cur = self.raw.cursor()
        cur.executemany(to_pyformat(sql), [tuple(r) for r in rows])
        return cur

    @property
    def in_transaction(self) -> bool:
        import psycopg

        return bool(self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE)

    @property
    def broken(self) -> bool:
        return bool(self.raw.closed or self.raw.broken)

    def close(self) -> None:
        self.raw.close()

    def __del__(self) -> None:
        # a store dropped without close(): its connections go quietly, as sqlite3's do
        raw = getattr(self, "raw", None)
        if raw is not None and not raw.closed:
            with contextlib.suppress(Exception):  # interpreter shutdown: nothing to tell
                raw.close()


def lock_key(receiver_id: str) -> int:
    """A receiver's advisory lock id (a signed 64-bit number from its id)."""
    return int.from_bytes(hashlib.blake2b(receiver_id.encode(), digest_size=8).digest(), "big", signed=True)


class SqliteBackend:
    kind = "sqlite"

    def __init__(self, path: Path, busy_timeout: float):
        self.path = path
        self.busy_timeout = busy_timeout
        self.where = str(path)

    def open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA cache_size = -512")
        return conn

    def begin(self, conn: Any, keys: Sequence[str], fence: tuple[str, str] | None = None) -> bool:
        conn.execute("BEGIN IMMEDIATE")  # one writer at a time: keys are implied
        return True  # one host on a file: the lock on its home fences it

    @staticmethod
    def broken(conn: Any) -> bool:
        return False

    def version(self, conn: Any) -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def set_version(self, conn: Any, version: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(version)}")


# does the host row still name this process (host, instance)?
HOLDS = "EXISTS (SELECT 1 FROM host WHERE name = ? AND instance = ? AND state = 'up')"


class PostgresBackend:
    kind = "postgresql"

    def __init__(self, url: str, busy_timeout: float):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise InvalidInput(
                "CAO_DATABASE_URL names a PostgreSQL server, but its driver is not installed: "
                "pip install 'cao[postgresql]' (psycopg 3)"
            ) from None
        DriverErrors.add_postgres()
        self.url = url
        self.busy_timeout = busy_timeout
        self.where = redact(url)

    def open(self) -> PgConnection:
        import psycopg

        raw = psycopg.connect(
            self.url,
            autocommit=True,  # transactions are begun explicitly, as on SQLite
            connect_timeout=max(1, int(self.busy_timeout)),
            cursor_factory=psycopg.ClientCursor,
            row_factory=_row_factory,
            application_name="cao",
        )
        ms = int(self.busy_timeout * 1000)
        raw.execute(f"SET lock_timeout = {ms}")
        raw.execute("SET idle_in_transaction_session_timeout = 60000")
        return PgConnection(raw)

    def begin(self, conn: Any, keys: Sequence[str], fence: tuple[str, str] | None = None) -> bool:
        """Start a write and take its locks; with ``fence`` (host, instance): whether the host row
        still names that process, read after the store lock is held (a name changes hands only
        under the exclusive store lock: the answer holds for the whole transaction). On a keyed
        write it rides on the first key's lock statement, so the check costs no round trip."""
        # READ COMMITTED whatever the database's default: each statement's snapshot is taken when
        # it starts, so the check below, after the store lock is held, sees any change of hands
        conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        if not keys:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (STORE_LOCK,))
            return fence is None or conn.execute(f"SELECT {HOLDS}", fence).fetchone()[0]
        conn.execute("SELECT pg_advisory_xact_lock_shared(?)", (STORE_LOCK,))
        first, *rest = sorted({lock_key(k) for k in keys})
        if fence is None:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (first,))
            holds = True
        else:  # a later statement than the store lock's: its snapshot sees any change of hands
            holds = conn.execute(f"SELECT pg_advisory_xact_lock(?), {HOLDS}", (first, *fence)).fetchone()[1]
        for key in rest:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (key,))
        return bool(holds)

    @staticmethod
    def broken(conn: Any) -> bool:
        return bool(conn.broken)

    def version(self, conn: Any) -> int:
        # the catalog read as a table (this statement's own snapshot), not through to_regclass:
        # its cache may not have seen a table another server created while this one waited for
        # the store lock (two servers starting at once on an empty database). Any schema on the
        # search path, as every unqualified query of the store looks there
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.relname = 'store_meta' "
            "AND n.nspname = ANY (current_schemas(false)))"
        ).fetchone()
        if not row[0]:
            return 0
        row = conn.execute("SELECT value FROM store_meta WHERE key = 'schema'").fetchone()
        return 0 if row is None else int(row[0])

    def set_version(self, conn: Any, version: int) -> None:
        conn.execute(
            "INSERT INTO store_meta (key, value) VALUES ('schema', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (int(version),),
        )


Backend = SqliteBackend | PostgresBackend


class DriverErrors:
    """The driver errors the store tells apart, as tuples for ``except``: ``busy`` means "busy or
    unreachable", never "a wrong statement"; ``unique`` is a row a unique index refused (on
    PostgreSQL: two keyed writes that raced). psycopg's join them only once a PostgreSQL store is
    opened: a SQLite server never loads the driver (its import alone is ~20 MB)."""

    busy: tuple[type[Exception], ...] = (sqlite3.OperationalError,)
    unique: tuple[type[Exception], ...] = (sqlite3.IntegrityError,)

    @classmethod
    def add_postgres(cls) -> None:
        import psycopg
        import psycopg.errors

        if psycopg.OperationalError not in cls.busy:
            cls.busy = (*cls.busy, psycopg.OperationalError, psycopg.InterfaceError)
            cls.unique = (*cls.unique, psycopg.errors.UniqueViolation)


ERRORS = DriverErrors


class CommitUnknown(StoreUnreachable):
    """The server went away while a COMMIT was on its way: the write may or may not have been kept."""


def pg_error(exc: Exception, where: str) -> Exception:
    """A psycopg error as cao's (503 either way, the URL without its password)."""
    if isinstance(exc, StoreBusy):
        return exc
    import psycopg.errors as pe

    if isinstance(
        exc, pe.LockNotAvailable | pe.DeadlockDetected | pe.SerializationFailure | pe.QueryCanceled
    ):
        return StoreBusy(
            "the database stayed locked past the busy timeout; nothing was written, retry the same request"
        )
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return StoreUnreachable(
        f"the database server ({where}) did not answer: {reason}; nothing was written. Retry the same "
        "request once it is back (cao-server reconnects by itself)"
    )
