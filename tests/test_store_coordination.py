"""Coordination rows on a real SQLite file: the ack cursor (compare-and-swap, forward only,
replays), results one per attempt, work-state changes won by one caller, wake-up slots created
once however often they are asked for, and the pure work-state step."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from cao import attention
from cao.coordination import TASK_GRACE, check_details, next_state
from cao.errors import Conflict, InvalidInput, NotFound
from cao.states import ScheduleState, WorkState
from cao.store import Schedule, Store, TaskResult
from tests.helpers import Clock
from tests.test_store import RID, _terminal

pytestmark = pytest.mark.db_backends
SUP = "bbbb0002"


@pytest.fixture
def store(db_location: Path | str, clock: Clock) -> Store:
    s = Store(db_location, clock=clock)
    _terminal(s)
    _terminal(s, SUP)
    s.update_terminal(RID, supervisor_id=SUP)
    return s


def send(store: Store, clock: Clock, body: str, **opts: object) -> int:
    a = attention.resolve(now=clock(), sender_is_terminal=False, **opts)  # type: ignore[arg-type]
    msg, _ = store.add_message(sender_id="s", receiver_id=RID, body=body, attention=a)
    return msg.id or 0


def deliver(store: Store, *ids: int) -> None:
    claim = store.claim(RID, limit=len(ids))
    assert claim is not None and claim.ids == list(ids)
    assert store.mark_delivered(claim.token) == len(ids)


# -- acknowledgements (ATTENTION.md scenario 10, on the store) ---------------------------------------
def test_the_cursor_moves_forward_only_with_its_expected_value(store: Store, clock: Clock):
    a, b, c = (send(store, clock, x) for x in "abc")
    deliver(store, a, b, c)
    with pytest.raises(Conflict) as stale:
        store.ack(RID, actor=RID, through=b, expected=5)
    assert stale.value.fields["current"] == 0 and "expected=0" in stale.value.message
    assert store.get_terminal(RID).ack_cursor == 0
    out = store.ack(RID, actor=RID, through=b, expected=0)
    assert (out["ack_cursor"], out["acked"], out["replay"]) == (b, [a, b], False)
    again = store.ack(RID, actor=RID, through=b, expected=0)  # a replay: satisfied already
    assert (again["ack_cursor"], again["acked"], again["replay"]) == (b, [], True)
    lower = store.ack(RID, actor=RID, through=a, expected=123)  # behind the cursor: satisfied
    assert lower["replay"] and store.get_terminal(RID).ack_cursor == b
    assert store.get_message(a).acked_at is not None and store.get_message(c).acked_at is None
    assert [m.id for m in store.unacked(RID)] == [c]


def test_nothing_undelivered_can_be_acknowledged(store: Store, clock: Clock):
    a = send(store, clock, "a")
    deliver(store, a)
    waiting = send(store, clock, "not yet")
    later = send(store, clock, "later")
    with pytest.raises(Conflict) as early:
        store.ack(RID, actor=RID, through=later)
    assert f"message {waiting} " in early.value.message and "pending" in early.value.message
    with pytest.raises(Conflict):
        store.ack(RID, actor=RID, ids=[waiting])
    assert store.get_terminal(RID).ack_cursor == 0 and store.get_message(a).acked_at is None
    other = store.add_message(sender_id="s", receiver_id=SUP, body="not yours")[0].id or 0
    with pytest.raises(NotFound):
        store.ack(RID, actor=RID, through=other)
    with pytest.raises(NotFound):
        store.ack(RID, actor=RID, ids=[a, other])
    assert store.get_message(a).acked_at is None  # all or nothing
    by_ids = store.ack(RID, actor=RID, ids=[a])
    assert by_ids["acked"] == [a] and by_ids["ack_cursor"] == 0
    assert store.ack(RID, actor=RID, ids=[a])["replay"]


def test_reads_never_move_the_cursor(store: Store, clock: Clock):
    a = send(store, clock, "a")
    deliver(store, a)
    store.mark_read(a, RID)
    assert store.get_message(a).read_at is not None
    assert store.get_message(a).acked_at is None and store.get_terminal(RID).ack_cursor == 0
    assert [m.id for m in store.unacked(RID)] == [a]


def test_two_acks_racing_with_one_expected_value_one_wins(store: Store, clock: Clock):
    ids = [send(store, clock, f"m{i}") for i in range(4)]
    deliver(store, *ids)
    results: list[object] = []

    def go(through: int) -> None:
        try:
            results.append(store.ack(RID, actor=RID, through=through, expected=0)["ack_cursor"])
        except Conflict as exc:
            results.append(exc)

    threads = [threading.Thread(target=go, args=(t,)) for t in (ids[1], ids[3])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Conflict) for r in results) == 1
    assert store.get_terminal(RID).ack_cursor in (ids[1], ids[3])


# -- results ------------------------------------------------------------------------------------------
def _result(summary: str = "did it", digest: str = "d1") -> TaskResult:
    return TaskResult(
        terminal_id=RID, task_id="m7", supervisor_id=SUP, status="done", summary=summary, digest=digest,
        created_at=time.time(),
    )  # fmt: skip


def test_one_result_per_attempt_a_retry_gets_the_first_receipt(store: Store):
    first, dup = store.put_result(_result())
    assert not dup
    again, dup = store.put_result(_result())
    assert dup and again.id == first.id
    with pytest.raises(Conflict) as other:
        store.put_result(_result("something else", "d2"))
    assert other.value.fields["result_id"] == first.id
    assert len(store.results(terminal_id=RID)) == 1


class Details(NamedTuple):
    details: object
    words: str | None


@pytest.mark.parametrize(
    "case",
    [
        Details({"branch": "feat/x", "files": ["a.py"], "tests": "12 passed"}, None),
        Details({"secret": "x"}, "details.secret is not a field"),
        Details({"files": "a.py"}, "details.files must be a list"),
        Details({"files": [""]}, "1-1000 characters"),
        Details({"notes": "x" * 9000}, "at most 8000"),
        Details(["a"], "must be an object"),
        Details({"branch": "a\x00b"}, "NUL"),
    ],
    ids=lambda c: str(c.words),
)
def test_result_details_are_known_fields_within_their_limits(case: Details):
    if case.words is None:
        assert check_details(case.details) == case.details
        return
    with pytest.raises(InvalidInput) as exc:
        check_details(case.details)
    assert case.words in exc.value.message


# -- work states --------------------------------------------------------------------------------------
class Step(NamedTuple):
    state: str | None
    status: str
    age: float
    to: WorkState | None


@pytest.mark.parametrize(
    "case",
    [
        Step(None, "completed", 9, None),  # never given work: nothing to tell
        Step("tasked", "processing", 0, WorkState.WORKING),
        Step("tasked", "idle", 0, None),  # its turn may not show yet
        Step("tasked", "completed", TASK_GRACE + 1, WorkState.FINISHED),  # a turn too short to see
        Step("working", "completed", 0, WorkState.FINISHED),
        Step("working", "idle", 0, WorkState.FINISHED),
        Step("working", "waiting_user_answer", 0, WorkState.BLOCKED),
        Step("blocked", "waiting_user_answer", 0, None),
        Step("blocked", "processing", 0, WorkState.WORKING),
        Step("blocked", "idle", 0, WorkState.FINISHED),
        Step("working", "error", 0, WorkState.FAILED),
        Step("finished", "processing", 0, None),  # a turn nobody asked for: not its task
        Step("exited", "idle", 9, None),
        Step("working", "unknown", 0, None),  # unknown: only after a while (the tick)
    ],
    ids=lambda c: f"{c.state}+{c.status}",
)
def test_the_work_state_step(case: Step):
    assert next_state(case.state, case.status, task_age=case.age) == case.to


def test_a_work_change_is_won_by_one_caller_with_its_notice_in_the_same_transaction(store: Store):
    store.update_terminal(RID, work_state="working")
    body = "Worker finished"
    a = attention.resolve(now=time.time(), sender_is_terminal=True, kind="notice", topic="worker.finished")
    got: list[object] = []

    def go() -> None:
        got.append(
            store.change_work(RID, "working", WorkState.FINISHED, reason="r", webhook=True, notice=(body, a))
        )

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    notes = [g for g in got if g is not False]
    assert len(notes) == 1
    [note] = store.notifications()
    assert note.event == "finished" and note.webhook == "pending" and note.supervisor_id == SUP
    [notice] = store.list_messages(receiver_id=SUP)
    assert notice.id == note.message_id and notice.kind == "notice" and notice.sender_id == RID


def test_a_supervisor_that_opted_out_or_is_gone_gets_no_notice_but_the_operator_still_hears(store: Store):
    store.update_terminal(RID, work_state="working", notify_supervisor=0)
    a = attention.resolve(now=time.time(), sender_is_terminal=True, kind="notice", topic="t")
    note = store.change_work(RID, "working", WorkState.FINISHED, reason="r", webhook=False, notice=("b", a))
    assert note is not False and note is not True and note.message_id is None and note.webhook is None
    store.update_terminal(RID, work_state="working", notify_supervisor=1)
    store.mark_gone(SUP, "exited")
    note = store.change_work(RID, "working", WorkState.FINISHED, reason="r", webhook=False, notice=("b", a))
    assert note is not False and note is not True and note.message_id is None
    assert store.list_messages(receiver_id=SUP) == []


# -- wake-up slots (ATTENTION.md scenario 14, on the store) ------------------------------------------
def _schedule(store: Store, clock: Clock, every: float | None = 60.0) -> Schedule:
    return store.add_schedule(
        Schedule(
            receiver_id=RID,
            created_by="cli",
            body="stand-up",
            first_at=clock() + 10,
            every_seconds=every,
            next_at=clock() + 10 if every else None,
            created_at=clock(),
        ),
        attention.resolve(now=clock(), sender_is_terminal=True, kind="wakeup"),
        limit=3,
    )


def slots(store: Store) -> list[tuple[str, float | None]]:
    return [
        (m.idempotency_key or "", m.not_before) for m in store.list_messages(receiver_id=RID, order="asc")
    ]


def test_each_slot_is_created_once_one_slot_ahead_however_often_asked(store: Store, clock: Clock):
    s = _schedule(store, clock)
    first = clock() + 10
    assert slots(store) == [("slot-0", first)]  # the first slot at once, deferred until its time
    wake = attention.resolve(now=clock(), sender_is_terminal=True, kind="wakeup")
    assert store.advance_schedules(clock(), wake) == []  # slot 0's time has not come: nothing more
    clock.t = first + 1
    assert store.advance_schedules(clock(), wake) == [RID]
    for _ in range(3):  # asked again and again (restarts, two servers): nothing doubles
        assert store.advance_schedules(clock(), wake) == []
    assert slots(store) == [("slot-0", first), ("slot-1", first + 60)]
    clock.t = first + 60 * 10 + 1  # down for ten slots: three are created late, the rest skipped
    store.advance_schedules(clock(), wake)
    keys = [k for k, _ in slots(store)]
    assert keys == ["slot-0", "slot-1", "slot-8", "slot-9", "slot-10", "slot-11"]
    assert store.get_schedule(s.id or 0).skipped == 6


def test_a_cancelled_schedule_creates_nothing_and_cancels_its_waiting_slot(store: Store, clock: Clock):
    s = _schedule(store, clock)
    [slot] = store.list_messages(receiver_id=RID)
    out = store.cancel_schedule(s.id or 0, actor="cli", as_agent=False)
    assert out.state == ScheduleState.CANCELLED and store.get_message(slot.id or 0).status == "cancelled"
    clock.t += 3600
    assert store.advance_schedules(clock(), attention.resolve(now=clock(), sender_is_terminal=True)) == []


def test_one_time_wake_ups_are_done_at_once_and_a_receiver_has_a_limit(store: Store, clock: Clock):
    s = _schedule(store, clock, every=None)
    assert s.state == ScheduleState.DONE and len(slots(store)) == 1
    _schedule(store, clock)
    _schedule(store, clock)
    _schedule(store, clock)
    with pytest.raises(Conflict) as full:
        _schedule(store, clock)
    assert "the most it may have (3)" in full.value.message


def test_a_message_deferred_until_later_doesnt_hold_the_cursor_and_is_acked_once_delivered(
    store: Store, clock: Clock
):
    later = send(store, clock, "later", deliver_at=_iso(clock() + 600))
    now = send(store, clock, "now")
    deliver(store, now)
    assert store.ack(RID, actor=RID, through=now, expected=0)["acked"] == [now]  # past the deferred one
    clock.t += 601
    deliver(store, later)  # it reached the agent after the cursor passed its id
    assert [m.id for m in store.unacked(RID)] == [later]
    out = store.ack(RID, actor=RID, through=now, expected=now)
    assert out["acked"] == [later] and not out["replay"] and out["ack_cursor"] == now


def _iso(t: float) -> str:
    from cao.timefmt import iso

    return str(iso(t))
