"""The event stream: what changed, published by the code that changed it.

    store/terminal/delivery code ──publish(type, **fields)──► EventBus ──► subscribers
                                                               (ring buffer    (GET /events: SSE,
                                                                of the last     the dashboard,
                                                                N events)       cao watch, MCP waits)

An event is ``{"id": "<epoch>-<seq>", "type": "message.delivered", "t": <unix time>, ...fields}``.
Ids grow by one per event within a server's life (``epoch`` names that life), so a client that
reconnects with ``Last-Event-ID`` gets every event after the one it saw, from the ring buffer;
if that event is no longer there (too old, or another server life), it gets one ``stream.reset``
event first and should re-read the state it shows. Publishing is cheap when nobody listens (one
append to a bounded deque under a lock); each subscriber has a bounded queue, and a subscriber
too slow to keep up is dropped with a ``stream.reset`` rather than slowing the publishers.

Event types (fields besides id/type/t):

    terminal.created     terminal_id, session_name, provider, agent_profile, supervisor_id
    terminal.status      terminal_id, status, previous
    terminal.gone        terminal_id, reason, failed_messages
    terminal.deleted     terminal_id, failed_messages
    terminal.worktree    terminal_id, state, branch, path, note   (made, retired or merged)
    message.queued       message_id, sender_id, receiver_id
    message.waiting      receiver_id, reason                 (the receiver's pending mail waits)
    message.claimed      receiver_id, message_ids, claim
    message.delivered    receiver_id, message_ids, latency_ms (one per message: commit → delivered)
    message.retried      receiver_id, message_ids, error, attempts
    message.failed       receiver_id, message_ids, error
    message.cancelled    message_id, receiver_id
    board.set            session_name, key, version, writer, deleted   (a fact written; never its value)
    stream.reset         reason                              (re-read the state; events were missed)
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]


@dataclass(eq=False)
class Subscription:
    """One listener: a bounded inbox of events, woken through ``notify`` (e.g. an asyncio loop's
    ``call_soon_threadsafe``). ``overflowed`` is set when it fell too far behind."""

    notify: Callable[[], None]
    limit: int
    events: deque[Event] = field(default_factory=deque)
    overflowed: bool = False

    def take(self) -> list[Event]:
        out = []
        while self.events:
            out.append(self.events.popleft())
        return out


class EventBus:
    def __init__(
        self, *, capacity: int = 10_000, subscriber_limit: int = 2_000, clock: Callable[[], float] = time.time
    ):
        self.epoch = secrets.token_hex(3)
        self.clock = clock
        self.subscriber_limit = subscriber_limit
        self._seq = itertools.count(1)
        # (seq, the event as compact JSON): a full ring costs ~2 MB, not the ~10 MB of dicts
        self._ring: deque[tuple[int, str]] = deque(maxlen=capacity)
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()

    @property
    def listening(self) -> bool:
        return bool(self._subs)

    @property
    def listeners(self) -> int:
        return len(self._subs)

    def publish(self, type_: str, **fields: Any) -> Event:
        with self._lock:
            seq = next(self._seq)
            event = {"id": f"{self.epoch}-{seq}", "type": type_, "t": self.clock(), **fields}
            self._ring.append((seq, json.dumps(event, separators=(",", ":"), default=str)))
            subs = list(self._subs)
            for sub in subs:
                if sub.overflowed:
                    continue
                if len(sub.events) >= sub.limit:
                    sub.overflowed = True
                    sub.events.clear()
                else:
                    sub.events.append(event)
        for sub in subs:
            sub.notify()
        return event

    def subscribe(self, notify: Callable[[], None], *, last_event_id: str | None = None) -> Subscription:
        """A new listener, primed with every buffered event after ``last_event_id`` (or a
        ``stream.reset`` when that event is unknown here)."""
        sub = Subscription(notify, self.subscriber_limit)
        with self._lock:
            if last_event_id:
                backlog = self._after(last_event_id)
                if backlog is None:
                    sub.events.append(self._reset("the last event you saw is no longer buffered"))
                else:
                    sub.events.extend(backlog)
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def publish_reset_for(self, sub: Subscription) -> Event:
        """The ``stream.reset`` a subscriber gets when it fell too far behind (then it is dropped)."""
        self.unsubscribe(sub)
        with self._lock:
            return self._reset("this client fell too far behind; re-read the state and reconnect")

    def since(self, last_event_id: str | None) -> list[Event] | None:
        """Buffered events after ``last_event_id`` (all when None); None if it is unknown here."""
        with self._lock:
            return (
                [json.loads(text) for _, text in self._ring]
                if not last_event_id
                else self._after(last_event_id)
            )

    def _after(self, last_event_id: str) -> list[Event] | None:
        epoch, _, seq = last_event_id.partition("-")
        if epoch != self.epoch or not (seq.isascii() and seq.isdigit()) or len(seq) > 18:
            return None
        n = int(seq)
        if n > self._last_seq():
            return None  # an id from the future: not one this server gave out
        if self._ring and self._ring[0][0] > n + 1:
            return None  # fell out of the ring
        return [json.loads(text) for s, text in self._ring if s > n]

    def _reset(self, reason: str) -> Event:
        return {
            "id": f"{self.epoch}-{self._last_seq()}",
            "type": "stream.reset",
            "t": self.clock(),
            "reason": reason,
        }

    def _last_seq(self) -> int:
        return self._ring[-1][0] if self._ring else 0
