"""The event stream: events come from where state changes, and a reconnect misses nothing.

The bus is tested directly (ids, resume, overflow); GET /events against a real cao-server with
scripted agents (SSE over HTTP, resumed with Last-Event-ID after a disconnect).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx

from cao.events import EventBus
from tests.helpers import ServerProcess, wait_until, write_rules


def test_ids_resume_and_reset():
    bus = EventBus(capacity=5)
    first = [bus.publish("x.a", n=i) for i in range(3)]
    assert [e["n"] for e in bus.since(first[0]["id"]) or []] == [1, 2]
    assert bus.since(first[-1]["id"]) == []
    for i in range(3, 10):
        bus.publish("x.a", n=i)
    assert bus.since(first[0]["id"]) is None  # fell out of the ring: the client must re-read
    assert bus.since("othersrv-3") is None  # another server life
    assert bus.since(f"{bus.epoch}-" + "9" * 5000) is None  # absurd: a reset, not a crash
    assert bus.since(f"{bus.epoch}-999999") is None  # from the future: never given out here
    assert bus.since(f"{bus.epoch}-٣") is None  # not ASCII digits
    woke: list[int] = []
    sub = bus.subscribe(lambda: woke.append(1), last_event_id="othersrv-3")
    assert [e["type"] for e in sub.take()] == ["stream.reset"]
    bus.publish("x.b")
    assert [e["type"] for e in sub.take()] == ["x.b"] and woke


def test_a_slow_subscriber_is_dropped_with_a_reset_not_a_blocked_publisher():
    bus = EventBus()
    bus.subscriber_limit = 3
    sub = bus.subscribe(lambda: None)
    for i in range(10):
        bus.publish("x", n=i)
    assert sub.overflowed and sub.events == type(sub.events)()
    assert bus.publish_reset_for(sub)["type"] == "stream.reset"
    assert not bus.listening


def test_publishing_costs_nothing_per_event_when_nobody_listens():
    bus = EventBus(capacity=100)
    for i in range(1000):
        bus.publish("x", n=i)
    assert len(bus.since(None) or []) == 100 and not bus.listening


class SSE:
    """A minimal SSE reader over httpx (what a browser's EventSource does)."""

    def __init__(self, client: httpx.Client, last_event_id: str | None = None) -> None:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        self._cm = client.stream("GET", "/events", headers=headers, timeout=httpx.Timeout(30, read=30))
        self.response = self._cm.__enter__()
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        data: list[str] = []
        try:
            for line in self.response.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    with self._lock:
                        self.events.append(json.loads("".join(data)))
                    data = []
        except (httpx.HTTPError, RuntimeError):
            pass

    def seen(self, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if pred(e)]

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def test_events_follow_a_message_and_a_reconnect_with_last_event_id_misses_nothing(make_server):
    srv: ServerProcess = make_server()
    write_rules(
        srv.home, "slow", {"record": True, "rules": [{"match": "^work", "delay": 1.0, "reply": "done"}]}
    )
    with srv.client() as c:
        tid = c.post("/sessions", json={"agent_profile": "slow"}).json()["id"]
        stream = SSE(c)
        try:
            wait_until(
                lambda: stream.seen(
                    lambda e: (
                        e["type"] == "terminal.status"
                        and e["terminal_id"] == tid
                        and e["status"] in ("idle", "completed")
                    )
                ),
                what="idle status event",
            )
            c.post(f"/terminals/{tid}/input", json={"message": "work now"})
            mid = c.post(f"/terminals/{tid}/inbox/messages", json={"message": "token-ev"}).json()[
                "message_id"
            ]
            wait_until(
                lambda: stream.seen(lambda e: e["type"] == "message.delivered" and mid in e["message_ids"]),
                timeout=15,
                what="delivered event",
            )
            types = [
                e["type"]
                for e in stream.seen(lambda e: e.get("receiver_id") == tid or e.get("message_id") == mid)
            ]
            for kind in ("message.queued", "message.waiting", "message.claimed", "message.delivered"):
                assert kind in types, types
            assert (
                types.index("message.queued")
                < types.index("message.claimed")
                < types.index("message.delivered")
            )
            [delivered] = stream.seen(lambda e: e["type"] == "message.delivered" and mid in e["message_ids"])
            assert delivered["latency_ms"] > 500  # it waited for the 1 s turn
            busy = stream.seen(lambda e: e["type"] == "terminal.status" and e["status"] == "processing")
            assert busy  # the status change was seen live, nobody asked for it
            last_id = stream.events[-1]["id"]
        finally:
            stream.close()
        # while disconnected, more happens
        ids = [
            c.post(f"/terminals/{tid}/inbox/messages", json={"message": f"token-gap-{i}"}).json()[
                "message_id"
            ]
            for i in range(3)
        ]
        wait_until(
            lambda: all(c.get(f"/messages/{i}").json()["status"] == "delivered" for i in ids), timeout=15
        )
        again = SSE(c, last_id)
        try:
            wait_until(
                lambda: len(again.seen(lambda e: e["type"] == "message.delivered")) >= 3, what="backlog"
            )
            queued = [e["message_id"] for e in again.seen(lambda e: e["type"] == "message.queued")]
            assert queued == ids  # every missed event, in order, none before the last one seen
            numbers = [int(e["id"].split("-")[1]) for e in again.events]
            assert numbers == sorted(numbers) and numbers[0] == int(last_id.split("-")[1]) + 1
        finally:
            again.close()
        stale = SSE(c, "nosuchepoch-1")
        try:
            wait_until(lambda: stale.events, what="reset")
            assert stale.events[0]["type"] == "stream.reset"
        finally:
            stale.close()
