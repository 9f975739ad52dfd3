"""What tests share: waiting, the scripted agents' records, servers as subprocesses, and the
small steps many delivery tests take (one place; tests import from here, not from each other)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from cao.core import Cao
from cao.settings import Settings
from cao.tmux import pid_alive  # noqa: F401 - re-exported for tests

REPO = Path(__file__).resolve().parents[1]


def wait_until(pred: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> Any:
    """Poll ``pred`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or pred!r} (last value: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(home: Path, socket_name: str, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TMUX", "CAO_"))}
    env.update(CAO_HOME=str(home), CAO_TMUX_SOCKET=socket_name, CAO_API_PORT=str(port), **extra)
    return env


class ServerProcess:
    """A real ``cao-server`` subprocess; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, home: Path, socket_name: str, cwd: Path = REPO, **env: str) -> None:
        self.home = home
        self.cwd = cwd  # the server's own directory: where agents start when a request names none
        self.socket_name = socket_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = server_env(home, socket_name, self.port, **env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.home.mkdir(parents=True, exist_ok=True)
        if hasattr(self, "stderr"):  # started again after a kill: the last run's file is done
            self.stderr.close()
        self.stderr = open(self.home / f"server-{self.port}.stderr", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cao.server", "--log-level", "debug"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            cwd=self.cwd,
        )
        wait_until(self._healthy, timeout=20, what="cao-server /health")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"cao-server exited with {self.proc.returncode}: {self.log()}")
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.home.glob("server-*.stderr"))

    def client(self, *, token: bool = False) -> httpx.Client:
        """Anonymous; ``token``: with the server's ``CAO_API_TOKEN``, if it has one."""
        value = self.env.get("CAO_API_TOKEN") if token else None
        headers = {"Authorization": f"Bearer {value}"} if value else None
        return httpx.Client(base_url=self.url, timeout=30, headers=headers)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if hasattr(self, "stderr"):
            self.stderr.close()


def read_records(home: Path, terminal_id: str) -> list[dict[str, Any]]:
    """What a scripted agent recorded as received (one entry per submitted turn)."""
    path = home / "scripted" / "received" / f"{terminal_id}.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["kind"] == "received"]


def done_times(home: Path, terminal_id: str) -> list[float]:
    """When the scripted agent finished each turn."""
    path = home / "scripted" / "received" / f"{terminal_id}.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e["t"] for e in entries if e["kind"] == "done"]


def received_bodies(home: Path, terminal_id: str) -> list[str]:
    return [m["body"] for rec in read_records(home, terminal_id) for m in rec["messages"]]


def write_rules(home: Path, profile: str, rules: dict[str, Any]) -> None:
    (home / "scripted").mkdir(parents=True, exist_ok=True)
    (home / "scripted" / f"{profile}.json").write_text(json.dumps(rules))


# -- the steps many delivery tests take ---------------------------------------------------------------
SLOW = {"record": True, "rules": [{"match": r"^work (?P<s>[\d.]+)$", "delay": 2.0, "reply": "worked"}]}


def idle(core: Cao, tid: str) -> bool:
    return core.status.status(core.store.get_terminal(tid)) in ("idle", "completed")


def new_terminal(
    core: Cao, profile: str = "developer", provider: str = "scripted", session: str | None = None
) -> str:
    t = core.lifecycle.create(provider=provider, agent_profile=profile, session_name=session)
    wait_until(lambda: idle(core, t.id), what=f"terminal {t.id} idle")
    return t.id


def settle(core: Cao, tid: str) -> None:
    """Wait until no delivery runs and the receiver is idle: a duplicate paste would show by now."""
    wait_until(lambda: core.engine.idle() and idle(core, tid), what="deliveries settled")


def status_of(core: Cao, msg_id: int) -> str:
    return core.store.get_message(msg_id).status


def crash(settings: Settings, fault: str, *args: str) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.crash_helper",
            str(settings.home),
            str(settings.tmux_socket),
            fault,
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CAO_DATABASE_URL": settings.database_url or ""},
    )
    return proc.returncode


LOCKER = """
import sqlite3, sys, time
if sys.argv[1].startswith("postgresql://"):
    import psycopg  # the store lock every write takes, held exclusively (cao/store/backend.py)
    from cao.store.backend import STORE_LOCK
    conn = psycopg.connect(sys.argv[1], autocommit=True)
    conn.execute("SELECT pg_advisory_lock(%s)", (STORE_LOCK,))
    print('locked', flush=True)
    time.sleep(float(sys.argv[2]))
    conn.close()
    raise SystemExit
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute('BEGIN IMMEDIATE')
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
conn.execute('ROLLBACK')
"""


class Clock:
    """A store's clock that a test moves by hand (``clock.t += 60``); the ``clock`` fixture."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def add_terminal_row(store: Any, tid: str, session: str = "cao-x") -> None:
    """A terminal row with no pane (the store's own tests: messages need a receiver)."""
    from cao.store import Terminal

    now = time.time()
    store.add_terminal(
        Terminal(
            id=tid,
            name="w",
            session_name=session,
            provider="scripted",
            agent_profile="developer",
            working_directory="/",
            created_at=now,
            last_active=now,
        )
    )
