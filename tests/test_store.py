"""The store on a real SQLite file: schema, idempotency, claims across threads and processes."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cao.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReceiverGone,
    SchemaTooNew,
    StoreBusy,
)
from cao.store import MAX_BODY_BYTES, SCHEMA_VERSION, Store
from tests.helpers import add_terminal_row

pytestmark = pytest.mark.db_backends

RID = "aaaa0001"


def _terminal(store: Store, tid: str = RID) -> None:
    add_terminal_row(store, tid)


@pytest.fixture
def store(db_location: Path | str) -> Iterator[Store]:
    s = Store(db_location, busy_timeout=2)
    _terminal(s)
    yield s
    s.close()


def test_fresh_database_is_migrated_and_in_wal_mode(tmp_path: Path):
    s = Store(tmp_path / "x.db")
    assert s.schema_version() == SCHEMA_VERSION
    with sqlite3.connect(tmp_path / "x.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"terminal", "message"} <= tables
    # the migrated columns are exactly the model's fields
    with sqlite3.connect(tmp_path / "x.db") as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(message)")]
    from cao.store import Message

    assert set(cols) == set(Message.model_fields)
    Store(tmp_path / "x.db")  # reopening is a no-op


@pytest.mark.parametrize(
    "table",
    [
        "terminal",
        "message",
        "handoff_job",
        "worktree",
        "task_result",
        "notification",
        "schedule",
        "board_fact",
    ],
)
def test_migrations_build_exactly_the_sqlmodel_tables(tmp_path: Path, table: str):
    """One source of truth: the sqlmodel table classes. The numbered migrations (which existing
    databases run) must end at the same columns, nullability and primary key."""
    from cao.store.schema import (
        BoardFactTable,
        HandoffJobTable,
        MessageTable,
        NotificationTable,
        ScheduleTable,
        TaskResultTable,
        TerminalTable,
        WorktreeTable,
    )

    Store(tmp_path / "x.db").close()
    with sqlite3.connect(tmp_path / "x.db") as conn:
        got = {r[1]: (not r[3] and not r[5], bool(r[5])) for r in conn.execute(f"PRAGMA table_info({table})")}
    tables = {
        "terminal": TerminalTable,
        "message": MessageTable,
        "handoff_job": HandoffJobTable,
        "worktree": WorktreeTable,
        "task_result": TaskResultTable,
        "notification": NotificationTable,
        "schedule": ScheduleTable,
        "board_fact": BoardFactTable,
    }
    meta = tables[table].__table__  # type: ignore[attr-defined]
    want = {c.name: (bool(c.nullable) and not c.primary_key, bool(c.primary_key)) for c in meta.columns}
    # a column with a default may be NOT NULL in SQL while the model allows leaving it out
    loose = {c.name for c in meta.columns if c.default is not None}
    assert set(got) == set(want)
    strict = set(got) - loose
    assert {k: got[k] for k in strict} == {k: want[k] for k in strict}


def test_an_old_database_moves_forward_and_keeps_its_rows(tmp_path: Path):
    """A schema-2 database (before pane identity and nonces) gets the new columns; its messages get
    nonces so their headers stay unforgeable."""
    from cao.store import MIGRATIONS

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for version in (1, 2):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 2")
        conn.execute(
            "INSERT INTO message (sender_id, receiver_id, body, body_sha256, status, created_at, attempts) "
            "VALUES ('s', 'aaaa0001', 'old body', 'x', 'pending', 1.0, 0)"
        )
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION
    [m] = s.list_messages()
    assert m.body == "old body" and m.nonce and len(m.nonce) == 12 and m.recheck is None


def test_newer_schema_is_refused_with_a_clear_error(tmp_path: Path):
    path = tmp_path / "new.db"
    Store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaTooNew, match="upgrade cao"):
        Store(path)


def test_idempotent_send_same_intent_returns_original(store: Store):
    m1, dup1 = store.add_message(sender_id="s1", receiver_id=RID, body="hello", idempotency_key="k1")
    m2, dup2 = store.add_message(sender_id="s1", receiver_id=RID, body="hello", idempotency_key="k1")
    assert (dup1, dup2) == (False, True)
    assert m2.id == m1.id
    # the same key from another sender is another message
    m3, dup3 = store.add_message(sender_id="s2", receiver_id=RID, body="hello", idempotency_key="k1")
    assert not dup3 and m3.id != m1.id
    assert len(store.list_messages(receiver_id=RID)) == 2


def test_same_key_other_intent_is_conflict_and_stores_nothing(store: Store):
    _terminal(store, "aaaa0002")
    store.add_message(sender_id="s1", receiver_id=RID, body="hello", idempotency_key="k1")
    with pytest.raises(Conflict, match="different message"):
        store.add_message(sender_id="s1", receiver_id=RID, body="other", idempotency_key="k1")
    with pytest.raises(Conflict):
        store.add_message(sender_id="s1", receiver_id="aaaa0002", body="hello", idempotency_key="k1")
    assert len(store.list_messages()) == 1


def test_body_limits(store: Store):
    exact = "x" * MAX_BODY_BYTES
    m, _ = store.add_message(sender_id="s", receiver_id=RID, body=exact)
    assert store.get_message(m.id or 0).body == exact
    with pytest.raises(PayloadTooLarge) as info:
        store.add_message(sender_id="s", receiver_id=RID, body=exact + "y")
    assert info.value.status_code == 413
    # multi-byte characters count as bytes
    with pytest.raises(PayloadTooLarge):
        store.add_message(sender_id="s", receiver_id=RID, body="é" * (MAX_BODY_BYTES // 2 + 1))
    with pytest.raises(InvalidInput):
        store.add_message(sender_id="s", receiver_id=RID, body="")
    assert len(store.list_messages()) == 1


def test_unknown_and_deleted_receivers(store: Store):
    with pytest.raises(NotFound):
        store.add_message(sender_id="s", receiver_id="bbbb0000", body="x")
    store.add_message(sender_id="s", receiver_id=RID, body="queued")
    assert store.delete_terminal(RID) == 1
    assert store.list_messages()[0].status == "failed"
    assert store.list_messages()[0].last_error == "receiver_gone"
    with pytest.raises(ReceiverGone):
        store.add_message(sender_id="s", receiver_id=RID, body="x")


def test_claim_is_fifo_batched_and_exclusive_per_receiver(store: Store):
    for i in range(5):
        store.add_message(sender_id="s", receiver_id=RID, body=f"m{i}")
    claim = store.claim(RID, limit=3)
    assert claim is not None and [m.body for m in claim.messages] == ["m0", "m1", "m2"]
    assert all(m.status == "delivering" and m.claim == claim.token for m in claim.messages)
    # a second claimer loses while the first claim is outstanding
    assert store.claim(RID) is None
    assert store.mark_delivered(claim.token) == 3
    claim2 = store.claim(RID)
    assert claim2 is not None and [m.body for m in claim2.messages] == ["m3", "m4"]
    assert claim2.fence == claim.fence + 1  # every claim takes the receiver's next pane fence
    store.release(claim2.token, "boom", max_attempts=2)
    rows = store.list_messages(order="asc")
    assert [(m.status, m.attempts) for m in rows[3:]] == [("pending", 1), ("pending", 1)]
    claim3 = store.claim(RID)
    assert claim3 is not None
    store.release(claim3.token, "boom again", max_attempts=2)
    rows = store.list_messages(order="asc")
    assert [(m.status, m.attempts, m.last_error) for m in rows[3:]] == [("failed", 2, "boom again")] * 2


def test_claim_byte_budget_takes_at_least_one(store: Store):
    store.add_message(sender_id="s", receiver_id=RID, body="a" * 1000)
    store.add_message(sender_id="s", receiver_id=RID, body="b" * 1000)
    claim = store.claim(RID, max_bytes=1500)
    assert claim is not None and len(claim.messages) == 1


def test_a_recheck_batch_is_reclaimed_exactly_and_nothing_newer_joins_it(store: Store):
    """DELIVERY.md 21 at the store level: a retry re-claims exactly the earlier batch."""
    for i in range(2):
        store.add_message(sender_id="s", receiver_id=RID, body=f"m{i}")
    first = store.claim(RID)
    assert first is not None and not first.recheck
    store.release(first.token, "submit not confirmed", max_attempts=5, recheck=True)
    store.add_message(sender_id="s", receiver_id=RID, body="newer")
    again = store.claim(RID)
    assert again is not None and again.recheck
    assert [m.body for m in again.messages] == ["m0", "m1"]  # "newer" waits for its own claim
    assert store.mark_delivered(again.token) == 2
    last = store.claim(RID)
    assert last is not None and not last.recheck and [m.body for m in last.messages] == ["newer"]


def test_a_claim_taken_over_can_neither_renew_nor_acknowledge(store: Store):
    """Ownership: acks and renewals are conditional on the claim; a recovery's takeover wins."""
    store.add_message(sender_id="s", receiver_id=RID, body="m")
    claim = store.claim(RID)
    assert claim is not None and store.renew(claim.token)
    took = store.take_over(claim.token)
    assert took is not None and took[1] > claim.fence
    assert not store.renew(claim.token)
    assert store.mark_delivered(claim.token) == 0  # the slow deliverer learns it lost
    assert store.take_over(claim.token) is None
    assert store.mark_delivered(took[0]) == 1


def test_waiting_reason_is_stored_with_pending_messages(store: Store):
    m, _ = store.add_message(sender_id="s", receiver_id=RID, body="m")
    assert store.note_waiting(RID, "receiver busy") == 1
    assert store.note_waiting(RID, "receiver busy") == 0  # unchanged: nothing rewritten
    assert (
        Store(store.location).get_message(m.id or 0).waiting_reason == "receiver busy"
    )  # survives a restart


def test_claims_across_threads_never_overlap(store: Store):
    for i in range(300):
        store.add_message(sender_id="s", receiver_id=RID, body=f"m{i}")
    seen: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        while store.has_pending(RID) or store.stale_claims():
            claim = store.claim(RID, limit=7)
            if claim is not None:
                with lock:
                    seen.extend(claim.ids)
                store.mark_delivered(claim.token)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == seen  # one receiver: batches go out in commit order
    assert len(seen) == len(set(seen)) == 300


CLAIMER = """
import sys, time
from pathlib import Path
from cao.store import Store
s = Store(sys.argv[1], busy_timeout=10)
got = []
deadline = time.time() + 60
while time.time() < deadline and (s.has_pending('aaaa0001') or s.stale_claims()):
    claim = s.claim('aaaa0001', limit=5)
    if claim is not None:
        got.extend(claim.ids)
        s.mark_delivered(claim.token)
print(' '.join(map(str, got)))
"""


def test_claims_across_processes_never_overlap(store: Store):
    for i in range(200):
        store.add_message(sender_id="s", receiver_id=RID, body=f"m{i}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(store.location)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    ids: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=90)
        ids.extend(int(x) for x in out.split())
    assert len(ids) == len(set(ids)) == 200
    assert store.counts_by_status()["delivered"] == 200


SENDER = """
import sys
from pathlib import Path
from cao.store import Store
s = Store(sys.argv[1], busy_timeout=10)
key = sys.argv[3] if len(sys.argv) > 3 else None
for i in range(int(sys.argv[2])):
    s.add_message(sender_id='p' + str(__import__('os').getpid()), receiver_id='aaaa0001',
                  body=f'{__import__("os").getpid()}:{i}', idempotency_key=key and f'{key}')
"""


def test_concurrent_senders_across_processes_all_stored_in_commit_order(store: Store):
    procs = [subprocess.Popen([sys.executable, "-c", SENDER, str(store.location), "50"]) for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=60) == 0
    rows = store.list_messages(limit=1000, order="asc")
    assert len(rows) == 200
    # per sender, its messages are in the order it sent them
    by_sender: dict[str, list[int]] = {}
    for m in rows:
        pid, i = m.body.split(":")
        by_sender.setdefault(pid, []).append(int(i))
    assert all(seq == list(range(50)) for seq in by_sender.values())
    assert [m.id for m in rows] == sorted(m.id or 0 for m in rows)


SAME_KEY = """
import sys
from pathlib import Path
from cao.store import Store
s = Store(sys.argv[1], busy_timeout=10)
m, dup = s.add_message(sender_id='shared', receiver_id='aaaa0001', body='once', idempotency_key='the-key')
print(m.id, dup)
"""


def test_same_key_sent_concurrently_from_two_processes_is_one_row(store: Store):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAME_KEY, str(store.location)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert {o[0] for o in outs} == {str(store.list_messages()[0].id)}
    assert sorted(o[1] for o in outs) == ["False", "True"]
    assert len(store.list_messages()) == 1


LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute('BEGIN IMMEDIATE')
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
conn.execute('ROLLBACK')
"""


def test_locked_database_gives_store_busy_and_writes_nothing(tmp_path: Path):
    store = Store(tmp_path / "cao.db", busy_timeout=0.2)
    _terminal(store)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(store.location), "2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusy, match="nothing was written"):
            store.add_message(sender_id="s", receiver_id=RID, body="x", idempotency_key="k")
    finally:
        locker.communicate(timeout=10)
    _, dup = store.add_message(sender_id="s", receiver_id=RID, body="x", idempotency_key="k")
    assert not dup and len(store.list_messages()) == 1


def test_cancel_only_pending(store: Store):
    m, _ = store.add_message(sender_id="s", receiver_id=RID, body="x")
    assert store.cancel(m.id or 0).status == "cancelled"
    with pytest.raises(Conflict, match="only a pending"):
        store.cancel(m.id or 0)
    with pytest.raises(NotFound):
        store.cancel(999)


def test_version_1_database_migrates_forward_keeping_rows(tmp_path: Path):
    from cao.store import MIGRATIONS

    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:
        for statement in MIGRATIONS[1]:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO terminal (id, name, session_name, provider, agent_profile, working_directory, "
            "created_at, last_active) VALUES ('aaaa0001', 'w', 'cao-x', 'scripted', 'developer', '/', 1, 1)"
        )
        conn.execute("PRAGMA user_version = 1")
    store = Store(path)
    assert store.schema_version() == SCHEMA_VERSION >= 2
    term = store.get_terminal(RID)
    assert term.mcp_ready_at is None and term.provider == "scripted"
    store.update_terminal(RID, mcp_ready_at=5.0)
    assert store.get_terminal(RID).mcp_ready_at == 5.0


def test_handoff_jobs_keep_their_result_under_the_client_id(store: Store):
    job = "0123456789abcdef0123456789abcdef"
    with pytest.raises(NotFound):
        store.get_handoff_job(job)
    store.put_handoff_job(job, "running", terminal_id="aaaa0001")
    store.put_handoff_job(job, "completed", last_message="the answer")
    got = store.get_handoff_job(job)
    assert (got.state, got.terminal_id, got.last_message, got.error_message) == (
        "completed",
        "aaaa0001",
        "the answer",
        None,
    )
    assert got.updated_at >= got.created_at
