"""DELIVERY.md scenarios 1-19 on a real tmux server, a real SQLite file and real scripted agents.

Scenario 20 (10,000 messages) and the cross-process HTTP senders live in test_delivery_load.py.
What an agent received is read from its own record (one JSONL entry per submitted turn), so
"exactly once" is counted on the receiving side, not inferred from the database.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from cao.delivery import Outcome
from cao.paste import format_batch, neutralise
from cao.settings import Settings
from cao.store import MAX_BODY_BYTES
from tests.helpers import (
    LOCKER,
    REPO,
    SLOW,
    crash,
    done_times,
    idle,
    new_terminal,
    read_records,
    received_bodies,
    settle,
    status_of,
    wait_until,
    write_rules,
)

# DELIVERY.md / ATTENTION.md on both tmux clients: control mode, and forced off (docs/tmux.md)
pytestmark = pytest.mark.tmux_clients


# -- 1-5: crashes and idempotent retries --------------------------------------------------------
def test_1_crash_before_commit_leaves_no_row_and_retry_creates_one(make_core: Callable[..., Cao], settings):
    setup = make_core(settings, start=False)
    tid = new_terminal(setup)
    assert crash(settings, "before_commit", "send", tid, "token-s1", "key-1") == 1
    assert setup.store.list_messages() == []
    core = make_core(settings)
    receipt = core.send_message(tid, "token-s1", sender_id="crasher", idempotency_key="key-1")
    assert not receipt.duplicate
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered")
    assert received_bodies(settings.home, tid) == ["token-s1"]


def test_2_crash_after_commit_is_pasted_once_after_restart(make_core: Callable[..., Cao], settings):
    setup = make_core(settings, start=False)
    tid = new_terminal(setup)
    assert crash(settings, "after_commit", "send", tid, "token-s2") == 1
    [msg] = setup.store.list_messages()
    assert msg.status == "pending"
    core = make_core(settings)  # restart
    wait_until(lambda: status_of(core, msg.id or 0) == "delivered")
    assert received_bodies(settings.home, tid) == ["token-s2"]


def test_3_crash_after_claim_before_paste_is_pasted_once_after_restart(
    make_core: Callable[..., Cao], settings
):
    setup = make_core(settings, start=False)
    tid = new_terminal(setup)
    msg, _ = setup.store.add_message(sender_id="s", receiver_id=tid, body="token-s3")
    assert crash(settings, "after_claim", "deliver", tid) == 1
    assert setup.store.get_message(msg.id or 0).status == "delivering"
    assert received_bodies(settings.home, tid) == []
    core = make_core(settings)  # restart: not in scrollback -> pending -> pasted
    wait_until(lambda: status_of(core, msg.id or 0) == "delivered")
    settle(core, tid)  # would a second paste follow? (nothing should)
    assert received_bodies(settings.home, tid) == ["token-s3"]


def test_4_crash_after_paste_is_found_in_scrollback_and_not_repasted(make_core: Callable[..., Cao], settings):
    setup = make_core(settings, start=False)
    tid = new_terminal(setup)
    msg, _ = setup.store.add_message(sender_id="s", receiver_id=tid, body="token-s4")
    assert crash(settings, "after_paste", "deliver", tid) == 1
    assert setup.store.get_message(msg.id or 0).status == "delivering"
    wait_until(lambda: received_bodies(settings.home, tid) == ["token-s4"], what="the paste arrived")
    core = make_core(settings)
    got = core.store.get_message(msg.id or 0)
    assert got.status == "delivered"  # resolved by start() before any trigger ran
    settle(core, tid)
    assert received_bodies(settings.home, tid) == ["token-s4"]


def test_4b_crash_between_paste_and_enter_submits_on_recovery(make_core: Callable[..., Cao], settings):
    """Text pasted into the box but never submitted: recovery presses Enter instead of re-pasting."""
    setup = make_core(settings, start=False)
    tid = new_terminal(setup)
    term = setup.store.get_terminal(tid)
    msg, _ = setup.store.add_message(sender_id="s", receiver_id=tid, body="token-s4b")
    claim = setup.store.claim(tid)
    assert claim is not None and [m.id for m in claim.messages] == [msg.id]
    setup.panes.paste(term, format_batch(claim.messages), fence=claim.fence, enter=False)
    wait_until(
        lambda: (
            setup.panes.provider(term).input_text(setup.tmux.capture(term.pane_id or "")) or ""
        ).startswith("[cao message"),
        what="text in the input box",
    )
    core = make_core(settings)
    assert core.store.get_message(msg.id or 0).status == "delivered"
    wait_until(lambda: received_bodies(settings.home, tid) == ["token-s4b"], what="submitted by recovery")


def test_5_retried_send_same_key_is_one_message_also_after_restart(make_core: Callable[..., Cao], settings):
    core = make_core(settings)
    tid = new_terminal(core)
    r1 = core.send_message(tid, "token-s5", sender_id="sender1", idempotency_key="k5")
    r2 = core.send_message(tid, "token-s5", sender_id="sender1", idempotency_key="k5")
    assert (r1.duplicate, r2.duplicate) == (False, True)
    assert r2.message.id == r1.message.id
    wait_until(lambda: status_of(core, r1.message.id or 0) == "delivered")
    core.stop()
    core2 = make_core(settings)
    r3 = core2.send_message(tid, "token-s5", sender_id="sender1", idempotency_key="k5")
    assert r3.duplicate and r3.message.id == r1.message.id
    assert r3.as_dict()["status"] == "delivered"
    settle(core2, tid)
    assert received_bodies(settings.home, tid) == ["token-s5"]


def test_6_same_key_other_intent_is_409_and_stores_nothing(core: Cao):
    tid = new_terminal(core)
    other = new_terminal(core)
    with TestClient(create_app(core)) as client:
        url = f"/terminals/{tid}/inbox/messages"
        first = client.post(url, json={"sender_id": "s", "message": "a", "idempotency_key": "k6"})
        assert first.status_code == 201 and first.json()["duplicate"] is False
        again = client.post(url, json={"sender_id": "s", "message": "a", "idempotency_key": "k6"})
        assert again.status_code == 200 and again.json()["duplicate"] is True
        same = ("message_id", "sender_id", "receiver_id", "created_at")
        assert {k: again.json()[k] for k in same} == {k: first.json()[k] for k in same}
        body = client.post(url, json={"sender_id": "s", "message": "b", "idempotency_key": "k6"})
        recv = client.post(
            f"/terminals/{other}/inbox/messages",
            json={"sender_id": "s", "message": "a", "idempotency_key": "k6"},
        )
        assert body.status_code == recv.status_code == 409
        assert "different message" in body.json()["detail"]
    assert len(core.store.list_messages()) == 1


# -- 7/8 across processes: see test_delivery_load.py and test_store.py -------------------------


# -- 9: all three triggers at once ---------------------------------------------------------------
def _fire_together(core: Cao, settings: Settings, tid: str) -> list[Outcome]:
    """Four threads (immediate, watchdog, 2x sweep) and another process call deliver() at once."""
    barrier = threading.Barrier(4)
    results: list[Outcome] = []

    def fire(trigger: str) -> None:
        barrier.wait()
        results.append(core.delivery.deliver(tid, trigger=trigger).outcome)

    threads = [threading.Thread(target=fire, args=(t,)) for t in ("immediate", "watchdog", "sweep", "sweep")]
    for t in threads:
        t.start()
    other = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.crash_helper",
            str(settings.home),
            str(settings.tmux_socket),
            "none",
            "deliver",
            tid,
        ],
        cwd=REPO,
    )
    for t in threads:
        t.join()
    assert other.wait(timeout=60) == 0
    return results


def test_9_immediate_watchdog_and_sweep_together_paste_once(make_core: Callable[..., Cao], settings):
    core = make_core(settings, start=False)
    tid = new_terminal(core)
    for round_ in range(5):
        msg, _ = core.store.add_message(sender_id="s", receiver_id=tid, body=f"token-s9-{round_}")
        results = _fire_together(core, settings, tid)
        wait_until(lambda m=msg: status_of(core, m.id or 0) == "delivered", what="delivered")
        assert results.count(Outcome.DELIVERED) <= 1
        wait_until(lambda: idle(core, tid))
    settle(core, tid)
    assert received_bodies(settings.home, tid) == [f"token-s9-{i}" for i in range(5)]


# -- 10/11: the status gate and eager delivery ---------------------------------------------------
def _busy_then_send(core: Cao, tid: str, body: str) -> tuple[int, float]:
    """Start a 2 s turn, send a message during it; returns (message id, when the turn was seen busy)."""
    core.typist.send_input(core.store.get_terminal(tid), "work 2")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing", what="busy")
    seen_busy = time.time()
    receipt = core.send_message(tid, body, sender_id="s")
    return receipt.message.id or 0, seen_busy


def _turn_end(home: Path, tid: str) -> float:
    """When the agent finished the 2 s turn."""
    start = next(r["t"] for r in read_records(home, tid) if r["text"] == "work 2")
    return wait_until(
        lambda: min((t for t in done_times(home, tid) if t > start), default=None), what="turn end"
    )


def test_10_busy_receiver_gets_nothing_until_idle(make_core: Callable[..., Cao], settings):
    write_rules(settings.home, "slow", SLOW)
    core = make_core(settings)
    tid = new_terminal(core, "slow")
    msg_id, _ = _busy_then_send(core, tid, "token-s10")
    wait_until(lambda: core.store.get_message(msg_id).waiting_reason == "receiver busy", what="gate closed")
    assert core.store.get_message(msg_id).status == "pending"
    assert core.message_view(core.store.get_message(msg_id))["waiting_reason"] == "receiver busy"
    wait_until(lambda: status_of(core, msg_id) == "delivered", timeout=15)
    recs = read_records(settings.home, tid)
    assert recs[0]["text"] == "work 2"
    assert recs[1]["messages"][0]["body"] == "token-s10"
    assert recs[1]["arrived_busy"] is False  # the agent was idle when it came in


def test_10b_the_watchdog_alone_delivers_when_the_turn_ends(make_core: Callable[..., Cao], settings):
    """With the sweep's grace window out of reach and output wakes off, only the log watcher can
    notice the idle prompt (on the control client, %output would otherwise get there first)."""
    write_rules(settings.home, "slow", SLOW)
    core = make_core(settings.with_(sweep_grace=3600, output_wakes=False))
    tid = new_terminal(core, "slow")
    msg_id, _ = _busy_then_send(core, tid, "token-s10b")
    wait_until(lambda: core.engine.watchdog_running, what="watcher started for the waiting receiver")
    wait_until(lambda: status_of(core, msg_id) == "delivered", timeout=15)
    assert core.engine.stats.get("delivered_by_watchdog") == 1
    assert received_bodies(settings.home, tid) == ["work 2", "token-s10b"]
    # once nothing waits, the next sweep parks the watcher (no polling while all inboxes are empty);
    # the receiver's runner first finishes its round (on a loaded machine that takes a moment)
    wait_until(core.engine.idle, what="the receiver's runner finished")
    core.engine.sweep_step()
    assert not core.engine.watchdog_running


@pytest.mark.parametrize(
    ("provider", "eager", "expect_during_turn"),
    [("scripted_eager", True, True), ("scripted_eager", False, False), ("scripted", True, False)],
    ids=["flag-on-capable", "flag-off-capable", "flag-on-not-capable"],
)
def test_11_eager_delivery(make_core: Callable[..., Cao], settings, provider, eager, expect_during_turn):
    write_rules(settings.home, "slow", SLOW)
    core = make_core(settings.with_(eager_delivery=eager))
    tid = new_terminal(core, "slow", provider=provider)
    msg_id, _ = _busy_then_send(core, tid, "token-s11")
    wait_until(lambda: status_of(core, msg_id) == "delivered", timeout=15)
    rec = [r for r in read_records(settings.home, tid) if r["messages"][0]["body"] == "token-s11"]
    assert len(rec) == 1
    assert rec[0]["arrived_busy"] is expect_during_turn
    if expect_during_turn:
        assert rec[0]["t"] < _turn_end(settings.home, tid)
    else:
        assert rec[0]["t"] >= _turn_end(settings.home, tid)


def test_11b_never_into_a_starting_pane_even_when_eager(make_core: Callable[..., Cao], settings):
    write_rules(settings.home, "sleepy", {"record": True, "startup_delay": 1.5})
    core = make_core(settings.with_(eager_delivery=True))
    t = core.lifecycle.create(provider="scripted_eager", agent_profile="sleepy")
    receipt = core.send_message(t.id, "token-s11b", sender_id="s")
    wait_until(
        lambda: core.store.get_message(receipt.message.id or 0).waiting_reason == "receiver starting",
        what="gate closed",
    )
    assert status_of(core, receipt.message.id or 0) == "pending"
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered", timeout=15)
    assert received_bodies(settings.home, t.id) == ["token-s11b"]
    assert read_records(settings.home, t.id)[0]["arrived_busy"] is False


# -- 12: the sweep catches what the fast paths missed ---------------------------------------------
def test_12_sweep_delivers_to_an_idle_receiver_when_the_immediate_attempt_misses(make_core, settings):
    s = settings.with_(fault_point="skip_immediate", sweep_interval=0.3, sweep_grace=1.0)
    core = make_core(s)
    tid = new_terminal(core)
    time.sleep(0.3)  # the pane is quiet: the watchdog has nothing to see
    receipt = core.send_message(tid, "token-s12", sender_id="s")
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered", timeout=10)
    msg = core.store.get_message(receipt.message.id or 0)
    assert (msg.delivered_at or 0) - msg.created_at >= s.sweep_grace  # not before the grace window
    assert received_bodies(settings.home, tid) == ["token-s12"]
    assert core.engine.stats["sweeps"] >= 1


# -- 13/14/19: receivers that go away -------------------------------------------------------------
def test_13_pane_killed_behind_our_back_fails_its_mail_for_good(make_core: Callable[..., Cao], settings):
    """A vanished pane is gone for good (guarantee 9): the attempt that finds it fails the mail with
    receiver_gone at once instead of retrying a pane that can never come back."""
    core = make_core(settings)
    tid = new_terminal(core, session="keep")
    new_terminal(core, session=None)  # another session keeps the tmux server up (see scenario 19)
    term = core.store.get_terminal(tid)
    core.tmux.kill_pane(term.pane_id or "", term.pane_pid)  # someone else's kill: no cao involved
    receipt = core.send_message(tid, "token-s13", sender_id="s")
    mid = receipt.message.id or 0
    wait_until(lambda: status_of(core, mid) == "failed", timeout=10)
    final = core.store.get_message(mid)
    assert (final.last_error or "").startswith("receiver_gone") and "gone" in (final.last_error or "")
    assert core.status.view(core.store.get_terminal(tid)).status == "gone"
    assert core.store.get_terminal(tid).state == "gone"
    r = TestClient(create_app(core)).post(f"/terminals/{tid}/inbox/messages", json={"message": "late"})
    assert r.status_code == 404 and "is gone" in r.json()["detail"]


def test_13b_attempts_that_fail_on_a_live_pane_retry_then_fail(make_core: Callable[..., Cao], settings):
    """A receiver that never takes the submit (it drops every Enter): each attempt counts, the text is
    never pasted twice, and past the retry limit the message fails with the reason."""
    write_rules(settings.home, "deaf", {"record": True, "swallow_enters": 1000})
    core = make_core(settings.with_(max_attempts=3, retry_delay=0.1))
    tid = new_terminal(core, "deaf")
    receipt = core.send_message(tid, "token-s13b", sender_id="s")
    mid = receipt.message.id or 0
    wait_until(lambda: core.store.get_message(mid).attempts >= 1, what="first failed attempt")
    first = core.store.get_message(mid)
    assert first.status in ("pending", "delivering") and "not confirmed" in (first.last_error or "")
    wait_until(lambda: status_of(core, mid) == "failed", timeout=20)
    final = core.store.get_message(mid)
    assert final.attempts == 3 and "not confirmed" in (final.last_error or "")
    term = core.store.get_terminal(tid)
    box = core.panes.provider(term).input_text(core.panes.screen(term)) or ""
    assert box.startswith("[cao message #") and box.count("[cao message") == 1  # pasted once, never again
    assert received_bodies(settings.home, tid) == []


def test_14_deleted_receiver_fails_pending_and_rejects_new_sends(make_core: Callable[..., Cao], settings):
    write_rules(settings.home, "slow", SLOW)
    core = make_core(settings)
    tid = new_terminal(core, "slow")
    msg_id, _ = _busy_then_send(core, tid, "token-s14")
    with TestClient(create_app(core)) as client:
        assert client.delete(f"/terminals/{tid}").json() == {"success": True, "failed_messages": 1}
        msg = client.get(f"/messages/{msg_id}").json()
        assert (msg["status"], msg["last_error"]) == ("failed", "receiver_gone")
        r = client.post(f"/terminals/{tid}/inbox/messages", json={"message": "late"})
        assert r.status_code == 404 and "deleted" in r.json()["detail"]


def test_19_tmux_server_gone_fails_mail_and_never_touches_the_new_servers_panes(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings)
    tid = new_terminal(core)
    old = core.store.get_terminal(tid)
    core.tmux.kill_server()
    with TestClient(create_app(core)) as client:
        r = client.post(f"/terminals/{tid}/inbox/messages", json={"message": "token-s19"})
        assert r.status_code == 201  # not known gone yet: committed, then found gone
        mid = r.json()["message_id"]
        wait_until(lambda: client.get(f"/messages/{mid}").json()["status"] == "failed")
        assert client.get(f"/messages/{mid}").json()["last_error"].startswith("receiver_gone")
        assert client.get(f"/terminals/{tid}").json()["status"] == "gone"
        assert client.get("/health").status_code == 200
        # a new terminal starts a new tmux server, which hands out the old pane id again
        new = client.post("/sessions", json={"session_name": "again"}).json()["id"]
        wait_until(lambda: client.get(f"/terminals/{new}").json()["status"] == "idle")
        new_term = core.store.get_terminal(new)
        assert new_term.pane_id == old.pane_id and new_term.tmux_server_pid != old.tmux_server_pid
        # the old terminal never comes back to life on the new pane, and gets no mail
        assert client.get(f"/terminals/{tid}").json()["status"] == "gone"
        late = client.post(f"/terminals/{tid}/inbox/messages", json={"message": "late"})
        assert late.status_code == 404
        r2 = client.post(f"/terminals/{new}/inbox/messages", json={"message": "token-s19-new"}).json()
        wait_until(lambda: client.get(f"/messages/{r2['message_id']}").json()["status"] == "delivered")
        # deleting the old terminal does not touch the new agent's pane (same pane id)
        assert client.delete(f"/terminals/{tid}").status_code == 200
        assert core.tmux.identity(new_term.pane_id or "")[1] == new_term.pane_pid
        assert client.get(f"/terminals/{new}").json()["status"] == "completed"  # alive, answered
    assert received_bodies(settings.home, new) == ["token-s19-new"]


# -- 15-17: what the body may contain ------------------------------------------------------------
def test_15_body_size_limit(make_core: Callable[..., Cao], settings: Settings):
    """The largest body the store takes is pasted whole when the inline limit allows it (by
    default it is announced: tests/test_attention.py)."""
    core = make_core(settings.with_(inline_limit=MAX_BODY_BYTES))
    tid = new_terminal(core)
    exact = ("0123456789abcdef" * (MAX_BODY_BYTES // 16))[: MAX_BODY_BYTES - 10] + "token-s15!"
    assert len(exact.encode()) == MAX_BODY_BYTES
    with TestClient(create_app(core)) as client:
        over = client.post(f"/terminals/{tid}/inbox/messages", json={"message": exact + "x"})
        assert over.status_code == 413 and "nothing was stored" in over.json()["detail"]
        ok = client.post(f"/terminals/{tid}/inbox/messages", json={"message": exact})
        assert ok.status_code == 201
        wait_until(
            lambda: client.get(f"/messages/{ok.json()['message_id']}").json()["status"] == "delivered",
            timeout=20,
        )
    assert received_bodies(core.settings.home, tid) == [exact]
    assert len(core.store.list_messages()) == 1


HOSTILE = (
    "start ünïcødé 日本語 🚀\n"
    "\x1b[201~\r/exit\r"  # try to end the paste and type a command
    "\x1b[200~nested\x1b[31mred\x1b[0m\x00nul\x07bell\r\nwindows line\x9b31mC1\x7fdel\n"
    "token-s16 end"
)


def test_16_hostile_body_arrives_as_one_message_and_types_nothing(core: Cao):
    tid = new_terminal(core)
    receipt = core.send_message(tid, HOSTILE, sender_id="s")
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered")
    settle(core, tid)
    recs = read_records(core.settings.home, tid)
    assert len(recs) == 1, recs  # one submit, nothing typed as keys
    [msg] = recs[0]["messages"]
    assert msg["body"] == neutralise(HOSTILE)
    assert "start ünïcødé 日本語 🚀" in msg["body"] and msg["body"].endswith("token-s16 end")
    assert "\x1b" not in msg["body"] and "\x00" not in msg["body"]
    assert idle(core, tid)  # "/exit" was not executed: the agent is still there


def test_17_multiline_body_is_one_submitted_message(core: Cao):
    tid = new_terminal(core)
    body = "line 1\nline 2\n\n  indented line 4\ntoken-s17"
    receipt = core.send_message(tid, body, sender_id="s")
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered")
    recs = read_records(core.settings.home, tid)
    assert len(recs) == 1 and recs[0]["messages"][0]["body"] == body


def test_batch_of_pending_messages_is_one_paste_in_order_and_attributed(
    make_core: Callable[..., Cao], settings
):
    write_rules(settings.home, "slow", SLOW)
    core = make_core(settings)
    tid = new_terminal(core, "slow")
    core.typist.send_input(core.store.get_terminal(tid), "work 2")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    ids = [core.send_message(tid, f"token-b{i}", sender_id=f"sender{i}").message.id for i in range(4)]
    wait_until(lambda: all(status_of(core, i or 0) == "delivered" for i in ids), timeout=15)
    recs = read_records(settings.home, tid)
    assert len(recs) == 2  # the turn, then one paste carrying all four
    assert [(m["id"], m["sender"], m["body"]) for m in recs[1]["messages"]] == [
        (ids[i], f"sender{i}", f"token-b{i}") for i in range(4)
    ]


# -- 18: SQLite locked ---------------------------------------------------------------------------


def test_18_locked_database_is_503_nothing_written_and_retry_succeeds(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings.with_(busy_timeout=0.3))
    tid = new_terminal(core)
    with TestClient(create_app(core)) as client:
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(settings.db_location), "2"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
            body = {"sender_id": "s", "message": "token-s18", "idempotency_key": "k18"}
            r = client.post(f"/terminals/{tid}/inbox/messages", json=body)
            assert r.status_code == 503
            assert "nothing was written" in r.json()["detail"] and r.headers["retry-after"] == "1"
        finally:
            locker.communicate(timeout=10)
        r2 = client.post(f"/terminals/{tid}/inbox/messages", json=body)
        assert r2.status_code == 201 and r2.json()["duplicate"] is False
        wait_until(lambda: client.get(f"/messages/{r2.json()['message_id']}").json()["status"] == "delivered")
    assert received_bodies(settings.home, tid) == ["token-s18"]


def test_self_send_and_bad_ids_are_rejected(core: Cao):
    tid = new_terminal(core)
    with TestClient(create_app(core)) as client:
        r = client.post(f"/terminals/{tid}/inbox/messages", json={"sender_id": tid, "message": "me"})
        assert r.status_code == 422 and "itself" in r.json()["detail"]
        r = client.post("/terminals/NOT-HEX/inbox/messages", json={"message": "x"})
        assert r.status_code == 422 and "8 hex digits" in r.json()["detail"]
        r = client.post(f"/terminals/{tid}/inbox/messages", json={"sender_id": "bad id!", "message": "x"})
        assert r.status_code == 422 and "sender_id" in r.json()["detail"]
        # the reference query form still works
        r = client.post(
            f"/terminals/{tid}/inbox/messages", params={"sender_id": "cli", "message": "query form"}
        )
        assert r.status_code == 201
        # the receiver is idle, so the query-form message is delivered, not cancellable any more
        wait_until(lambda: client.get(f"/messages/{r.json()['message_id']}").json()["status"] == "delivered")
        late = client.post(f"/messages/{r.json()['message_id']}/cancel")
        assert late.status_code == 409 and "only a pending message" in late.json()["detail"]
    assert len(core.store.list_messages()) == 1


def test_gate_holds_input_until_the_agents_mcp_tools_are_up():
    from cao.delivery import gate
    from providers import get

    claude = get("claude_code")
    assert claude.waits_for_mcp and not get("scripted").waits_for_mcp
    assert gate("idle", claude, eager=False, ready=True, mcp_ready=False) == (
        "receiver's MCP tools not connected yet"
    )
    assert gate("idle", claude, eager=False, ready=True, mcp_ready=True) is None
    assert gate("processing", claude, eager=True, ready=True, mcp_ready=True) is None


def test_mcp_ready_report_is_recorded_and_shown(core: Cao):
    tid = new_terminal(core)
    with TestClient(create_app(core)) as client:
        assert client.get(f"/terminals/{tid}").json()["mcp_ready"] is None  # scripted: not waited for
        assert client.post(f"/terminals/{tid}/mcp-ready").json() == {"success": True}
        assert client.post("/terminals/abcdef12/mcp-ready").status_code == 404
    assert core.store.get_terminal(tid).mcp_ready_at is not None
