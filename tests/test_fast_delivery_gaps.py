"""More of the delivery logic on memory panes (cao/testing/panes.py): the paths a mutation of
cao/delivery.py could break without tests/test_fast_delivery.py noticing (a gate that guesses on
an unknown screen, a paste without its fence, a claim left behind, Enter on a person's text)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cao.delivery import Outcome
from cao.paste import format_batch
from cao.states import Blocked, Held, MessageStatus, TerminalState, WaitReason
from cao.store import Terminal
from tests.helpers import write_rules
from tests.test_fast_delivery import World

pytestmark = pytest.mark.fast


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


def pasted(world: World, tid: str, text: str) -> int:
    """How many times bytes carrying ``text`` reached the agent."""
    return sum(text in chunk for chunk in world.io.pane(world.pane(tid)).received)


def test_an_unknown_screen_gets_no_paste(world: World):
    write_rules(world.settings.home, "odd", {"record": True, "prompt_mark": "» "})
    tid = world.core.lifecycle.create(provider="scripted", agent_profile="odd").id
    assert world.status(tid) == "unknown"
    mid = world.send(tid, "never guessed")
    assert world.deliver(tid) == Outcome.WAITING
    assert world.message(mid).waiting_reason == WaitReason.UNKNOWN
    assert pasted(world, tid, "never guessed") == 0


def test_a_starting_receiver_holds_its_mail(world: World):
    now = world.clock.now()
    world.core.store.add_terminal(
        Terminal(
            id="0b0b0b0b",
            name="developer-0b0b",
            session_name="cao-s",
            provider="scripted",
            agent_profile="developer",
            working_directory="/",
            state=TerminalState.STARTING.value,
            created_at=now,
            last_active=now,
        )
    )
    mid = world.send("0b0b0b0b", "for later")
    assert world.deliver("0b0b0b0b") == Outcome.WAITING
    message = world.message(mid)
    assert message.status == MessageStatus.PENDING and message.waiting_reason == WaitReason.STARTING


def test_the_delivery_paste_carries_its_claims_fence(world: World):
    """A recovery that fenced the pane after this claim was taken: the paste must be refused."""
    tid = world.agent()
    mid = world.send(tid, "fenced out")
    pane = world.io.pane(world.pane(tid))
    world.core.delivery.faults.hooks["after_claim"] = lambda: setattr(pane, "fence", 10**6)
    assert world.deliver(tid) == Outcome.LOST_RACE
    assert pasted(world, tid, "fenced out") == 0 and world.message(mid).status == MessageStatus.DELIVERING


def test_a_mode_begun_after_the_look_gives_the_claim_back(world: World):
    tid = world.agent()
    mid = world.send(tid, "after the mode")
    world.core.delivery.faults.hooks["after_claim"] = lambda: world.io.enter_mode(world.pane(tid))
    result = world.core.delivery.deliver(tid, trigger="sweep")
    assert result.outcome == Outcome.WAITING and result.reason in set(Blocked)
    assert world.message(mid).status == MessageStatus.PENDING  # not left delivering until the lease
    world.core.delivery.faults.hooks.clear()
    world.io.leave_mode(world.pane(tid))
    assert world.deliver(tid) == Outcome.DELIVERED and world.received(tid) == [["after the mode"]]


def test_a_claim_moved_on_since_the_look_is_looked_at_again(world: World):
    """Someone claimed (and gave back) in between, and a person typed meanwhile: look again."""
    tid = world.agent()
    mid = world.send(tid, "second look")

    def meanwhile() -> None:
        other = world.core.store.claim(tid)
        assert other is not None
        world.core.store.unclaim(other.token)
        world.io.type(world.pane(tid), "half a command")

    world.core.delivery.faults.hooks["before_claim"] = meanwhile
    assert world.deliver(tid) == Outcome.WAITING
    message = world.message(mid)
    assert message.status == MessageStatus.PENDING and message.waiting_reason == WaitReason.BOX_TEXT
    assert world.received(tid) == []  # nothing submitted: not the person's text, not the message


def test_a_retried_message_that_did_arrive_is_found_not_pasted_again(world: World):
    tid = world.agent()
    mid = world.send(tid, "arrived after all")
    claim = world.core.store.claim(tid)
    assert claim is not None
    term = world.core.store.get_terminal(tid)
    with world.core.panes.lock(tid):  # it was submitted, but the deliverer could not confirm it
        world.core.typist.submit(term, format_batch(claim.messages), fence=claim.fence)
    world.core.store.release(claim.token, "submit not confirmed", max_attempts=5, recheck=True)
    assert world.deliver(tid) == Outcome.DELIVERED and world.message(mid).status == MessageStatus.DELIVERED
    assert world.received(tid) == [["arrived after all"]] and pasted(world, tid, "arrived after all") == 1


def test_a_persons_text_after_cao_s_unsubmitted_paste_is_never_submitted(tmp_path: Path):
    w = World(tmp_path)
    try:
        tid = w.agent("deaf", swallow_enters=2)
        mid = w.send(tid, "left in the box")
        assert w.deliver(tid) == Outcome.RETRY  # cao's paste sits unsubmitted in the box
        w.io.type(w.pane(tid), " and rm -rf build")  # a person adds to it
        assert w.deliver(tid) == Outcome.WAITING
        message = w.message(mid)
        assert message.status == MessageStatus.PENDING and message.waiting_reason == WaitReason.BOX_TEXT
        assert w.received(tid) == []
    finally:
        w.core.stop()


def test_recovery_never_presses_enter_on_a_persons_text(world: World):
    tid = world.agent()
    mid = world.send(tid, "claimed, then the deliverer died")
    assert world.core.store.claim(tid) is not None
    world.io.type(world.pane(tid), "git push --force")
    world.clock.advance(world.settings.lease_seconds + 1)
    world.core.delivery.recover(tid, older_than=world.clock.now() - world.settings.lease_seconds)
    assert world.received(tid) == [] and world.message(mid).status == MessageStatus.PENDING


def test_a_claim_taken_over_before_the_acknowledgement_is_not_reported_delivered(world: World):
    tid = world.agent()
    world.send(tid, "taken over")

    def take_over() -> None:
        for token, _ in world.core.store.stale_claims():
            world.core.store.take_over(token)

    world.core.delivery.faults.hooks["before_ack"] = take_over
    assert world.deliver(tid) == Outcome.LOST_RACE


def test_after_the_interrupt_key_a_fresh_turn_start_report_is_looked_at_again_when_it_settles(world: World):
    """Found on the real Claude Code 1.0 (tests/realcli/test_attention_realcli.py): an interrupted
    turn reports no end (no Stop hook), so for ``hook_settle`` seconds after its start the fresh
    turn-start report alone reads ``processing`` though the prompt is back, and the pane then draws
    nothing more. The hold must say when that report stops counting (as a plain busy hold does),
    or the urgent message waits for the sweep (a minute in the bed)."""
    tid = world.agent("slow", rules=[{"match": "^work", "delay": 30.0, "reply": "worked"}])
    world.type_task(tid, "work hard")
    world.core.hook(tid, {"source": "claude", "event": "UserPromptSubmit"})  # the CLI: a turn started
    mid = (
        world.core.send_message(
            tid, "stop now", sender_id="boss", priority="urgent", if_busy="interrupt"
        ).message.id
        or 0
    )
    first = world.core.delivery.deliver(tid, trigger="sweep")
    assert first.outcome == Outcome.WAITING and world.message(mid).interrupt_at is not None  # the key went
    assert world.status(tid) == "processing"  # the prompt is back; the report is younger than hook_settle
    again = world.core.delivery.deliver(tid, trigger="retry")
    assert again.outcome == Outcome.WAITING and again.reason == Held.INTERRUPT_SENT
    assert again.look_again_in is not None
    assert 0 < again.look_again_in <= world.settings.hook_settle + 0.1
    world.clock.advance(again.look_again_in)
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.received(tid)[-1] == ["stop now"] and world.message(mid).channel == "paste"


def test_a_deadline_passing_while_caos_own_paste_waits_in_the_box_never_strands_the_batch(tmp_path: Path):
    """An unsubmitted paste of [short-lived, other] sits in the box; the first one's deadline passes
    before the retry. Expiring it would leave its text in the box, and the other message could never
    prove the box its own: held "input box holds text" for ever. Typed before the deadline, the
    paste is finished (Enter), as recovery finishes it; nothing is typed twice."""
    w = World(tmp_path)
    try:
        tid = w.agent("deaf", swallow_enters=2)
        short = w.core.send_message(tid, "short lived", sender_id="s", ttl_seconds=10).message.id or 0
        other = w.send(tid, "no deadline")
        assert w.deliver(tid) == Outcome.RETRY  # both typed, the Enter swallowed
        w.clock.advance(11)
        assert w.deliver(tid) == Outcome.DELIVERED
        assert w.message(other).status == MessageStatus.DELIVERED
        assert w.message(short).status == MessageStatus.DELIVERED
        assert w.received(tid) == [["short lived", "no deadline"]]
        assert pasted(w, tid, "no deadline") == 1
    finally:
        w.core.stop()
