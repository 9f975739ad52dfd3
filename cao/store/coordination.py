"""Coordination rows: acknowledgements, task attempts and results, where a worker is in its work
(with the notifications and notices that follow from it), and wake-up schedules
(cao/coordination.py is the library over these; docs/orchestration.md the user's view)."""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import Any

from cao.attention import Attention
from cao.errors import Conflict, Forbidden, InvalidInput, NotFound, PayloadTooLarge
from cao.states import (
    NOTICE_STATES,
    Event,
    MessageStatus,
    ScheduleState,
    TerminalState,
    WebhookState,
    WorkState,
)
from cao.store.base import _row, body_digest, insert_row, open_task_window
from cao.store.messages import MessageRows
from cao.store.schema import MAX_BODY_BYTES, Message, MessageEvent, Notification, Schedule, TaskResult
from cao.timefmt import iso

MAX_CATCH_UP = 3  # slots of a schedule that passed while cao-server was down, created late at most
ACK_EVENTS_MAX = 500  # timeline events one ack writes at most (the rest are acked all the same)
UNDELIVERED = (MessageStatus.PENDING.value, MessageStatus.DELIVERING.value)


def slot_sender(schedule_id: int) -> str:
    """The sender name of a schedule's wake-ups (its header reads ``from schedule-<id>``)."""
    return f"schedule-{schedule_id}"  # (core.SCHEDULE_SENDER: refused as a sender of a plain send)


def slot_body(s: Schedule, slot: int) -> str:
    every = f", every {_span(s.every_seconds)}" if s.every_seconds else ""
    return f"{s.body}\n\n(cao) wake-up {s.id}, slot {slot}{every}; cancel it with `cao schedule rm {s.id}`"


def _span(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


class CoordinationRows(MessageRows):
    # -- acknowledgements ---------------------------------------------------------------------------
    def ack(
        self,
        receiver_id: str,
        *,
        actor: str,
        through: int | None = None,
        ids: Sequence[int] = (),
        expected: int | None = None,
    ) -> dict[str, Any]:
        """Acknowledge messages to ``receiver_id``: all of them up to ``through`` (its forward-only
        cursor, compare-and-swap on ``expected``), or the given ``ids``. A message not delivered yet
        can't be acknowledged (409); an ack already satisfied succeeds again (``replay``)."""
        now = self.clock()
        told: list[MessageEvent] = []
        with self._write() as conn:
            row = conn.execute("SELECT ack_cursor FROM terminal WHERE id = ?", (receiver_id,)).fetchone()
            if row is None:
                raise NotFound(f"terminal {receiver_id} not found; list terminals with `cao status`")
            cursor = int(row[0])
            acked: list[int] = []
            if through is not None:
                if expected is not None and expected != cursor and through > cursor:
                    raise Conflict(
                        f"stale ack: terminal {receiver_id}'s cursor is at {cursor}, not {expected}; nothing "
                        f"was acknowledged. Ack again with expected={cursor} (check_inbox shows the cursor)",
                        current=cursor,
                    )
                target = conn.execute("SELECT receiver_id FROM message WHERE id = ?", (through,)).fetchone()
                if target is None or target[0] != receiver_id:
                    raise NotFound(
                        f"message {through} is not a message to terminal {receiver_id}; ack the id of one "
                        "of your own messages (check_inbox lists them)"
                    )
                # what is due (or being pasted) but has not reached it blocks the cursor; a message
                # deferred until later (a wake-up's next slot) has not come its way yet: it doesn't
                early = conn.execute(
                    "SELECT id, status FROM message WHERE receiver_id = ? AND id <= ? "
                    "AND (status = 'delivering' OR (status = 'pending' AND "
                    "(not_before IS NULL OR not_before <= ?))) ORDER BY id LIMIT 1",
                    (receiver_id, through, now),
                ).fetchone()
                if early is not None and early[0] > cursor:
                    raise Conflict(
                        f"message {early[0]} to terminal {receiver_id} is {early[1]}, not delivered yet: "
                        f"nothing was acknowledged. Ack only what reached you (through a lower id, or "
                        "by ids)",
                        current=cursor,
                    )
                # every delivered message up to it (one delivered late, below the cursor, too)
                acked = [
                    int(r[0])
                    for r in conn.execute(
                        "UPDATE message SET acked_at = ? WHERE receiver_id = ? AND id <= ? "
                        "AND status = 'delivered' AND acked_at IS NULL RETURNING id",
                        (now, receiver_id, through),
                    ).fetchall()
                ]
                if through > cursor:
                    conn.execute("UPDATE terminal SET ack_cursor = ? WHERE id = ?", (through, receiver_id))
                    cursor = through
            else:
                if not ids:
                    raise InvalidInput("say what to acknowledge: through_message_id, or message_ids")
                rows = {
                    int(r[0]): r
                    for r in conn.execute(
                        "SELECT id, receiver_id, status FROM message "
                        f"WHERE id IN ({','.join('?' * len(ids))})",
                        tuple(ids),
                    ).fetchall()
                }
                for mid in ids:
                    r = rows.get(mid)
                    if r is None or r[1] != receiver_id:
                        raise NotFound(
                            f"message {mid} is not a message to terminal {receiver_id}; nothing was "
                            "acknowledged"
                        )
                    if r[2] != MessageStatus.DELIVERED:
                        raise Conflict(
                            f"message {mid} is {r[2]}, not delivered: nothing was acknowledged (ack only "
                            "what reached you)",
                            current=cursor,
                        )
                acked = [
                    int(r[0])
                    for r in conn.execute(
                        f"UPDATE message SET acked_at = ? WHERE id IN ({','.join('?' * len(ids))}) "
                        "AND acked_at IS NULL RETURNING id",
                        (now, *ids),
                    ).fetchall()
                ]
            acked.sort()
            told = self._timeline(conn, Event.ACKED, receiver_id, acked[:ACK_EVENTS_MAX], actor=actor, at=now)
        self._told(told)
        return {"terminal_id": receiver_id, "ack_cursor": cursor, "acked": acked, "replay": not acked}

    # (``unacked`` below lists every delivered message without an ack, below the cursor too: one
    # delivered after the cursor passed it, a deferred one, is acked through or by its id)

    def unacked(self, receiver_id: str, *, limit: int = 50) -> list[Message]:
        """Delivered to ``receiver_id`` and not acknowledged, oldest first (the newest ``limit``)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM (SELECT * FROM message WHERE receiver_id = ? AND status = 'delivered' "
                "AND acked_at IS NULL ORDER BY id DESC LIMIT ?) AS newest ORDER BY id",
                (receiver_id, limit),
            ).fetchall()
        return [_row(Message, r) for r in rows]

    # -- task attempts and results --------------------------------------------------------------
    def set_task(self, terminal_id: str, task_id: str, *, tasked: bool = True) -> None:
        """A task typed into the terminal (a handoff step): a new attempt; ``tasked``: it was
        typed, so it has work now (before the typing: the attempt only, so an early report counts)."""
        now = self.clock()
        with self._write() as conn:
            if tasked:
                conn.execute(
                    "UPDATE terminal SET task_id = ?, task_at = ?, work_state = ? WHERE id = ?",
                    (task_id, now, WorkState.TASKED.value, terminal_id),
                )
            else:
                conn.execute("UPDATE terminal SET task_id = ? WHERE id = ?", (task_id, terminal_id))
            # the attempt's responses from here on are its cost (cao/usage.py; the first call wins)
            open_task_window(conn, terminal_id, task_id, now)
        if tasked and self.on_tasked is not None:
            self.on_tasked(terminal_id)

    def put_result(self, result: TaskResult) -> tuple[TaskResult, bool]:
        """Store a worker's report on its attempt: (the stored one, duplicate). An exact retry is
        the first receipt; a different report for the same attempt is a 409."""
        with self._write() as conn:
            prior = conn.execute(
                "SELECT * FROM task_result WHERE terminal_id = ? AND task_id = ?",
                (result.terminal_id, result.task_id),
            ).fetchone()
            if prior is not None:
                first = _row(TaskResult, prior)
                if first.digest != result.digest:
                    raise Conflict(
                        f"worker {result.terminal_id} already reported {first.status!r} for this task "
                        f"(result {first.id}, {iso(first.created_at)}): a task attempt has one result. "
                        "Send anything further with send_message",
                        result_id=first.id,
                    )
                return first, True
            row = result.model_dump(exclude={"id"})
            result.id = insert_row(conn, "task_result", row)
        return result, False

    def set_result_message(self, result_id: int, message_id: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE task_result SET message_id = ? WHERE id = ?", (message_id, result_id))

    def get_result(self, terminal_id: str, task_id: str) -> TaskResult | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT * FROM task_result WHERE terminal_id = ? AND task_id = ?", (terminal_id, task_id)
            ).fetchone()
        return None if row is None else _row(TaskResult, row)

    def results(
        self, *, terminal_id: str | None = None, supervisor_id: str | None = None
    ) -> list[TaskResult]:
        sql, args = "SELECT * FROM task_result WHERE 1=1", list[str]()
        if terminal_id is not None:
            sql, args = sql + " AND terminal_id = ?", [*args, terminal_id]
        if supervisor_id is not None:
            sql, args = sql + " AND supervisor_id = ?", [*args, supervisor_id]
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY id DESC LIMIT 200", tuple(args)).fetchall()
        return [_row(TaskResult, r) for r in rows]

    # -- where a worker is in its work: notifications and notices --------------------------------
    def work_states(self) -> dict[str, str | None]:
        """Live terminals' work states (coordination's cache at start)."""
        with self._read() as conn:
            mine = "" if self.host is None else " AND host = ?"
            args = () if self.host is None else (self.host,)
            rows = conn.execute(
                f"SELECT id, work_state FROM terminal WHERE state = 'live'{mine}", args
            ).fetchall()
        return {str(r[0]): r[1] for r in rows}

    def change_work(
        self,
        terminal_id: str,
        expect: str | None,
        to: WorkState,
        *,
        reason: str,
        webhook: bool,
        notice: tuple[str, Attention] | None = None,
    ) -> Notification | bool | None:
        """Move a terminal's work state from ``expect`` to ``to`` (compare-and-swap: one caller wins
        each change). A change into a notice state records a notification and, with ``notice``
        (body, attention), puts that notice into its supervisor's inbox, in the same transaction.
        Returns the notification, True for a plain change, False when another caller won."""
        now = self.clock()
        told: list[MessageEvent] = []
        with self._write() as conn:
            row = conn.execute(
                "UPDATE terminal SET work_state = ? WHERE id = ? AND work_state IS NOT DISTINCT FROM ? "
                "RETURNING session_name, supervisor_id, notify_supervisor",
                (to.value, terminal_id, expect),
            ).fetchone()
            if row is None:
                return False
            if to not in NOTICE_STATES:
                return True
            session, supervisor, wanted = row[0], row[1], bool(row[2])
            message_id = None
            if notice is not None and supervisor and wanted:
                live = conn.execute("SELECT state FROM terminal WHERE id = ?", (supervisor,)).fetchone()
                if live is not None and live[0] in (TerminalState.LIVE, TerminalState.STARTING):
                    body, attention = notice
                    message_id, _, told = self._insert_message(
                        conn,
                        sender_id=terminal_id,
                        receiver_id=supervisor,
                        body=body,
                        digest=body_digest(supervisor, body),
                        idempotency_key=None,
                        now=now,
                        nonce=secrets.token_hex(6),
                        waiting_reason=None,
                        attention=attention,
                    )
            note = Notification(
                terminal_id=terminal_id,
                session_name=session,
                supervisor_id=supervisor,
                event=to.value,
                reason=reason,
                at=now,
                message_id=message_id,
                webhook=WebhookState.PENDING.value if webhook else None,
            )
            fields = note.model_dump(exclude={"id"})
            note.id = insert_row(conn, "notification", fields)
        self._told(told)
        return note

    def notifications(
        self, *, limit: int = 100, terminal_id: str | None = None, after: int = 0
    ) -> list[Notification]:
        sql, args = "SELECT * FROM notification WHERE id > ?", list[Any]([after])
        if terminal_id is not None:
            sql, args = sql + " AND terminal_id = ?", [*args, terminal_id]
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?) AS newest ORDER BY id", (*args, limit)
            ).fetchall()
        return [_row(Notification, r) for r in rows]

    def prune_notifications(self, *, older_than: float) -> int:
        """Drop notifications older than ``older_than`` (a week, as the timeline), unless the
        webhook still owes them a POST."""
        with self._read() as conn:
            (old,) = conn.execute(
                "SELECT count(*) FROM notification WHERE at < ? AND coalesce(webhook, '') != 'pending'",
                (older_than,),
            ).fetchone()
        if not old:
            return 0
        with self._write() as conn:
            return int(
                conn.execute(
                    "DELETE FROM notification WHERE at < ? AND coalesce(webhook, '') != 'pending'",
                    (older_than,),
                ).rowcount
            )

    def webhook_pending(self, *, limit: int = 50) -> list[Notification]:
        with self._read() as conn:
            # each host posts the notices about its own workers (several hosts would post each twice)
            mine = "" if self.host is None else " AND terminal_id IN (SELECT id FROM terminal WHERE host = ?)"
            args = (limit,) if self.host is None else (self.host, limit)
            rows = conn.execute(
                f"SELECT * FROM notification WHERE webhook = 'pending'{mine} ORDER BY id LIMIT ?", args
            ).fetchall()
        return [_row(Notification, r) for r in rows]

    def webhook_tried(self, notification_id: int, *, sent: bool, final: bool, error: str | None) -> None:
        """One POST of a notification: sent, failed for good (``final``), or to be retried."""
        state = WebhookState.SENT if sent else WebhookState.FAILED if final else WebhookState.PENDING
        with self._write() as conn:
            conn.execute(
                "UPDATE notification SET webhook = ?, webhook_attempts = webhook_attempts + 1, "
                "webhook_error = ?, webhook_at = ? WHERE id = ? AND webhook = 'pending'",
                (state.value, error, self.clock(), notification_id),
            )

    # -- wake-up schedules ----------------------------------------------------------------------
    def add_schedule(self, schedule: Schedule, attention: Attention, *, limit: int) -> Schedule:
        """Store a schedule and create its first slot's message (deferred until its time), in one
        transaction; at most ``limit`` active schedules per receiver."""
        size = len(schedule.body.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES // 4:
            raise PayloadTooLarge(
                f"a wake-up's message is {size} bytes, over the {MAX_BODY_BYTES // 4}-byte limit; nothing "
                "was stored; point to a file instead"
            )
        with self._write() as conn:
            (active,) = conn.execute(
                "SELECT count(*) FROM schedule WHERE receiver_id = ? AND state = 'active'",
                (schedule.receiver_id,),
            ).fetchone()
            if active >= limit:
                raise Conflict(
                    f"terminal {schedule.receiver_id} has {active} active wake-ups, the most it may have "
                    f"({limit}); nothing was stored. Cancel some (`cao schedule list`, `cao schedule rm`)"
                )
            row = schedule.model_dump(exclude={"id"})
            schedule.id = insert_row(conn, "schedule", row)
            told, created = self._slots(conn, schedule, attention, upto=0)
            first = created[0] if created else None
            when = iso(schedule.first_at)
            every = f", then every {_span(schedule.every_seconds)}" if schedule.every_seconds else ""
            told += self._timeline(
                conn,
                Event.SCHEDULED,
                schedule.receiver_id,
                [first],
                reason=f"wake-up {schedule.id} at {when}{every}",
                actor=schedule.created_by,
            )
        self._told(told)
        return self.get_schedule(schedule.id)

    def _slots(
        self, conn: Any, s: Schedule, attention: Attention, *, upto: int
    ) -> tuple[list[MessageEvent], list[int]]:
        """Create the messages of slots ``s.next_slot`` .. ``upto`` (each deferred until its time;
        a slot's idempotency key names it, so it is created once), and move the schedule on.
        Returns the timeline events and the messages created."""
        told: list[MessageEvent] = []
        created: list[int] = []
        sender = slot_sender(s.id or 0)
        for slot in range(s.next_slot, upto + 1):
            key = f"slot-{slot}"
            if conn.execute(
                "SELECT 1 FROM message WHERE sender_id = ? AND idempotency_key = ?", (sender, key)
            ).fetchone():
                continue
            body = slot_body(s, slot)
            a = Attention(
                kind=attention.kind,
                priority=attention.priority,
                if_busy=attention.if_busy,
                expires_at=None,
                not_before=s.first_at + slot * (s.every_seconds or 0.0),
                topic=None,
            )
            mid, _, events = self._insert_message(
                conn,
                sender_id=sender,
                receiver_id=s.receiver_id,
                body=body,
                digest=body_digest(s.receiver_id, body),
                idempotency_key=key,
                now=self.clock(),
                nonce=secrets.token_hex(6),
                waiting_reason=None,
                attention=a,
            )
            told += events
            created.append(mid)
        s.next_slot = upto + 1
        if s.every_seconds:
            s.next_at = s.first_at + s.next_slot * s.every_seconds
            conn.execute(
                "UPDATE schedule SET next_slot = ?, next_at = ?, skipped = ? WHERE id = ?",
                (s.next_slot, s.next_at, s.skipped, s.id),
            )
        else:
            s.next_at, s.state = None, ScheduleState.DONE.value
            conn.execute(
                "UPDATE schedule SET next_slot = ?, next_at = NULL, state = ? WHERE id = ?",
                (s.next_slot, s.state, s.id),
            )
        return told, created

    def advance_schedules(self, now: float, attention: Attention) -> list[str]:
        """Create the next slot's message of every active schedule whose previous slot's time has
        come (so each slot's message exists before its time); slots that passed while nothing ran
        are created late, at most ``MAX_CATCH_UP`` of them (the rest are counted as skipped).
        Returns the receivers that got a message."""
        woke: list[str] = []
        told: list[MessageEvent] = []
        with self._write() as conn:
            rows = conn.execute(
                "SELECT * FROM schedule WHERE state = 'active' AND next_at IS NOT NULL "
                "AND next_at - every_seconds <= ? ORDER BY next_at LIMIT 200",
                (now,),
            ).fetchall()
            for r in rows:
                s = _row(Schedule, r)
                every = s.every_seconds or 0.0
                live = conn.execute("SELECT state FROM terminal WHERE id = ?", (s.receiver_id,)).fetchone()
                if live is None or live[0] not in (TerminalState.LIVE, TerminalState.STARTING):
                    conn.execute(
                        "UPDATE schedule SET state = 'cancelled', closed_by = 'cao', closed_at = ? "
                        "WHERE id = ?",
                        (now, s.id),
                    )
                    continue
                latest = math.floor((now - s.first_at) / every)  # the newest slot whose time has come
                if latest - s.next_slot + 1 > MAX_CATCH_UP:
                    skip = latest - MAX_CATCH_UP + 1 - s.next_slot
                    s.skipped += skip
                    s.next_slot += skip
                events, created = self._slots(conn, s, attention, upto=latest + 1)
                told += events
                if created:
                    woke.append(s.receiver_id)
        self._told(told)
        return woke

    def cancel_schedule(self, schedule_id: int, *, actor: str, as_agent: bool) -> Schedule:
        """Cancel a schedule and its slots' messages still waiting. An agent: its own wake-ups
        only (those it scheduled, or scheduled for it)."""
        now = self.clock()
        with self._write() as conn:
            row = conn.execute("SELECT * FROM schedule WHERE id = ?", (schedule_id,)).fetchone()
            if row is None:
                raise NotFound(f"wake-up {schedule_id} not found; list them with `cao schedule list`")
            s = _row(Schedule, row)
            if as_agent and actor not in (s.receiver_id, s.created_by):
                raise Forbidden(
                    f"wake-up {schedule_id} is terminal {s.receiver_id}'s; an agent cancels its own wake-ups"
                )
            if s.state == ScheduleState.CANCELLED:
                return s
            ids = [
                int(r[0])
                for r in conn.execute(
                    "UPDATE message SET status = 'cancelled', closed_by = ?, closed_reason = ?, "
                    "waiting_reason = NULL WHERE sender_id = ? AND receiver_id = ? AND status = 'pending' "
                    "AND recheck IS NULL RETURNING id",
                    (actor, f"wake-up {schedule_id} cancelled", slot_sender(schedule_id), s.receiver_id),
                ).fetchall()
            ]
            conn.execute(
                "UPDATE schedule SET state = 'cancelled', closed_by = ?, closed_at = ? WHERE id = ?",
                (actor, now, schedule_id),
            )
            told = self._timeline(
                conn, Event.UNSCHEDULED, s.receiver_id, [None], reason=f"wake-up {schedule_id}", actor=actor
            )
            told += self._timeline(
                conn,
                Event.CANCELLED,
                s.receiver_id,
                sorted(ids),
                reason=f"wake-up {schedule_id}",
                actor=actor,
            )
        self._told(told)
        return self.get_schedule(schedule_id)

    def get_schedule(self, schedule_id: int) -> Schedule:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM schedule WHERE id = ?", (schedule_id,)).fetchone()
        if row is None:
            raise NotFound(f"wake-up {schedule_id} not found; list them with `cao schedule list`")
        return _row(Schedule, row)

    def list_schedules(self, *, receiver_id: str | None = None, active_only: bool = False) -> list[Schedule]:
        sql, args = "SELECT * FROM schedule WHERE 1=1", []
        if receiver_id is not None:
            sql, args = sql + " AND receiver_id = ?", [receiver_id]
        if active_only:
            sql += " AND state = 'active'"
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY id DESC LIMIT 500", tuple(args)).fetchall()
        return [_row(Schedule, r) for r in rows]

    def schedule_messages(self, schedule: Schedule) -> list[Message]:
        """The messages a schedule created (newest first)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM message WHERE sender_id = ? AND receiver_id = ? ORDER BY id DESC LIMIT 50",
                (slot_sender(schedule.id or 0), schedule.receiver_id),
            ).fetchall()
        return [_row(Message, r) for r in rows]

    def next_schedule_due(self) -> float | None:
        """When the next active schedule wants its next slot created."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT min(next_at - every_seconds) FROM schedule "
                "WHERE state = 'active' AND next_at IS NOT NULL"
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])
