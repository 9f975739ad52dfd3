"""SQLite persistence: terminals, inbox messages, the sessions' boards. The only module that writes SQL.

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

from cao.store.base import Database, body_digest, disk_error
from cao.store.board import BoardRows
from cao.store.coordination import CoordinationRows
from cao.store.hosts import HostRows
from cao.store.messages import MessageRows  # noqa: F401 - CoordinationRows builds on it
from cao.store.records import RecordRows
from cao.store.schema import (
    MAX_BODY_BYTES,
    MESSAGE_STATUSES,
    MIGRATIONS,
    POOL_SIZE,
    SCHEMA_VERSION,
    WAL_SUFFIX,
    BoardFact,
    Claim,
    HandoffJob,
    Host,
    Message,
    MessageEvent,
    Notification,
    Schedule,
    TaskResult,
    Terminal,
    Worktree,
)
from cao.store.usage import UsageRow, UsageRows


class Store(HostRows, RecordRows, CoordinationRows, BoardRows, UsageRows):
    """All reads and writes of the cao database. Thread-safe; many processes may share the file."""


__all__ = [
    "MAX_BODY_BYTES",
    "MESSAGE_STATUSES",
    "MIGRATIONS",
    "POOL_SIZE",
    "SCHEMA_VERSION",
    "WAL_SUFFIX",
    "BoardFact",
    "Claim",
    "Database",
    "HandoffJob",
    "Host",
    "Message",
    "MessageEvent",
    "Notification",
    "Schedule",
    "Store",
    "TaskResult",
    "Terminal",
    "UsageRow",
    "Worktree",
    "body_digest",
    "disk_error",
]
