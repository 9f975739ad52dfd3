"""A receiver's queue as people and agents manage it (docs/attention.md): the message view, defer,
drop, re-prioritise, read, and one agent's attention state with its queue and timeline.

Who acts: a terminal id that names a terminal is the receiving agent (its own queue only, never
a person's ``chat``: 403); any other name is the operator (``cao inbox``, the dashboard).
"""

from __future__ import annotations

from collections.abc import Callable

from cao import attention
from cao.errors import Forbidden, InvalidInput, NotFound
from cao.names import TERMINAL_ID_RE, validate_terminal_id
from cao.states import ATTENTION_OF, AttentionState, Event, MessageStatus
from cao.store import Message, MessageEvent, Store
from cao.timefmt import iso

OPERATOR = "operator"


def event_view(e: MessageEvent) -> dict[str, object]:
    return {
        "id": e.id,
        "at": iso(e.at),
        "event": e.event,
        "message_id": e.message_id,
        "receiver_id": e.receiver_id,
        "reason": e.reason,
        "actor": e.actor,
    }


class Inbox:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        # why a receiver's mail can't move at all: its host is down (cao/hosts.py), else None
        self.host_down: Callable[[str], str | None] = lambda _rid: None

    # -- views ------------------------------------------------------------------------------------
    def view(self, m: Message) -> dict[str, object]:
        """One message as the API shows it (the reference's keys first, then ours)."""
        now = self.clock()
        waiting = None
        if m.status == MessageStatus.PENDING:
            deferred = m.not_before is not None and m.not_before > now
            waiting = f"deferred until {iso(m.not_before)}" if deferred else m.waiting_reason
            if not deferred and (down := self.host_down(m.receiver_id)) is not None:
                waiting = down
            if m.expires_at is not None and m.expires_at <= now and m.recheck is None:
                waiting = "its deadline passed: expiring (never pasted now)"  # until the next tick
        return {
            "id": m.id,
            "message_id": m.id,
            "sender_id": m.sender_id,
            "receiver_id": m.receiver_id,
            "status": m.status,
            "message": m.body,
            "idempotency_key": m.idempotency_key,
            "created_at": iso(m.created_at),
            "claimed_at": iso(m.claimed_at),
            "delivered_at": iso(m.delivered_at),
            "attempts": m.attempts,
            "last_error": m.last_error,
            "failure": m.failure,
            "waiting_reason": waiting,
            "priority": attention.priority_name(m.priority),
            "kind": m.kind,
            "if_busy": m.if_busy,
            "expires_at": iso(m.expires_at),
            "deliver_at": iso(m.not_before),
            "topic": m.topic,
            "superseded_by": m.superseded_by,
            "closed_by": m.closed_by,
            "closed_reason": m.closed_reason,
            "read_at": iso(m.read_at),
            "acked_at": iso(m.acked_at),
            "channel": m.channel,
            "interrupt_at": iso(m.interrupt_at),
            "size": len(m.body.encode("utf-8", "surrogatepass")),
        }

    def attention(self, terminal_id: str, status: str, *, limit: int = 200) -> dict[str, object]:
        """What an agent is attending to: its state (idle, working since when and on which message,
        waiting for an answer, unknown), its queue in serving order, its timeline."""
        validate_terminal_id(terminal_id)
        terminal = self.store.get_terminal(terminal_id, include_deleted=True)
        queue = self.store.queue(terminal_id)
        last = self.store.last_delivered(terminal_id)
        state = ATTENTION_OF.get(status, AttentionState.UNKNOWN)
        working_on = None
        if state == AttentionState.WORKING and last is not None:
            working_on = {"message_id": last.id, "since": iso(last.delivered_at), "sender_id": last.sender_id}
        return {
            "terminal_id": terminal_id,
            "name": terminal.name,
            "status": status,
            "attention": state.value,
            "working_on": working_on,
            "queue": [self.view(m) for m in queue],
            "timeline": [event_view(e) for e in self.store.timeline(terminal_id, limit=limit)],
        }

    # -- managing a queue ------------------------------------------------------------------------
    def actor(self, by: str | None) -> tuple[str, bool]:
        """(who, is it the receiving agent): a terminal id that names a terminal is an agent."""
        who = (by or "").strip() or OPERATOR
        if len(who) > 64 or not all(c.isalnum() or c in "-_." for c in who):
            raise InvalidInput(
                f"by {who!r} is not a name; use a terminal id or your name (letters, digits, -_.)"
            )
        if TERMINAL_ID_RE.fullmatch(who.lower()) and who != who.lower():
            raise InvalidInput(
                f"by {who!r} looks like a terminal id; terminal ids are lowercase: {who.lower()}"
            )
        if TERMINAL_ID_RE.fullmatch(who):
            try:
                self.store.get_terminal(who, include_deleted=True)
            except NotFound:
                raise InvalidInput(f"by {who!r} looks like a terminal id but names no terminal") from None
            return who, True
        return who, False

    def defer(
        self,
        message_id: int,
        *,
        by: str | None,
        reason: str | None,
        until: str | None = None,
        seconds: float | None = None,
    ) -> Message:
        who, agent = self.actor(by)
        now = self.clock()
        if (until is None) == (seconds is None):
            raise InvalidInput("say until when: give until (ISO 8601) or seconds, one of them")
        if seconds is not None:
            if not 0 < seconds <= attention.MAX_DEFER:
                raise InvalidInput(f"seconds must be above 0 and at most {attention.MAX_DEFER:.0f}")
            when = now + seconds
        else:
            when = attention.instant("until", until or "")
            if when <= now:
                raise InvalidInput(f"until {until!r} has passed already; give a time in the future")
            if when - now > attention.MAX_DEFER:
                raise InvalidInput(f"until {until!r} is more than 30 days away")
        why = (reason or "").strip() or "no reason given"
        return self.store.manage(
            message_id, Event.DEFERRED, actor=who, as_agent=agent, reason=why, until=when
        )

    def cancel(self, message_id: int, *, by: str | None) -> Message:
        """Never delivered. An agent naming itself: its own queue only, never a person's chat."""
        who, agent = self.actor(by)
        return self.store.manage(
            message_id, Event.CANCELLED, actor=who, as_agent=agent, reason=f"cancelled by {who}"
        )

    def drop(self, message_id: int, *, by: str | None, reason: str | None) -> Message:
        who, agent = self.actor(by)
        why = attention.check_reason(reason, "drop")
        return self.store.manage(message_id, Event.DROPPED, actor=who, as_agent=agent, reason=why)

    def prioritize(self, message_id: int, *, priority: str, by: str | None, reason: str | None) -> Message:
        who, agent = self.actor(by)
        p = attention.check_priority(priority)
        why = (reason or "").strip() or "no reason given"
        return self.store.manage(
            message_id, Event.PRIORITIZED, actor=who, as_agent=agent, reason=why, priority=attention.rank(p)
        )

    def read(self, message_id: int, *, by: str | None) -> Message:
        """The whole body. Read by its receiver: recorded (``read_at``, the timeline); by anyone else
        (the operator looking): just shown. Never acknowledges anything."""
        who, agent = self.actor(by)
        m = self.store.get_message(message_id)
        if agent and who != m.receiver_id:
            raise Forbidden(
                f"message {message_id} is for terminal {m.receiver_id}, not {who}; an agent reads its "
                "own mail"
            )
        if agent:
            return self.store.mark_read(message_id, who)
        return m
