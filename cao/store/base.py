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
    SchemaTooNew,
    StoreBusy,
    StoreGone,
    StoreUnwritable,
)
from cao.store.schema import (
    MIGRATIONS,
    POOL_SIZE,
    SCHEMA_VERSION,
    WAL_SUFFIX,
    BoardFact,
    HandoffJob,
    Message,
    MessageEvent,
    Notification,
    Schedule,
    TaskResult,
    Terminal,
    Worktree,
)

logger = logging.getLogger("cao.store")

M = TypeVar(
    "M", Terminal, Message, MessageEvent, HandoffJob, Worktree, TaskResult, Notification, Schedule, BoardFact
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


def body_digest(receiver_id: str, body: str) -> str:
    """The *intent* of a send, for idempotency: receiver and body."""
    return hashlib.sha256(f"{receiver_id}\n{body}".encode()).hexdigest()


class Database:
    """The connection pool, the write transaction, the file's identity checks and the schema."""

    def __init__(self, path: Path, *, busy_timeout: float = 5.0, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()
        self._pool_lock = threading.Lock()
        self._opened = 0
        self._write_lock = threading.Lock()
        self._gone: str | None = None  # why this store stopped (its file deleted or replaced)
        self._identity: tuple[int, int] | None = None  # the database file's (device, inode)
        self._wal_identity: tuple[int, int] | None = None  # and its write-ahead log's
        self._writes_seen = -1  # the write count this store last committed (-1: not counting yet)
        # told of each timeline event once its transaction committed (Cao: the event bus)
        self.on_event: Callable[[MessageEvent], None] | None = None
        # a delivery gave a terminal work (store/messages.py _note_tasked): coordination follows it
        self.on_tasked: Callable[[str], None] | None = None
        self.migrate()
        self._identity = self._file_identity()
        with self._read() as conn:
            self._writes_seen = int(
                conn.execute("SELECT value FROM store_meta WHERE key = 'writes'").fetchone()[0]
            )
        self._wal_identity = self._file_identity(WAL_SUFFIX)

    # -- connection plumbing -------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA cache_size = -512")
        return conn

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
        given from then on would be forgotten at the next start."""
        if self._gone is not None:
            raise StoreGone(self._gone)
        if self._identity is None:
            return  # opening: nothing to compare with yet
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
                f"lost its write-ahead log ({self.path.name}{WAL_SUFFIX} was deleted or replaced)"
            )

    def verify(self) -> None:
        """The housekeeping check: also a file rewound in place (an older copy restored through
        SQLite, e.g. ``sqlite3 cao.db ".restore old.db"``) shows, by a write count lower than the
        one this store committed."""
        self.check()
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
    def _conn(self) -> Iterator[sqlite3.Connection]:
        """A pooled connection (stdlib sqlite3: each call is a handful of statements, and every
        Python layer in between would hold the GIL, and so the write lock, longer under load).
        At most ``POOL_SIZE`` connections, however many threads the server runs."""
        self.check()
        try:
            conn = self._pool.get_nowait()
        except queue.Empty:
            with self._pool_lock:
                grow = self._opened < POOL_SIZE
                if grow:
                    self._opened += 1
            try:
                conn = self._open() if grow else self._pool.get(timeout=self.busy_timeout)
            except queue.Empty:
                raise StoreBusy(
                    "no database connection came free within the busy timeout; nothing was written, "
                    "retry the same request"
                ) from None
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._pool.put(conn)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._conn() as conn:
                yield conn
        except sqlite3.OperationalError as exc:
            raise self._busy(exc) from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short BEGIN IMMEDIATE transaction. Never call tmux inside it.

        Writers of this process queue on a lock first: SQLite's own busy handler sleeps in growing
        steps (up to 100 ms), which under contention from many threads costs far more than the
        sub-millisecond transactions themselves. Other processes still meet ``busy_timeout``.
        """
        if not self._write_lock.acquire(timeout=self.busy_timeout):
            raise StoreBusy(
                "the database stayed locked past the busy timeout; nothing was written, "
                "retry the same request"
            )
        try:
            with self._conn() as conn:
                conn.execute("BEGIN IMMEDIATE")
                count = None
                try:
                    if self._writes_seen >= 0:  # counting (after the migrations)
                        row = conn.execute(
                            "UPDATE store_meta SET value = value + 1 WHERE key = 'writes' RETURNING value"
                        ).fetchone()
                        count = None if row is None else int(row[0])
                        self._check_count(None if count is None else count - 1, self._writes_seen)
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                if count is not None:
                    self._writes_seen = max(self._writes_seen, count)
        except sqlite3.OperationalError as exc:
            raise self._busy(exc) from exc
        finally:
            self._write_lock.release()

    def _busy(self, exc: sqlite3.OperationalError) -> Exception:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreBusy(
                "the database stayed locked past the busy timeout; nothing was written, "
                "retry the same request"
            )
        if "full" in text or "disk I/O error" in text:
            return disk_error(self.path.parent, text)
        return exc

    def close(self) -> None:
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                break
        with self._pool_lock:
            self._opened = 0
        self._wal_identity = None  # the last connection gone, SQLite removes the log

    # -- schema ----------------------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._read() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> None:
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {current} but this cao understands up to "
                f"{SCHEMA_VERSION}; upgrade cao (pip install -U cao) or point CAO_HOME elsewhere"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            with self._write() as conn:
                for statement in MIGRATIONS[version]:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version}")

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
            cur = conn.execute(
                "INSERT INTO message_event (receiver_id, message_id, at, event, reason, actor) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (receiver_id, mid, when, event, reason, actor),
            )
            out.append(
                MessageEvent(
                    id=cur.lastrowid,
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
