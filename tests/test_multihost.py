"""Three hosts, each in its own network namespace with its own tmux server and address, sharing one
PostgreSQL server (tests/netlab.py): cross-host sends under load while a host is killed -9, a host
is cut off for 20 s and the database restarts — counted by the receiving agents' own records.

What must hold: every message a sender got a receipt for arrives exactly once, at the agent it was
sent to, on the host whose tmux runs that agent; nothing arrives that nobody sent."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cao.testing.pgserver import PgServer, missing_reason
from tests.helpers import REPO, read_records, wait_until
from tests.netlab import HUB_ADDR, Lab, Proxy, lab_problem

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOSTS = 3
RECEIVERS_PER_HOST = 10
SENDERS_PER_HOST = 2
MESSAGES = 5040  # over 6 senders: 840 each, 168 per receiver
PORT = 9889


class Host:
    def __init__(self, lab: Lab, i: int, home: Path, db_url: str, token: str) -> None:
        self.lab, self.i, self.home = lab, i, home
        self.name = f"h{i}"
        self.url = f"http://{lab.addr(i)}:{PORT}"
        self.socket = f"cao-test-{uuid.uuid4().hex[:8]}"
        self.env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(home / "home"),
            "LANG": "C.UTF-8",
            "CAO_HOME": str(home),
            "CAO_TMUX_SOCKET": self.socket,
            "CAO_DATABASE_URL": db_url,
            "CAO_API_TOKEN": token,
            "CAO_HOST_NAME": self.name,
            "CAO_SERVER_URL": self.url,
            "CAO_SCRIPTED_RECORD": "1",
            "CAO_HOST_HEARTBEAT": "0.5",
            "CAO_HOST_LEASE": "3",
            "CAO_INBOX_RECONCILE_INTERVAL": "5",
            "CAO_INBOX_RECONCILE_GRACE_SECONDS": "5",
            "CAO_DB_BUSY_TIMEOUT": "3",
        }
        (home / "home").mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.proxy = Proxy(lab, i, token)

    def start(self) -> None:
        log = open(self.home / "server.stderr", "ab")  # noqa: SIM115 - closed by the process's end
        self.proc = self.lab.popen(
            self.i,
            [sys.executable, "-m", "cao.server", "--host", self.lab.addr(self.i), "--port", str(PORT)],
            env=self.env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        wait_until(self._healthy, timeout=30, what=f"{self.name} healthy")

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited: {(self.home / 'server.stderr').read_text()[-2000:]}")
        return self.api("GET", "/health")[0] == 200

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.proxy.request(method, self.url + path, body)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Lab, PgServer, list[Host]]]:
    why = lab_problem() or missing_reason()
    if why is not None:
        pytest.skip(why)
    net = Lab(HOSTS).start()
    pg_root = Path(tempfile.mkdtemp(prefix="cao-pg-lab-"))  # the postgres user can't enter tmp_path
    pg: PgServer | None = None
    hosts: list[Host] = []
    try:
        pg = PgServer.start(pg_root, netns=net.argv(0, []), listen=HUB_ADDR, trust=f"{HUB_ADDR}/24")
        url = pg.new_database()
        name = url.split("/")[3].split("?")[0]
        db_url = f"postgresql://cao@{HUB_ADDR}:5432/{name}"
        token = secrets.token_urlsafe(24)
        hosts = [Host(net, i, tmp_path / f"h{i}", db_url, token) for i in range(1, HOSTS + 1)]
        for h in hosts:
            h.start()
        yield net, pg, hosts
    finally:
        for h in hosts:
            h.stop()
        if pg is not None:
            pg.stop()
        net.stop()
        shutil.rmtree(pg_root, ignore_errors=True)


def _state_of(asker: Host, name: str) -> str | None:
    status, hosts = asker.api("GET", "/hosts")
    return next((h["state"] for h in hosts if h["name"] == name), None) if status == 200 else None


def _receivers(hosts: list[Host]) -> dict[str, Host]:
    """RECEIVERS_PER_HOST agents on every host, each created through another host's API."""
    owner: dict[str, Host] = {}
    for h in hosts:
        asker = hosts[h.i % len(hosts)]  # the next host asks for it: creation is forwarded
        for _ in range(RECEIVERS_PER_HOST):
            status, term = asker.api("POST", "/sessions", {"provider": "scripted", "host": h.name})
            assert status == 201, term
            assert term["host"] == h.name
            owner[term["id"]] = h
    for tid, h in owner.items():
        wait_until(
            lambda tid=tid, h=h: h.api("GET", f"/terminals/{tid}")[1].get("status") == "idle", timeout=60
        )
    return owner


def test_cross_host_sends_under_load_survive_a_kill_a_cut_and_a_database_restart(
    lab: tuple[Lab, PgServer, list[Host]], tmp_path: Path
):
    net, pg, hosts = lab
    owner = _receivers(hosts)
    # every sender sends to receivers on every host, most of them on other hosts
    ids = sorted(owner)
    senders: list[subprocess.Popen[bytes]] = []
    outs: list[Path] = []
    per_sender = MESSAGES // (HOSTS * SENDERS_PER_HOST)
    for h in hosts:
        for s in range(SENDERS_PER_HOST):
            out = tmp_path / f"sent-{h.name}-{s}.jsonl"
            outs.append(out)
            rotated = ids[(h.i * 7 + s * 3) % len(ids) :] + ids[: (h.i * 7 + s * 3) % len(ids)]
            senders.append(
                net.popen(
                    h.i,
                    [
                        sys.executable,
                        str(REPO / "tests" / "netsender.py"),
                        f"--url={h.url}",
                        f"--token={h.env['CAO_API_TOKEN']}",
                        f"--name={h.name}s{s}",
                        f"--receivers={','.join(rotated)}",
                        f"--count={per_sender}",
                        f"--out={out}",
                    ],
                    cwd=REPO,
                )
            )

    def sent() -> int:
        return sum(len(o.read_text().splitlines()) for o in outs if o.exists())

    # the world, unkind, while they send: host 2 killed -9 and restarted, host 3 cut off for 20 s,
    # the database restarted
    wait_until(lambda: sent() >= MESSAGES // 6, timeout=120, what="a sixth sent")
    hosts[1].kill9()
    hosts[1].start()
    wait_until(lambda: sent() >= MESSAGES // 3, timeout=120, what="a third sent")
    net.cut(3)
    cut_at = time.monotonic()
    # the others see it go: its lease lapses, its agents read host_unreachable
    wait_until(lambda: _state_of(hosts[0], "h3") == "lapsed", timeout=15, what="h3 lapsed, seen from h1")
    restart = threading.Timer(3, pg.restart)  # the database restarts while host 3 is away
    restart.start()
    wait_until(lambda: time.monotonic() - cut_at >= 20, timeout=30, interval=0.5)
    restart.join()
    net.heal(3)
    for proc in senders:
        assert proc.wait(timeout=300) == 0, "a sender gave up"
    # the senders met the failures (a 503 while the database restarted, no answer from a host)
    assert sum(int(Path(f"{o}.retries").read_text()) for o in outs) > 0
    sent_rows = [json.loads(line) for o in outs for line in o.read_text().splitlines()]
    assert len(sent_rows) == MESSAGES - MESSAGES % (HOSTS * SENDERS_PER_HOST)
    want = {r["marker"]: r["receiver"] for r in sent_rows}

    def arrived() -> dict[str, list[str]]:
        got: dict[str, list[str]] = {}
        for tid, h in owner.items():
            for rec in read_records(h.home, tid):
                for m in rec["messages"]:
                    marker = str(m["body"]).split(" ", 1)[0]
                    got.setdefault(marker, []).append(tid)
        return got

    wait_until(lambda: len(arrived()) >= len(want), timeout=240, interval=1, what="every message arrived")
    got = arrived()
    lost = [m for m in want if m not in got]
    doubled = {m: t for m, t in got.items() if len(t) > 1}
    wrong = {m: t for m, t in got.items() if m in want and t != [want[m]]}
    unsent = [m for m in got if m not in want]
    assert (lost, doubled, wrong, unsent) == ([], {}, {}, []), (
        len(lost),
        len(doubled),
        len(wrong),
        len(unsent),
    )
    # and the store agrees: every one of them delivered, none pending, failed or delivering
    import psycopg

    with psycopg.connect(pg.url(hosts[0].env["CAO_DATABASE_URL"].rsplit("/", 1)[1]), autocommit=True) as conn:
        rows = dict(conn.execute("SELECT status, COUNT(*) FROM message GROUP BY status").fetchall())
    assert rows == {"delivered": len(want)}, rows
