"""The store on both backends: one schema source, and what PostgreSQL adds (writers side by side,
a server that restarts, credentials that never show). The store's behaviour itself is proven on
both by the store modules (``pytest.mark.db_backends``)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cao.errors import Conflict, StoreBusy, StoreUnreachable
from cao.store import MIGRATIONS, SCHEMA_VERSION, Store
from cao.store.backend import redact, to_pyformat
from cao.store.schema import TABLES
from cao.testing.pgserver import PgServer
from tests.test_store import _terminal

R1, R2 = "aaaa0001", "bbbb0002"


def _sqlite_schema(path: Path) -> list[tuple[str, str, str]]:
    """Every table and index as SQLite keeps it (a renamed table's name is stored quoted: the same
    name)."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        return sorted((t, n, sql.replace(f'CREATE TABLE "{n}"', f"CREATE TABLE {n}")) for t, n, sql in rows)


def test_an_old_database_ends_exactly_where_a_new_one_begins(tmp_path: Path):
    """Version 1 (hand-written DDL, with its drift: ``state DEFAULT 'live'``) migrated forward has
    the very tables and indexes a new database is created with, from the table classes; its rows
    and its id counter are kept (an id is never handed out twice)."""
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        for version in range(1, 13):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute(
            "INSERT INTO terminal (id, name, session_name, provider, agent_profile, working_directory, "
            "state, created_at, last_active) VALUES ('aaaa0001', 'w', 'cao-x', 'scripted', 'developer', "
            "'/', 'live', 1, 1)"
        )
        for i in range(3):
            conn.execute(
                "INSERT INTO message (sender_id, receiver_id, body, body_sha256, status, created_at, "
                "attempts, nonce) VALUES ('s', 'aaaa0001', ?, 'x', 'delivered', 1.0, 0, 'n')",
                (f"old {i}",),
            )
        conn.execute("DELETE FROM message WHERE body = 'old 2'")  # the newest id is gone: not reused
        conn.execute("INSERT INTO task_window VALUES ('aaaa0001', 'm9', 5.0)")
        conn.execute("INSERT INTO task_window VALUES ('aaaa0001', 'm4', 5.0)")
        conn.execute("PRAGMA user_version = 12")
    store = Store(old)
    assert store.schema_version() == SCHEMA_VERSION
    assert _sqlite_schema(old) == _sqlite_schema(fresh)
    assert [m.body for m in store.list_messages(receiver_id=R1, order="asc")] == ["old 0", "old 1"]
    new, _ = store.add_message(sender_id="s", receiver_id=R1, body="new")
    assert new.id == 4
    # two attempts that began at the same instant keep the order they were recorded in
    assert store.task_windows(R1) == [("m9", 5.0), ("m4", 5.0)]
    store.close()


def test_the_schema_on_postgresql_is_the_table_classes(pg_url: str):
    store = Store(pg_url)
    with store._read() as conn:
        rows = conn.execute(
            "SELECT table_name, column_name, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_schema = 'public'"
        ).fetchall()
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}
    got = {(r[0], r[1]): r[2] == "YES" for r in rows}
    want = {}
    for model in TABLES:
        table = model.__table__  # type: ignore[attr-defined]
        for c in table.columns:
            want[(table.name, c.name)] = bool(c.nullable) and not c.primary_key
    assert got == want
    declared = {str(ix.name) for model in TABLES for ix in model.__table__.indexes}  # type: ignore[attr-defined]
    assert declared <= indexes
    defaults = {(r[0], r[1]): r[3] for r in rows}
    assert defaults[("terminal", "state")] == "'starting'::character varying"  # the model's, not 'live'
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    Store(pg_url).close()  # a second start finds it current: nothing to do


def test_placeholders_translate_outside_quoted_text_only():
    assert to_pyformat("SELECT ? WHERE a LIKE 'x?%' AND b % 2 = ?") == (
        "SELECT %s WHERE a LIKE 'x?%%' AND b %% 2 = %s"
    )
    assert to_pyformat("UPDATE t SET a = :a WHERE b = ':b' AND c::text = :c", True) == (
        "UPDATE t SET a = %(a)s WHERE b = ':b' AND c::text = %(c)s"
    )
    assert to_pyformat("SELECT length(CAST(body AS BLOB)) FROM m") == "SELECT octet_length(body) FROM m"


def test_a_url_is_shown_without_its_password():
    assert redact("postgresql://cao:s3cret@db.example:5433/cao?sslmode=require") == (
        "postgresql://cao:***@db.example:5433/cao?sslmode=require"
    )
    assert redact("postgresql://cao@/cao?host=/run/pg") == "postgresql://cao@/cao?host=/run/pg"


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    s = Store(pg_url, busy_timeout=0.5)
    _terminal(s, R1)
    _terminal(s, R2)
    yield s
    s.close()


def _hold(store: Store, *keys: str) -> tuple[threading.Event, threading.Event, threading.Thread]:
    """A write transaction with ``keys`` held open in a thread until ``release`` is set."""
    held, release = threading.Event(), threading.Event()

    def run() -> None:
        with store._write(*keys):
            held.set()
            release.wait(10)

    t = threading.Thread(target=run)
    t.start()
    assert held.wait(10)
    return held, release, t


def test_writes_about_different_receivers_run_side_by_side_and_one_receiver_queues(pg_store: Store):
    """A send to R2 commits while a transaction about R1 is open; a send to R1 waits for it (and,
    past the busy timeout, fails with nothing written); a write about no receiver runs alone."""
    other = Store(pg_store.location, busy_timeout=0.5)
    _, release, t = _hold(pg_store, R1)
    try:
        m, _ = other.add_message(sender_id="s", receiver_id=R2, body="to R2 while R1 is busy")
        assert other.claim(R2) is not None  # a claim is keyed too
        with pytest.raises(StoreBusy, match="nothing was written"):
            other.add_message(sender_id="s", receiver_id=R1, body="must wait for R1")
        with pytest.raises(StoreBusy):
            other.update_terminal(R2, mcp_ready_at=1.0)  # not keyed: waits for everyone
    finally:
        release.set()
        t.join()
    assert [x.body for x in other.list_messages(receiver_id=R1)] == []
    assert other.get_message(m.id or 0).status == "delivering"
    other.close()


def test_one_idempotency_key_raced_to_two_receivers_stores_one_message(pg_store: Store):
    """The two sends hold different receivers' locks, so the unique index decides: the loser runs
    again alone and is told the key was used for a different message."""
    barrier = threading.Barrier(2)
    out: dict[str, object] = {}

    def send(rid: str) -> None:
        s = Store(pg_store.location, busy_timeout=5)
        barrier.wait()
        try:
            out[rid] = s.add_message(sender_id="s", receiver_id=rid, body="same", idempotency_key="k")
        except Conflict as exc:
            out[rid] = exc
        finally:
            s.close()

    for _ in range(5):
        out.clear()
        with pg_store._write() as conn:
            conn.execute("DELETE FROM message")
        threads = [threading.Thread(target=send, args=(rid,)) for rid in (R1, R2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(type(v).__name__ for v in out.values()) == ["Conflict", "tuple"]
        assert len(pg_store.list_messages()) == 1


SENDER = """
import sys
import tempfile
from cao.store import Store
s = Store(sys.argv[1], busy_timeout=10)
for i in range(int(sys.argv[3])):
    s.add_message(sender_id=sys.argv[2], receiver_id=sys.argv[4 + i % 2], body=f"{sys.argv[2]}:{i}")
"""


def test_senders_on_many_connections_keep_each_receivers_order(pg_store: Store):
    """Four processes send to two receivers at once: every message stored once, and each
    receiver's ids follow each sender's order (ids are handed out under the receiver's lock)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", SENDER, str(pg_store.location), f"p{n}", "60", R1, R2])
        for n in range(4)
    ]
    assert [p.wait(60) for p in procs] == [0, 0, 0, 0]
    for rid in (R1, R2):
        got = pg_store.list_messages(receiver_id=rid, limit=1000, order="asc")
        assert len(got) == 120
        ids = [m.id or 0 for m in got]
        assert ids == sorted(ids)
        for n in range(4):
            mine = [int(m.body.split(":")[1]) for m in got if m.body.startswith(f"p{n}:")]
            assert mine == sorted(mine) and len(mine) == 30


def test_a_postgresql_restart_is_a_clear_503_and_the_store_comes_back(pg_server: PgServer):
    """While the server is down a send fails with nothing written, naming the server without its
    password; once it is back the same store works again on new connections."""
    root = Path(tempfile.mkdtemp(prefix="cao-pg-"))  # its own server: the shared one stays up
    server = PgServer.start(root)
    try:
        url = server.new_database().replace("postgresql://cao@", "postgresql://cao:hunter2@")
        store = Store(url, busy_timeout=1)
        _terminal(store, R1)
        store.add_message(sender_id="s", receiver_id=R1, body="before")
        server._run(str(server.bin / "pg_ctl"), "-D", str(server.data), "-m", "fast", "-w", "stop")
        with pytest.raises(StoreUnreachable) as down:
            store.add_message(sender_id="s", receiver_id=R1, body="while down")
        assert "nothing was written" in str(down.value) and "hunter2" not in str(down.value)
        assert "cao:***@" in str(down.value)
        server._start()
        store.add_message(sender_id="s", receiver_id=R1, body="after")
        assert [m.body for m in store.list_messages(receiver_id=R1, order="asc")] == ["before", "after"]
        store.close()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
