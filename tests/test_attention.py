"""Attention (docs/attention.md; the contract's scenarios 1, 2, 3's first half, 4, 5, 7, 8, 9 and
11): priorities, busy modes, interrupts at a safe point, deadlines, coalescing notices, a queue
the receiver and the operator manage, large bodies announced. Real tmux, real SQLite, the
scripted agent in its pane; every delivery is proven by the message's own header in the agent's
record of what it received."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from cao.settings import Settings
from tests.helpers import new_terminal, read_records, received_bodies, status_of, wait_until, write_rules

# DELIVERY.md / ATTENTION.md on both tmux clients: control mode, and forced off (docs/tmux.md)
pytestmark = pytest.mark.tmux_clients

BUSY = {
    "record": True,
    "rules": [
        {"match": r"^work (?P<s>[\d.]+)$", "delay": 3.0, "reply": "worked"},
        {"match": r"^long work$", "delay": 5.0, "reply": "worked long"},
        {"match": r"^deploy$", "ask": "Allow tool deploy?", "delay": 3.0, "reply": "deployed"},
    ],
}


@pytest.fixture
def busy_core(make_core: Callable[..., Cao], settings: Settings) -> Cao:
    write_rules(settings.home, "developer", BUSY)
    return make_core(settings)


@pytest.fixture
def api(busy_core: Cao):
    with TestClient(create_app(busy_core)) as c:
        yield c


def start_turn(core: Cao, tid: str, text: str = "work 1") -> None:
    core.typist.send_input(core.store.get_terminal(tid), text)
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing", what="busy")


def records(core: Cao, tid: str) -> list[dict[str, Any]]:
    path = core.settings.home / "scripted" / "received" / f"{tid}.jsonl"
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def order_received(core: Cao, tid: str) -> list[int]:
    return [int(m["id"]) for rec in read_records(core.settings.home, tid) for m in rec["messages"] if m["id"]]


def events_of(core: Cao, tid: str, mid: int) -> list[str]:
    return [e.event for e in core.store.timeline(tid, message_id=mid)]


# -- 1. served by priority, then commit order --------------------------------------------------------
def test_a_busy_receivers_queue_is_served_urgent_first_then_by_priority_and_order(busy_core: Cao):
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid)
    low = core.send_message(tid, "low note", sender_id="s", priority="low").message.id
    n1 = core.send_message(tid, "normal one", sender_id="s", priority="normal").message.id
    urgent = core.send_message(tid, "urgent: stop", sender_id="s", priority="urgent").message.id
    n2 = core.send_message(tid, "normal two", sender_id="s", priority="normal").message.id
    wait_until(lambda: all(status_of(core, m) == "delivered" for m in (low, n1, urgent, n2)), timeout=20)
    assert order_received(core, tid) == [urgent, n1, n2, low]
    assert [m.id for m in core.store.queue(tid)] == []


# -- 2. refuse: 409 naming the status, nothing stored -----------------------------------------------
def test_refuse_to_a_busy_receiver_stores_nothing_and_names_its_status(busy_core: Cao, api: TestClient):
    tid = new_terminal(busy_core)
    start_turn(busy_core, tid)
    before = busy_core.store.counts_by_status()
    r = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "only if free", "if_busy": "refuse"})
    assert r.status_code == 409, r.text
    assert r.json()["receiver_status"] == "processing"
    assert "processing" in r.json()["detail"] and "if_busy=wait" in r.json()["detail"]
    assert busy_core.store.counts_by_status() == before
    wait_until(lambda: busy_core.status.status(busy_core.store.get_terminal(tid)) == "completed", timeout=10)
    r = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "free now?", "if_busy": "refuse"})
    assert r.status_code == 201, r.text
    mid = r.json()["message_id"]
    wait_until(lambda: status_of(busy_core, mid) == "delivered")
    assert "free now?" in received_bodies(busy_core.settings.home, tid)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"if_busy": "interrupt"}, "needs priority 'urgent'"),
        ({"if_busy": "interrupt", "priority": "high"}, "needs priority 'urgent'"),
        ({"priority": "asap"}, "priority 'asap' is unknown"),
        ({"kind": "gossip"}, "kind 'gossip' is unknown"),
        ({"if_busy": "maybe"}, "if_busy 'maybe' is unknown"),
        ({"ttl_seconds": 0}, "ttl_seconds must be"),
        ({"ttl_seconds": "soon"}, "ttl_seconds must be a number"),
        ({"ttl_seconds": 5, "expires_at": "2999-01-01T00:00:00Z"}, "not both"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "has passed already"),
        ({"expires_at": "tomorrow"}, "not a time with a zone"),
        ({"deliver_at": "2026-12-01T10:00:00"}, "not a time with a zone"),
        ({"kind": "chat", "sender_id": "0a0a0a0a"}, "kind 'chat' is a person's"),
        ({"topic": ""}, None),  # empty: not given
    ],
)
def test_attention_options_are_checked_before_anything_is_stored(
    busy_core: Cao, api: TestClient, body: dict[str, Any], words: str | None
):
    tid = new_terminal(busy_core)
    before = busy_core.store.counts_by_status()
    r = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "x", **body})
    if words is None:
        assert r.status_code == 201, r.text
        return
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]
    assert busy_core.store.counts_by_status() == before


# -- 4. urgent + interrupt: one interrupt key, the prompt back, the urgent message first -------------
def test_an_urgent_interrupt_stops_the_turn_once_and_is_pasted_first(busy_core: Cao):
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid, "long work")
    queued = core.send_message(tid, "a normal note", sender_id="s").message.id
    mid = core.send_message(
        tid, "stop: the plan changed", sender_id="s", priority="urgent", if_busy="interrupt"
    )
    urgent = mid.message.id or 0
    wait_until(lambda: status_of(core, urgent) == "delivered", timeout=10, what="urgent delivered")
    stops = [r for r in records(core, tid) if r["kind"] == "stopped"]
    assert len(stops) == 1  # one interrupt key, one stopped turn
    assert order_received(core, tid)[:1] == [urgent]
    m = core.store.get_message(urgent)
    assert m.interrupt_at is not None and m.channel == "paste"
    assert events_of(core, tid, urgent).count("interrupted") == 1
    wait_until(lambda: status_of(core, queued) == "delivered", timeout=10)
    assert order_received(core, tid).count(urgent) == 1
    # the turn it interrupted never wrote its reply
    assert "worked long" not in core.output(tid)


def test_an_urgent_interrupt_waits_while_a_permission_prompt_is_open(busy_core: Cao):
    core = busy_core
    tid = new_terminal(core)
    core.typist.send_input(core.store.get_terminal(tid), "deploy")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "waiting_user_answer")
    urgent = core.send_message(tid, "urgent news", sender_id="s", priority="urgent", if_busy="interrupt")
    mid = urgent.message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason == "receiver waiting for a user answer")
    m = core.store.get_message(mid)
    assert m.status == "pending" and m.interrupt_at is None
    assert m.waiting_reason == "receiver waiting for a user answer"
    assert not [r for r in records(core, tid) if r["kind"] == "stopped"]
    assert "Allow tool deploy?" in core.output(tid)  # the question is still open, unanswered
    assert "permission denied" not in core.output(tid)
    answered = time.time()
    core.typist.send_input(core.store.get_terminal(tid), "y")  # the person answers; the turn ends
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=15)
    assert (core.store.get_message(mid).delivered_at or 0) > answered
    assert "deployed" in core.output(tid)  # the answer reached the question, not cao's key
    assert core.store.get_message(mid).interrupt_at is None


def test_an_interrupt_never_discards_a_persons_half_typed_text(busy_core: Cao):
    """The scripted agent hides its input while it works, but keeps it through an interrupt."""
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid, "long work")
    core.tmux.send_keys_checked(core.panes.ref(core.store.get_terminal(tid)), "half typed", literal=True)
    mid = core.send_message(tid, "urgent", sender_id="s", priority="urgent", if_busy="interrupt").message.id
    wait_until(lambda: core.store.get_message(mid or 0).interrupt_at is not None, timeout=10)
    # the prompt is back holding the person's text: cao pastes nothing over it
    wait_until(lambda: "half typed" in core.output(tid, "full"), timeout=5)
    wait_until(lambda: core.store.get_message(mid or 0).waiting_reason == "input box holds text")
    m = core.store.get_message(mid or 0)
    assert m.status == "pending" and m.waiting_reason == "input box holds text"


# -- 7. deadlines --------------------------------------------------------------------------------------
def test_a_deadline_that_passes_while_the_receiver_works_expires_the_message(busy_core: Cao):
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid, "long work")
    mid = core.send_message(tid, "only useful now", sender_id="s", ttl_seconds=2).message.id or 0
    wait_until(lambda: status_of(core, mid) == "expired", timeout=8, what="expired while busy")
    assert core.store.get_message(mid).closed_reason == "its deadline passed while it waited"
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "completed", timeout=10)
    wait_until(core.engine.idle, what="no delivery run left")  # every trigger had its chance
    assert "only useful now" not in received_bodies(core.settings.home, tid)
    assert status_of(core, mid) == "expired"
    assert events_of(core, tid, mid) == ["queued", "expired"]


# -- 8. notices coalesce per sender and topic ---------------------------------------------------------
def test_five_notices_on_one_topic_deliver_only_the_newest(busy_core: Cao):
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid)
    ids = [
        core.send_message(tid, f"build {i}/5", sender_id="w1", kind="notice", topic="build").message.id or 0
        for i in range(1, 6)
    ]
    other = (
        core.send_message(tid, "tests green", sender_id="w1", kind="notice", topic="tests").message.id or 0
    )
    wait_until(
        lambda: status_of(core, ids[-1]) == "delivered" and status_of(core, other) == "delivered", timeout=15
    )
    assert [status_of(core, i) for i in ids[:-1]] == ["superseded"] * 4
    assert [core.store.get_message(i).superseded_by for i in ids[:-1]] == [ids[1], ids[2], ids[3], ids[4]]
    bodies = received_bodies(core.settings.home, tid)
    assert "build 5/5" in bodies and not any(f"build {i}/5" in bodies for i in range(1, 5))
    assert core.store.get_message(ids[-1]).priority == 3  # a notice is low by default
    assert core.store.get_message(ids[-1]).expires_at is not None  # and expires by default


# -- 9. defer, drop, and a person's chat protected from agents ----------------------------------------
def test_a_deferred_message_waits_for_its_time_even_across_a_restart(
    make_core: Callable[..., Cao], settings: Settings
):
    write_rules(settings.home, "developer", BUSY)
    core = make_core(settings)
    tid = new_terminal(core)
    mid = core.send_message(tid, "later please", sender_id="s", deliver_at=_iso_in(4)).message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason is not None or core.engine.idle())
    assert status_of(core, mid) == "pending"
    assert str(core.message_view(core.store.get_message(mid))["waiting_reason"]).startswith("deferred until")
    core.stop()
    core2 = make_core(settings)
    wait_until(core2.engine.idle, what="the restart's startup delivery ran")
    assert status_of(core2, mid) == "pending"  # still not due after the restart
    wait_until(lambda: status_of(core2, mid) == "delivered", timeout=10, what="delivered once due")
    delivered = core2.store.get_message(mid).delivered_at or 0
    assert delivered >= core2.store.get_message(mid).not_before - 0.01  # type: ignore[operator]
    assert received_bodies(settings.home, tid).count("later please") == 1


def test_operator_defers_drops_and_reprioritises_through_the_api(busy_core: Cao, api: TestClient):
    tid = new_terminal(busy_core)
    start_turn(busy_core, tid, "long work")
    a = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "drop me", "priority": "low"}).json()
    b = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "later", "sender_id": "w"}).json()
    c = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "bump me", "priority": "low"}).json()
    r = api.post(f"/messages/{a['message_id']}/drop", json={"reason": "no longer needed", "by": "ana"})
    assert r.status_code == 200 and r.json()["status"] == "dropped" and r.json()["closed_by"] == "ana"
    assert r.json()["closed_reason"] == "no longer needed"
    assert api.post(f"/messages/{a['message_id']}/drop", json={"reason": "again"}).status_code == 409
    assert api.post(f"/messages/{b['message_id']}/drop", json={}).status_code == 422  # a reason is required
    r = api.post(f"/messages/{b['message_id']}/defer", json={"seconds": 600, "reason": "after lunch"})
    assert r.status_code == 200 and r.json()["waiting_reason"].startswith("deferred until")
    r = api.post(f"/messages/{c['message_id']}/prioritize", json={"priority": "urgent"})
    assert r.status_code == 200 and r.json()["priority"] == "urgent"
    view = api.get(f"/terminals/{tid}/attention").json()
    assert view["attention"] == "working"
    assert [m["id"] for m in view["queue"]] == [c["message_id"], b["message_id"]]  # the deferred one last
    events = [(e["event"], e["message_id"]) for e in view["timeline"]]
    assert ("dropped", a["message_id"]) in events and ("deferred", b["message_id"]) in events
    assert ("prioritized", c["message_id"]) in events
    wait_until(lambda: status_of(busy_core, c["message_id"]) == "delivered", timeout=15)
    wait_until(busy_core.engine.idle, what="no delivery run left")
    bodies = received_bodies(busy_core.settings.home, tid)
    assert "drop me" not in bodies and "later" not in bodies
    assert status_of(busy_core, b["message_id"]) == "pending"


def test_an_agent_manages_its_own_queue_but_never_a_persons_chat(busy_core: Cao, api: TestClient):
    tid = new_terminal(busy_core)
    other = new_terminal(busy_core)
    start_turn(busy_core, tid, "long work")
    chat = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "from a person"}).json()
    assert chat["kind"] == "chat" and chat["priority"] == "high"
    note = api.post(f"/terminals/{tid}/inbox/messages", json={"message": "fyi", "sender_id": other}).json()
    assert note["kind"] == "message"
    for action, body in (
        ("drop", {"reason": "meh"}),
        ("defer", {"seconds": 60}),
        ("prioritize", {"priority": "low"}),
    ):
        r = api.post(f"/messages/{chat['message_id']}/{action}", json={"by": tid, **body})
        assert r.status_code == 403, r.text
        assert "person's chat" in r.json()["detail"]
        r = api.post(f"/messages/{note['message_id']}/{action}", json={"by": other, **body})
        assert r.status_code == 403 and "its own queue" in r.json()["detail"]
    r = api.post(f"/messages/{note['message_id']}/drop", json={"by": tid, "reason": "handled elsewhere"})
    assert r.status_code == 200 and r.json()["closed_by"] == tid
    assert busy_core.store.get_message(chat["message_id"]).status == "pending"


# -- 11. a large body is announced, and read whole ---------------------------------------------------
def test_a_200_kib_body_is_announced_and_read_back_byte_for_byte(busy_core: Cao, api: TestClient):
    tid = new_terminal(busy_core)
    body = "".join(f"line {i}: ünïcödé ✓ {'x' * 40}\n" for i in range(3800))[: 200 * 1024]
    assert len(body.encode()) > 200 * 1024 - 8
    mid = busy_core.send_message(tid, body, sender_id="s").message.id or 0
    wait_until(lambda: status_of(busy_core, mid) == "delivered", timeout=15)
    got = received_bodies(busy_core.settings.home, tid)[-1]
    assert len(got) < 1000 and f"read_message tool (message_id {mid})" in got and "line 0:" in got
    r = api.post(f"/messages/{mid}/read", json={"by": tid})
    assert r.status_code == 200 and r.json()["message"] == body
    assert busy_core.store.get_message(mid).read_at is not None
    assert "read" in events_of(busy_core, tid, mid)
    # an operator's look is not the receiver's read; another agent may not read it
    other = new_terminal(busy_core)
    assert api.post(f"/messages/{mid}/read", json={"by": other}).status_code == 403


def _iso_in(seconds: float) -> str:
    from cao.timefmt import iso

    return str(iso(time.time() + seconds))


def test_cao_inbox_shows_the_queue_and_timeline(busy_core: Cao, tmp_path: Path):
    """The same view in the terminal (JSON): serving order, priority, kind, deadline."""
    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid, "long work")
    lo = core.send_message(tid, "low", sender_id="s", priority="low", ttl_seconds=300).message.id
    hi = core.send_message(tid, "high", sender_id="s", priority="high").message.id
    view = core.attention(tid)
    assert view["attention"] == "working"
    queue = view["queue"]
    assert isinstance(queue, list)
    assert [m["id"] for m in queue] == [hi, lo]
    assert queue[1]["expires_at"] is not None and queue[1]["kind"] == "chat"


# -- 3 (scripted) and 6: an urgent interrupt handed to the running turn by its hook -------------------
TOOLS = {
    "hooks": True,
    "record": True,
    "rules": [{"match": r"^use tools$", "steps": [1.5, 1.5, 1.5], "delay": 0.5, "reply": "tools done"}],
}
TOKEN = "attention-test-token"


def _hooked_server(make_server: Callable[..., Any], tmp_path: Path, **env: str) -> tuple[Any, Any]:
    import httpx

    write_rules(tmp_path / "cao", "tooler", TOOLS)
    srv = make_server(CAO_API_TOKEN=TOKEN, **env)
    http = httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    return srv, http


def _entries(home: Path, tid: str, kind: str) -> list[dict[str, Any]]:
    path = home / "scripted" / "received" / f"{tid}.jsonl"
    if not path.exists():
        return []
    return [
        e for e in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if e["kind"] == kind
    ]


def _handed_ids(home: Path, tid: str) -> list[int]:
    return [int(m["id"]) for e in _entries(home, tid, "context") for m in e["messages"] if m["id"]]


def _pasted_ids(home: Path, tid: str) -> list[int]:
    return [int(m["id"]) for e in _entries(home, tid, "received") for m in e["messages"] if m["id"]]


def _busy_tooler(http: Any, tmp_path: Path) -> str:
    r = http.post(
        "/sessions",
        json={"provider": "scripted", "agent_profile": "tooler", "working_directory": str(tmp_path)},
    )
    assert r.status_code == 201, r.text
    tid = str(r.json()["id"])
    wait_until(lambda: http.get(f"/terminals/{tid}").json()["status"] == "idle", timeout=15, what="idle")
    assert http.post(f"/terminals/{tid}/input", json={"message": "use tools"}).status_code == 200
    wait_until(
        lambda: http.get(f"/terminals/{tid}").json()["status"] == "processing", timeout=10, what="busy"
    )
    return tid


def test_an_urgent_interrupt_is_handed_to_the_running_turn_at_its_next_tool_call(
    make_server: Callable[..., Any], tmp_path: Path
):
    srv, http = _hooked_server(make_server, tmp_path)
    with http:
        tid = _busy_tooler(http, tmp_path)
        assert http.get(f"/terminals/{tid}/attention").json()["attention"] == "working"
        r = http.post(
            f"/terminals/{tid}/inbox/messages",
            json={
                "message": "stop: the plan changed",
                "sender_id": "boss",
                "priority": "urgent",
                "if_busy": "interrupt",
            },
        )
        mid = r.json()["message_id"]
        wait_until(
            lambda: http.get(f"/messages/{mid}").json()["status"] == "delivered", timeout=10, what="handed"
        )
        m = http.get(f"/messages/{mid}").json()
        assert m["channel"] == "hook" and m["interrupt_at"] is None  # no key: the turn went on
        # delivered once the hook printed it; the agent records it when the hook has exited
        wait_until(lambda: _handed_ids(srv.home, tid) == [mid], timeout=5, what="the agent has it")
        # the turn goes on and ends with its own answer; the message was never pasted
        wait_until(lambda: _entries(srv.home, tid, "done"), timeout=15, what="the turn's end")
        assert "tools done" in http.get(f"/terminals/{tid}/output").json()["output"]
        assert not _entries(srv.home, tid, "stopped")
        wait_until(lambda: http.get(f"/terminals/{tid}").json()["status"] == "completed", timeout=10)
        assert mid not in _pasted_ids(srv.home, tid) and _handed_ids(srv.home, tid) == [mid]
        events = [
            e["event"]
            for e in http.get(f"/terminals/{tid}/attention").json()["timeline"]
            if e["message_id"] == mid
        ]
        assert events == ["queued", "held", "handed", "delivered"] or events == [
            "queued",
            "handed",
            "delivered",
        ]


def test_a_hand_over_claim_answers_only_its_own_terminal_and_key(
    make_server: Callable[..., Any], tmp_path: Path
):
    srv, http = _hooked_server(make_server, tmp_path)
    with http:
        tid = _busy_tooler(http, tmp_path)
        assert http.post(f"/terminals/{tid}/hooks/handed", json={"claim": "x" * 32}).status_code == 403
        from cao.hookstate import HOOK_KEY_HEADER, hook_key, load_secret

        key = {HOOK_KEY_HEADER: hook_key(load_secret(srv.home), tid)}
        r = http.post(f"/terminals/{tid}/hooks/handed", json={"claim": "x" * 32}, headers=key)
        assert r.status_code == 409 and "holds no message" in r.json()["detail"]
        assert (
            http.post(f"/terminals/{tid}/hooks/handed", json={"claim": "../x"}, headers=key).status_code
            == 422
        )


@pytest.mark.parametrize("fault", ["after_hand_claim", "before_hand_ack"])
def test_a_crash_during_a_hand_over_neither_loses_nor_doubles_the_message(
    make_server: Callable[..., Any], tmp_path: Path, fault: str
):
    """kill -9 between the hook's claim and its answer (the hook prints nothing), or between the
    printed hand-over and its confirmation (the agent has it): after the restart the message is
    delivered exactly once: found in the pane, or pasted when the turn has ended."""
    srv, http = _hooked_server(make_server, tmp_path, CAO_FAULT_POINT=fault, CAO_DELIVERY_LEASE_SECONDS="3")
    with http:
        tid = _busy_tooler(http, tmp_path)
        r = http.post(
            f"/terminals/{tid}/inbox/messages",
            json={
                "message": "urgent once",
                "sender_id": "boss",
                "priority": "urgent",
                "if_busy": "interrupt",
            },
        )
        mid = r.json()["message_id"]
        wait_until(lambda: srv.proc.poll() is not None, timeout=10, what="the server died at the fault point")
    srv.stop()  # it died at the fault point; this closes its log
    again = make_server(home=srv.home, CAO_API_TOKEN=TOKEN, CAO_DELIVERY_LEASE_SECONDS="3")
    with again.client() as http2:
        http2.headers["Authorization"] = f"Bearer {TOKEN}"
        wait_until(
            lambda: http2.get(f"/messages/{mid}").json()["status"] == "delivered",
            timeout=30,
            what="delivered",
        )
        wait_until(lambda: _entries(srv.home, tid, "done"), timeout=20, what="the turn's end")
        wait_until(lambda: http2.get(f"/terminals/{tid}").json()["status"] == "completed", timeout=10)
        handed, pasted = _handed_ids(srv.home, tid), _pasted_ids(srv.home, tid)
        assert handed.count(mid) + pasted.count(mid) == 1, (handed, pasted)
        channel = http2.get(f"/messages/{mid}").json()["channel"]
        assert channel == ("hook" if handed else "paste")
        if fault == "before_hand_ack":
            assert handed == [mid]  # the agent had it: found in the pane, not pasted again


def test_eager_delivery_hands_mail_to_a_turn_that_a_paste_would_cancel(
    make_server: Callable[..., Any], tmp_path: Path
):
    """CAO_EAGER_INBOX_DELIVERY with a CLI that can't queue a paste mid-turn (the scripted agent,
    like Codex): an ordinary message goes into the running turn through the hook, not pasted."""
    srv, http = _hooked_server(make_server, tmp_path, CAO_EAGER_INBOX_DELIVERY="true")
    with http:
        tid = _busy_tooler(http, tmp_path)
        mid = http.post(
            f"/terminals/{tid}/inbox/messages", json={"message": "fyi", "sender_id": "w1"}
        ).json()["message_id"]
        wait_until(
            lambda: http.get(f"/messages/{mid}").json()["status"] == "delivered", timeout=10, what="handed"
        )
        assert http.get(f"/messages/{mid}").json()["channel"] == "hook"
        wait_until(lambda: _handed_ids(srv.home, tid) == [mid], timeout=5, what="the agent has it")
        assert mid not in _pasted_ids(srv.home, tid)
        assert not _entries(srv.home, tid, "done")  # inside the turn, which still runs


def test_without_eager_delivery_an_ordinary_message_waits_for_the_turn_to_end(
    make_server: Callable[..., Any], tmp_path: Path
):
    srv, http = _hooked_server(make_server, tmp_path)
    with http:
        tid = _busy_tooler(http, tmp_path)
        mid = http.post(
            f"/terminals/{tid}/inbox/messages", json={"message": "fyi", "sender_id": "w1"}
        ).json()["message_id"]
        wait_until(lambda: http.get(f"/messages/{mid}").json()["status"] == "delivered", timeout=15)
        assert http.get(f"/messages/{mid}").json()["channel"] == "paste"
        assert _handed_ids(srv.home, tid) == [] and _pasted_ids(srv.home, tid) == [mid]
        done = _entries(srv.home, tid, "done")[0]["t"]
        got = next(
            e["t"] for e in _entries(srv.home, tid, "received") if e["messages"] and e["messages"][0]["id"]
        )
        assert got >= done


# -- the same from the terminal: cao send / cao inbox -------------------------------------------------
def test_cao_send_and_cao_inbox_manage_a_busy_agents_queue(busy_core: Cao):
    from click.testing import CliRunner

    from cao.cli import cli
    from cao.client import Client

    core = busy_core
    tid = new_terminal(core)
    start_turn(core, tid, "long work")
    with TestClient(create_app(core)) as http:
        client = Client("http://testserver", http=http)

        def run(*args: str) -> Any:
            return CliRunner().invoke(cli, list(args), obj={"client": client})

        refused = run("send", tid, "only if free", "--if-busy", "refuse")
        assert (
            refused.exit_code == 1
            and "processing" in refused.output
            and "nothing was stored" in refused.output
        )
        bad = run("send", tid, "x", "--if-busy", "interrupt")
        assert bad.exit_code == 1 and "needs priority 'urgent'" in bad.output
        low = json.loads(run("send", tid, "a low one", "--priority", "low", "--ttl", "600", "--json").output)
        assert low["priority"] == "low" and low["kind"] == "chat" and low["expires_at"]
        note = json.loads(run("send", tid, "fyi", "--kind", "notice", "--topic", "ci", "--json").output)
        assert note["priority"] == "low" and note["kind"] == "notice"
        later = json.loads(run("send", tid, "later", "--priority", "high", "--json").output)
        shown = json.loads(run("inbox", "show", tid, "--json").output)
        assert [m["id"] for m in shown["queue"]] == [
            later["message_id"],
            low["message_id"],
            note["message_id"],
        ]
        table = run("inbox", "show", tid)
        assert table.exit_code == 0 and "working" in table.output and "queued" in table.output
        assert run("inbox", "prioritize", str(low["message_id"]), "urgent").exit_code == 0
        assert (
            run(
                "inbox", "defer", str(later["message_id"]), "--for", "600", "--reason", "after lunch"
            ).exit_code
            == 0
        )
        dropped = run("inbox", "drop", str(note["message_id"]), "--reason", "stale", "--json")
        assert json.loads(dropped.output)["status"] == "dropped"
        again = run("inbox", "drop", str(note["message_id"]), "--reason", "stale")
        assert again.exit_code == 1 and "only a pending message" in again.output
        no_reason = run("inbox", "drop", str(low["message_id"]))
        assert no_reason.exit_code == 2  # click: --reason is required
        shown = json.loads(run("inbox", "show", tid, "--json").output)
        assert [m["id"] for m in shown["queue"]] == [low["message_id"], later["message_id"]]
        assert [m["priority"] for m in shown["queue"]] == ["urgent", "high"]
        assert shown["queue"][1]["waiting_reason"].startswith("deferred until")
        read = run("inbox", "read", str(low["message_id"]))
        assert read.exit_code == 0 and read.output == "a low one"
        assert (
            core.store.get_message(low["message_id"] or 0).read_at is None
        )  # the operator's look is no read
        listing = run("inbox", tid)  # the old form still lists, with the attention view around it
        assert listing.exit_code == 0 and "dropped" in listing.output
        assert "working" in listing.output and "timeline" in listing.output
        assert isinstance(json.loads(run("inbox", tid, "--json").output), list)  # scripts: the list
