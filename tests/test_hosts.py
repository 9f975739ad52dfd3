"""Several cao-servers ("hosts") sharing one PostgreSQL store (cao/hosts.py, docs/multi-host.md).

Each host here is a real cao-server with its own CAO_HOME and its own tmux server, all on one
database of the test PostgreSQL server. A delivery is proven by the receiving agent's own record,
on the host whose tmux runs it."""

from __future__ import annotations

import contextlib
import secrets
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.helpers import REPO, ServerProcess, add_terminal_row, received_bodies, wait_until

pytestmark = pytest.mark.slow

TOKEN = secrets.token_urlsafe(24)
FAST_HOSTS = {
    "CAO_SCRIPTED_RECORD": "1",  # the agents keep what they received: the proof of each delivery
    "CAO_HOST_HEARTBEAT": "0.2",
    "CAO_HOST_LEASE": "1.5",
    # the sweep would find cross-host mail by itself after 30 s + 30 s: these tests must not lean on it
    "CAO_INBOX_RECONCILE_INTERVAL": "600",
    # one token shared by the hosts, as in a deployment: every forwarded request is signed with it
    "CAO_API_TOKEN": TOKEN,
}


class Hosts:
    """cao-servers on one database, each with its own home and tmux server; all stopped at the end."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.servers: dict[str, ServerProcess] = {}
        self.sockets: list[str] = []
        self._clients: dict[str, httpx.Client] = {}
        self.all: list[ServerProcess] = []  # every server started, also one a later start replaced

    def process(self, name: str, *, home: str | None = None, **env: str) -> ServerProcess:
        """A cao-server on the store (not started): its own home and tmux server."""
        sock = f"cao-test-{uuid.uuid4().hex[:8]}"
        self.sockets.append(sock)
        srv = ServerProcess(
            self.root / (home or name),
            sock,
            REPO,
            CAO_DATABASE_URL=self.url,
            CAO_HOST_NAME=name,
            **{**FAST_HOSTS, **env},
        )
        self.all.append(srv)
        return srv

    def start(self, name: str, *, home: str | None = None, **env: str) -> ServerProcess:
        srv = self.process(name, home=home, **env)
        self.servers[name] = srv
        return srv.start()

    def refused(self, name: str, home: str, match: str, **env: str) -> None:
        """A cao-server that must exit at start, saying ``match``."""
        with pytest.raises(AssertionError, match=match):
            self.process(name, home=home, **env).start()

    def client(self, name: str) -> httpx.Client:
        srv = self.servers[name]
        if name not in self._clients or self._clients[name].base_url != httpx.URL(srv.url):
            self._clients[name] = srv.client(token=True)
        return self._clients[name]

    def stop(self) -> None:
        for c in self._clients.values():
            c.close()
        for srv in self.all:
            srv.stop()
        for name in self.sockets:
            subprocess.run(["tmux", "-L", name, "kill-server"], capture_output=True)


@pytest.fixture
def hosts(tmp_path: Path, pg_url: str) -> Iterator[Hosts]:
    made = Hosts(tmp_path, pg_url)
    yield made
    made.stop()


def _launch(client: httpx.Client, **body: object) -> dict[str, object]:
    r = client.post("/sessions", json={"provider": "scripted", **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def _idle(client: httpx.Client, tid: str) -> bool:
    return client.get(f"/terminals/{tid}").json().get("status") == "idle"


def test_every_host_registers_and_lists_the_others(hosts: Hosts):
    for name in ("a", "b", "c"):
        hosts.start(name)
    for name in ("a", "b", "c"):
        listed = hosts.client(name).get("/hosts").json()
        assert [h["name"] for h in listed] == ["a", "b", "c"]
        assert all(h["alive"] and h["state"] == "up" for h in listed), listed
        assert [h["name"] for h in listed if h["this_host"]] == [name]
        assert hosts.client(name).get("/info").json()["host"] == name


def test_a_terminal_runs_on_the_host_named_and_every_host_reaches_it(hosts: Hosts):
    a, b, c = (hosts.start(n) for n in ("a", "b", "c"))
    term = _launch(hosts.client("a"), host="b")
    tid = str(term["id"])
    assert term["host"] == "b"
    # its pane is in b's tmux, and in no other host's
    panes = {
        n: subprocess.run(
            ["tmux", "-L", srv.socket_name, "list-panes", "-a", "-F", "#{@cao_terminal}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        for n, srv in hosts.servers.items()
    }
    assert tid in panes["b"] and tid not in panes["a"] and tid not in panes["c"], panes
    for name in ("a", "c"):  # status and output of b's terminal, read through a and c
        wait_until(lambda name=name: _idle(hosts.client(name), tid), timeout=20, what=f"idle via {name}")
        listed = {t["id"]: t for t in hosts.client(name).get("/terminals").json()}
        assert listed[tid]["status"] == "idle" and listed[tid]["host"] == "b"
        out = hosts.client(name).get(f"/terminals/{tid}/output", params={"mode": "full"})
        assert out.status_code == 200, out.text
    # mail from every host, each message once, to the agent on b
    markers = []
    for i, name in enumerate(["a", "b", "c"] * 3):
        marker = f"m{i}-{uuid.uuid4().hex[:6]}"
        markers.append(marker)
        r = hosts.client(name).post(
            f"/terminals/{tid}/inbox/messages", json={"message": marker, "sender_id": name}
        )
        assert r.status_code == 201, r.text
    wait_until(
        lambda: all(any(m in body for body in received_bodies(b.home, tid)) for m in markers),
        timeout=30,
        what="every message at the agent on b",
    )
    bodies = received_bodies(b.home, tid)
    assert all(sum(body.count(m) for body in bodies) == 1 for m in markers), bodies
    assert received_bodies(a.home, tid) == [] and received_bodies(c.home, tid) == []
    # typed input and delete go to b too
    r = hosts.client("c").delete(f"/terminals/{tid}")
    assert r.status_code == 200, r.text
    wait_until(
        lambda: (
            tid
            not in subprocess.run(
                ["tmux", "-L", b.socket_name, "list-panes", "-a", "-F", "#{@cao_terminal}"],
                capture_output=True,
                text=True,
            ).stdout
        ),
        what="its pane killed on b",
    )


def test_a_name_held_by_a_live_host_is_refused(hosts: Hosts):
    hosts.start("a")
    hosts.refused("a", "twin", "host name a is held by a running cao-server")
    listed = hosts.client("a").get("/hosts").json()
    assert len(listed) == 1 and listed[0]["alive"]


def test_a_host_that_stops_reads_unreachable_and_its_mail_waits_for_it(hosts: Hosts):
    hosts.start("a")
    b = hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    wait_until(lambda: _idle(hosts.client("a"), tid), timeout=20, what="idle")
    b.kill()  # no clean stop: its lease lapses
    wait_until(
        lambda: hosts.client("a").get(f"/terminals/{tid}").json().get("status") == "host_unreachable",
        timeout=10,
        what="host_unreachable",
    )
    wait_until(
        lambda: {h["name"]: h for h in hosts.client("a").get("/hosts").json()}["b"]["state"] == "lapsed",
        timeout=10,
        what="b's lease lapsed",
    )
    marker = f"held-{uuid.uuid4().hex[:6]}"
    r = hosts.client("a").post(f"/terminals/{tid}/inbox/messages", json={"message": marker})
    assert r.status_code == 201, r.text
    mid = r.json()["message_id"]
    msg = hosts.client("a").get(f"/messages/{mid}").json()
    assert msg["status"] == "pending" and "host" in str(msg.get("waiting_reason")), msg
    out = hosts.client("a").post(f"/terminals/{tid}/input", json={"message": "hello"})
    assert out.status_code == 503 and "host b" in out.json()["detail"], out.text
    b.start()  # the same home: it re-adopts its pane and delivers what waited, once
    wait_until(lambda: hosts.client("a").get(f"/messages/{mid}").json()["status"] == "delivered", timeout=20)
    assert sum(body.count(marker) for body in received_bodies(b.home, tid)) == 1


def test_an_operator_fails_a_host_that_is_down(hosts: Hosts):
    hosts.start("a")
    b = hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    r = hosts.client("a").post("/hosts/b/fail", json={"reason": "too soon"})
    assert r.status_code == 409 and "is up" in r.json()["detail"], r.text
    b.kill()
    wait_until(
        lambda: not {h["name"]: h for h in hosts.client("a").get("/hosts").json()}["b"]["alive"], timeout=10
    )
    mid = (
        hosts.client("a")
        .post(f"/terminals/{tid}/inbox/messages", json={"message": "lost"})
        .json()["message_id"]
    )
    r = hosts.client("a").post("/hosts/b/fail", json={"reason": "machine lost"})
    assert r.status_code == 200, r.text
    assert r.json()["terminals_gone"] == [tid] and r.json()["messages_failed"] == 1
    msg = hosts.client("a").get(f"/messages/{mid}").json()
    assert msg["status"] == "failed", msg
    # its name is free now, also for another machine or home
    hosts.start("b", home="b-new")
    assert {h["name"]: h for h in hosts.client("a").get("/hosts").json()}["b"]["alive"]


def test_a_host_another_home_held_is_refused_until_failed(hosts: Hosts):
    a = hosts.start("a")
    a.stop()  # a clean stop: nobody holds the name, but its terminals are still a's
    hosts.refused("a", "elsewhere", "belongs to a cao-server on another machine or CAO_HOME")


def test_a_cross_host_send_wakes_the_owning_host_at_once(hosts: Hosts):
    """With the sweep 10 minutes away and the receiver's log not watched (nothing was waiting),
    only the store's wake (LISTEN/NOTIFY) can bring the owning host to deliver."""
    hosts.start("a")
    b = hosts.start("b")
    tid = str(_launch(hosts.client("b"))["id"])
    wait_until(lambda: _idle(hosts.client("b"), tid), timeout=20, what="idle")
    marker = f"wake-{uuid.uuid4().hex[:6]}"
    r = hosts.client("a").post(f"/terminals/{tid}/inbox/messages", json={"message": marker})
    assert r.status_code == 201
    wait_until(lambda: any(marker in x for x in received_bodies(b.home, tid)), timeout=15, what="delivered")


@contextlib.contextmanager
def _hung_peer(hosts: Hosts, name: str) -> Iterator[list[socket.socket]]:
    """Host ``name``'s row points at a socket that accepts and never answers (its lease stays
    live); yields the connections it accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def hang() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    catcher = threading.Thread(target=hang)
    catcher.start()
    try:
        with psycopg.connect(hosts.url, autocommit=True) as conn:
            url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            conn.execute("UPDATE host SET url = %s WHERE name = %s", (url, name))
        yield accepted
    finally:
        stop.set()
        catcher.join()
        for sock in accepted:
            sock.close()
        listener.close()


# -- a host's clock, an older host, a newer store ---------------------------------------------------
def test_a_host_whose_clock_is_an_hour_off_writes_the_store_s_time(tmp_path: Path, pg_url: str):
    """Leases, deadlines and timestamps written by hosts with different clocks must agree: each
    host corrects its clock by the database server's."""
    from cao.clock import Clock
    from cao.hosts import Hosts as HostsOf
    from cao.hosts import StoreClock
    from cao.settings import Settings
    from cao.store import Store

    class AnHourAhead(Clock):
        def now(self) -> float:
            return time.time() + 3600

    clock = StoreClock(AnHourAhead())
    store = Store(pg_url, clock=clock.now)
    hosts = HostsOf(Settings(home=tmp_path, host_name="skewed"), store, clock, "tag", "0")
    try:
        assert abs(clock.now() - time.time() - 3600) < 1
        hosts.register()
        assert abs(clock.now() - time.time()) < 1  # the store's time now, not its own
        row = store.get_host("skewed")
        assert abs(row.heartbeat_at - time.time()) < 2 and row.lease_until > time.time()
    finally:
        hosts.stop()
        store.close()


def test_a_newer_cao_does_not_migrate_a_store_under_hosts_running_an_older_one(pg_url: str):
    from cao.errors import SchemaTooNew
    from cao.store import Store
    from cao.store.schema import SCHEMA_VERSION

    Store(pg_url).close()
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        old = SCHEMA_VERSION - 1
        conn.execute("UPDATE store_meta SET value = %s WHERE key = 'schema'", (old,))
        conn.execute(
            "INSERT INTO host (name, instance, machine, url, version, schema_version, pid, started_at, "
            "heartbeat_at, lease_until, state) VALUES ('old-1', 'i', 'm', 'http://old-1:9889', '0.0.9', "
            "%s, 1, 0, extract(epoch from now()), extract(epoch from now()) + 600, 'up')",
            (old,),
        )
    with pytest.raises(SchemaTooNew, match=r"old-1 \(cao 0.0.9, schema"):
        Store(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # its lease lapsed: migrating is fine
        conn.execute("UPDATE host SET lease_until = 0")
    Store(pg_url).close()


def test_a_host_stops_when_a_newer_cao_moved_the_store_on(hosts: Hosts):
    a = hosts.start("a")
    import psycopg

    with psycopg.connect(hosts.url, autocommit=True) as conn:
        conn.execute("UPDATE store_meta SET value = 999 WHERE key = 'schema'")
    assert a.proc is not None
    a.proc.wait(timeout=20)  # it exits by itself
    assert "moved to schema 999 by a newer cao" in a.log()


# -- what a hostile review found (each failed before its fix) ----------------------------------------
def _panes(srv: ServerProcess) -> list[str]:
    out = subprocess.run(
        ["tmux", "-L", srv.socket_name, "list-panes", "-a", "-F", "#{@cao_terminal} #{pane_dead}"],
        capture_output=True,
        text=True,
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.endswith(" 0")]


def test_a_session_on_two_hosts_is_deleted_on_each_once(hosts: Hosts):
    a, b = hosts.start("a"), hosts.start("b")
    here = _launch(hosts.client("a"), session_name="team")["id"]
    r = hosts.client("a").post("/sessions/team/terminals", json={"provider": "scripted", "host": "b"})
    assert r.status_code == 201, r.text
    there = r.json()["id"]
    r = hosts.client("b").delete("/sessions/team")  # it used to bounce between the two hosts
    assert r.status_code == 200, r.text
    assert sorted(r.json()["deleted_terminals"]) == sorted([here, there])
    wait_until(lambda: here not in _panes(a) and there not in _panes(b), what="both panes killed")


def test_a_forged_forwarded_request_never_touches_another_host_s_terminal(hosts: Hosts):
    hosts.start("a")
    b = hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    forged = {"X-Cao-Forwarded": "1"}
    r = hosts.client("a").delete(f"/terminals/{tid}", headers=forged)
    assert r.status_code == 409 and "runs on host b" in r.json()["detail"], r.text
    r = hosts.client("a").post("/sessions", json={"host": "b"}, headers=forged)
    assert r.status_code == 409 and "reached host a" in r.json()["detail"], r.text
    r = hosts.client("a").get("/terminals", params={"host": "b"}, headers=forged)
    assert r.status_code == 409, r.text
    wait_until(lambda: _idle(hosts.client("b"), tid), timeout=20, what="still there, on b")
    assert tid in _panes(b)


def test_a_session_name_is_taken_once_any_host_runs_it(hosts: Hosts):
    hosts.start("a")
    hosts.start("b")
    _launch(hosts.client("b"), session_name="team")
    r = hosts.client("a").post("/sessions", json={"provider": "scripted", "session_name": "team"})
    assert r.status_code == 422 and "already exists" in r.json()["detail"], r.text
    assert hosts.client("a").get("/sessions/team").json()["status"] == "active"


def test_a_url_a_live_host_is_reached_at_is_refused(hosts: Hosts):
    a = hosts.start("a")
    hosts.refused("copycat", "copycat", "is where host a is reached", CAO_SERVER_URL=a.url)


def test_a_host_that_hangs_is_waited_for_once_not_by_every_request(hosts: Hosts):
    hosts.start("a")
    hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    with _hung_peer(hosts, "b") as accepted:
        first = hosts.client("a").get(f"/terminals/{tid}/output")
        assert first.status_code == 503 and "did not answer" in first.json()["detail"], first.text
        second = hosts.client("a").get(f"/terminals/{tid}/output")
        assert second.status_code == 503, second.text
        assert len(accepted) == 1  # the second was answered without asking b again


def test_a_second_process_of_the_same_machine_and_home_waits_for_a_lease_that_goes_on(
    tmp_path: Path, pg_url: str
):
    """A cloned machine (the same machine id and home path, another filesystem) must not take over
    a live host: only a lease that lapses proves its holder gone."""
    from cao.clock import SYSTEM
    from cao.errors import Conflict
    from cao.hosts import Hosts as HostsOf
    from cao.hosts import StoreClock
    from cao.settings import Settings
    from cao.store import Store

    settings = Settings(home=tmp_path, host_name="twin", host_heartbeat=0.1, host_lease=0.6)
    made: list[tuple[HostsOf, Store]] = []

    def host() -> HostsOf:
        clock = StoreClock(SYSTEM)
        store = Store(pg_url, clock=clock.now)
        h = HostsOf(settings, store, clock, "same-home", "0")
        made.append((h, store))
        return h

    try:
        first = host()
        first.register()
        first.start()
        with pytest.raises(Conflict, match="held by a running cao-server"):
            host().register()
        first._stop.set()  # its heartbeat stops, as at a kill -9: the lease lapses, then it is taken
        for thread in first._threads:
            thread.join()
        third = host()
        third.register()
        assert third.store.get_host("twin").instance == third.instance
    finally:
        for h, store in made:
            h._stop.set()
            store.close()


def test_message_ids_past_32_bits_are_kept_on_postgresql(tmp_path: Path, pg_url: str):
    import sqlite3

    from cao.store import Store
    from cao.store.copy import copy_store

    src = tmp_path / "cao.db"
    store = Store(src)
    store.close()
    big = 2**31 + 5
    with sqlite3.connect(src) as conn:
        conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('message', ?)", (big,))
    store = Store(src)
    add_terminal_row(store, "aaaa0001")
    m, _ = store.add_message(sender_id="cli", receiver_id="aaaa0001", body="far")
    store.close()
    assert m.id == big + 1
    copy_store(src, pg_url, host="h")
    target = Store(pg_url)
    try:
        assert target.get_message(big + 1).body == "far"
        again, _ = target.add_message(sender_id="cli", receiver_id="aaaa0001", body="after")
        assert again.id == big + 2
        assert [e.message_id for e in target.timeline("aaaa0001")][-1] == big + 2
    finally:
        target.close()


# -- the second review (of the first review's fixes) -------------------------------------------------
def test_a_hung_host_holds_at_most_a_few_threads_of_the_others(hosts: Hosts):
    from cao.hosts import PER_HOST_REQUESTS

    hosts.start("a")
    hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    with _hung_peer(hosts, "b") as accepted:
        codes: list[int] = []

        def ask() -> None:
            with hosts.servers["a"].client(token=True) as c:
                codes.append(c.get(f"/terminals/{tid}/output").status_code)

        askers = [threading.Thread(target=ask) for _ in range(20)]
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        assert codes == [503] * 20
        assert len(accepted) <= PER_HOST_REQUESTS, len(accepted)


def test_a_host_that_lost_its_name_stops_even_with_a_dashboard_open(hosts: Hosts):
    import threading

    hosts.start("a")
    b = hosts.start("b")
    opened = threading.Event()

    def watch() -> None:  # the dashboard's event stream: it never ends by itself
        try:
            with b.client(token=True) as c, c.stream("GET", "/events", timeout=None) as r:
                opened.set()
                for _ in r.iter_bytes():
                    pass
        except httpx.HTTPError:
            pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert opened.wait(10)
    import psycopg

    with psycopg.connect(hosts.url, autocommit=True) as conn:
        conn.execute("UPDATE host SET state = 'failed', note = 'test' WHERE name = 'b'")
    assert b.proc is not None
    b.proc.wait(timeout=30)  # fenced: it stops, stream or not
    assert "lost its host name" in b.log()
    watcher.join(timeout=10)


def test_a_failed_host_s_terminals_and_sessions_can_be_deleted(hosts: Hosts):
    hosts.start("a")
    b = hosts.start("b")
    here = str(_launch(hosts.client("a"), session_name="mixed")["id"])
    r = hosts.client("a").post("/sessions/mixed/terminals", json={"provider": "scripted", "host": "b"})
    there = r.json()["id"]
    lone = str(_launch(hosts.client("a"), host="b")["id"])
    b.kill()
    wait_until(lambda: _state_of(hosts.client("a"), "b") == "lapsed", timeout=10, what="b lapsed")
    assert hosts.client("a").post("/hosts/b/fail", json={"reason": "gone"}).status_code == 200
    listed = {t["id"]: t["status"] for t in hosts.client("a").get("/terminals").json()}
    assert listed[there] == "gone" and listed[lone] == "gone"
    r = hosts.client("a").delete(f"/terminals/{lone}")
    assert r.status_code == 200, r.text
    r = hosts.client("a").delete("/sessions/mixed")
    assert r.status_code == 200, r.text
    assert sorted(r.json()["deleted_terminals"]) == sorted([here, there])


def _state_of(client: httpx.Client, name: str) -> str | None:
    return next((h["state"] for h in client.get("/hosts").json() if h["name"] == name), None)


def test_a_session_delete_with_a_host_down_says_what_it_deleted(hosts: Hosts):
    hosts.start("a")
    hosts.start("b")
    c = hosts.start("c")
    _launch(hosts.client("a"), session_name="three")
    ids = {}
    for name in ("b", "c"):
        r = hosts.client("a").post("/sessions/three/terminals", json={"provider": "scripted", "host": name})
        ids[name] = r.json()["id"]
    c.kill()
    wait_until(lambda: _state_of(hosts.client("a"), "c") == "lapsed", timeout=10, what="c lapsed")
    r = hosts.client("a").delete("/sessions/three")
    assert r.status_code == 503, r.text
    detail = r.json()["detail"]
    assert ids["b"] in detail and "host c" in detail, detail
    listed = {t["id"] for t in hosts.client("a").get("/terminals").json()}
    assert ids["b"] not in listed and ids["c"] in listed


def test_two_hosts_creating_one_new_session_at_once_make_it_once(hosts: Hosts):
    import threading

    hosts.start("a")
    hosts.start("b")
    for i in range(6):
        name = f"race{i}"
        codes: dict[str, int] = {}

        def create(host: str, name: str = name, codes: dict[str, int] = codes) -> None:
            with hosts.servers[host].client(token=True) as c:
                codes[host] = c.post(
                    "/sessions", json={"provider": "scripted", "session_name": name}
                ).status_code

        both = [threading.Thread(target=create, args=(h,)) for h in ("a", "b")]
        for t in both:
            t.start()
        for t in both:
            t.join()
        assert sorted(codes.values()) == [201, 422], codes


def test_an_older_postgresql_store_s_id_columns_are_widened(pg_url: str):
    import psycopg

    from cao.store import Store
    from cao.store.schema import SCHEMA_VERSION

    Store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as schema 13 left them
        conn.execute("ALTER TABLE message_event ALTER COLUMN message_id TYPE integer")
        conn.execute("ALTER TABLE terminal ALTER COLUMN ack_cursor TYPE integer")
        conn.execute("UPDATE store_meta SET value = %s WHERE key = 'schema'", (SCHEMA_VERSION - 1,))
    Store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        types = dict(
            conn.execute(
                "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
                "WHERE column_name IN ('message_id', 'ack_cursor')"
            ).fetchall()
        )
    assert types["message_event.message_id"] == "bigint" and types["terminal.ack_cursor"] == "bigint"


@contextlib.contextmanager
def _catching_peer(hosts: Hosts, name: str) -> Iterator[list[bytes]]:
    """Host ``name``'s row points at a socket that reads each request whole, keeps its bytes and
    answers 502: what a database writer who re-pointed a row would get."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    caught: list[bytes] = []
    stop = threading.Event()

    def catch() -> None:
        while not stop.is_set():
            try:
                conn = listener.accept()[0]
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536) or b"\r\n\r\n"
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    body += conn.recv(65536)
                caught.append(head + b"\r\n\r\n" + body)
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    catcher = threading.Thread(target=catch)
    catcher.start()
    try:
        with psycopg.connect(hosts.url, autocommit=True) as conn:
            url = f"http://127.0.0.1:{listener.getsockname()[1]}"
            conn.execute("UPDATE host SET url = %s WHERE name = %s", (url, name))
        yield caught
    finally:
        stop.set()
        catcher.join()
        listener.close()


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    """``request`` sent as it is to 127.0.0.1:port: the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_a_row_pointed_elsewhere_gets_a_signature_it_cannot_use_never_the_token(hosts: Hosts):
    """Whoever can write the hosts table decides where a forwarded request goes. What arrives there
    is signed for that address and that request: no token, and nothing that works on a real host."""
    hosts.start("a")
    b = hosts.start("b")
    tid = str(_launch(hosts.client("a"), host="b")["id"])
    wait_until(lambda: _idle(hosts.client("b"), tid), timeout=20, what="b's agent idle")
    with _catching_peer(hosts, "b") as caught:
        r = hosts.client("a").post(f"/terminals/{tid}/input", json={"message": "planted command"})
        assert r.status_code == 502, r.text  # the catcher's answer, passed back as it came
    assert len(caught) == 1
    request = caught[0]
    assert TOKEN.encode() not in request and b"authorization" not in request.lower()
    assert b"x-cao-peer: v1 " in request.lower() and b"planted command" in request
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    # sent on as it came: b does not answer to the catcher's address
    status, _ = _raw(b.port, request)
    assert status == 400
    # its Host rewritten to b's: the signature covered the Host it was sent to
    rehosted = b"\r\n".join(
        [lines[0]]
        + [ln if not ln.lower().startswith(b"host:") else b"host: 127.0.0.1:%d" % b.port for ln in lines[1:]]
    )
    status, answer = _raw(b.port, rehosted + b"\r\n\r\n" + body)
    assert status == 401 and b"bad peer signature" in answer, answer
    assert "planted command" not in hosts.client("b").get(f"/terminals/{tid}/output").json()["output"]


def test_a_signed_request_is_good_once_fresh_and_for_exactly_what_was_signed(hosts: Hosts):
    from cao import peerauth

    b = hosts.start("b")
    tid = str(_launch(hosts.client("b"))["id"])
    host = f"127.0.0.1:{b.port}"
    path = f"/terminals/{tid}/output?mode=last".encode()

    def ask(header: str, target: bytes = path, token_free: bool = True) -> tuple[int, bytes]:
        request = b"GET %s HTTP/1.1\r\nhost: %s\r\nx-cao-peer: %s\r\nconnection: close\r\n\r\n" % (
            target,
            host.encode(),
            header.encode(),
        )
        assert token_free and TOKEN.encode() not in request
        return _raw(b.port, request)

    now = time.time()
    signed = peerauth.sign(TOKEN, "GET", host, path, b"", now, to="b")
    assert ask(signed)[0] == 200
    status, answer = ask(signed)  # the same bytes again: a replay
    assert status == 401 and b"replayed" in answer, answer
    fresh = peerauth.sign(TOKEN, "GET", host, path, b"", now, to="b")
    status, answer = ask(fresh, f"/terminals/{tid}/output?mode=full".encode())  # another query
    assert status == 401 and b"bad peer signature" in answer, answer
    status, answer = ask(peerauth.sign("not-the-token", "GET", host, path, b"", now, to="b"))
    assert status == 401 and b"bad peer signature" in answer, answer
    old = peerauth.sign(TOKEN, "GET", host, path, b"", now - 3 * peerauth.WINDOW, to="b")  # a clock far off
    status, answer = ask(old)
    assert status == 401 and b"clocks disagree" in answer, answer
    status, answer = ask("v1 t=1 n=zz s=00")
    assert status == 401 and b"malformed" in answer, answer


# -- review h6: a process that lost its name, a clock that steps, a gone worker's work ----------------
def _status(client: httpx.Client, tid: str) -> str:
    return str(client.get(f"/terminals/{tid}").json().get("status"))


def test_a_process_frozen_past_its_lease_writes_nothing_for_the_name_it_lost(hosts: Hosts):
    """Host b's process is frozen (a paused VM, a closed lid) past its lease; the operator fails b
    and starts b elsewhere (another home), which launches an agent. When the old process wakes, it
    still believes the new agent is its own and finds no pane for it in its tmux: it must write
    nothing (not 'gone', not failed mail) and stop."""
    from tests.helpers import write_rules

    hosts.start("a")
    old = hosts.start("b", CAO_HOST_LEASE="6")
    a = hosts.client("a")
    assert old.proc is not None
    old.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _state_of(a, "b") == "lapsed", timeout=20, what="old b lapsed")
        assert a.post("/hosts/b/fail", json={"reason": "machine unplugged"}).status_code == 200
        write_rules(
            hosts.root / "b-new",
            "developer",
            {"record": True, "rules": [{"match": "^slow$", "delay": 60, "reply": "done"}]},
        )
        new = hosts.start("b", home="b-new")
        tid = str(_launch(a, host="b")["id"])
        wait_until(lambda: _status(a, tid) == "idle", timeout=20, what="new b's agent idle")
        assert a.post(f"/terminals/{tid}/inbox/messages", json={"message": "slow"}).status_code == 201
        wait_until(lambda: _status(a, tid) == "processing", timeout=20, what="new b's agent busy")
        r = a.post(f"/terminals/{tid}/inbox/messages", json={"message": "then this"})
        assert r.status_code == 201, r.text
        waiting = r.json()["message_id"]
    finally:
        old.proc.send_signal(signal.SIGCONT)  # the old b wakes up, and must stop
    old.proc.wait(timeout=30)
    assert "lost its host name" in old.log()
    assert _status(a, tid) == "processing"
    assert a.get(f"/messages/{waiting}").json()["status"] == "pending"
    assert received_bodies(new.home, tid) == ["slow"]


class _Stepped:
    """A host's wall clock that NTP steps by ``step`` seconds (its monotonic clock goes on), and
    a monotonic clock that stood still ``slept`` seconds while the machine was suspended (after
    which every reading costs 1 ms: the round trips after the wake are the slower ones)."""

    def __init__(self) -> None:
        self.step = 0.0
        self.slept = 0.0

    def now(self) -> float:
        return time.time() + self.step

    def monotonic(self) -> float:
        if self.slept:
            time.sleep(0.001)
        return time.monotonic() - self.slept

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _db_now(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        return float(conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0])


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_step_of_a_host_s_clock_moves_neither_its_lease_nor_the_time_it_writes(
    tmp_path: Path, pg_url: str, step: float
):
    from cao.errors import Conflict
    from cao.hosts import Hosts as HostsOf
    from cao.hosts import StoreClock
    from cao.settings import Settings
    from cao.store import Store

    wall = _Stepped()
    clock = StoreClock(wall)  # type: ignore[arg-type]
    store = Store(pg_url, clock=clock.now)
    operator = Store(pg_url)
    settings = Settings(home=tmp_path, host_name="stepped", server_url="http://stepped.invalid:9889")
    hosts = HostsOf(settings, store, clock, "tag", "0")
    try:
        hosts.register()
        for _ in range(7):  # the samples of a host that ran a while
            hosts.measure_clock()
        assert hosts.heartbeat()
        wall.step = step  # NTP corrects an hour, a VM resumes
        assert abs(clock.now() - _db_now(pg_url)) < 1  # at once, before any new sample
        assert hosts.heartbeat()
        ahead = store.get_host("stepped").lease_until - _db_now(pg_url)
        assert 0 < ahead <= settings.host_lease, ahead
        with pytest.raises(Conflict):  # its lease is live: no operator may fail it
            operator.fail_host("stepped", reason="looked lapsed")
    finally:
        hosts.stop()
        store.close()
        operator.close()


@pytest.mark.parametrize("how", ["terminal", "session"])
def test_a_gone_worker_deleted_through_another_host_keeps_its_work(hosts: Hosts, tmp_path: Path, how: str):
    """Its worktree is on its host's disk: the delete is that host's, which commits the unsaved
    work on the worker's branch, as when it is asked directly."""
    from tests.test_worktrees import git

    proj = tmp_path / "proj"
    proj.mkdir()
    git(proj, "init", "-q", "-b", "main")
    (proj / "app.py").write_text("one\n")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "initial")
    hosts.start("a")
    b = hosts.start("b")
    r = hosts.client("a").post(
        "/sessions",
        json={
            "provider": "scripted",
            "host": "b",
            "session_name": "work",
            "working_directory": str(proj),
            "use_worktree": True,
        },
    )
    assert r.status_code == 201, r.text
    tid, tree = r.json()["id"], r.json()["worktree"]
    (Path(tree["path"]) / "app.py").write_text("one\ntwo: unsaved work\n")
    panes = subprocess.run(
        ["tmux", "-L", b.socket_name, "list-panes", "-a", "-F", "#{pane_id}"], capture_output=True, text=True
    ).stdout.split()
    for pane in panes:  # its agent dies: b finds it gone
        subprocess.run(["tmux", "-L", b.socket_name, "kill-pane", "-t", pane], capture_output=True)
    wait_until(lambda: _status(hosts.client("b"), tid) == "gone", timeout=20, what="gone")
    if how == "terminal":
        r = hosts.client("a").delete(f"/terminals/{tid}")
    else:
        r = hosts.client("a").delete("/sessions/work")
    assert r.status_code == 200, r.text
    rows = {w["terminal_id"]: w for w in hosts.client("a").get("/worktrees").json()}
    assert rows[tid]["state"] != "active", rows[tid]
    assert len(git(proj, "log", "--oneline", tree["branch"]).splitlines()) == 2  # the work, committed


def test_a_host_that_slept_follows_the_database_s_clock_from_its_first_sample_after(
    tmp_path: Path, pg_url: str
):
    """A suspended machine's monotonic clock stands still: the first sample after the wake
    contradicts every older one, which all go (the fastest of them would say an hour ago)."""
    from cao.hosts import Hosts as HostsOf
    from cao.hosts import StoreClock
    from cao.settings import Settings
    from cao.store import Store

    wall = _Stepped()
    clock = StoreClock(wall)  # type: ignore[arg-type]
    store = Store(pg_url, clock=clock.now)
    settings = Settings(home=tmp_path, host_name="sleeper", server_url="http://sleeper.invalid:9889")
    hosts = HostsOf(settings, store, clock, "tag", "0")
    try:
        hosts.register()
        for _ in range(7):
            hosts.measure_clock()
        wall.slept = 3600.0  # an hour suspended
        assert abs(clock.now() - _db_now(pg_url) + 3600) < 1  # until it looks again
        assert hosts.heartbeat()
        assert abs(clock.now() - _db_now(pg_url)) < 1
    finally:
        hosts.stop()
        store.close()


def _held_by(store: Any, url: str) -> None:
    """Terminal 0000f00d on host h, whose row names ``store``'s process (instance 'mine')."""
    add_terminal_row(store, "0000f00d")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO host (name, instance, machine, url, version, schema_version, pid, started_at, "
            "heartbeat_at, lease_until, state) VALUES ('h', 'mine', 'm', 'http://h:9889', '0', 14, 1, 0, "
            "extract(epoch from now()), extract(epoch from now()) + 600, 'up')"
        )
        conn.execute("UPDATE terminal SET host = 'h'")
    store.host, store.host_instance = "h", "mine"


def test_a_store_whose_host_row_names_another_process_writes_nothing(pg_url: str):
    """The fence every write of a shared store checks: a keyed write (a send) and a keyless one
    (a terminal found gone) are refused once the row names another instance, nothing written,
    and the host is told at once."""
    from cao.errors import HostFenced
    from cao.store import Store

    store = Store(pg_url)
    try:
        _held_by(store, pg_url)
        lost: list[bool] = []
        store.on_host_lost = lambda: lost.append(True)
        store.add_message(sender_id="op", receiver_id="0000f00d", body="while it holds the name")
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("UPDATE host SET instance = 'another'")  # a new process took the name
        with pytest.raises(HostFenced, match="no longer holds host name h"):
            store.add_message(sender_id="op", receiver_id="0000f00d", body="after")
        with pytest.raises(HostFenced):
            store.mark_gone("0000f00d", "no pane in this tmux")
        assert lost == [True, True]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert [r[0] for r in conn.execute("SELECT body FROM message")] == ["while it holds the name"]
            assert conn.execute("SELECT state FROM terminal").fetchone()[0] != "gone"
    finally:
        store.close()


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read", "serializable"])
def test_a_name_taken_while_a_write_waits_for_the_store_lock_fences_that_write(pg_url: str, isolation: str):
    """The fence holds whatever the database's default isolation: a write that waited for the
    store lock while another process took the name sees the change and writes nothing."""
    from cao.errors import HostFenced
    from cao.store import Store
    from cao.store.backend import STORE_LOCK

    database = psycopg.conninfo.conninfo_to_dict(pg_url)["dbname"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{isolation}'")
    store = Store(pg_url)
    try:
        _held_by(store, pg_url)
        store.on_host_lost = lambda: None
        with psycopg.connect(pg_url, autocommit=True) as taker:  # register_host's shape
            taker.execute("BEGIN")
            taker.execute("SELECT pg_advisory_xact_lock(%s)", (STORE_LOCK,))
            taker.execute("UPDATE host SET instance = 'another'")
            outcome: list[object] = []

            def send() -> None:
                try:
                    store.add_message(sender_id="op", receiver_id="0000f00d", body="by the fenced process")
                    outcome.append("committed")
                except HostFenced as exc:
                    outcome.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            wait_until(
                lambda: (
                    taker.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    ).fetchone()[0]
                    > 0
                ),
                timeout=10,
                what="the send waiting for the store lock",
            )
            taker.execute("COMMIT")
            sender.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], HostFenced), outcome
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM message").fetchone()[0] == 0
    finally:
        store.close()


def _stores_at_once(url: str, n: int) -> tuple[list[Any], list[BaseException]]:
    """``n`` stores opened on ``url`` at the same moment: those that opened, and the errors."""
    from cao.store import Store

    stores: list[Any] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(n)

    def start() -> None:
        gate.wait()
        try:
            stores.append(Store(url))
        except BaseException as exc:
            errors.append(exc)

    starters = [threading.Thread(target=start) for _ in range(n)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(30)
    return stores, errors


def test_hosts_starting_at_once_on_an_empty_database_make_its_tables_once(pg_url: str):
    """A fleet's first boot: one creates the tables, the others find them (none fails)."""
    from cao.store.schema import SCHEMA_VERSION

    for _round in range(3):
        with psycopg.connect(pg_url, autocommit=True) as conn:  # empty again
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
        stores, errors = _stores_at_once(pg_url, 3)
        try:
            assert errors == [] and len(stores) == 3, errors
            assert {s.schema_version() for s in stores} == {SCHEMA_VERSION}
        finally:
            for s in stores:
                s.close()


def test_a_forged_row_sends_nothing_to_another_host_s_agent(hosts: Hosts):
    """A database writer points host b's row at host c: a request meant for b's agent must reach
    no agent of c's — not by c's plain address (signed for b: c refuses it), and not by an address
    carrying a path and query that would swallow the forwarded path (never sent)."""
    a, b, c = hosts.start("a"), hosts.start("b"), hosts.start("c")
    on_b = str(_launch(hosts.client("a"), host="b")["id"])
    on_c = str(_launch(hosts.client("a"), host="c")["id"])
    for tid, name in ((on_b, "b"), (on_c, "c")):
        wait_until(lambda tid=tid, name=name: _idle(hosts.client(name), tid), timeout=20, what="idle")
    forged = {
        "plain": f"http://127.0.0.1:{c.port}",
        "path and query": f"http://127.0.0.1:{c.port}/terminals/{on_c}/input?x=",
    }
    for how, url in forged.items():
        with psycopg.connect(hosts.url, autocommit=True) as conn:
            conn.execute("UPDATE host SET url = %s WHERE name = 'b'", (url,))
        r = hosts.client("a").post(f"/terminals/{on_b}/input", json={"message": f"for b only ({how})"})
        assert r.status_code == 503, (how, r.text)
        detail = r.json()["detail"]
        assert ("not signed for host c" if how == "plain" else "not a plain") in detail, (how, detail)
        r = hosts.client("a").delete(f"/terminals/{on_b}")
        assert r.status_code == 503, (how, r.text)
    out = hosts.client("c").get(f"/terminals/{on_c}/output", params={"mode": "full"}).json()["output"]
    assert "for b only" not in out
    listed = {t["id"]: t for t in hosts.client("c").get("/terminals").json()}
    assert listed[on_c]["status"] == "idle" and on_b in listed
    assert a.proc is not None and b.proc is not None


def test_a_host_that_speaks_another_peer_protocol_is_not_joined(hosts: Hosts):
    """A cao from before signed requests (peer protocol 1) still up on the store: a newer one
    refuses to start beside it instead of joining a fleet it can't talk to."""
    hosts.start("a")
    with psycopg.connect(hosts.url, autocommit=True) as conn:
        conn.execute("UPDATE host SET protocol = 1 WHERE name = 'a'")  # what an older cao writes
    hosts.refused("b", "b", match="another peer protocol.*a \\(cao .*peer protocol 1\\)")
    with psycopg.connect(hosts.url, autocommit=True) as conn:
        conn.execute("UPDATE host SET protocol = 2 WHERE name = 'a'")
    hosts.start("b")


def test_a_server_url_with_a_path_is_refused_at_start(hosts: Hosts):
    hosts.refused("a", "a", match="not a plain http", CAO_SERVER_URL="http://127.0.0.1:9/cao/?x=")


def test_a_host_whose_address_reaches_another_host_stops_saying_so(hosts: Hosts):
    """Two hosts given one address, spelled differently (``localhost`` for ``127.0.0.1``): the
    newcomer asks its own address who answers, finds the other host, and stops."""
    b = hosts.start("b")
    twin = hosts.process("twin", CAO_SERVER_URL=f"http://localhost:{b.port}")
    with contextlib.suppress(AssertionError):  # it may stop before its first health check
        twin.start()
    assert twin.proc is not None
    wait_until(
        lambda: twin.proc is not None and twin.proc.poll() is not None, timeout=30, what="twin stopped"
    )
    assert "reaches host b, not this one" in twin.log()
    assert _alive_host(hosts.client("b"), "b")


def _alive_host(client: httpx.Client, name: str) -> bool:
    return any(h["name"] == name and h["alive"] for h in client.get("/hosts").json())


@contextlib.contextmanager
def _host_rewriting_proxy(to_port: int) -> Iterator[int]:
    """A reverse proxy on a free loopback port that passes each request to ``to_port`` with its
    Host header rewritten (nginx's default, ``Host: $proxy_host``); yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = next(
                (int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:")), 0
            )
            while len(body) < length:
                body += conn.recv(65536)
            lines = [lines[0]] + [
                b"host: 127.0.0.1:%d" % to_port if x.lower().startswith(b"host:") else x
                for x in lines[1:]
                if not x.lower().startswith(b"connection:")
            ]
            with socket.create_connection(("127.0.0.1", to_port), timeout=10) as up:
                up.sendall(b"\r\n".join([*lines, b"connection: close"]) + b"\r\n\r\n" + body)
                while chunk := up.recv(65536):
                    conn.sendall(chunk)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn = listener.accept()[0]
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        acceptor.join()
        listener.close()


def test_a_host_behind_a_proxy_that_rewrites_host_is_warned_not_stopped(hosts: Hosts):
    """Its own signed request comes back refused by itself (the proxy changed the Host the
    signature covers): that is no other cao-server; the host goes on, with a warning that says
    what to fix."""
    srv = hosts.process("a")
    with _host_rewriting_proxy(srv.port) as proxy_port:
        srv.env["CAO_SERVER_URL"] = f"http://127.0.0.1:{proxy_port}"
        hosts.servers["a"] = srv.start()
        wait_until(lambda: "refused its own signed request" in srv.log(), timeout=30, what="the warning")
        assert srv.proc is not None and srv.proc.poll() is None
        assert _alive_host(hosts.client("a"), "a")


def test_a_store_is_found_anywhere_on_the_search_path(pg_url: str):
    """A DBA adds a schema named after the role (first on PostgreSQL's default search path,
    ``"$user", public``): the store in ``public`` is still the store, not replaced by a new one."""
    from cao.store import Store

    store = Store(pg_url)
    add_terminal_row(store, "0000beef")
    store.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        role = conn.execute("SELECT current_user").fetchone()[0]
        conn.execute(f'CREATE SCHEMA "{role}"')
    store = Store(pg_url)
    try:
        assert [t.id for t in store.list_terminals()] == ["0000beef"]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            schemas = conn.execute(
                "SELECT DISTINCT table_schema FROM information_schema.tables WHERE table_name = 'store_meta'"
            ).fetchall()
        assert schemas == [("public",)]
    finally:
        store.close()
