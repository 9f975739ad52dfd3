"""Terminal rows: created, given their pane, gone, deleted."""

from __future__ import annotations

import sqlite3
from typing import Any

from cao.errors import (
    InvalidInput,
    NotFound,
)
from cao.states import RECEIVER_GONE, FailureKind, TerminalState
from cao.store.base import Database, _row
from cao.store.schema import Terminal


class TerminalRows(Database):
    # -- terminals -------------------------------------------------------------------------------
    def add_terminal(self, terminal: Terminal, *, new_session: bool = False) -> Terminal:
        """Write a new terminal's row. ``new_session``: refused (nothing written) when another host
        already runs a terminal in that session (several hosts share the store: two creating the
        same new session at once, one wins)."""
        row = terminal.model_dump()
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self._write() as conn:
            if new_session and self.host is not None:
                taken = conn.execute(
                    "SELECT host FROM terminal WHERE session_name = ? AND host != ? "
                    "AND state IN ('starting', 'live') LIMIT 1",
                    (terminal.session_name, self.host),
                ).fetchone()
                if taken is not None:
                    raise InvalidInput(
                        f"session {terminal.session_name} already exists (on host {taken[0]}); pick another "
                        "name or add a terminal to it"
                    )
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
        local: bool = False,
    ) -> list[Terminal]:
        """Terminals, oldest first (``local``: only this host's, those whose panes it may touch)."""
        sql = "SELECT * FROM terminal WHERE 1=1"
        args: list[Any] = []
        if local and self.host is not None:
            sql += " AND host = ?"
            args.append(self.host)
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
            return bool(cur.rowcount == 1)

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
