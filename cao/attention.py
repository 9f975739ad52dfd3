"""Attention: what a message asks of its receiver (docs/attention.md, ../ATTENTION.md's contract).

The kind registry (one rule per kind: default priority, whether it needs a turn of its own, its
default deadline, whether the receiving agent may drop or defer it), and the checks a send's
attention options get before anything is stored. Pure: no I/O.

    priority   urgent > high > normal > low; a receiver's queue is served by priority, then
               commit order (a recheck batch, which may already have arrived, always first)
    if_busy    wait (default) | refuse (409 at send time when not ready, nothing stored) |
               interrupt (urgent only: into the running turn at its next safe point)
    deadline   ttl_seconds or expires_at: still pending when it passes → expired, never pasted
    topic      notices from one sender on one topic coalesce: a newer one supersedes the older
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from cao.errors import InvalidInput
from cao.states import PRIORITY_RANK, IfBusy, Kind, Priority

MAX_TTL = 30 * 24 * 3600.0  # a deadline further out than this is a mistake (a month)
MAX_DEFER = 30 * 24 * 3600.0
TOPIC_CHARS = 200
REASON_CHARS = 1000
TIMELINE_KEEP_SECONDS = 7 * 24 * 3600.0  # timeline events older than a week are pruned by the sweep


@dataclass(frozen=True)
class KindRule:
    kind: Kind
    priority: Priority  # when the sender names none
    needs_turn: bool  # False: informational, it needs no turn of its own
    ttl: float | None  # default deadline in seconds (None: never expires unless the sender says)
    agent_may_manage: bool  # may the receiving agent drop or defer it (a person's chat: no)
    who: str  # one line for docs and --help


REGISTRY: dict[Kind, KindRule] = {
    r.kind: r
    for r in (
        KindRule(Kind.CHAT, Priority.HIGH, True, None, False, "a person: `cao send`, the dashboard"),
        KindRule(Kind.MESSAGE, Priority.NORMAL, True, None, True, "agent to agent (send_message)"),
        KindRule(Kind.TASK, Priority.NORMAL, True, None, True, "assign, handoff, a new agent's first task"),
        KindRule(Kind.RESULT, Priority.HIGH, True, None, True, "a worker's report to its supervisor"),
        KindRule(Kind.NOTICE, Priority.LOW, False, 3600.0, True, "informational; coalesces per topic"),
        KindRule(Kind.WAKEUP, Priority.NORMAL, True, None, True, "a scheduled wake-up"),
    )
}
assert set(REGISTRY) == set(Kind), "every kind has a rule"


def rank(priority: str) -> int:
    return PRIORITY_RANK[priority]


def priority_name(rank_: int) -> str:
    return list(Priority)[rank_].value


def check_priority(value: str) -> Priority:
    try:
        return Priority(value)
    except ValueError:
        raise InvalidInput(
            f"priority {value!r} is unknown; use one of {', '.join(Priority)} (default: the kind's)"
        ) from None


def check_kind(value: str) -> Kind:
    try:
        return Kind(value)
    except ValueError:
        raise InvalidInput(f"kind {value!r} is unknown; use one of {', '.join(Kind)}") from None


def check_if_busy(value: str) -> IfBusy:
    try:
        return IfBusy(value)
    except ValueError:
        raise InvalidInput(f"if_busy {value!r} is unknown; use one of {', '.join(IfBusy)}") from None


@dataclass(frozen=True)
class Attention:
    """A send's attention options, checked and resolved (defaults from the kind's rule)."""

    kind: Kind
    priority: Priority
    if_busy: IfBusy
    expires_at: float | None
    not_before: float | None
    topic: str | None

    @property
    def rank(self) -> int:
        return PRIORITY_RANK[self.priority]


def resolve(
    *,
    now: float,
    sender_is_terminal: bool,
    kind: str | None = None,
    priority: str | None = None,
    if_busy: str | None = None,
    ttl_seconds: float | None = None,
    expires_at: str | None = None,
    deliver_at: str | None = None,
    topic: str | None = None,
) -> Attention:
    """Check a send's options and fill in the defaults. ``sender_is_terminal``: an agent sends
    (its default kind is ``message``; ``chat`` is a person's and an agent may not claim it);
    otherwise a person or a script (default ``chat``)."""
    k = check_kind(kind) if kind else (Kind.MESSAGE if sender_is_terminal else Kind.CHAT)
    if k == Kind.CHAT and sender_is_terminal:
        raise InvalidInput(
            "kind 'chat' is a person's message; an agent sends kind 'message' (the default) or another kind"
        )
    rule = REGISTRY[k]
    p = check_priority(priority) if priority else rule.priority
    busy = check_if_busy(if_busy) if if_busy else IfBusy.WAIT
    if busy == IfBusy.INTERRUPT and p != Priority.URGENT:
        raise InvalidInput(
            f"if_busy 'interrupt' needs priority 'urgent' (got {p.value!r}); send it urgent, or use "
            "if_busy 'wait' to have it delivered when the turn ends"
        )
    if ttl_seconds is not None and expires_at:
        raise InvalidInput("give ttl_seconds or expires_at, not both")
    deadline: float | None = None
    if ttl_seconds is not None:
        if not math.isfinite(ttl_seconds) or not 0 < ttl_seconds <= MAX_TTL:
            raise InvalidInput(f"ttl_seconds must be a number of seconds above 0 and at most {MAX_TTL:.0f}")
        deadline = now + ttl_seconds
    elif expires_at:
        deadline = instant("expires_at", expires_at)
        if deadline <= now:
            raise InvalidInput(f"expires_at {expires_at!r} has passed already; nothing was stored")
        if deadline - now > MAX_TTL:
            raise InvalidInput(f"expires_at {expires_at!r} is more than 30 days away")
    elif rule.ttl is not None:
        deadline = now + rule.ttl
    start: float | None = None
    if deliver_at:
        start = instant("deliver_at", deliver_at)
        if start - now > MAX_DEFER:
            raise InvalidInput(f"deliver_at {deliver_at!r} is more than 30 days away")
        if deadline is not None and start >= deadline:
            raise InvalidInput(
                "deliver_at is at or after the message's deadline: it could never be delivered"
            )
        if start <= now:
            start = None
    if topic is not None:
        topic = topic.strip()
        if not topic or len(topic) > TOPIC_CHARS:
            raise InvalidInput(f"topic must be 1-{TOPIC_CHARS} characters")
    return Attention(k, p, busy, deadline, start, topic or None)


def check_reason(reason: str | None, what: str) -> str:
    text = (reason or "").strip()
    if not text:
        raise InvalidInput(f"say why you {what} it: reason is required")
    if len(text) > REASON_CHARS:
        raise InvalidInput(f"reason is {len(text)} characters; keep it under {REASON_CHARS}")
    return text


def instant(name: str, text: str) -> float:
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise InvalidInput(
            f"{name} {text!r} is not a time with a zone; use ISO 8601, e.g. 2026-12-01T18:00:00Z"
        )
    return when.timestamp()
