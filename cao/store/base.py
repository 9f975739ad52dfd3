"""SQLite persistence: terminals and inbox messages. The only module that writes SQL.

Rows are sqlmodel classes (typed, cheap to build); the schema itself is created by explicit,
numbered migrations so an existing database can move forward (``PRAGMA user_version`` holds the
version; a database newer than this code is refused with a clear error). SQL runs on a small pool
of stdlib ``sqlite3`` connections: each call is a handful of statements, and every Python layer
in between would hold the GIL (and with it the write lock) longer under load.

Concurrency model (see docs/inbox-delivery.md):
- WAL journal, ``busy_timeout`` on every connection; every write is one short ``BEGIN IMMEDIATE``
  transaction; nothing else (no tmux call) ever runs inside it.
- A delivery *claim* is a conditional UPDATE that only one caller can win, across threads and
  processes: pending rows of one receiver move to ``delivering`` only while no other row of that
  receiver is ``delivering`` (a per-receiver lease), so messages to one receiver are pasted one
  batch at a time, in commit order.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from cao.errors import (
    CaoError,
    DiskFull,
    HostFenced,
    SchemaTooNew,
    StoreBusy,
    StoreGone,
    StoreUnwritable,
)
from cao.store.backend import (
    ERRORS,
    WAKE_CHANNEL,
    Backend,
    CommitUnknown,
    PostgresBackend,
    SqliteBackend,
    is_postgres,
    pg_error,
)
from cao.store.schema import (
    CATCH_UP_VERSIONS,
    MIGRATIONS,
    POOL_SIZE,
    REBUILD_VERSION,
    SCHEMA_VERSION,
    TABLES,
    WAL_SUFFIX,
    BoardFact,
    HandoffJob,
    Host,
    Message,
    MessageEvent,
    Notification,
    Schedule,
    TaskResult,
    Terminal,
    Worktree,
    column_ddl,
    create_table_ddl,
    index_ddl,
    rebuild_sqlite,
    schema_ddl,
)

logger = logging.getLogger("cao.store")

M = TypeVar(
    "M",
    Terminal,
    Message,
    MessageEvent,
    HandoffJob,
    Worktree,
    TaskResult,
    Notification,
    Schedule,
    BoardFact,
    Host,
)
T = TypeVar("T")


def _row(model: type[M], row: Any) -> M:
    """A typed row from our own database (already valid, so no re-validation: 9x cheaper)."""
    return model.model_construct(**row)


def disk_error(where: Path, detail: str) -> CaoError:
    """A write that failed for want of space (507), or a disk that failed otherwise (503); either
    way nothing was written and the same request may be retried."""
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        free = 0
    if "full" in detail or free < 1024 * 1024:
        return DiskFull(
            f"the disk holding {where} is full ({free // 1024} KiB free); nothing was written. Free some "
            "space, then retry the same request"
        )
    return StoreUnwritable(
        f"the database could not be written ({detail}); nothing was written: check the disk and the "
        "file's permissions, then retry"
    )


def insert_row(conn: Any, table: str, row: dict[str, Any]) -> int:
    """Insert one row (column names from our own models) and return its new id."""
    cols = ", ".join(row)
    marks = ", ".join("?" * len(row))
    return int(
        conn.execute(
            f"INSERT INTO {table} ({cols}) VALUES ({marks}) RETURNING id", tuple(row.values())
        ).fetchone()[0]
    )


def open_task_window(conn: Any, terminal_id: str, task_id: str, started_at: float) -> None:
    """Note when a task attempt began (the first call wins); ``seq`` keeps the order they began in."""
    conn.execute(
        "INSERT INTO task_window (terminal_id, task_id, started_at, seq) VALUES (?, ?, ?, "
        "(SELECT coalesce(max(seq), 0) + 1 FROM task_window WHERE terminal_id = ?)) "
        "ON CONFLICT (terminal_id, task_id) DO NOTHING",
        (terminal_id, task_id, started_at, terminal_id),
    )


def body_digest(receiver_id: str, body: str) -> str:
    """The *intent* of a send, for idempotency: receiver and body."""
    return hashlib.sha256(f"{receiver_id}\n{body}".encode()).hexdigest()


PRE_HOSTS_LOCK = 0x63616F01  # the advisory lock cao's one-server-per-database release held


class Database:
    """The connection pool, the write transaction, the store's identity checks and the schema.

    ``location``: a SQLite file's path, or a ``postgresql://`` URL (cao/store/backend.py)."""

    def __init__(
        self, location: Path | str, *, busy_timeout: float = 5.0, clock: Callable[[], float] = time.time
    ):
        self.busy_timeout = busy_timeout
        self.clock = clock
        # where it lives, as given (a URL keeps its password: show ``where`` instead)
        self.location: Path | str = location
        self.backend: Backend
        if is_postgres(location):
            self.backend = PostgresBackend(str(location), busy_timeout)
            self.path: Path | None = None
        else:
            self.path = Path(location)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.backend = SqliteBackend(self.path, busy_timeout)
        self._pool: queue.LifoQueue[Any] = queue.LifoQueue()
        self._pool_lock = threading.Lock()
        self._opened = 0
        # SQLite: one writer at a time anyway, and queueing on a lock here beats SQLite's busy
        # handler (below); PostgreSQL: writers run side by side under their own locks
        self._write_lock: threading.Lock | None = threading.Lock() if self.path is not None else None
        self._gone: str | None = None  # why this store stopped (its file deleted or replaced)
        self._identity: tuple[int, int] | None = None  # the database file's (device, inode)
        self._wal_identity: tuple[int, int] | None = None  # and its write-ahead log's
        self._writes_seen = -1  # the write count this store last committed (-1: not counting yet)
        # the host this store serves (cao/hosts.py sets both once it holds its name): the engine's
        # own queries see only its terminals, and on PostgreSQL a claim is fenced by the instance
        self.host: str | None = None
        self.host_instance: str | None = None
        # told (once, from the writing thread: it must return at once) that a write found this
        # process no longer holds its host's name (cao/hosts.py fences itself)
        self.on_host_lost: Callable[[], None] | None = None
        # told of each timeline event once its transaction committed (Cao: the event bus)
        self.on_event: Callable[[MessageEvent], None] | None = None
        # a delivery gave a terminal work (store/messages.py _note_tasked): coordination follows it
        self.on_tasked: Callable[[str], None] | None = None
        self.migrate()
        if self.path is not None:
            self._identity = self._file_identity()
            with self._read() as conn:
                self._writes_seen = int(
                    conn.execute("SELECT value FROM store_meta WHERE key = 'writes'").fetchone()[0]
                )
            self._wal_identity = self._file_identity(WAL_SUFFIX)

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.backend.kind

    @property
    def where(self) -> str:
        """The store as it may be shown: a file's path, or a server's URL without its password."""
        return self.backend.where

    # -- connection plumbing -------------------------------------------------------------------
    def _file_identity(self, suffix: str = "") -> tuple[int, int] | None:
        try:
            st = os.stat(f"{self.path}{suffix}")
        except FileNotFoundError:
            if suffix:
                return None  # no log (yet): nothing to compare
            raise
        return st.st_dev, st.st_ino

    def _lose(self, why: str) -> StoreGone:
        """The file under us is not the one we opened: stop for good (every call raises from now)."""
        if self._gone is None:
            self._gone = (
                f"{self.path} {why} while cao-server was running; nothing was written. Writes and "
                "deliveries are stopped, so nothing is acknowledged that a restart would forget: put the "
                "right file back (or let a new one start) and restart cao-server"
            )
            logger.error("database file lost; writes and deliveries stopped", extra={"reason": why})
        return StoreGone(self._gone)

    def check(self) -> None:
        """Raise :class:`StoreGone` unless the database file is still the one this store opened
        (a stat: cheap enough for every call). Deleted, or replaced by another file (an older
        copy), a connection would go on writing into the unlinked or other file and every receipt
        given from then on would be forgotten at the next start. (A PostgreSQL server keeps its
        own files: nothing to check here.)"""
        if self._gone is not None:
            raise StoreGone(self._gone)
        if self._identity is None:
            return  # opening, or not a file: nothing to compare with
        try:
            identity = self._file_identity()
            wal = self._file_identity(WAL_SUFFIX) if self._wal_identity is not None else None
        except FileNotFoundError:
            raise self._lose("was deleted") from None
        except OSError:
            return  # can't tell (permissions): the next call looks again
        if identity != self._identity:
            raise self._lose("was replaced by another file")
        if wal != self._wal_identity:
            # the log holds every write since the last checkpoint: deleted, those live on only in
            # an unlinked file, and a crash would lose them for good
            raise self._lose(
                f"lost its write-ahead log ({self.path.name if self.path else ''}{WAL_SUFFIX} was deleted "
                "or replaced)"
            )

    def verify(self) -> None:
        """The housekeeping check: also a file rewound in place (an older copy restored through
        SQLite, e.g. ``sqlite3 cao.db ".restore old.db"``) shows, by a write count lower than the
        one this store committed. On PostgreSQL: a read that proves the server answers."""
        self.check()
        if self.path is None:
            with self._read() as conn:
                conn.execute("SELECT 1").fetchone()
            return
        # read what we committed *before* the snapshot: every write it counts was committed before
        # the read begins (read after, a write committed meanwhile would look like a rewind)
        seen = self._writes_seen
        with self._read() as conn:
            row = conn.execute("SELECT value FROM store_meta WHERE key = 'writes'").fetchone()
        self._check_count(None if row is None else int(row[0]), seen)

    def _check_count(self, found: int | None, seen: int) -> None:
        if found is None:
            raise self._lose("was replaced by another database (it has no write count)")
        if found < seen:
            raise self._lose(
                f"went back in time (it counts {found} writes, this server committed its "
                f"{seen}th): an older copy was restored over it"
            )

    @property
    def gone(self) -> str | None:
        return self._gone

    @contextmanager
    def _conn(self) -> Iterator[Any]:
        """A pooled connection (stdlib sqlite3, or psycopg: each call is a handful of statements,
        and every Python layer in between would hold the GIL, and so the write lock, longer under
        load). At most ``POOL_SIZE`` connections, however many threads the server runs. A
        connection the server dropped (a PostgreSQL restart) is closed, never pooled again."""
        self.check()
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            with self._pool_lock:
                grow = self._opened < POOL_SIZE
                if grow:
                    self._opened += 1
            try:
                conn = self._opened_conn() if grow else self._pool.get(timeout=self.busy_timeout)
            except queue.Empty:
                raise StoreBusy(
                    "no database connection came free within the busy timeout; nothing was written, "
                    "retry the same request"
                ) from None
        try:
            yield conn
        finally:
            self._put_back(conn)

    def _opened_conn(self) -> Any:
        try:
            return self.backend.open()
        except BaseException:
            with self._pool_lock:
                self._opened -= 1
            raise

    def _put_back(self, conn: Any) -> None:
        if not self.backend.broken(conn):
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            except Exception:  # the server went while we held it: drop it below
                logger.debug("rollback on a returned connection failed", exc_info=True)
            if not self.backend.broken(conn):
                self._pool.put(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()
        with self._pool_lock:
            self._opened -= 1

    @contextmanager
    def _read(self) -> Iterator[Any]:
        try:
            with self._conn() as conn:
                yield conn
        except ERRORS.busy as exc:
            raise self._busy(exc) from exc

    @contextmanager
    def _write(self, *keys: str, fence: bool = True) -> Iterator[Any]:
        """One short write transaction. Never call tmux inside it.

        ``keys``: the receivers it is about, when it touches only their rows (a send, a claim): on
        PostgreSQL writes about different receivers then run side by side; a write without keys
        runs alone (cao/store/backend.py). SQLite runs one writer at a time whatever the keys.

        ``fence``: on a shared store, once this process holds a host's name, every write first
        checks that the host row still names this process (:class:`HostFenced` if not, nothing
        written): a process that lost its name — frozen past its lease, then failed or replaced —
        never writes what it saw of panes another process now serves. Taking or losing the name
        runs alone (no keys), so the check and the change are never interleaved.

        SQLite writers of this process queue on a lock first: SQLite's own busy handler sleeps in
        growing steps (up to 100 ms), which under contention from many threads costs far more than
        the sub-millisecond transactions themselves. Other processes still meet ``busy_timeout``.
        """
        lock = self._write_lock
        if lock is not None and not lock.acquire(timeout=self.busy_timeout):
            raise StoreBusy(
                "the database stayed locked past the busy timeout; nothing was written, "
                "retry the same request"
            )
        try:
            with self._conn() as conn:
                holds = self.backend.begin(conn, keys, self._fence() if fence else None)
                count = None
                try:
                    if not holds:
                        self._lost_name()
                    if self._writes_seen >= 0:  # counting (after the migrations; SQLite only)
                        row = conn.execute(
                            "UPDATE store_meta SET value = value + 1 WHERE key = 'writes' RETURNING value"
                        ).fetchone()
                        count = None if row is None else int(row[0])
                        self._check_count(None if count is None else count - 1, self._writes_seen)
                    yield conn
                except BaseException:
                    if not self.backend.broken(conn):
                        with contextlib.suppress(*ERRORS.busy):
                            conn.execute("ROLLBACK")
                    raise
                try:
                    conn.execute("COMMIT")
                except ERRORS.busy as exc:
                    if self.backend.broken(conn):  # the server went away with the COMMIT in flight
                        raise CommitUnknown(
                            f"the database server ({self.where}) went away while this write was being "
                            "committed, so it may or may not have been kept; retry the same request (a "
                            "send with the same idempotency key is stored once)"
                        ) from exc
                    raise
                if count is not None:
                    self._writes_seen = max(self._writes_seen, count)
        except ERRORS.busy as exc:
            raise self._busy(exc) from exc
        finally:
            if lock is not None:
                lock.release()

    def _busy(self, exc: Exception) -> Exception:
        """A driver's error as cao's: busy or unreachable (503, nothing written, retry), a full or
        failing disk, or itself (a bug: a statement the database refused)."""
        text = str(exc)
        if isinstance(exc, sqlite3.Error):
            if "locked" in text or "busy" in text:
                return StoreBusy(
                    "the database stayed locked past the busy timeout; nothing was written, "
                    "retry the same request"
                )
            if "full" in text or "disk I/O error" in text:
                return disk_error(self.path.parent if self.path else Path("."), text)
            return exc
        return pg_error(exc, self.where)

    # -- hosts: what this one owns ---------------------------------------------------------------
    def _own_receivers(self) -> tuple[str, tuple[Any, ...]]:
        """A ``WHERE`` fragment keeping the engine's queries to this host's receivers."""
        if self.host is None:
            return "", ()
        return " AND receiver_id IN (SELECT id FROM terminal WHERE host = ?)", (self.host,)

    def _fence(self) -> tuple[str, str] | None:
        """(host, instance) every write checks the host row still names (a shared store, once this
        process holds a name); None: one host on a SQLite file, whose home lock makes it so."""
        if self.host_instance is None or self.host is None or self.path is not None:
            return None
        return self.host, self.host_instance

    def _lost_name(self) -> None:
        if self.on_host_lost is not None:
            self.on_host_lost()
        raise HostFenced(
            f"this cao-server no longer holds host name {self.host} (another cao-server took it, or an "
            "operator failed it): nothing was written, and it is stopping; send the request to another "
            "host (`cao hosts` lists them)"
        )

    def _holds_receiver(self, conn: Any, receiver_id: str) -> bool:
        """Inside a claim (PostgreSQL, several hosts): this process still holds its host's name and
        the receiver is that host's. A process that lost its name (an operator failed it, or it was
        restarted elsewhere) claims nothing more, whatever it still believes."""
        if self.host_instance is None or self.path is not None:
            return True  # one host on a SQLite file: the lock on CAO_HOME makes it so
        row = conn.execute(
            "SELECT 1 FROM terminal t JOIN host h ON h.name = t.host WHERE t.id = ? AND h.name = ? "
            "AND h.instance = ? AND h.state = 'up'",
            (receiver_id, self.host, self.host_instance),
        ).fetchone()
        return row is not None

    # -- wakes across hosts (PostgreSQL LISTEN/NOTIFY) -------------------------------------------
    def notify_wake(self, receiver_ids: Sequence[str]) -> None:
        """Tell every host listening that these receivers have mail that may be due now (the
        owning host kicks its delivery; the others ignore it). Best effort: the watchdog and the
        sweep stay the safety nets. Nothing to do on SQLite (one host)."""
        if self.path is not None or not receiver_ids:
            return
        try:
            with self._read() as conn:
                conn.execute("SELECT pg_notify(?, ?)", (WAKE_CHANNEL, ",".join(receiver_ids)))
        except CaoError:
            logger.debug("wake not sent (the sweep will find the mail)", exc_info=True)

    def listen_wakes(self, on_wake: Callable[[list[str]], None], stop: threading.Event) -> None:
        """Until ``stop``: hear :meth:`notify_wake` from every host, on a connection of its own
        (reconnecting with back-off while the server is away), and pass the receiver ids on."""
        delay = 0.2
        while not stop.is_set():
            try:
                conn: Any = self.backend.open()
            except Exception:
                stop.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                conn.execute(f"LISTEN {WAKE_CHANNEL}")
                delay = 0.2
                on_wake([])  # (re)connected: notices sent while away were lost; the caller looks
                while not stop.is_set():
                    for note in conn.raw.notifies(timeout=0.5, stop_after=64):
                        on_wake([r for r in note.payload.split(",") if r])
            except Exception:
                logger.debug("wake listener lost its connection; reconnecting", exc_info=True)
            finally:
                with contextlib.suppress(Exception):
                    conn.close()

    def close(self) -> None:
        while True:
            try:
                conn = self._pool.get_nowait()
            except queue.Empty:
                break
            with contextlib.suppress(Exception):
                conn.close()
        with self._pool_lock:
            self._opened = 0
        self._wal_identity = None  # the last connection gone, SQLite removes the log

    # -- schema ----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read() as conn:
            return self.backend.version(conn)

    def migrate(self) -> None:
        """Bring the schema to ``SCHEMA_VERSION``. A new database (either backend) is created from
        the table classes (cao/store/schema.py); an old SQLite one runs the numbered migrations,
        the last of which rebuilds its tables from those same classes."""
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.where} has schema version {current} but this cao understands up to "
                f"{SCHEMA_VERSION}; upgrade cao (pip install -U cao) or point CAO_HOME elsewhere"
            )
        if current == SCHEMA_VERSION:
            return
        with self._write() as conn:
            # PostgreSQL: two servers starting on an empty database at once: one creates it
            current = self.backend.version(conn)
            if 0 < current < SCHEMA_VERSION:
                self._refuse_under_older_hosts(conn)
            if current == 0:
                for statement in schema_ddl(self.kind):
                    conn.execute(statement)
                conn.execute("INSERT INTO store_meta (key, value) VALUES ('writes', 0)")
                self.backend.set_version(conn, SCHEMA_VERSION)
                return
        for version in range(current + 1, SCHEMA_VERSION + 1):
            with self._write() as conn:
                if version == REBUILD_VERSION and self.path is not None:
                    self._rebuild_from_models(conn)
                elif version in CATCH_UP_VERSIONS:
                    self._catch_up(conn)
                else:
                    for statement in MIGRATIONS[version]:
                        conn.execute(statement)
                self.backend.set_version(conn, version)

    def _refuse_under_older_hosts(self, conn: Any) -> None:
        """A shared store is not migrated under hosts that still run an older cao: they would
        read and write tables they don't know. Stop (or upgrade) them first."""
        if self.path is not None:
            return
        # a cao from before hosts held this advisory lock for its life (one server per database)
        pre_hosts = conn.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objid = ? AND "
            "objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (PRE_HOSTS_LOCK,),
        ).fetchone()
        if pre_hosts is not None:
            raise SchemaTooNew(
                f"{self.where} is in use by a cao-server from before hosts (one server per database); this "
                f"cao would move the store to schema {SCHEMA_VERSION} under it; nothing was changed. Stop "
                "that cao-server first, then start this one"
            )
        if "name" not in self._columns(conn, "host"):
            return
        rows = conn.execute(
            "SELECT name, version, schema_version FROM host WHERE state = 'up' AND schema_version < ? "
            "AND lease_until > extract(epoch from clock_timestamp())::float8 ORDER BY name",
            (SCHEMA_VERSION,),
        ).fetchall()
        if rows:
            names = ", ".join(f"{r[0]} (cao {r[1]}, schema {r[2]})" for r in rows)
            raise SchemaTooNew(
                f"{self.where} is shared with hosts still running an older cao: {names}. This cao would "
                f"move the store to schema {SCHEMA_VERSION} under them; nothing was changed. Stop those "
                "cao-servers (or upgrade them first), then start this one"
            )

    def _columns(self, conn: Any, table: str) -> list[str]:
        if self.path is not None:
            return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? ORDER BY ordinal_position",
            (table,),
        )
        return [str(r[0]) for r in rows]

    def _catch_up(self, conn: Any) -> None:
        """A migration from the classes alone (both backends): a table they add is created, a column
        they add is added (SQLite: its table rebuilt, so the file ends as a new one begins)."""
        if self.path is not None:
            self._rebuild_from_models(conn, only_changed=True)
            return
        for model in TABLES:
            table = model.__table__  # type: ignore[attr-defined]
            have = self._columns(conn, table.name)
            if not have:
                for statement in [create_table_ddl(table, self.kind), *index_ddl(table, self.kind)]:
                    conn.execute(statement)
                continue
            for column in table.columns:
                if column.name not in have:
                    conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column_ddl(column, self.kind)}")
            # a column the classes made 64-bit (a message id's) is widened where an older one isn't
            types = dict(
                conn.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE "
                    "table_schema = current_schema() AND table_name = ?",
                    (table.name,),
                ).fetchall()
            )
            for column in table.columns:
                wide = column_ddl(column, self.kind).split()[1] in ("BIGINT", "BIGSERIAL")
                if wide and types.get(column.name) == "integer":
                    conn.execute(f"ALTER TABLE {table.name} ALTER COLUMN {column.name} TYPE BIGINT")

    def _rebuild_from_models(self, conn: Any, *, only_changed: bool = False) -> None:
        """Migration 13 (SQLite): every table rebuilt from its class, rows and id counters kept, so
        an old database ends exactly where a new one begins (hand-written DDL had drifted).
        ``only_changed``: only tables whose columns differ from their class (a later catch-up)."""
        seqs = {str(r[0]): int(r[1]) for r in conn.execute("SELECT name, seq FROM sqlite_sequence")}
        for model in TABLES:
            table = model.__table__  # type: ignore[attr-defined]
            have = self._columns(conn, table.name)
            if not have:
                for statement in [create_table_ddl(table, "sqlite"), *index_ddl(table, "sqlite")]:
                    conn.execute(statement)
                continue
            if only_changed and have == [c.name for c in table.columns]:
                continue
            for statement in rebuild_sqlite(table, have):
                conn.execute(statement)
            conn.execute(
                "DELETE FROM sqlite_sequence WHERE name IN (?, ?)", (table.name, f"_rebuild_{table.name}")
            )
            if table.name in seqs:
                conn.execute(
                    "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table.name, seqs[table.name])
                )

    def _timeline(
        self,
        conn: sqlite3.Connection,
        event: str,
        receiver_id: str,
        message_ids: Sequence[int | None],
        *,
        reason: str | None = None,
        actor: str | None = None,
        at: float | None = None,
    ) -> list[MessageEvent]:
        """Write timeline events inside the caller's transaction; publish them with ``_told``
        once it committed."""
        when = self.clock() if at is None else at
        out = []
        for mid in message_ids:
            row = conn.execute(
                "INSERT INTO message_event (receiver_id, message_id, at, event, reason, actor) "
                "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                (receiver_id, mid, when, event, reason, actor),
            ).fetchone()
            out.append(
                MessageEvent(
                    id=int(row[0]),
                    receiver_id=receiver_id,
                    message_id=mid,
                    at=when,
                    event=event,
                    reason=reason,
                    actor=actor,
                )
            )
        return out

    def _told(self, events: Sequence[MessageEvent]) -> None:
        if self.on_event is None:
            return
        for e in events:
            try:
                self.on_event(e)
            except Exception:  # a listener's bug is not the write's failure
                logger.exception("timeline listener failed")

    def retrying(self, fn: Callable[[], T], *, for_seconds: float) -> T:
        """Run a write, retrying while the database stays busy (acks must not be dropped: a row
        left ``delivering`` would stall its receiver until the lease expires)."""
        deadline = time.monotonic() + for_seconds
        delay = 0.05
        while True:
            try:
                return fn()
            except StoreBusy:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
