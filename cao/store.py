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
import secrets
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlmodel import Field, SQLModel

from cao.errors import (
    CaoError,
    Conflict,
    DiskFull,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReceiverGone,
    SchemaTooNew,
    StoreBusy,
    StoreGone,
    StoreUnwritable,
)
from cao.states import RECEIVER_GONE, FailureKind, MessageStatus, TerminalState

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 8

MESSAGE_STATUSES: tuple[str, ...] = tuple(MessageStatus)
MAX_BODY_BYTES = 256 * 1024
WAL_SUFFIX = "-wal"
POOL_SIZE = 8


class Terminal(SQLModel):
    """A terminal row (plain model: cheap to build, free to mutate).

    Its pane's identity is the triple (``tmux_server_pid``, ``pane_id``, ``pane_pid``): a new tmux
    server reuses pane ids, so ``pane_id`` alone names nothing. ``fence`` counts delivery claims
    and recoveries; the pane carries the last one that pasted (tmux option ``@cao_fence``), so a
    deliverer that lost its claim can't paste (see cao/tmux.py).
    """

    id: str = Field(primary_key=True)
    name: str
    session_name: str
    provider: str
    agent_profile: str
    working_directory: str
    pane_id: str | None = None
    pane_pid: int | None = None
    state: str = TerminalState.STARTING.value
    status: str = "processing"
    supervisor_id: str | None = None
    created_at: float
    last_active: float
    ready_at: float | None = None
    mcp_ready_at: float | None = None  # when the agent's cao MCP server reported in (schema 2)
    tmux_server_pid: int | None = None  # schema 3
    fence: int = 0  # schema 3
    gone_reason: str | None = None  # schema 3: why the terminal is gone
    initial_message_id: int | None = None  # schema 4: the task it was created with (an inbox message)
    # schema 6: the CLI's latest lifecycle hook report (cao/hooks.py), so a restart keeps it
    hook_phase: str | None = None
    hook_event: str | None = None
    hook_at: float | None = None
    hook_starts: int = 0  # 1: the CLI has reported a turn start (it reports them all)


class Message(SQLModel):
    """A message row (plain model: cheap to build, free to mutate).

    ``nonce`` goes into the message's header when it is pasted, so evidence that it arrived can't
    be forged by a body or mistaken for another message. ``recheck`` marks rows whose earlier paste
    may have arrived (a crash, an unconfirmed submit): the next attempt re-claims exactly that
    batch and looks for it before pasting. ``waiting_reason`` says why a pending row waits.
    """

    id: int | None = Field(default=None, primary_key=True)
    sender_id: str
    receiver_id: str
    body: str
    body_sha256: str
    idempotency_key: str | None = None
    status: str = MessageStatus.PENDING.value
    created_at: float
    claimed_at: float | None = None
    delivered_at: float | None = None
    attempts: int = 0
    last_error: str | None = None
    claim: str | None = None
    nonce: str | None = None  # schema 3
    recheck: str | None = None  # schema 3
    waiting_reason: str | None = None  # schema 3
    failure: str | None = None  # schema 8: FailureKind of a failed message


class HandoffJob(SQLModel):
    """One ``POST /terminals/run-step`` job (a reference client's handoff), kept under the id its
    client chose so the result can be fetched again (``GET /handoff-results/{job_id}``) after the
    request itself timed out. ``state``: running, completed or error."""

    job_id: str = Field(primary_key=True)
    state: str
    terminal_id: str | None = None
    last_message: str | None = None
    error_message: str | None = None
    created_at: float
    updated_at: float


class Worktree(SQLModel):
    """A worker's git worktree (schema 5): where it is, its branch, where it came from.

    ``state``: ``active`` while the worktree exists for its terminal, ``removed`` once the delete
    retired it (``note`` says what happened to its work and its branch), ``kept`` when it could
    not be retired safely and was left as it is. ``setup_paths`` (JSON list) are the files cao
    copied or linked in: never committed, never counted as the worker's changes.
    """

    terminal_id: str = Field(primary_key=True)
    repo_dir: str  # the checkout it was made from (the default merge target is its branch)
    common_dir: str  # the repository's shared git directory
    path: str
    branch: str
    base_commit: str
    base_branch: str | None = None
    subdir: str = ""
    setup_paths: str = "[]"
    state: str = "active"
    note: str | None = None
    created_at: float
    removed_at: float | None = None


class TerminalTable(Terminal, table=True):
    """The ``terminal`` table's metadata; tests/test_store.py checks MIGRATIONS against it."""

    __tablename__ = "terminal"


class MessageTable(Message, table=True):
    """The ``message`` table's metadata; tests/test_store.py checks MIGRATIONS against it."""

    __tablename__ = "message"


class HandoffJobTable(HandoffJob, table=True):
    """The ``handoff_job`` table's metadata; tests/test_store.py checks MIGRATIONS against it."""

    __tablename__ = "handoff_job"


class WorktreeTable(Worktree, table=True):
    """The ``worktree`` table's metadata; tests/test_store.py checks MIGRATIONS against it."""

    __tablename__ = "worktree"


@dataclass(frozen=True)
class Claim:
    """A won claim: the token that owns the rows, the pane fence for its paste, the rows in order."""

    token: str
    fence: int
    messages: list[Message]
    recheck: bool  # the batch was pasted before and may have arrived: look before pasting

    @property
    def ids(self) -> list[int]:
        return [m.id or 0 for m in self.messages]


MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE terminal (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            session_name TEXT NOT NULL,
            provider TEXT NOT NULL,
            agent_profile TEXT NOT NULL,
            working_directory TEXT NOT NULL,
            pane_id TEXT,
            pane_pid INTEGER,
            state TEXT NOT NULL DEFAULT 'live',
            status TEXT NOT NULL DEFAULT 'processing',
            supervisor_id TEXT,
            created_at REAL NOT NULL,
            last_active REAL NOT NULL,
            ready_at REAL
        )""",
        "CREATE INDEX ix_terminal_session ON terminal (session_name)",
        """CREATE TABLE message (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            sender_id TEXT NOT NULL,
            receiver_id TEXT NOT NULL,
            body TEXT NOT NULL,
            body_sha256 TEXT NOT NULL,
            idempotency_key TEXT,
            status TEXT NOT NULL DEFAULT 'pending',
            created_at REAL NOT NULL,
            claimed_at REAL,
            delivered_at REAL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            claim TEXT
        )""",
        "CREATE INDEX ix_message_receiver_status ON message (receiver_id, status, id)",
        "CREATE INDEX ix_message_status_created ON message (status, created_at)",
        "CREATE UNIQUE INDEX ux_message_idempotency ON message (sender_id, idempotency_key)",
        # outstanding claims only: keeps mark_delivered/release O(batch) however big the table grows
        "CREATE INDEX ix_message_claim ON message (claim) WHERE status = 'delivering'",
    ),
    # 2: agents whose CLI starts cao's MCP server report in, so input can wait for their tools
    2: ("ALTER TABLE terminal ADD COLUMN mcp_ready_at REAL",),
    # 3: pane identity (tmux server pid), paste fences, unforgeable headers, stored waiting reasons
    3: (
        "ALTER TABLE terminal ADD COLUMN tmux_server_pid INTEGER",
        "ALTER TABLE terminal ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE terminal ADD COLUMN gone_reason TEXT",
        "ALTER TABLE message ADD COLUMN nonce TEXT",
        "ALTER TABLE message ADD COLUMN recheck TEXT",
        "ALTER TABLE message ADD COLUMN waiting_reason TEXT",
        "UPDATE message SET nonce = lower(hex(randomblob(6))) WHERE nonce IS NULL",
    ),
    # 4: the reference orchestrator's clients: a terminal's initial task, handoff jobs by client id
    4: (
        "ALTER TABLE terminal ADD COLUMN initial_message_id INTEGER",
        """CREATE TABLE handoff_job (
            job_id TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            terminal_id TEXT,
            last_message TEXT,
            error_message TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
    ),
    # 5: a git worktree per worker (docs/worktrees.md)
    5: (
        """CREATE TABLE worktree (
            terminal_id TEXT PRIMARY KEY,
            repo_dir TEXT NOT NULL,
            common_dir TEXT NOT NULL,
            path TEXT NOT NULL,
            branch TEXT NOT NULL,
            base_commit TEXT NOT NULL,
            base_branch TEXT,
            subdir TEXT NOT NULL DEFAULT '',
            setup_paths TEXT NOT NULL DEFAULT '[]',
            state TEXT NOT NULL DEFAULT 'active',
            note TEXT,
            created_at REAL NOT NULL,
            removed_at REAL
        )""",
    ),
    # 6: the CLI's latest lifecycle hook report survives a restart (cao/hooks.py)
    6: (
        "ALTER TABLE terminal ADD COLUMN hook_phase TEXT",
        "ALTER TABLE terminal ADD COLUMN hook_event TEXT",
        "ALTER TABLE terminal ADD COLUMN hook_at REAL",
        "ALTER TABLE terminal ADD COLUMN hook_starts INTEGER NOT NULL DEFAULT 0",
    ),
    # 7: every write transaction counts itself, so a file rewound under a running server (an older
    # copy restored in place) shows: the count it finds is lower than the one this server wrote
    7: (
        "CREATE TABLE store_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
        "INSERT INTO store_meta (key, value) VALUES ('writes', 0)",
    ),
    # 8: why a failed message failed, as a kind (cao/states.py FailureKind), beside its error text
    8: (
        "ALTER TABLE message ADD COLUMN failure TEXT",
        "UPDATE message SET failure = 'receiver_gone' "
        "WHERE status = 'failed' AND last_error LIKE 'receiver_gone%'",
        "UPDATE message SET failure = 'retries_exhausted' WHERE status = 'failed' AND failure IS NULL",
    ),
}

M = TypeVar("M", Terminal, Message, HandoffJob, Worktree)
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


class Store:
    """All reads and writes of the cao database. Thread-safe; many processes may share the file."""

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

    # -- terminals -------------------------------------------------------------------------------
    def add_terminal(self, terminal: Terminal) -> Terminal:
        row = terminal.model_dump()
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self._write() as conn:
            conn.execute(f"INSERT INTO terminal ({cols}) VALUES ({marks})", row)
        return terminal

    def get_terminal(self, terminal_id: str, *, include_deleted: bool = False) -> Terminal:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM terminal WHERE id = ?", (terminal_id,)).fetchone()
        if row is None or (
            row["state"] in (TerminalState.DELETING, TerminalState.DELETED) and not include_deleted
        ):
            raise NotFound(f"terminal {terminal_id} not found; list terminals with `cao status`")
        return _row(Terminal, row)

    def list_terminals(
        self,
        *,
        session_name: str | None = None,
        include_deleted: bool = False,
        state: str | None = None,
    ) -> list[Terminal]:
        sql = "SELECT * FROM terminal WHERE 1=1"
        args: list[Any] = []
        if not include_deleted:
            sql += " AND state NOT IN ('deleting', 'deleted')"
        if session_name is not None:
            sql += " AND session_name = ?"
            args.append(session_name)
        if state is not None:
            sql += " AND state = ?"
            args.append(state)
        sql += " ORDER BY created_at, id"
        with self._read() as conn:
            rows = conn.execute(sql, tuple(args)).fetchall()
        return [_row(Terminal, r) for r in rows]

    def update_terminal(self, terminal_id: str, **fields: Any) -> None:
        """Update plain fields of a terminal (status, timestamps). State changes have their own
        methods below, each conditional on the state it moves from."""
        if not fields:
            return
        assert "state" not in fields, "state moves only through the conditional methods"
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        with self._write() as conn:
            conn.execute(f"UPDATE terminal SET {sets} WHERE id = :_id", {**fields, "_id": terminal_id})

    def set_pane(self, terminal_id: str, *, server_pid: int, pane_id: str, pane_pid: int) -> bool:
        """``starting`` → ``live`` with the pane's identity. False if the row moved on meanwhile."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE terminal SET state = 'live', tmux_server_pid = ?, pane_id = ?, pane_pid = ? "
                "WHERE id = ? AND state = 'starting'",
                (server_pid, pane_id, pane_pid, terminal_id),
            )
            return cur.rowcount == 1

    def adopt_identity(self, terminal_id: str, server_pid: int) -> None:
        """A terminal written before schema 3 gets its tmux server's pid (pane id + pid matched)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE terminal SET tmux_server_pid = ? WHERE id = ? AND tmux_server_pid IS NULL",
                (server_pid, terminal_id),
            )

    def mark_gone(self, terminal_id: str, reason: str) -> int:
        """The terminal's pane is gone for good: the row never goes live again and its undelivered
        mail fails with ``receiver_gone``. Returns how many messages failed (0 if already gone)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE terminal SET state = 'gone', status = 'gone', gone_reason = ?, last_active = ? "
                "WHERE id = ? AND state IN ('starting', 'live')",
                (reason, self.clock(), terminal_id),
            )
            if cur.rowcount == 0:
                return 0
            return self._fail_mail(conn, terminal_id, f"{RECEIVER_GONE}: {reason}")

    def begin_delete(self, terminal_id: str) -> int:
        """First half of a delete: mark the row ``deleting`` and fail its undelivered mail.

        The pane is killed afterwards (identity verified), then :meth:`finish_delete`; a delete
        interrupted in between is finished by the sweep (rows still ``deleting``).
        """
        with self._write() as conn:
            conn.execute(
                "UPDATE terminal SET state = 'deleting', status = 'gone', last_active = ? "
                "WHERE id = ? AND state != 'deleted'",
                (self.clock(), terminal_id),
            )
            return self._fail_mail(conn, terminal_id, RECEIVER_GONE)

    def finish_delete(self, terminal_id: str) -> None:
        with self._write() as conn:
            conn.execute("UPDATE terminal SET state = 'deleted' WHERE id = ?", (terminal_id,))

    @staticmethod
    def _fail_mail(conn: sqlite3.Connection, terminal_id: str, reason: str) -> int:
        cur = conn.execute(
            "UPDATE message SET status = 'failed', last_error = ?, failure = ?, claim = NULL, "
            "waiting_reason = NULL WHERE receiver_id = ? AND status IN ('pending', 'delivering')",
            (reason, FailureKind.RECEIVER_GONE, terminal_id),
        )
        return int(cur.rowcount)

    def fail_undelivered(self, terminal_id: str, reason: str) -> int:
        with self._write() as conn:
            return self._fail_mail(conn, terminal_id, reason)

    def delete_terminal(self, terminal_id: str, *, reason: str = RECEIVER_GONE) -> int:
        """Mark a terminal deleted at once (no pane to kill) and fail its undelivered messages."""
        failed = self.begin_delete(terminal_id)
        self.finish_delete(terminal_id)
        return failed

    # -- messages: send --------------------------------------------------------------------------
    def add_message(
        self,
        *,
        sender_id: str,
        receiver_id: str,
        body: str,
        idempotency_key: str | None = None,
        before_commit: Callable[[], None] | None = None,
        waiting_reason: str | None = None,
    ) -> tuple[Message, bool]:
        """Commit one message. Returns ``(message, duplicate)``.

        Checks the receiver inside the same transaction, so a send can't race a delete.
        """
        if not body:
            raise InvalidInput("message is empty; send some text")
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"message body is {size} bytes, over the {MAX_BODY_BYTES}-byte (256 KiB) limit; nothing was "
                "stored; split it into several messages or send a file path instead"
            )
        digest = body_digest(receiver_id, body)
        now = self.clock()
        nonce = secrets.token_hex(6)
        with self._write() as conn:
            if idempotency_key is not None:
                prior = conn.execute(
                    "SELECT * FROM message WHERE sender_id = ? AND idempotency_key = ?",
                    (sender_id, idempotency_key),
                ).fetchone()
                if prior is not None:
                    if prior["body_sha256"] != digest or prior["receiver_id"] != receiver_id:
                        raise Conflict(
                            f"idempotency key {idempotency_key!r} was already used by {sender_id} for a "
                            f"different message (#{prior['id']}); use a new key for a new message"
                        )
                    return _row(Message, prior), True
            recv = conn.execute("SELECT state FROM terminal WHERE id = ?", (receiver_id,)).fetchone()
            if recv is None:
                raise NotFound(f"receiver terminal {receiver_id} not found; list terminals with `cao status`")
            if recv[0] in (TerminalState.DELETING, TerminalState.DELETED):
                raise ReceiverGone(
                    f"receiver terminal {receiver_id} was deleted; send to a live terminal (`cao status`)"
                )
            if recv[0] == TerminalState.GONE:
                raise ReceiverGone(
                    f"receiver terminal {receiver_id} is gone (its agent exited or its pane was closed); "
                    f"nothing was stored; delete it with `cao shutdown {receiver_id}` and send to a live one"
                )
            cur = conn.execute(
                "INSERT INTO message (sender_id, receiver_id, body, body_sha256, idempotency_key, status, "
                "created_at, attempts, nonce, waiting_reason) VALUES (?, ?, ?, ?, ?, 'pending', ?, 0, ?, ?)",
                (sender_id, receiver_id, body, digest, idempotency_key, now, nonce, waiting_reason),
            )
            msg_id = cur.lastrowid
            if before_commit is not None:
                before_commit()
        return (
            Message(
                id=msg_id,
                sender_id=sender_id,
                receiver_id=receiver_id,
                body=body,
                body_sha256=digest,
                idempotency_key=idempotency_key,
                created_at=now,
                nonce=nonce,
                waiting_reason=waiting_reason,
            ),
            False,
        )

    # -- messages: read --------------------------------------------------------------------------
    def get_message(self, message_id: int) -> Message:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM message WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
        return _row(Message, row)

    def list_messages(
        self,
        *,
        receiver_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        order: Literal["asc", "desc"] = "desc",
    ) -> list[Message]:
        sql = "SELECT * FROM message WHERE 1=1"
        args: list[Any] = []
        if receiver_id is not None:
            sql += " AND receiver_id = ?"
            args.append(receiver_id)
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        sql += f" ORDER BY id {'ASC' if order == 'asc' else 'DESC'} LIMIT ?"
        args.append(limit)
        with self._read() as conn:
            rows = conn.execute(sql, tuple(args)).fetchall()
        return [_row(Message, r) for r in rows]

    def has_pending(self, receiver_id: str) -> bool:
        return self.newest_pending(receiver_id) is not None

    def newest_pending(self, receiver_id: str) -> int | None:
        """The id of the newest pending message of ``receiver_id`` (None: nothing pending)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT max(id) FROM message WHERE receiver_id = ? AND status = 'pending'", (receiver_id,)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def oldest_pending(self, receiver_id: str) -> Message | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT * FROM message WHERE receiver_id = ? AND status = 'pending' ORDER BY id LIMIT 1",
                (receiver_id,),
            ).fetchone()
        return None if row is None else _row(Message, row)

    def receivers_with_pending(self, *, older_than: float | None = None) -> list[str]:
        """Receivers with pending messages (created before ``older_than`` if given)."""
        sql = "SELECT DISTINCT receiver_id FROM message WHERE status = 'pending'"
        args: tuple[Any, ...] = ()
        if older_than is not None:
            sql += " AND created_at <= ?"
            args = (older_than,)
        with self._read() as conn:
            return [r[0] for r in conn.execute(sql, args).fetchall()]

    def pending_counts(self, receiver_ids: Sequence[str]) -> dict[str, int]:
        """How many pending messages each of ``receiver_ids`` has (receivers with none are left out)."""
        if not receiver_ids:
            return {}
        marks = ",".join("?" * len(receiver_ids))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT receiver_id, COUNT(*) FROM message WHERE status = 'pending' "
                f"AND receiver_id IN ({marks}) GROUP BY receiver_id",
                tuple(receiver_ids),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def counts_by_status(self) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute("SELECT status, COUNT(*) FROM message GROUP BY status").fetchall()
        return {status: 0 for status in MESSAGE_STATUSES} | {r[0]: int(r[1]) for r in rows}

    # -- messages: the delivery lifecycle -------------------------------------------------------
    def claim(self, receiver_id: str, *, limit: int = 20, max_bytes: int = MAX_BODY_BYTES) -> Claim | None:
        """Atomically move the oldest pending messages of one receiver to ``delivering``.

        Wins only if no other claim on this receiver is outstanding; None when it lost or there was
        nothing to claim. If the oldest pending rows are marked ``recheck`` (an earlier paste of
        theirs may have arrived), exactly that batch is claimed again, nothing newer joins it. Else
        the batch stops before ``max_bytes`` of bodies (the first message is always taken). Each
        claim takes the receiver's next pane fence.
        """
        token = uuid.uuid4().hex
        now = self.clock()
        with self._write() as conn:
            busy = conn.execute(
                "SELECT 1 FROM message WHERE receiver_id = ? AND status = 'delivering' LIMIT 1",
                (receiver_id,),
            ).fetchone()
            if busy is not None:
                return None
            first = conn.execute(
                "SELECT id, recheck FROM message WHERE receiver_id = ? AND status = 'pending' "
                "ORDER BY id LIMIT 1",
                (receiver_id,),
            ).fetchone()
            if first is None:
                return None
            recheck = first["recheck"]
            if recheck is not None:
                rows = conn.execute(
                    "SELECT id FROM message WHERE receiver_id = ? AND status = 'pending' AND recheck = ? "
                    "ORDER BY id",
                    (receiver_id, recheck),
                ).fetchall()
                ids = [int(r[0]) for r in rows]
            else:
                rows = conn.execute(
                    "SELECT id, length(CAST(body AS BLOB)) FROM message WHERE receiver_id = ? "
                    "AND status = 'pending' AND recheck IS NULL ORDER BY id LIMIT ?",
                    (receiver_id, limit),
                ).fetchall()
                ids = []
                total = 0
                for msg_id, size in rows:
                    if ids and total + int(size) > max_bytes:
                        break
                    ids.append(int(msg_id))
                    total += int(size)
            fence_row = conn.execute(
                "UPDATE terminal SET fence = fence + 1 WHERE id = ? RETURNING fence", (receiver_id,)
            ).fetchone()
            marks = ",".join("?" * len(ids))
            conn.execute(
                f"UPDATE message SET status = 'delivering', claim = ?, claimed_at = ? "
                f"WHERE status = 'pending' AND id IN ({marks})",
                (token, now, *ids),
            )
            got = conn.execute(
                "SELECT * FROM message WHERE claim = ? AND status = 'delivering' ORDER BY id", (token,)
            ).fetchall()
        fence = int(fence_row[0]) if fence_row is not None else 0
        return Claim(token, fence, [_row(Message, r) for r in got], recheck is not None)

    def unclaim(self, token: str) -> int:
        """Give a claim back untouched (the gate closed again before the paste): pending, no attempt
        counted, its recheck mark and last error kept."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET status = 'pending', claim = NULL, claimed_at = NULL "
                "WHERE claim = ? AND status = 'delivering'",
                (token,),
            )
            return int(cur.rowcount)

    def delivery_view(self, receiver_id: str) -> tuple[Terminal, bool, int | None]:
        """The receiver's row and whether some claim on it is outstanding, in one read: a deliverer
        that sees no claim outstanding and later wins the claim with fence + 1 knows nobody else
        pasted into that pane in between (its screen read is still current)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT t.*, EXISTS(SELECT 1 FROM message m WHERE m.receiver_id = t.id "
                "AND m.status = 'delivering') AS outstanding, (SELECT max(id) FROM message m "
                "WHERE m.receiver_id = t.id AND m.status = 'pending') AS newest "
                "FROM terminal t WHERE t.id = ?",
                (receiver_id,),
            ).fetchone()
        if row is None:
            raise NotFound(f"terminal {receiver_id} not found; list terminals with `cao status`")
        extra = ("outstanding", "newest")
        fields = {k: row[k] for k in row.keys() if k not in extra}  # noqa: SIM118 (sqlite3.Row)
        newest = None if row["newest"] is None else int(row["newest"])
        return _row(Terminal, fields), bool(row["outstanding"]), newest

    def renew(self, token: str) -> bool:
        """Extend a claim's lease; False means the claim was lost (recovered by someone else)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET claimed_at = ? WHERE claim = ? AND status = 'delivering'",
                (self.clock(), token),
            )
            return cur.rowcount > 0

    def take_over(self, token: str) -> tuple[str, int] | None:
        """Recovery: own a stale claim under a new token and take the receiver's next pane fence.

        Returns ``(new token, fence)``, or None if the claim was resolved meanwhile.
        """
        new = uuid.uuid4().hex
        with self._write() as conn:
            row = conn.execute(
                "SELECT receiver_id FROM message WHERE claim = ? AND status = 'delivering' LIMIT 1", (token,)
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE message SET claim = ?, claimed_at = ? WHERE claim = ? AND status = 'delivering'",
                (new, self.clock(), token),
            )
            fence = conn.execute(
                "UPDATE terminal SET fence = fence + 1 WHERE id = ? RETURNING fence", (row[0],)
            ).fetchone()
        return new, int(fence[0]) if fence is not None else 0

    def mark_delivered(self, token: str, ids: Sequence[int] | None = None) -> int:
        """Acknowledge a paste. Conditional on the claim: returns how many rows this claim still
        owned (0 = ownership was lost; the caller must not report them delivered)."""
        now = self.clock()
        sql = (
            "UPDATE message SET status = 'delivered', delivered_at = ?, attempts = attempts + 1, "
            "last_error = NULL, waiting_reason = NULL, recheck = NULL "
            "WHERE claim = ? AND status = 'delivering'"
        )
        args: list[Any] = [now, token]
        if ids is not None:
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            args.extend(ids)
        with self._write() as conn:
            return int(conn.execute(sql, tuple(args)).rowcount)

    def release(
        self,
        token: str,
        error: str,
        *,
        max_attempts: int,
        count_attempt: bool = True,
        recheck: bool = False,
    ) -> dict[str, int]:
        """Return a claim to ``pending`` (attempts+1), or ``failed`` past the retry limit.

        ``recheck``: the paste may have arrived (unconfirmed submit, recovered crash), so the next
        attempt re-claims exactly these rows and looks before it pastes.
        """
        inc = 1 if count_attempt else 0
        with self._write() as conn:
            failed = conn.execute(
                "UPDATE message SET status = 'failed', attempts = attempts + ?, last_error = ?, "
                "failure = ?, claim = NULL, waiting_reason = NULL "
                "WHERE claim = ? AND status = 'delivering' AND attempts + ? >= ?",
                (inc, error, FailureKind.RETRIES_EXHAUSTED, token, inc, max_attempts),
            ).rowcount
            pending = conn.execute(
                "UPDATE message SET status = 'pending', attempts = attempts + ?, last_error = ?, "
                "claim = NULL, claimed_at = NULL, recheck = CASE WHEN ? THEN ? ELSE recheck END "
                "WHERE claim = ? AND status = 'delivering'",
                (inc, error, recheck, token, token),
            ).rowcount
        return {"failed": int(failed), "pending": int(pending)}

    def note_waiting(self, receiver_id: str, reason: str | None) -> int:
        """Store why a receiver's pending messages wait (shown by `cao inbox`, kept across restarts)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET waiting_reason = ? WHERE receiver_id = ? AND status = 'pending' "
                "AND waiting_reason IS NOT ?",
                (reason, receiver_id, reason),
            )
            return int(cur.rowcount)

    def stale_claims(self, *, older_than: float | None = None) -> list[tuple[str, list[Message]]]:
        """Outstanding claims (``delivering`` rows), grouped by claim, oldest first."""
        sql = "SELECT * FROM message WHERE status = 'delivering'"
        args: tuple[Any, ...] = ()
        if older_than is not None:
            sql += " AND claimed_at <= ?"
            args = (older_than,)
        sql += " ORDER BY id"
        with self._read() as conn:
            rows = conn.execute(sql, args).fetchall()
        groups: dict[str, list[Message]] = {}
        for r in rows:
            groups.setdefault(str(r["claim"]), []).append(_row(Message, r))
        return list(groups.items())

    def cancel(self, message_id: int) -> Message:
        with self._write() as conn:
            row = conn.execute("SELECT status FROM message WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
            if row[0] != MessageStatus.PENDING:
                raise Conflict(f"message {message_id} is {row[0]}; only a pending message can be cancelled")
            conn.execute(
                "UPDATE message SET status = 'cancelled', last_error = 'cancelled by operator', "
                "waiting_reason = NULL WHERE id = ?",
                (message_id,),
            )
        return self.get_message(message_id)

    # -- handoff jobs (POST /terminals/run-step) ------------------------------------------------
    def put_handoff_job(
        self,
        job_id: str,
        state: str,
        *,
        terminal_id: str | None = None,
        last_message: str | None = None,
        error_message: str | None = None,
    ) -> None:
        """Record a job's state (insert, or update the row with that id); ``None`` keeps a field."""
        now = self.clock()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO handoff_job (job_id, state, terminal_id, last_message, error_message, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, "
                "terminal_id = coalesce(excluded.terminal_id, terminal_id), "
                "last_message = coalesce(excluded.last_message, last_message), "
                "error_message = coalesce(excluded.error_message, error_message), "
                "updated_at = excluded.updated_at",
                (job_id, state, terminal_id, last_message, error_message, now, now),
            )

    def get_handoff_job(self, job_id: str) -> HandoffJob:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM handoff_job WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"handoff job {job_id} not found; it was never started on this server")
        return _row(HandoffJob, row)

    # -- worktrees (docs/worktrees.md) -----------------------------------------------------------
    def add_worktree(self, worktree: Worktree) -> None:
        row = worktree.model_dump()
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO worktree ({', '.join(row)}) VALUES ({', '.join(f':{k}' for k in row)})", row
            )

    def get_worktree(self, terminal_id: str) -> Worktree | None:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM worktree WHERE terminal_id = ?", (terminal_id,)).fetchone()
        return None if row is None else _row(Worktree, row)

    def list_worktrees(self, *, state: str | None = None) -> list[Worktree]:
        sql = "SELECT * FROM worktree"
        args: tuple[str, ...] = ()
        if state is not None:
            sql, args = sql + " WHERE state = ?", (state,)
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, terminal_id", args).fetchall()
        return [_row(Worktree, r) for r in rows]

    def update_worktree_paths(self, terminal_id: str, setup_paths: str) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE worktree SET setup_paths = ? WHERE terminal_id = ?", (setup_paths, terminal_id)
            )

    def finish_worktree(self, terminal_id: str, state: str, note: str) -> bool:
        """``active`` → ``removed``/``kept`` with what happened; False if it was not active."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE worktree SET state = ?, note = ?, removed_at = ? "
                "WHERE terminal_id = ? AND state = 'active'",
                (state, note, self.clock(), terminal_id),
            )
            return cur.rowcount == 1
