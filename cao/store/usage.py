"""Usage rows: what each terminal's CLI spent, per task attempt and model (cao/usage.py reads the
CLIs' own records and writes the totals here; a terminal's HOME may go, its totals stay)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from cao.states import Kind
from cao.store.base import Database


class UsageRow(NamedTuple):
    terminal_id: str
    task_id: str  # "" before its first task
    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    responses: int
    first_at: float | None
    last_at: float | None


class UsageRows(Database):
    def task_windows(self, terminal_id: str) -> list[tuple[str, float]]:
        """The terminal's task attempts and when each began, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT task_id, started_at FROM task_window WHERE terminal_id = ? ORDER BY started_at, seq",
                (terminal_id,),
            ).fetchall()
        return [(str(r[0]), float(r[1])) for r in rows]

    def put_usage(self, terminal_id: str, rows: Sequence[UsageRow] | None) -> None:
        """Replace the terminal's totals with a fresh reading (``None``: its CLI records nothing)."""
        with self._write() as conn:
            conn.execute("DELETE FROM usage_total WHERE terminal_id = ?", (terminal_id,))
            if rows:
                conn.executemany(
                    f"INSERT INTO usage_total ({', '.join(UsageRow._fields)}) VALUES ({', '.join('?' * 10)})",
                    [tuple(r) for r in rows],
                )
            conn.execute(
                "UPDATE terminal SET usage_known = ? WHERE id = ?", (0 if rows is None else 1, terminal_id)
            )

    def usage_rows(self, terminal_ids: Sequence[str]) -> list[UsageRow]:
        if not terminal_ids:
            return []
        marks = ",".join("?" * len(terminal_ids))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT * FROM usage_total WHERE terminal_id IN ({marks}) ORDER BY terminal_id, first_at",
                tuple(terminal_ids),
            ).fetchall()
        return [UsageRow(*tuple(r)) for r in rows]

    def set_budget_state(self, terminal_id: str, *, hold: str | None, warned: str | None) -> bool:
        """Record a terminal's budget hold and warnings; True when the hold changed."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE terminal SET budget_hold = ?, budget_warned = ? WHERE id = ? "
                "AND budget_hold IS DISTINCT FROM ? RETURNING id",
                (hold, warned, terminal_id, hold),
            ).fetchall()
            if not cur:
                conn.execute("UPDATE terminal SET budget_warned = ? WHERE id = ?", (warned, terminal_id))
            return bool(cur)

    def hold_tasks(self, receiver_id: str, reason: str) -> bool:
        """A receiver over budget: its pending tasks say why they wait. True when other mail (not a
        task) may still go."""
        with self._write() as conn:
            conn.execute(
                "UPDATE message SET waiting_reason = ? WHERE receiver_id = ? AND status = 'pending' "
                "AND kind = ? AND waiting_reason IS DISTINCT FROM ?",
                (reason, receiver_id, Kind.TASK.value, reason),
            )
            other = conn.execute(
                "SELECT 1 FROM message WHERE receiver_id = ? AND status = 'pending' AND kind != ? LIMIT 1",
                (receiver_id, Kind.TASK.value),
            ).fetchone()
        return other is not None
