"""The delivery logic on the in-memory pane backend (cao/testing/panes.py): the fast tier.

The same ``Cao`` as everywhere (a real SQLite file, the real delivery function, the real scripted
agent's program logic drawing the screens the scripted provider reads), with panes in memory and
a fake clock, so gating, batching, retries, fences and recovery are checked in milliseconds. The
integration tier proves the same against real tmux and real agent processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cao.core import Cao
from cao.delivery import Outcome
from cao.errors import FenceLost
from cao.settings import Settings
from cao.states import Blocked, WaitReason
from cao.testing.clock import FakeClock
from cao.testing.panes import MemoryPanes
from tests.helpers import read_records, write_rules

pytestmark = pytest.mark.fast


class World:
    """A Cao on memory panes and a fake clock; its engine never starts (tests call the step)."""

    def __init__(self, tmp_path: Path, **knobs: Any) -> None:
        self.clock = FakeClock()
        self.io = MemoryPanes(self.clock)
        self.settings = Settings(
            home=tmp_path / "cao",
            server_url="http://127.0.0.1:9",
            scripted_record=True,
            recovery_settle=0.1,
            **knobs,
        )
        self.core = Cao(self.settings, environ={"PATH": "/usr/bin:/bin"}, clock=self.clock, pane_io=self.io)

    def agent(self, profile: str = "developer", provider: str = "scripted", **rules: Any) -> str:
        if rules:
            write_rules(self.settings.home, profile, {"record": True, **rules})
        t = self.core.lifecycle.create(provider=provider, agent_profile=profile)
        assert self.status(t.id) == "idle"
        return t.id

    def pane(self, tid: str) -> str:
        return self.core.store.get_terminal(tid).pane_id or ""

    def status(self, tid: str) -> str:
        return self.core.status.status(self.core.store.get_terminal(tid, include_deleted=True))

    def send(self, tid: str, body: str, sender: str = "s") -> int:
        return self.core.send_message(tid, body, sender_id=sender).message.id or 0

    def deliver(self, tid: str) -> Outcome:
        return self.core.delivery.deliver(tid, trigger="sweep").outcome

    def message(self, mid: int) -> Any:
        return self.core.store.get_message(mid)

    def received(self, tid: str) -> list[list[str]]:
        """Each submitted turn's message bodies, as the agent recorded them."""
        return [[m["body"] for m in r["messages"]] for r in read_records(self.settings.home, tid)]

    def type_task(self, tid: str, text: str) -> None:
        self.core.typist.send_input(self.core.store.get_terminal(tid), text)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


def test_an_idle_receiver_gets_its_message_once(world: World):
    tid = world.agent()
    mid = world.send(tid, "hello there")
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.message(mid).status == "delivered" and world.message(mid).attempts == 1
    assert world.deliver(tid) == Outcome.NOTHING  # nothing pending: no second paste
    assert world.received(tid) == [["hello there"]]


def test_a_busy_receiver_waits_and_gets_everything_in_one_paste_in_order_after_its_turn(world: World):
    tid = world.agent("slow", rules=[{"match": "^work", "delay": 5.0, "reply": "worked"}])
    world.type_task(tid, "work hard")
    assert world.status(tid) == "processing"
    ids = [world.send(tid, f"note {n}") for n in range(3)]
    assert world.deliver(tid) == Outcome.WAITING
    assert world.message(ids[0]).waiting_reason == WaitReason.BUSY
    world.clock.advance(6)
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.received(tid)[-1] == ["note 0", "note 1", "note 2"]  # one turn, commit order
    assert all(world.message(i).status == "delivered" for i in ids)


def test_a_persons_text_in_the_box_holds_the_mail_until_it_is_cleared(world: World):
    tid = world.agent()
    world.io.type(world.pane(tid), "rm -rf build && ")
    mid = world.send(tid, "the message")
    assert world.deliver(tid) == Outcome.WAITING
    assert world.message(mid).waiting_reason == WaitReason.BOX_TEXT and world.message(mid).attempts == 0
    world.io.type(world.pane(tid), "\x03")  # the person clears it
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.received(tid) == [["the message"]]


@pytest.mark.parametrize("mode", ["copy-mode", "view-mode", "tree-mode"])
def test_a_pane_in_a_tmux_mode_gets_nothing_and_is_looked_at_again(world: World, mode: str):
    tid = world.agent()
    world.io.enter_mode(world.pane(tid), mode)
    mid = world.send(tid, "line one\n/exit\nline three")
    result = world.core.delivery.deliver(tid, trigger="sweep")
    assert result.outcome == Outcome.WAITING and result.look_again_in  # leaving a mode writes no log
    assert world.message(mid).waiting_reason in set(Blocked) and world.message(mid).attempts == 0
    assert world.io.pane(world.pane(tid)).received == []  # not one byte reached the agent
    world.io.leave_mode(world.pane(tid))
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.received(tid) == [["line one\n/exit\nline three"]] and world.status(tid) != "gone"


def test_a_swallowed_enter_is_pressed_once_more_and_counted_once(tmp_path: Path):
    w = World(tmp_path)
    tid = w.agent("laggy", swallow_enters=1)
    mid = w.send(tid, "typed while painting")
    assert w.deliver(tid) == Outcome.DELIVERED
    assert w.received(tid) == [["typed while painting"]] and w.message(mid).attempts == 1
    w.core.stop()


def test_an_unconfirmed_paste_is_retried_by_looking_for_its_own_text_not_pasting_again(tmp_path: Path):
    w = World(tmp_path)
    tid = w.agent("deaf", swallow_enters=2)  # the paste's Enter and the one more both swallowed
    mid = w.send(tid, "still in the box")
    assert w.deliver(tid) == Outcome.RETRY
    message = w.message(mid)
    assert message.status == "pending" and message.attempts == 1 and message.recheck
    assert w.deliver(tid) == Outcome.DELIVERED  # its own text in the box: Enter only
    assert w.received(tid) == [["still in the box"]]
    pasted = [chunk for chunk in w.io.pane(w.pane(tid)).received if "still in the box" in chunk]
    assert len(pasted) == 1  # pasted once
    w.core.stop()


def test_a_receiver_that_never_takes_a_submit_fails_after_the_retry_limit(tmp_path: Path):
    w = World(tmp_path, max_attempts=2)
    tid = w.agent("stone", swallow_enters=1000)
    mid = w.send(tid, "never submitted")
    assert w.deliver(tid) == Outcome.RETRY
    assert w.deliver(tid) == Outcome.FAILED
    assert w.message(mid).status == "failed" and w.message(mid).attempts == 2
    w.core.stop()


def test_a_pane_closed_behind_caos_back_fails_the_mail_for_good(world: World):
    tid = world.agent()
    mid = world.send(tid, "to nobody")
    world.io.close(world.pane(tid))
    assert world.deliver(tid) == Outcome.FAILED
    assert world.message(mid).status == "failed" and "receiver_gone" in (world.message(mid).last_error or "")
    assert world.status(tid) == "gone"


def test_a_new_tmux_server_reusing_pane_ids_gets_none_of_the_old_terminals_mail(world: World):
    old = world.agent()
    world.io.restart_server()
    new = world.agent()
    assert world.pane(new) == "%1" == world.core.store.get_terminal(old, include_deleted=True).pane_id
    mid = world.send(old, "for the old agent")
    assert world.deliver(old) == Outcome.FAILED and world.message(mid).status == "failed"
    assert world.received(new) == []


def test_a_crash_after_the_claim_recovers_to_one_paste(world: World):
    tid = world.agent()
    mid = world.send(tid, "claimed then crashed")
    assert world.core.store.claim(tid) is not None  # the deliverer dies here
    world.clock.advance(world.settings.lease_seconds + 1)
    assert (
        world.core.delivery.recover(tid, older_than=world.clock.now() - world.settings.lease_seconds)[
            "pending"
        ]
        == 1
    )
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.received(tid) == [["claimed then crashed"]] and world.message(mid).status == "delivered"


def test_a_crash_after_the_paste_is_recovered_by_its_header_without_pasting_again(world: World):
    tid = world.agent()
    mid = world.send(tid, "pasted then crashed")
    claim = world.core.store.claim(tid)
    assert claim is not None
    from cao.paste import format_batch

    term = world.core.store.get_terminal(tid)
    with world.core.panes.lock(tid):  # the deliverer pasted and submitted, then died before the ack
        world.core.typist.submit(term, format_batch(claim.messages), fence=claim.fence)
    world.clock.advance(world.settings.lease_seconds + 1)
    done = world.core.delivery.recover(tid, older_than=world.clock.now() - world.settings.lease_seconds)
    assert done["delivered"] == 1 and world.message(mid).status == "delivered"
    assert world.received(tid) == [["pasted then crashed"]]  # once


def test_a_stale_deliverer_cannot_paste_after_a_recovery_took_over(world: World):
    tid = world.agent()
    world.send(tid, "contested")
    claim = world.core.store.claim(tid)
    assert claim is not None
    world.clock.advance(world.settings.lease_seconds + 1)
    world.core.delivery.recover(tid, older_than=world.clock.now() - world.settings.lease_seconds)
    term = world.core.store.get_terminal(tid)
    with pytest.raises(FenceLost):  # the old claim's fence is behind the pane's now
        world.core.panes.paste(term, "stale paste", fence=claim.fence)
    assert world.deliver(tid) == Outcome.DELIVERED and world.received(tid) == [["contested"]]


def test_eager_delivery_queues_into_a_busy_capable_agent_and_never_into_a_question(tmp_path: Path):
    w = World(tmp_path, eager_delivery=True)
    tid = w.agent(
        "eager",
        provider="scripted_eager",
        rules=[
            {"match": "^work", "delay": 5.0, "reply": "worked"},
            {"match": "^deploy", "ask": "Allow deploy?", "reply": "deployed"},
        ],
    )
    w.type_task(tid, "work hard")
    mid = w.send(tid, "meanwhile")
    assert w.deliver(tid) == Outcome.DELIVERED  # mid-turn: queued as its own turn
    assert w.message(mid).status == "delivered" and w.status(tid) == "processing"
    w.clock.advance(6)
    w.status(tid)
    w.type_task(tid, "deploy now")
    assert w.status(tid) == "waiting_user_answer"
    asked = w.send(tid, "not into the question")
    assert w.deliver(tid) == Outcome.WAITING and w.message(asked).waiting_reason == WaitReason.ANSWER
    w.core.stop()


def test_an_error_turn_with_the_prompt_back_gets_its_mail(world: World, tmp_path: Path):
    tid = world.agent("flaky", rules=[{"match": "^fail", "error": "API Error: 500"}])
    world.type_task(tid, "fail now")
    assert world.status(tid) == "error"
    mid = world.send(tid, "after the error")
    assert world.deliver(tid) == Outcome.DELIVERED and world.message(mid).status == "delivered"
