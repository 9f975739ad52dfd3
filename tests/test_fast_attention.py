"""The attention layer (cao/inbox.py, cao/core.py's queue routes) on memory panes and a fake clock:
who may act on a queue, and the checks every route's inputs get."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cao.errors import Forbidden, InvalidInput, ReceiverGone
from cao.states import MessageStatus
from tests.test_fast_delivery import World

pytestmark = pytest.mark.fast


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


def test_cancel_checks_who_acts_like_every_other_queue_route(world: World):
    """`by` on cancel was stored as given (4000 characters, markup, any terminal's id), and an agent
    naming itself could cancel a person's chat or another agent's mail: the one route of the queue
    where the 403s of docs/attention.md did not apply."""
    tid = world.agent(rules=[{"match": "^work", "delay": 60.0, "reply": "worked"}])
    other = world.agent()
    world.type_task(tid, "work hard")
    chat = world.send(tid, "from a person", sender="cli")
    note = world.core.send_message(tid, "fyi", sender_id=other).message.id or 0
    with pytest.raises(InvalidInput, match="is not a name"):
        world.core.cancel_message(note, by="y" * 4000 + "<script>")
    with pytest.raises(Forbidden, match="person's chat"):
        world.core.cancel_message(chat, by=tid)
    with pytest.raises(Forbidden, match="its own queue"):
        world.core.cancel_message(note, by=other)
    assert world.message(chat).status == world.message(note).status == MessageStatus.PENDING
    done = world.core.cancel_message(note, by=tid)  # its own mail, not a person's: allowed
    assert done["status"] == MessageStatus.CANCELLED and done["closed_by"] == tid
    op = world.core.cancel_message(chat, by=None)  # the operator may cancel anything
    assert op["status"] == MessageStatus.CANCELLED and op["closed_by"] == "operator"


def test_refuse_to_a_receiver_whose_pane_just_closed_says_gone_not_wait(world: World):
    """Its pane closed behind cao's back (not yet noticed by the store): refuse read the screen as
    ``gone`` and answered 409 "send with if_busy=wait to have it delivered when the agent is
    ready" — advice that can never come true. It is the send's own "gone" answer, nothing stored."""
    tid = world.agent()
    world.io.close(world.pane(tid))
    before = world.core.store.counts_by_status()
    with pytest.raises(ReceiverGone, match="is gone") as err:
        world.core.send_message(tid, "anyone?", if_busy="refuse")
    assert "if_busy=wait" not in err.value.message and f"cao shutdown {tid}" in err.value.message
    assert world.core.store.counts_by_status() == before


def test_a_hook_confirming_a_paste_claim_marks_nothing_delivered(world: World):
    """A paste claim's token is on the event stream (``message.claimed``); a hook answering
    ``hooks/handed`` with it marked the messages delivered through the hook while the deliverer was
    still to paste them (and if that paste then failed, delivered for ever, never typed). Only a
    claim that was handed to a hook can be confirmed by one."""
    tid = world.agent()
    mid = world.send(tid, "for the paste")
    claim = world.core.store.claim(tid)
    assert claim is not None
    assert world.core.delivery.handed(tid, claim.token) == 0
    assert world.message(mid).status == MessageStatus.DELIVERING and world.message(mid).channel is None
