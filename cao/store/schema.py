"""The database's tables (sqlmodel classes: typed rows, cheap to build) and the numbered
migrations that create and move them forward (``PRAGMA user_version`` holds the version)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BigInteger, DefaultClause, Index, Integer, Table, text
from sqlalchemy.dialects.postgresql import dialect as postgresql_dialect
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable
from sqlmodel import Field, SQLModel

from cao.states import MessageStatus, TerminalState

SCHEMA_VERSION = 15
# an old SQLite database's tables are rebuilt from the table classes at this version (base.py)
REBUILD_VERSION = 13
# from here on a version's new tables and columns come from the classes alone, on both backends
# (base.py ``_catch_up``): no hand-written DDL to drift from them
CATCH_UP_VERSIONS = frozenset({14, 15})

MESSAGE_STATUSES: tuple[str, ...] = tuple(MessageStatus)
MAX_BODY_BYTES = 256 * 1024
WAL_SUFFIX = "-wal"
POOL_SIZE = 8


# Ids: a 64-bit identity on PostgreSQL; on SQLite an INTEGER PRIMARY KEY AUTOINCREMENT (the rowid,
# never reused: acknowledgement cursors and timelines count on ids only growing). Every column that
# holds a message's id is as wide (SQLite's INTEGER already is).
ROW_ID = BigInteger().with_variant(Integer(), "sqlite")


class Terminal(SQLModel):
    """A terminal row (plain model: cheap to build, free to mutate).

    Its pane's identity is the triple (``tmux_server_pid``, ``pane_id``, ``pane_pid``): a new tmux
    server reuses pane ids, so ``pane_id`` alone names nothing. ``fence`` counts delivery claims
    and recoveries; the pane carries the last one that pasted (tmux option ``@cao_fence``), so a
    deliverer that lost its claim can't paste (see cao/tmux/).
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
    initial_message_id: int | None = Field(
        default=None, sa_type=ROW_ID
    )  # schema 4: the task it was created with (an inbox message)
    # schema 6: the CLI's latest lifecycle hook report (cao/hookstate.py), so a restart keeps it
    hook_phase: str | None = None
    hook_event: str | None = None
    hook_at: float | None = None
    hook_starts: int = 0  # 1: the CLI has reported a turn start (it reports them all)
    turn_channel: str | None = None  # schema 9: the hook its launch wired to hand text to a turn
    # schema 10: coordination (cao/coordination.py, docs/orchestration.md)
    ack_cursor: int = Field(
        default=0, sa_type=ROW_ID
    )  # it acknowledged every message to it up to this id (forward only)
    notify_supervisor: int = 1  # 0: its supervisor gets no notices about it (assign/handoff notify=false)
    task_id: str | None = None  # its current task attempt: m<message id> (assign), j<job>/s<token> (handoff)
    task_at: float | None = None
    work_state: str | None = None  # states.WorkState: where it is in its work (notices follow it)
    # schema 12: what it cost (cao/usage.py): NULL not read yet, 0 its CLI records nothing, 1 known
    usage_known: int | None = None
    budget_hold: str | None = None  # a budget it is over: new tasks to it wait, with this reason
    budget_warned: str | None = None  # the budgets it was warned about (once each)
    # schema 14: the host whose tmux runs it (cao/hosts.py): only that host touches its pane
    host: str | None = None


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
    # schema 9: attention (cao/attention.py, docs/attention.md)
    priority: int = 2  # its rank: 0 urgent, 1 high, 2 normal, 3 low (states.PRIORITY_RANK)
    kind: str = "message"
    if_busy: str = "wait"
    expires_at: float | None = None  # still pending then: expired
    not_before: float | None = None  # deferred (or scheduled) until then
    topic: str | None = None  # notices coalesce per sender and topic
    superseded_by: int | None = Field(default=None, sa_type=ROW_ID)
    closed_by: str | None = None  # who dropped, deferred or cancelled it
    closed_reason: str | None = None  # why it was dropped, expired, superseded or cancelled
    read_at: float | None = None  # the receiver fetched it (read_message)
    channel: str | None = None  # how it was delivered: paste or hook (states.Channel)
    interrupt_at: float | None = None  # the CLI's interrupt key was sent for it (at most once)
    acked_at: float | None = None  # schema 10: the receiver said it acted on it (ack)


class MessageEvent(SQLModel):
    """One change in a message's life on its receiver's timeline (schema 9; states.Event)."""

    id: int | None = Field(default=None, primary_key=True)
    receiver_id: str
    message_id: int | None = Field(
        default=None, sa_type=ROW_ID
    )  # None: about the receiver's whole queue (a held reason)
    at: float
    event: str
    reason: str | None = None
    actor: str | None = None  # who did it: a terminal id, an operator's name, or cao


class TaskResult(SQLModel):
    """A worker's report on one task attempt (schema 10; report_result). One per attempt: an exact
    retry gets this receipt again, a different second report is refused."""

    id: int | None = Field(default=None, primary_key=True)
    terminal_id: str  # the worker
    task_id: str  # the attempt (Terminal.task_id when it reported)
    supervisor_id: str | None = None
    status: str  # states.ResultStatus
    summary: str
    details: str | None = None  # JSON object
    digest: str  # of status, summary and details: what "the same report" means
    message_id: int | None = Field(
        default=None, sa_type=ROW_ID
    )  # the result message to the supervisor (none for a handoff)
    created_at: float


class Notification(SQLModel):
    """A worker event the operator hears about (schema 10): the dashboard's attention list, the
    webhook's queue (``webhook``: states.WebhookState, None when no CAO_NOTIFY_URL was set)."""

    id: int | None = Field(default=None, primary_key=True)
    terminal_id: str
    session_name: str
    supervisor_id: str | None = None
    event: str  # states.WorkState: finished, blocked, failed, exited
    reason: str | None = None
    at: float
    message_id: int | None = Field(
        default=None, sa_type=ROW_ID
    )  # the notice to its supervisor, if one was sent
    webhook: str | None = None
    webhook_attempts: int = 0
    webhook_error: str | None = None
    webhook_at: float | None = None


class Schedule(SQLModel):
    """A wake-up (schema 10): one message per slot (``first_at + k * every_seconds``), each created
    one slot ahead as a deferred message whose idempotency key names the slot, so a slot is
    created once however often the store is asked (restarts, crashes)."""

    id: int | None = Field(default=None, primary_key=True)
    receiver_id: str
    created_by: str
    body: str
    first_at: float
    every_seconds: float | None = None  # None: once
    next_slot: int = 0  # the first slot whose message is not created yet
    next_at: float | None = None  # that slot's time (None: no more slots)
    state: str = "active"  # states.ScheduleState
    created_at: float
    closed_by: str | None = None
    closed_at: float | None = None
    skipped: int = 0  # slots that passed while cao-server was down, past the catch-up limit


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


class BoardFact(SQLModel):
    """One version of one fact on a session's coordination board (schema 11; docs/orchestration.md).

    ``value`` is the fact as JSON text; None marks a tombstone (the key was deleted at this
    version: its history stays, its versions go on from there). ``head`` is 1 on the key's newest
    version only, so a listing and the key count read one partial index instead of every version.
    """

    session_name: str = Field(primary_key=True)
    key: str = Field(primary_key=True)
    version: int = Field(primary_key=True)
    value: str | None = None
    writer: str
    at: float
    head: int = 1


# -- the tables: the one source of the schema on both backends ------------------------------------
# Each table class below *is* its table: columns, types, NOT NULL, defaults (each field's default is
# also the column's DEFAULT, so an INSERT that leaves a column out gets the model's value) and
# indexes. ``schema_ddl(dialect)`` compiles them for SQLite or PostgreSQL; a new database on either
# is created from it, and an old SQLite database ends there too (migration 13 rebuilds its tables
# from it). tests/test_store_schema.py proves both.


def _index(name: str, *columns: str, where: str | None = None, unique: bool = False) -> Index:
    """An index; ``where`` makes it partial (the same predicate on both backends)."""
    kw: dict[str, Any] = {}
    if where is not None:
        kw = {"sqlite_where": text(where), "postgresql_where": text(where)}
    return Index(name, *columns, unique=unique, **kw)


PENDING = "status = 'pending'"


class TerminalTable(Terminal, table=True):
    __tablename__ = "terminal"
    __table_args__ = (_index("ix_terminal_session", "session_name"),)


class MessageTable(Message, table=True):
    __tablename__ = "message"
    __table_args__ = (
        _index("ix_message_receiver_status", "receiver_id", "status", "id"),
        _index("ix_message_status_created", "status", "created_at"),
        _index("ux_message_idempotency", "sender_id", "idempotency_key", unique=True),
        # outstanding claims only: keeps mark_delivered/release O(batch) however big the table grows
        _index("ix_message_claim", "claim", where="status = 'delivering'"),
        # the queue in serving order, and the deadlines still to keep
        _index("ix_message_queue", "receiver_id", "priority", "id", where=PENDING),
        _index("ix_message_expiry", "expires_at", where=f"{PENDING} AND expires_at IS NOT NULL"),
        # the few rows each claim and each look must find at once, however long the queue
        _index("ix_message_recheck", "receiver_id", "id", where=f"{PENDING} AND recheck IS NOT NULL"),
        _index(
            "ix_message_deferred", "receiver_id", "not_before", where=f"{PENDING} AND not_before IS NOT NULL"
        ),
        _index("ix_message_interrupt", "receiver_id", where=f"{PENDING} AND if_busy = 'interrupt'"),
        # the delivered-but-unacknowledged messages of one receiver (check_inbox, the attention view)
        _index("ix_message_unacked", "receiver_id", "id", where="status = 'delivered' AND acked_at IS NULL"),
        {"sqlite_autoincrement": True},
    )
    id: int | None = Field(default=None, primary_key=True, sa_type=ROW_ID)


class MessageEventTable(MessageEvent, table=True):
    __tablename__ = "message_event"
    # one index only: each message writes two or more events; one message's events are found
    # within its receiver's, and the weekly prune goes by id
    __table_args__ = (
        _index("ix_message_event_receiver", "receiver_id", "id"),
        {"sqlite_autoincrement": True},
    )
    id: int | None = Field(default=None, primary_key=True, sa_type=ROW_ID)


class TaskResultTable(TaskResult, table=True):
    __tablename__ = "task_result"
    __table_args__ = (
        _index("ux_task_result_attempt", "terminal_id", "task_id", unique=True),
        {"sqlite_autoincrement": True},
    )
    id: int | None = Field(default=None, primary_key=True, sa_type=ROW_ID)


class NotificationTable(Notification, table=True):
    __tablename__ = "notification"
    __table_args__ = (
        _index("ix_notification_webhook", "id", where="webhook = 'pending'"),
        {"sqlite_autoincrement": True},
    )
    id: int | None = Field(default=None, primary_key=True, sa_type=ROW_ID)


class ScheduleTable(Schedule, table=True):
    __tablename__ = "schedule"
    __table_args__ = (
        _index("ix_schedule_due", "next_at", where="state = 'active'"),
        {"sqlite_autoincrement": True},
    )
    id: int | None = Field(default=None, primary_key=True, sa_type=ROW_ID)


class HandoffJobTable(HandoffJob, table=True):
    __tablename__ = "handoff_job"


class WorktreeTable(Worktree, table=True):
    __tablename__ = "worktree"


class BoardFactTable(BoardFact, table=True):
    __tablename__ = "board_fact"
    # each key's newest version: a listing, the key count, the oldest tombstone to purge
    __table_args__ = (_index("ix_board_head", "session_name", "key", where="head = 1"),)


class StoreMetaTable(SQLModel, table=True):
    """Counters of the store itself: ``writes`` (every SQLite write transaction counts itself, so a
    file rewound under a running server shows) and, on PostgreSQL, ``schema`` (its version)."""

    __tablename__ = "store_meta"
    key: str = Field(primary_key=True)
    value: int


class Host(SQLModel):
    """A cao-server sharing the store (schema 14; cao/hosts.py, docs/multi-host.md).

    ``instance`` is the running process's own random token: a host renews its lease only while the
    row still names it, so a process that lost its name (to a restart elsewhere, or an operator who
    failed it) can never act for it again. ``machine`` says where it runs (the machine's id and the
    ``CAO_HOME`` it serves): a name moves to another machine only once an operator failed it.
    Times are the store's clock (each host corrects its own by the database server's)."""

    name: str = Field(primary_key=True)
    instance: str
    machine: str
    url: str
    version: str
    schema_version: int
    pid: int
    started_at: float
    heartbeat_at: float
    lease_until: float
    state: str = "up"  # states.HostState
    note: str | None = None  # why it stopped or was failed
    # schema 15: how it talks to the other hosts (cao/hosts.py PEER_PROTOCOL; 1: before signed
    # requests and the write fence): a host refuses to join hosts that speak another one
    protocol: int = 1


class HostTable(Host, table=True):
    __tablename__ = "host"


class TaskWindowTable(SQLModel, table=True):
    """When each task attempt of a terminal began (cao/usage.py counts a response to the task it
    was made for). ``seq`` orders attempts that began at the same instant."""

    __tablename__ = "task_window"
    terminal_id: str = Field(primary_key=True)
    task_id: str = Field(primary_key=True)
    started_at: float
    seq: int = 0  # schema 13


class UsageTotalTable(SQLModel, table=True):
    """Tokens per terminal, task attempt and model (cao/usage.py; the columns of store.UsageRow)."""

    __tablename__ = "usage_total"
    terminal_id: str = Field(primary_key=True)
    task_id: str = Field(primary_key=True)
    model: str = Field(primary_key=True)
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    responses: int
    first_at: float | None = None
    last_at: float | None = None


TABLES: tuple[type[SQLModel], ...] = (
    TerminalTable,
    MessageTable,
    HandoffJobTable,
    WorktreeTable,
    StoreMetaTable,
    MessageEventTable,
    TaskResultTable,
    NotificationTable,
    ScheduleTable,
    BoardFactTable,
    TaskWindowTable,
    UsageTotalTable,
    HostTable,
)


def _defaults_in_sql() -> None:
    """Each field's default becomes its column's DEFAULT: one place says what a left-out column
    holds, for the Python rows and for SQL alike."""
    for model in TABLES:
        for column in model.__table__.columns:  # type: ignore[attr-defined]
            info = model.model_fields.get(column.name)
            value = None if info is None else info.default
            if column.primary_key or value is None or isinstance(value, bool):
                continue
            if isinstance(value, int | float | str):
                literal = repr(value) if not isinstance(value, str) else "'" + value.replace("'", "''") + "'"
                column.server_default = DefaultClause(text(literal))


_defaults_in_sql()


def table_of(name: str) -> Table:
    for model in TABLES:
        table: Table = model.__table__  # type: ignore[attr-defined]
        if table.name == name:
            return table
    raise KeyError(name)


def _dialect(name: str) -> Any:
    return sqlite_dialect() if name == "sqlite" else postgresql_dialect()  # type: ignore[no-untyped-call]


def create_table_ddl(table: Table, dialect: str, *, name: str | None = None) -> str:
    """``CREATE TABLE`` for one table (``name``: under another name, for a rebuild)."""
    sql = str(CreateTable(table).compile(dialect=_dialect(dialect))).strip()
    if name is not None:
        head = f"CREATE TABLE {table.name} ("
        assert sql.startswith(head), sql
        sql = f"CREATE TABLE {name} (" + sql[len(head) :]
    return sql


def column_ddl(column: Any, dialect: str) -> str:
    """One column as ``ALTER TABLE … ADD COLUMN`` takes it (name, type, NOT NULL, DEFAULT)."""
    return str(CreateColumn(column).compile(dialect=_dialect(dialect))).strip()


def index_ddl(table: Table, dialect: str) -> list[str]:
    return [
        str(CreateIndex(ix).compile(dialect=_dialect(dialect))).strip()
        for ix in sorted(table.indexes, key=lambda ix: str(ix.name))
    ]


def schema_ddl(dialect: str) -> list[str]:
    """Every statement that creates the current schema on ``dialect`` ("sqlite" or "postgresql")."""
    out: list[str] = []
    for model in TABLES:
        table: Table = model.__table__  # type: ignore[attr-defined]
        out.append(create_table_ddl(table, dialect))
        out += index_ddl(table, dialect)
    return out


def rebuild_sqlite(table: Table, existing: Sequence[str]) -> list[str]:
    """Statements that rebuild one SQLite table exactly as the models declare it, keeping its rows
    (``existing``: the columns it has now; a column it lacks gets its DEFAULT). SQLite can't change
    a column's DEFAULT or a table's keys in place; this is its documented way. The caller keeps the
    AUTOINCREMENT counter (an id is never handed out twice)."""
    keep = [c.name for c in table.columns if c.name in existing]
    into, pick = list(keep), list(keep)
    if table.name == "task_window" and "seq" not in existing:
        into.append("seq")
        pick.append("rowid")  # the order the attempts were recorded in
    scratch = f"_rebuild_{table.name}"
    return [
        create_table_ddl(table, "sqlite", name=scratch),
        f"INSERT INTO {scratch} ({', '.join(into)}) "
        f"SELECT {', '.join(pick)} FROM {table.name} ORDER BY rowid",
        f"DROP TABLE {table.name}",
        f"ALTER TABLE {scratch} RENAME TO {table.name}",
        *index_ddl(table, "sqlite"),
    ]


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
    # 6: the CLI's latest lifecycle hook report survives a restart (cao/hookstate.py)
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
    # 9: attention: priority, kind, what to do if busy, deadlines, deferral, coalescing notices,
    # who closed a message and why, read receipts, the delivery channel; one timeline per agent
    9: (
        "ALTER TABLE terminal ADD COLUMN turn_channel TEXT",
        "ALTER TABLE message ADD COLUMN priority INTEGER NOT NULL DEFAULT 2",
        "ALTER TABLE message ADD COLUMN kind TEXT NOT NULL DEFAULT 'message'",
        "ALTER TABLE message ADD COLUMN if_busy TEXT NOT NULL DEFAULT 'wait'",
        "ALTER TABLE message ADD COLUMN expires_at REAL",
        "ALTER TABLE message ADD COLUMN not_before REAL",
        "ALTER TABLE message ADD COLUMN topic TEXT",
        "ALTER TABLE message ADD COLUMN superseded_by INTEGER",
        "ALTER TABLE message ADD COLUMN closed_by TEXT",
        "ALTER TABLE message ADD COLUMN closed_reason TEXT",
        "ALTER TABLE message ADD COLUMN read_at REAL",
        "ALTER TABLE message ADD COLUMN channel TEXT",
        "ALTER TABLE message ADD COLUMN interrupt_at REAL",
        "UPDATE message SET channel = 'paste' WHERE status = 'delivered'",
        # the queue in serving order, and the deadlines still to keep
        "CREATE INDEX ix_message_queue ON message (receiver_id, priority, id) WHERE status = 'pending'",
        "CREATE INDEX ix_message_expiry ON message (expires_at) "
        "WHERE status = 'pending' AND expires_at IS NOT NULL",
        # the few rows each claim and each look must find at once, however long the queue
        "CREATE INDEX ix_message_recheck ON message (receiver_id, id) "
        "WHERE status = 'pending' AND recheck IS NOT NULL",
        "CREATE INDEX ix_message_deferred ON message (receiver_id, not_before) "
        "WHERE status = 'pending' AND not_before IS NOT NULL",
        "CREATE INDEX ix_message_interrupt ON message (receiver_id) "
        "WHERE status = 'pending' AND if_busy = 'interrupt'",
        """CREATE TABLE message_event (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            receiver_id TEXT NOT NULL,
            message_id INTEGER,
            at REAL NOT NULL,
            event TEXT NOT NULL,
            reason TEXT,
            actor TEXT
        )""",
        "CREATE INDEX ix_message_event_receiver ON message_event (receiver_id, id)",
        # (one index only: each message writes two or more events; one message's events are found
        # within its receiver's, and the weekly prune goes by id)
    ),
    # 10: coordination: acknowledgements (a forward-only cursor per receiver), a worker's task
    # attempt and where it is in its work (notices), structured results, the operator's
    # notifications (and the webhook's queue), durable wake-up schedules
    10: (
        "ALTER TABLE terminal ADD COLUMN ack_cursor INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE terminal ADD COLUMN notify_supervisor INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE terminal ADD COLUMN task_id TEXT",
        "ALTER TABLE terminal ADD COLUMN task_at REAL",
        "ALTER TABLE terminal ADD COLUMN work_state TEXT",
        "ALTER TABLE message ADD COLUMN acked_at REAL",
        """CREATE TABLE task_result (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            terminal_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            supervisor_id TEXT,
            status TEXT NOT NULL,
            summary TEXT NOT NULL,
            details TEXT,
            digest TEXT NOT NULL,
            message_id INTEGER,
            created_at REAL NOT NULL
        )""",
        "CREATE UNIQUE INDEX ux_task_result_attempt ON task_result (terminal_id, task_id)",
        """CREATE TABLE notification (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            terminal_id TEXT NOT NULL,
            session_name TEXT NOT NULL,
            supervisor_id TEXT,
            event TEXT NOT NULL,
            reason TEXT,
            at REAL NOT NULL,
            message_id INTEGER,
            webhook TEXT,
            webhook_attempts INTEGER NOT NULL DEFAULT 0,
            webhook_error TEXT,
            webhook_at REAL
        )""",
        "CREATE INDEX ix_notification_webhook ON notification (id) WHERE webhook = 'pending'",
        """CREATE TABLE schedule (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            receiver_id TEXT NOT NULL,
            created_by TEXT NOT NULL,
            body TEXT NOT NULL,
            first_at REAL NOT NULL,
            every_seconds REAL,
            next_slot INTEGER NOT NULL DEFAULT 0,
            next_at REAL,
            state TEXT NOT NULL DEFAULT 'active',
            created_at REAL NOT NULL,
            closed_by TEXT,
            closed_at REAL,
            skipped INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX ix_schedule_due ON schedule (next_at) WHERE state = 'active'",
        # the delivered-but-unacknowledged messages of one receiver (check_inbox, the attention view)
        "CREATE INDEX ix_message_unacked ON message (receiver_id, id) "
        "WHERE status = 'delivered' AND acked_at IS NULL",
    ),
    # 11: a coordination board per session: versioned facts that wake no one (cao/store/board.py)
    11: (
        """CREATE TABLE board_fact (
            session_name TEXT NOT NULL,
            key TEXT NOT NULL,
            version INTEGER NOT NULL,
            value TEXT,
            writer TEXT NOT NULL,
            at REAL NOT NULL,
            head INTEGER NOT NULL DEFAULT 1,
            PRIMARY KEY (session_name, key, version)
        )""",
        # each key's newest version: a listing, the key count, the oldest tombstone to purge
        "CREATE INDEX ix_board_head ON board_fact (session_name, key) WHERE head = 1",
    ),
    # 12: tokens and cost per terminal, task and model, from what each CLI records (cao/usage.py);
    # the task attempts' start times, so a response is counted to the task it was made for
    12: (
        "ALTER TABLE terminal ADD COLUMN usage_known INTEGER",
        "ALTER TABLE terminal ADD COLUMN budget_hold TEXT",
        "ALTER TABLE terminal ADD COLUMN budget_warned TEXT",
        """CREATE TABLE task_window (
            terminal_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            started_at REAL NOT NULL,
            PRIMARY KEY (terminal_id, task_id)
        )""",
        """CREATE TABLE usage_total (
            terminal_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            model TEXT NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            cache_read_tokens INTEGER NOT NULL,
            cache_write_tokens INTEGER NOT NULL,
            responses INTEGER NOT NULL,
            first_at REAL,
            last_at REAL,
            PRIMARY KEY (terminal_id, task_id, model)
        )""",
    ),
}
