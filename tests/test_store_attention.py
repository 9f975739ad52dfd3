"""The attention columns on a real SQLite file: the claim's serving order, deadlines in the claim's
own transaction, coalescing, the queue view agreeing with the claim, recheck batches first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cao import attention
from cao.errors import Conflict, Forbidden
from cao.inbox import Inbox
from cao.states import Event
from cao.store import Store
from cao.store.messages import EXPIRED_REASON
from tests.helpers import Clock
from tests.test_store import RID, _terminal

pytestmark = pytest.mark.db_backends


@pytest.fixture
def store(db_location: Path | str, clock: Clock) -> Iterator[Store]:
    s = Store(db_location, clock=clock)
    _terminal(s)
    yield s
    s.close()


def send(store: Store, clock: Clock, body: str, sender: str = "s", **opts: object) -> int:
    a = attention.resolve(now=clock(), sender_is_terminal=False, **opts)  # type: ignore[arg-type]
    msg, _ = store.add_message(sender_id=sender, receiver_id=RID, body=body, attention=a)
    return msg.id or 0


def test_the_claim_serves_by_priority_then_commit_order_and_the_queue_agrees(store: Store, clock: Clock):
    ids = {
        b: send(store, clock, b, priority=p)
        for b, p in [
            ("low", "low"),
            ("n1", "normal"),
            ("urgent", "urgent"),
            ("n2", "normal"),
            ("high", "high"),
        ]
    }
    assert [m.id for m in store.queue(RID)] == [ids[b] for b in ("urgent", "high", "n1", "n2", "low")]
    claim = store.claim(RID, limit=3)
    assert claim is not None and [m.body for m in claim.messages] == ["urgent", "high", "n1"]


def test_a_passed_deferral_is_served_by_priority_like_any_other(store: Store, clock: Clock):
    low = send(store, clock, "low", priority="low")
    urgent = send(store, clock, "urgent", priority="urgent")
    store.manage(urgent, Event.DEFERRED, actor="op", as_agent=False, reason="r", until=clock() + 5)
    assert [m.id for m in store.queue(RID)] == [low, urgent]  # the deferred one last while it waits
    claim = store.claim(RID)
    assert claim is not None and claim.ids == [low]
    store.mark_delivered(claim.token)
    clock.t += 10
    send(store, clock, "low2", priority="low")
    assert store.queue(RID)[0].id == urgent  # due now: by priority again
    again = store.claim(RID)
    assert again is not None and again.ids[0] == urgent


def test_a_deadline_expires_in_the_claims_own_transaction(store: Store, clock: Clock):
    short = send(store, clock, "short", ttl_seconds=2)
    keep = send(store, clock, "keep")
    clock.t += 3
    claim = store.claim(RID)
    assert claim is not None and claim.ids == [keep]
    m = store.get_message(short)
    assert m.status == "expired" and m.closed_reason == EXPIRED_REASON
    assert [e.event for e in store.timeline(RID, message_id=short)] == ["queued", "expired"]


def test_a_batch_being_rechecked_is_served_first_and_is_never_expired_dropped_or_handed(
    store: Store, clock: Clock
):
    old = send(store, clock, "old", ttl_seconds=2)
    claim = store.claim(RID)
    assert claim is not None
    store.release(claim.token, "unconfirmed", max_attempts=5, recheck=True)  # it may have arrived
    urgent = send(store, clock, "urgent", priority="urgent", if_busy="interrupt")
    clock.t += 3
    assert store.expire_due() == []  # its earlier paste may be in the pane: its claim decides
    with pytest.raises(Conflict, match="may already have arrived"):
        store.manage(old, Event.DROPPED, actor="op", as_agent=False, reason="r")
    assert store.claim(RID, handing="interrupts") is None  # nothing handed while a recheck waits
    again = store.claim(RID)
    assert again is not None and again.ids == [old] and again.recheck
    assert store.get_message(urgent).status == "pending"


def test_notices_coalesce_per_sender_and_topic_only(store: Store, clock: Clock):
    a1 = send(store, clock, "a1", kind="notice", topic="build")
    b1 = send(store, clock, "b1", sender="other", kind="notice", topic="build")
    t1 = send(store, clock, "t1", kind="notice", topic="tests")
    m1 = send(store, clock, "m1", kind="message", topic="build")
    a2 = send(store, clock, "a2", kind="notice", topic="build")
    assert store.get_message(a1).status == "superseded" and store.get_message(a1).superseded_by == a2
    assert {store.get_message(i).status for i in (b1, t1, m1, a2)} == {"pending"}


def test_an_agent_manages_only_its_own_queue_and_never_a_chat(store: Store, clock: Clock):
    chat = send(store, clock, "from a person")
    assert store.get_message(chat).kind == "chat"
    with pytest.raises(Forbidden, match="person's chat"):
        store.manage(chat, Event.DROPPED, actor=RID, as_agent=True, reason="r")
    with pytest.raises(Forbidden, match="its own queue"):
        store.manage(chat, Event.DROPPED, actor="bbbb0002", as_agent=True, reason="r")
    assert store.manage(chat, Event.DROPPED, actor="ana", as_agent=False, reason="done").status == "dropped"


def test_the_interrupting_claim_takes_only_the_interrupting_head_of_the_queue(store: Store, clock: Clock):
    normal = send(store, clock, "normal")
    assert store.claim(RID, handing="interrupts") is None
    u1 = send(store, clock, "u1", priority="urgent", if_busy="interrupt")
    send(store, clock, "u2 waits", priority="urgent")
    u3 = send(store, clock, "u3", priority="urgent", if_busy="interrupt")
    claim = store.claim(RID, handing="interrupts")
    assert claim is not None and claim.ids == [u1]  # u2 (wait) stands between u1 and u3
    assert store.get_message(normal).status == "pending" and store.get_message(u3).status == "pending"


def test_working_on_names_the_message_delivered_last_not_the_newest_id(store: Store, clock: Clock):
    """Served by priority, the message delivered last can be an older one: an urgent #2 goes first,
    then the low #1 starts the turn the agent is working on. ``working_on`` named the highest id."""
    low = send(store, clock, "low", priority="low")
    urgent = send(store, clock, "urgent", priority="urgent")
    for expected in (urgent, low):
        claim = store.claim(RID, limit=1)
        assert claim is not None and claim.ids == [expected]
        clock.t += 1
        store.mark_delivered(claim.token)
    view = Inbox(store, clock).attention(RID, "processing")
    assert view["attention"] == "working"
    assert view["working_on"]["message_id"] == low  # type: ignore[index]


def test_the_weekly_prune_drops_only_events_older_than_the_cutoff(store: Store, clock: Clock):
    first = send(store, clock, "old")
    clock.t += 100
    second = send(store, clock, "new")
    assert store.prune_timeline(older_than=clock.t - 200) == 0
    assert store.prune_timeline(older_than=clock.t - 50) == 1  # the first message's queued event
    assert [e.message_id for e in store.timeline(RID)] == [second]
    assert store.get_message(first).body == "old"  # the messages stay
    assert store.prune_timeline(older_than=clock.t + 1) == 1
    assert store.timeline(RID) == [] and store.prune_timeline(older_than=clock.t + 1) == 0


def test_the_inline_limit_counts_what_would_be_typed_not_the_raw_bytes():
    from cao.paste import format_message
    from cao.store import Message

    def msg(body: str) -> Message:
        return Message(
            id=7, sender_id="s", receiver_id=RID, body=body, body_sha256="", created_at=0.0, nonce="ab"
        )

    assert "read_message tool" not in format_message(msg("x" * 4096), 4096)  # exactly at the limit: typed
    assert "read_message tool" in format_message(msg("x" * 4097), 4096)  # one byte over: announced
    assert "read_message tool" in format_message(msg("\x01" * 2000), 4096)  # 2000 bytes typing as 6000
    assert "read_message tool" in format_message(msg("é" * 2049), 4096)  # 4098 bytes in UTF-8


def test_a_message_past_its_deadline_reads_expiring_until_the_tick_expires_it(store: Store, clock: Clock):
    from cao.inbox import Inbox

    mid = send(store, clock, "short", ttl_seconds=2)
    clock.t += 3
    assert (
        Inbox(store, clock).view(store.get_message(mid))["waiting_reason"].startswith("its deadline passed")
    )
    assert [e.message_id for e in store.expire_due()] == [mid]


def test_a_hand_over_found_after_a_crash_keeps_its_channel_a_later_paste_says_paste(
    store: Store, clock: Clock
):
    """A hand-over claim left by a crash goes back to the queue to be looked for: found later by
    its evidence it was handed (channel hook); pasted after all (never found), it says paste."""
    a = send(store, clock, "a", priority="urgent", if_busy="interrupt")
    claim = store.claim(RID, handing="interrupts")
    assert claim is not None
    store.note_handed(claim.token, "PostToolUse")
    store.release(claim.token, "recovered: not seen", max_attempts=10**9, count_attempt=False, recheck=True)
    again = store.claim(RID)
    assert again is not None and again.recheck
    assert store.mark_delivered(again.token, found=True) == 1
    assert store.get_message(a).channel == "hook"
    b = send(store, clock, "b", priority="urgent", if_busy="interrupt")
    claim = store.claim(RID, handing="interrupts")
    assert claim is not None
    store.note_handed(claim.token, "PostToolUse")
    store.release(claim.token, "recovered: not seen", max_attempts=10**9, count_attempt=False, recheck=True)
    pasted = store.claim(RID)
    assert pasted is not None
    store.release(pasted.token, "submit not confirmed", max_attempts=5, recheck=True, pasted=True)
    last = store.claim(RID)
    assert last is not None and store.mark_delivered(last.token, found=True) == 1
    assert store.get_message(b).channel == "paste"
