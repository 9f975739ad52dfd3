"""Coordination beyond "pasted" (docs/orchestration.md, ../ATTENTION.md guarantees 7, 9–11):

    ack            delivered is not acted on: a forward-only cursor per receiver (compare-and-swap
                   on ``expected``), or explicit ids; reads never ack, nothing is re-pasted for a
                   missing ack
    results        a worker's report on its task attempt, validated, one per attempt, delivered to
                   its supervisor as a ``result`` message (high) and returned by ``handoff``
    notices        where a worker is in its work (states.WorkState), followed from its status reads:
                   each change into finished / blocked / failed / exited is one notification (the
                   operator's attention list, the webhook) and one ``notice`` to its supervisor
    wake-ups       durable schedules: each slot one deferred ``wakeup`` message, created once

Work states, as the status reads move them (one compare-and-swap per change, so two readers
never both report it)::

    (a task or its supervisor's message delivered) ──► tasked ──processing──► working
    tasked/working ──prompt──► blocked ──processing──► working
    tasked/working/blocked ──ready──► finished     (tasked: only once its turn can't still start)
    tasked/working ──error, or unknown for long──► failed
    any ──pane gone──► exited

A later turn nobody asked for (a person typing into a finished worker) is not its task: no notice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from cao import attention
from cao.errors import Conflict, Forbidden, InvalidInput, NotFound
from cao.events import EventBus
from cao.inbox import Inbox
from cao.names import validate_terminal_id
from cao.settings import Settings
from cao.states import (
    ENDED,
    NOTICE_STATES,
    Kind,
    Priority,
    ResultStatus,
    ScheduleState,
    Status,
    TerminalState,
    WorkState,
)
from cao.store import Notification, Schedule, Store, TaskResult, Terminal
from cao.timefmt import iso

logger = logging.getLogger(__name__)

SUMMARY_CHARS = 4000
DETAIL_TEXT_CHARS = 8000
DETAIL_LIST_ITEMS = 200
DETAILS_BYTES = 32 * 1024
# what a result's details may name: an experienced reviewer's checklist, nothing free-form beyond notes
DETAIL_FIELDS: dict[str, str] = {
    "branch": "text",  # the branch its work is on
    "commit": "text",
    "files": "list",  # files it changed or wrote
    "artifacts": "list",  # anything else it produced: paths, URLs
    "tests": "text",  # what it ran and how that went
    "notes": "text",
}
TASK_GRACE = 2.0  # seconds after a task's delivery before a ready screen counts as its turn's end
REFRESH_EVERY = 0.25  # a working agent's status is re-read at most this often on its log changes
LOOK_AFTER = 1.0  # the housekeeping tick re-reads an attended terminal not read for this long
LOOK_AFTER_BLOCKED = 10.0  # ... one waiting for a person (its answer prints: the log wakes a read)

WORK_WORDS = {
    WorkState.FINISHED: "ended its turn on its task",
    WorkState.BLOCKED: "is waiting at a permission or question prompt (a person must answer it)",
    WorkState.FAILED: "failed",
    WorkState.EXITED: "exited",
}
# follow these: they may still produce a notice
ATTENDED = (WorkState.TASKED, WorkState.WORKING, WorkState.BLOCKED)


def next_state(state: str | None, status: str, *, task_age: float) -> WorkState | None:
    """The work state a status read moves ``state`` to (None: no change). Pure."""
    if state is None or state in (WorkState.EXITED, WorkState.FAILED, WorkState.FINISHED):
        return None
    if status == Status.PROCESSING:
        return WorkState.WORKING if state != WorkState.WORKING else None
    if status == Status.WAITING_USER_ANSWER:
        return WorkState.BLOCKED if state != WorkState.BLOCKED else None
    if status == Status.ERROR and state != WorkState.BLOCKED:
        return WorkState.FAILED
    if status in (Status.IDLE, Status.COMPLETED, Status.ERROR):
        if state == WorkState.TASKED and task_age < TASK_GRACE:
            return None  # its turn may not have begun on the screen yet
        return WorkState.FINISHED
    return None


def check_details(details: object) -> dict[str, Any] | None:
    """A result's details: an object of known fields (DETAIL_FIELDS), texts and lists of texts
    within their limits; anything else is refused with the reason."""
    if details is None:
        return None
    if not isinstance(details, Mapping):
        raise InvalidInput(
            f"details must be an object with some of: {', '.join(DETAIL_FIELDS)}; "
            f"got {type(details).__name__}"
        )
    out: dict[str, Any] = {}
    for key, value in details.items():
        kind = DETAIL_FIELDS.get(str(key))
        if kind is None:
            raise InvalidInput(
                f"details.{key} is not a field a result has; use {', '.join(DETAIL_FIELDS)} (put "
                "anything else in notes)"
            )
        if kind == "text":
            if not isinstance(value, str) or len(value) > DETAIL_TEXT_CHARS:
                raise InvalidInput(f"details.{key} must be a text of at most {DETAIL_TEXT_CHARS} characters")
            out[key] = _text(f"details.{key}", value)
        else:
            if not isinstance(value, list) or len(value) > DETAIL_LIST_ITEMS:
                raise InvalidInput(f"details.{key} must be a list of at most {DETAIL_LIST_ITEMS} texts")
            if not all(isinstance(v, str) and 0 < len(v) <= 1000 for v in value):
                raise InvalidInput(f"details.{key} must hold texts of 1-1000 characters each")
            out[key] = [_text(f"details.{key}", v) for v in value]
    size = len(json.dumps(out, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > DETAILS_BYTES:
        raise InvalidInput(f"details are {size} bytes, over the {DETAILS_BYTES}-byte limit; shorten them")
    return out


def _text(what: str, value: str) -> str:
    from cao import inputs

    inputs.check_text(what, value, kind="free_text")
    return value


def result_text(worker: Terminal, r: TaskResult) -> str:
    """The result message a supervisor reads (and handoff returns)."""
    lines = [f"Result from worker {worker.id} ({worker.agent_profile}): {r.status}", "", r.summary]
    details = json.loads(r.details) if r.details else {}
    for key, value in details.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def result_view(r: TaskResult) -> dict[str, object]:
    return {
        "result_id": r.id,
        "terminal_id": r.terminal_id,
        "task_id": r.task_id,
        "supervisor_id": r.supervisor_id,
        "status": r.status,
        "summary": r.summary,
        "details": json.loads(r.details) if r.details else None,
        "message_id": r.message_id,
        "created_at": iso(r.created_at),
    }


def notification_view(n: Notification) -> dict[str, object]:
    return {
        "id": n.id,
        "event": n.event,
        "terminal_id": n.terminal_id,
        "session_name": n.session_name,
        "supervisor_id": n.supervisor_id,
        "reason": n.reason,
        "at": iso(n.at),
        "message_id": n.message_id,
        "webhook": n.webhook,
        "webhook_attempts": n.webhook_attempts,
        "webhook_error": n.webhook_error,
    }


class Coordination:
    """Acks, results, notices and wake-ups over the store. ``refresh`` re-reads a terminal's
    status (the engine's coalesced refresh); ``wake`` kicks a receiver's delivery."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        inbox: Inbox,
        *,
        events: EventBus,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.inbox = inbox
        self.events = events
        self.clock = clock
        self.wake: Callable[[str], None] = lambda _rid: None
        self.refresh: Callable[[str], None] = lambda _tid: None
        self.attend: Callable[[], None] = lambda: None  # make sure attended logs are polled
        self.attending: set[str] = set()  # terminals whose work may still produce a notice
        self._states: dict[str, str | None] = {}
        self._read_at: dict[str, float] = {}  # when each attended terminal's status was last read
        self._unknown_since: dict[str, float] = {}
        self._lock = threading.Lock()
        self.webhook = Webhook(settings, store, clock=clock) if settings.notify_url else None
        store.on_tasked = self.tasked

    def start(self) -> None:
        states = self.store.work_states()
        with self._lock:
            self._states = dict(states)
            self.attending.clear()  # (the engine's watch holds this very set)
            self.attending.update(t for t, s in states.items() if s in ATTENDED)
        if self.webhook is not None:
            self.webhook.start()
        if self.attending:
            self.attend()

    def stop(self) -> None:
        if self.webhook is not None:
            self.webhook.stop()

    # -- acknowledgements -------------------------------------------------------------------------
    def ack(
        self,
        terminal_id: str,
        *,
        by: str | None,
        through: int | None = None,
        ids: list[int] | None = None,
        expected: int | None = None,
    ) -> dict[str, Any]:
        validate_terminal_id(terminal_id)
        who, agent = self.inbox.actor(by)
        if agent and who != terminal_id:
            raise Forbidden(
                f"terminal {who} can't acknowledge terminal {terminal_id}'s messages; an agent acks its own"
            )
        if (through is None) == (not ids):
            raise InvalidInput("give through_message_id (everything up to it) or message_ids, one of them")
        if ids is not None and not isinstance(ids, list):
            raise InvalidInput("message_ids must be a list of message ids, e.g. [41, 42]")
        for n in [through, expected, *(ids or [])]:
            if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 0 <= n < 2**63):
                raise InvalidInput("message ids and expected are whole numbers (0 or more, below 2**63)")
        if ids is not None and len(ids) > 500:
            raise InvalidInput("at most 500 message_ids in one ack; ack through an id instead")
        return self.store.ack(terminal_id, actor=who, through=through, ids=ids or (), expected=expected)

    def inbox_view(self, terminal_id: str, *, limit: int = 50) -> dict[str, Any]:
        """What waits (serving order) and what was delivered but not acknowledged; changes nothing."""
        validate_terminal_id(terminal_id)
        t = self.store.get_terminal(terminal_id, include_deleted=True)
        now = self.clock()
        unacked = []
        for m in self.store.unacked(terminal_id, limit=limit):
            v = self.inbox.view(m)
            v["age_seconds"] = round(now - (m.delivered_at or now), 1)
            unacked.append(v)
        return {
            "terminal_id": terminal_id,
            "ack_cursor": t.ack_cursor,
            "waiting": [self.inbox.view(m) for m in self.store.queue(terminal_id, limit=limit)],
            "unacked": unacked,
        }

    # -- results ------------------------------------------------------------------------------------
    def report_result(
        self,
        terminal_id: str,
        *,
        by: str | None,
        status: str,
        summary: str,
        details: object = None,
    ) -> dict[str, Any]:
        """A worker's report on its current task attempt, to its own supervisor."""
        validate_terminal_id(terminal_id)
        who, _ = self.inbox.actor(by)
        if who != terminal_id:  # not even the operator: a result is the worker's own word
            raise Forbidden(
                f"{who} can't report a result for terminal {terminal_id}: a worker reports its own (by = "
                "its terminal id; its report_result tool does); tell its supervisor with send_message instead"
            )
        if status not in set(ResultStatus):
            raise InvalidInput(f"status {status!r} is not one of {', '.join(ResultStatus)}")
        summary = (summary or "").strip()
        if not summary or len(summary) > SUMMARY_CHARS:
            raise InvalidInput(f"summary must be 1-{SUMMARY_CHARS} characters: what came of the task")
        _text("summary", summary)
        clean = check_details(details)
        worker = self.store.get_terminal(terminal_id)
        if worker.state in ENDED:
            raise Conflict(f"terminal {terminal_id} is {worker.state}; a result comes from a live worker")
        if not worker.task_id:
            raise Conflict(
                f"terminal {terminal_id} has not been given a task yet (assign or handoff), so there is "
                "nothing to report on"
            )
        if not worker.supervisor_id and not _is_step(worker.task_id):  # a step's answer goes to its caller
            raise Conflict(
                f"terminal {terminal_id} has no supervisor (it wasn't started by assign or handoff), so "
                "it has nobody to report a result to; tell whoever needs it with send_message"
            )
        detail_json = json.dumps(clean, ensure_ascii=False, sort_keys=True) if clean else None
        digest = hashlib.sha256(json.dumps([status, summary, detail_json]).encode()).hexdigest()
        stored, duplicate = self.store.put_result(
            TaskResult(
                terminal_id=terminal_id,
                task_id=worker.task_id,
                supervisor_id=worker.supervisor_id,
                status=status,
                summary=summary,
                details=detail_json,
                digest=digest,
                created_at=self.clock(),
            )
        )
        if stored.message_id is None and worker.supervisor_id and not _is_step(stored.task_id):
            # (a retry after a crash between the two writes sends it now: the key makes it one)
            want = attention.resolve(now=self.clock(), sender_is_terminal=True, kind=Kind.RESULT.value)
            message, _ = self.store.add_message(
                sender_id=terminal_id,
                receiver_id=worker.supervisor_id,
                body=result_text(worker, stored),
                idempotency_key=f"result-{stored.task_id}",
                attention=want,
            )
            self.store.set_result_message(stored.id or 0, message.id or 0)
            stored.message_id = message.id
            self.wake(worker.supervisor_id)
        self.events.publish(
            "result.reported", terminal_id=terminal_id, result_id=stored.id, status=stored.status
        )
        out = result_view(stored)
        out["duplicate"] = duplicate
        out["note"] = (
            "the same report was already stored: this is its receipt"
            if duplicate
            else "returned to your supervisor's handoff"
            if _is_step(stored.task_id)
            else f"delivered to your supervisor {worker.supervisor_id} as a result message"
        )
        return out

    def reported(self, terminal_id: str, task_id: str | None) -> TaskResult | None:
        return self.store.get_result(terminal_id, task_id) if task_id else None

    def results(self, terminal_id: str) -> list[dict[str, object]]:
        validate_terminal_id(terminal_id)
        self.store.get_terminal(terminal_id, include_deleted=True)
        return [result_view(r) for r in self.store.results(terminal_id=terminal_id)]

    # -- following a worker's work ------------------------------------------------------------------
    def tasked(self, terminal_id: str) -> None:
        """A delivery (or a handoff's typing) gave it work (the store's on_tasked)."""
        with self._lock:
            self._states[terminal_id] = WorkState.TASKED.value
            self.attending.add(terminal_id)
            self._read_at.pop(terminal_id, None)
        self.attend()

    def observe(self, terminal: Terminal, status: str) -> None:
        """A status read of ``terminal`` (StatusReader.status): move its work state on."""
        tid = terminal.id
        with self._lock:
            if tid not in self.attending:
                return
            state = self._states.get(tid)
            now = self.clock()
            self._read_at[tid] = now
            if status == Status.UNKNOWN:
                self._unknown_since.setdefault(tid, now)
            else:
                self._unknown_since.pop(tid, None)
        age = self.clock() - (terminal.task_at or 0.0)
        to = next_state(state, status, task_age=age)
        if to is not None:
            self._change(terminal, state, to, _why(to, status))

    def gone(self, terminal_id: str) -> None:
        """Its pane closed (the agent exited, or it was killed): one ``exited`` event."""
        try:
            t = self.store.get_terminal(terminal_id, include_deleted=True)
        except NotFound:
            return
        if t.state in (TerminalState.DELETING, TerminalState.DELETED):
            return  # deleted on purpose (cao shutdown, a handoff's teardown): nobody to tell
        state = self._states.get(terminal_id, t.work_state)
        if state != WorkState.EXITED:
            self._change(t, state, WorkState.EXITED, t.gone_reason or "its pane closed")

    def deleted(self, terminal_id: str) -> None:
        with self._lock:
            self.attending.discard(terminal_id)
            self._states.pop(terminal_id, None)
            self._read_at.pop(terminal_id, None)
            self._unknown_since.pop(terminal_id, None)

    def _change(self, terminal: Terminal, state: str | None, to: WorkState, reason: str) -> None:
        notice = None
        # a handoff returns its answer (and its own error): no finished or exited notice for a step
        step = _is_step(terminal.task_id) and to in (WorkState.FINISHED, WorkState.EXITED)
        quiet = step or (to == WorkState.FINISHED and self._answered(terminal))
        if to in NOTICE_STATES and not quiet:
            notice = (self._notice_body(terminal, to, reason), self._notice_attention(to))
        try:
            changed = self.store.change_work(
                terminal.id, state, to, reason=reason, webhook=self.webhook is not None, notice=notice
            )
        except Exception:  # a busy store: the next status read tries again
            logger.warning("work state not recorded", extra={"terminal_id": terminal.id}, exc_info=True)
            return
        with self._lock:
            if changed is False:  # another reader won: take what the row says now
                self._states.pop(terminal.id, None)
                row = self.store.get_terminal(terminal.id, include_deleted=True)
                self._states[terminal.id] = row.work_state
                to_now = row.work_state
            else:
                self._states[terminal.id] = to.value
                to_now = to.value
            if to_now in ATTENDED:
                self.attending.add(terminal.id)
            else:
                self.attending.discard(terminal.id)
        if isinstance(changed, Notification):
            logger.info(
                "worker event noted",
                extra={"terminal_id": terminal.id, "event": changed.event, "message_id": changed.message_id},
            )
            fields = notification_view(changed)
            fields["notification_id"] = fields.pop("id")  # the bus gives every event its own id
            self.events.publish("notification", **fields)
            if changed.message_id is not None and changed.supervisor_id:
                self.wake(changed.supervisor_id)
            if self.webhook is not None:
                self.webhook.poke()

    def _answered(self, terminal: Terminal) -> bool:
        """It reported a result for this task: the result says more than a "finished" notice."""
        return self.reported(terminal.id, terminal.task_id) is not None

    @staticmethod
    def _notice_body(terminal: Terminal, to: WorkState, reason: str) -> str:
        hint = {
            WorkState.FINISHED: f"its answer: `cao output {terminal.id} --mode last`",
            WorkState.BLOCKED: f"see it: `cao output {terminal.id}`; a person answers in its tmux pane "
            f"(session {terminal.session_name})",
            WorkState.FAILED: f"see it: `cao output {terminal.id}`",
            WorkState.EXITED: "it can't take messages any more",
        }[to]
        return f"Worker {terminal.id} ({terminal.agent_profile}) {WORK_WORDS[to]}: {reason}. ({hint})"

    def _notice_attention(self, to: WorkState) -> attention.Attention:
        # blocked and failed want a person soon: normal; finished and exited: the notice's low
        priority = Priority.NORMAL if to in (WorkState.BLOCKED, WorkState.FAILED) else None
        return attention.resolve(
            now=self.clock(),
            sender_is_terminal=True,
            kind=Kind.NOTICE.value,
            priority=priority.value if priority else None,
            topic=f"worker.{to.value}",
        )

    def tick(self, now: float | None = None) -> None:
        """Housekeeping: re-read attended terminals nobody read lately (a turn's end the log
        didn't show, a task's grace over), fail those unknown for long, create wake-up slots."""
        now = self.clock() if now is None else now
        with self._lock:
            stale = [
                t
                for t in self.attending
                if now - self._read_at.get(t, 0.0)
                >= (LOOK_AFTER_BLOCKED if self._states.get(t) == WorkState.BLOCKED else LOOK_AFTER)
            ]
            unknown = [
                t
                for t, since in self._unknown_since.items()
                if t in self.attending and now - since >= self.settings.notice_unknown_after
            ]
        for tid in stale:
            self.refresh(tid)
        for tid in unknown:
            try:
                t = self.store.get_terminal(tid)
            except NotFound:
                continue
            with self._lock:
                self._unknown_since.pop(tid, None)
            minutes = self.settings.notice_unknown_after
            self._change(
                t, self._states.get(tid), WorkState.FAILED, f"its status read unknown for {minutes:g} s"
            )
        due = self.store.next_schedule_due()  # a read: no write transaction on an idle tick
        if due is not None and due <= now:
            for rid in self.store.advance_schedules(now, self._wakeup_attention()):
                self.wake(rid)

    def on_log(self, terminal_id: str) -> bool:
        """A pane log changed: should its status be re-read now (attended, not read lately)?"""
        with self._lock:
            return terminal_id in self.attending and (
                self.clock() - self._read_at.get(terminal_id, 0.0) >= REFRESH_EVERY
            )

    def notifications(self, *, limit: int = 100, terminal_id: str | None = None) -> list[dict[str, object]]:
        if not 1 <= limit <= 1000:
            raise InvalidInput("limit must be between 1 and 1000")
        if terminal_id is not None:
            validate_terminal_id(terminal_id)
        return [notification_view(n) for n in self.store.notifications(limit=limit, terminal_id=terminal_id)]

    # -- wake-ups -------------------------------------------------------------------------------------
    def _wakeup_attention(self) -> attention.Attention:
        return attention.resolve(now=self.clock(), sender_is_terminal=True, kind=Kind.WAKEUP.value)

    def schedule(
        self,
        receiver_id: str,
        *,
        message: str,
        by: str | None,
        at: str | None = None,
        in_seconds: float | None = None,
        every_seconds: float | None = None,
    ) -> dict[str, Any]:
        validate_terminal_id(receiver_id)
        who, agent = self.inbox.actor(by)
        if agent and who != receiver_id:
            raise Forbidden(f"terminal {who} can schedule wake-ups for itself only, not for {receiver_id}")
        now = self.clock()
        if (at is None) == (in_seconds is None):
            raise InvalidInput("say when: give at (ISO 8601 with a zone) or in_seconds, one of them")
        if in_seconds is not None:
            if not 0 <= in_seconds <= attention.MAX_DEFER:
                raise InvalidInput(f"in_seconds must be between 0 and {attention.MAX_DEFER:.0f}")
            first = now + in_seconds
        else:
            first = attention.instant("at", at or "")
            if first - now > attention.MAX_DEFER:
                raise InvalidInput(f"at {at!r} is more than 30 days away")
            first = max(first, now)  # a time just passed: now
        if every_seconds is not None:
            low = self.settings.schedule_min_every
            if not low <= every_seconds <= attention.MAX_DEFER:
                raise InvalidInput(
                    f"every must be between {low:g} seconds and 30 days (CAO_SCHEDULE_MIN_EVERY sets the "
                    "shortest)"
                )
        from cao.paste import is_blank

        if is_blank(message or ""):
            raise InvalidInput("message is empty; say what the wake-up should tell the agent")
        _text("message", message)
        terminal = self.store.get_terminal(receiver_id)
        if terminal.state in ENDED:
            raise Conflict(f"terminal {receiver_id} is {terminal.state}; schedule wake-ups for a live one")
        s = self.store.add_schedule(
            Schedule(
                receiver_id=receiver_id,
                created_by=who,
                body=message,
                first_at=first,
                every_seconds=every_seconds,
                next_at=first if every_seconds else None,
                state=ScheduleState.ACTIVE.value,
                created_at=now,
            ),
            self._wakeup_attention(),
            limit=self.settings.schedules_per_terminal,
        )
        self.wake(receiver_id)  # its look-again timer: the first slot's time
        return self.schedule_view(s)

    def cancel_schedule(self, schedule_id: int, *, by: str | None) -> dict[str, Any]:
        who, agent = self.inbox.actor(by)
        return self.schedule_view(self.store.cancel_schedule(schedule_id, actor=who, as_agent=agent))

    def schedules(self, receiver_id: str | None = None, *, active_only: bool = False) -> list[dict[str, Any]]:
        if receiver_id is not None:
            validate_terminal_id(receiver_id)
        return [
            self.schedule_view(s)
            for s in self.store.list_schedules(receiver_id=receiver_id, active_only=active_only)
        ]

    def schedule_view(self, s: Schedule) -> dict[str, Any]:
        msgs = self.store.schedule_messages(s)
        return {
            "id": s.id,
            "receiver_id": s.receiver_id,
            "created_by": s.created_by,
            "message": s.body,
            "first_at": iso(s.first_at),
            "every_seconds": s.every_seconds,
            "next_at": iso(s.next_at),
            "state": s.state,
            "created_at": iso(s.created_at),
            "closed_by": s.closed_by,
            "closed_at": iso(s.closed_at),
            "skipped": s.skipped,
            "slots": [
                {
                    "message_id": m.id,
                    "status": m.status,
                    "deliver_at": iso(m.not_before),
                    "delivered_at": iso(m.delivered_at),
                }
                for m in msgs
            ],
        }


def _is_step(task_id: str | None) -> bool:
    """A handoff's attempt (its answer is returned, not mailed)."""
    return bool(task_id) and not str(task_id).startswith("m")


def _why(to: WorkState, status: str) -> str:
    return {
        WorkState.FINISHED: f"its status reads {status}",
        WorkState.BLOCKED: "a prompt waits for an answer",
        WorkState.FAILED: "its turn ended with an error",
    }.get(to, status)


class Webhook:
    """Notifications to ``CAO_NOTIFY_URL``: each one POSTed as JSON, in order, retried with a
    bound (``notify_retries``, 1 s, 2 s, 4 s … apart, each POST at most ``notify_timeout``), then
    recorded as failed with the error. The queue is the store's (pending rows), so a restart goes
    on where it stopped; a notification carries its id, so a receiver can drop the one repeat a
    crash between a POST and its record may cause."""

    def __init__(self, settings: Settings, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry_at: dict[int, float] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cao-webhook", daemon=True)
        self._thread.start()
        self.poke()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.notify_timeout + 2)

    def poke(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                wait = self.step()
            except Exception:  # never let one bad notification or URL end the webhook for good
                logger.exception("webhook step failed")
                wait = 5.0
            self._wake.wait(wait)

    def step(self) -> float:
        """POST what is due; returns how long to sleep (until the next retry, or a poke)."""
        try:
            pending = self.store.webhook_pending()
        except Exception:
            logger.warning("webhook queue not read", exc_info=True)
            return 1.0
        now = time.monotonic()
        sleep = 30.0
        for n in pending:
            if self._stop.is_set():
                break
            due = self._retry_at.get(n.id or 0, 0.0)
            if due > now:
                sleep = min(sleep, due - now)
                continue
            error = self._post(n)
            final = error is not None and n.webhook_attempts + 1 > self.settings.notify_retries
            try:
                self.store.webhook_tried(n.id or 0, sent=error is None, final=final, error=error)
            except Exception:
                logger.warning("webhook attempt not recorded", exc_info=True)
                return 1.0
            if error is None or final:
                self._retry_at.pop(n.id or 0, None)
                if final:
                    logger.warning("webhook gave up", extra={"notification_id": n.id, "error": error})
            else:
                delay = float(2**n.webhook_attempts)
                self._retry_at[n.id or 0] = time.monotonic() + delay
                sleep = min(sleep, delay)
            now = time.monotonic()
        return sleep

    def _post(self, n: Notification) -> str | None:
        """One POST, bounded as a whole by ``notify_timeout`` (httpx's timeouts are per read: a
        receiver trickling its answer byte by byte would hold it for ever): a timer closes the
        client under it. Any failure is the error text, never an exception."""
        import httpx

        payload = {**notification_view(n), "source": "cao"}
        for key in ("webhook", "webhook_attempts", "webhook_error"):
            payload.pop(key, None)
        limit = self.settings.notify_timeout
        late = f"no answer within {limit:g} s (CAO_NOTIFY_TIMEOUT)"
        http = httpx.Client(timeout=limit, follow_redirects=False)
        timer = threading.Timer(limit, http.close)
        timer.daemon = True
        started = time.monotonic()
        try:
            timer.start()
            resp = http.post(str(self.settings.notify_url), json=payload)
            resp.read()
        except Exception as exc:  # httpx's errors, an InvalidURL, the client closed by the timer
            return late if time.monotonic() - started >= limit else f"{type(exc).__name__}: {exc}"[:500]
        finally:
            timer.cancel()
            http.close()
        if time.monotonic() - started > limit:
            return late
        if resp.status_code >= 300:
            return f"HTTP {resp.status_code}"
        return None
