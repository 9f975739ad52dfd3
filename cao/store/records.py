"""Handoff jobs and worktree rows."""

from __future__ import annotations

from cao.errors import (
    NotFound,
)
from cao.store.base import Database, _row
from cao.store.schema import HandoffJob, Worktree


class RecordRows(Database):
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
                "terminal_id = coalesce(excluded.terminal_id, handoff_job.terminal_id), "
                "last_message = coalesce(excluded.last_message, handoff_job.last_message), "
                "error_message = coalesce(excluded.error_message, handoff_job.error_message), "
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
                f"INSERT INTO worktree ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                tuple(row.values()),
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
            return bool(cur.rowcount == 1)
