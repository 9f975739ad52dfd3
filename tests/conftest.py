"""Shared fixtures: a private tmux server per test, HOME/CAO_HOME in tmp, no TMUX*/CAO_* leaking in.

Every process a test starts is stopped by that test (the fixtures below own them).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cao.core import Cao
from cao.settings import Settings
from cao.tmux import Tmux, pid_alive  # noqa: F401 - pid_alive re-exported for tests

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


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Strip TMUX*/CAO_* and point HOME at a temp dir, for this test and what it starts."""
    for key in list(os.environ):
        if key.startswith(("TMUX", "CAO_")):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return dict(os.environ)


@pytest.fixture
def tmux_socket() -> Iterator[str]:
    name = f"cao-test-{secrets.token_hex(4)}"
    yield name
    tmux = Tmux(name)
    tmux.kill_server()
    with contextlib.suppress(Exception):
        path = tmux.server.socket_path or f"/tmp/tmux-{os.getuid()}/{name}"
        Path(path).unlink(missing_ok=True)
    Path(f"/tmp/tmux-{os.getuid()}/{name}").unlink(missing_ok=True)


@pytest.fixture
def tmux(tmux_socket: str) -> Tmux:
    return Tmux(tmux_socket)


@pytest.fixture
def settings(tmp_path: Path, tmux_socket: str) -> Settings:
    return Settings(
        home=tmp_path / "cao",
        tmux_socket=tmux_socket,
        server_url="http://127.0.0.1:9",  # nothing listens: agents can't reach a server in core tests
        sweep_interval=0.5,
        sweep_grace=1.0,
        scripted_record=True,
        allowed_hosts=("testserver",),  # FastAPI's TestClient sends Host: testserver
    )


@pytest.fixture
def make_core(clean_env: dict[str, str]) -> Iterator[Callable[..., Cao]]:
    made: list[Cao] = []

    def make(settings: Settings, *, start: bool = True) -> Cao:
        core = Cao(settings, environ=clean_env)
        if start:
            core.start()
        made.append(core)
        return core

    yield make
    for core in made:
        core.stop()


@pytest.fixture
def core(make_core: Callable[..., Cao], settings: Settings) -> Cao:
    return make_core(settings)


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

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

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


@pytest.fixture
def make_server(tmp_path: Path, tmux_socket: str) -> Iterator[Callable[..., ServerProcess]]:
    made: list[ServerProcess] = []

    def make(home: Path | None = None, cwd: Path = REPO, **env: str) -> ServerProcess:
        srv = ServerProcess(home or tmp_path / "cao", tmux_socket, cwd, **env)
        made.append(srv)
        return srv.start()

    yield make
    for srv in made:
        srv.stop()


def read_records(home: Path, terminal_id: str) -> list[dict[str, Any]]:
    """What a scripted agent recorded as received (one entry per submitted turn)."""
    import json

    path = home / "scripted" / "received" / f"{terminal_id}.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in entries if e["kind"] == "received"]


def done_times(home: Path, terminal_id: str) -> list[float]:
    """When the scripted agent finished each turn."""
    import json

    path = home / "scripted" / "received" / f"{terminal_id}.jsonl"
    if not path.exists():
        return []
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e["t"] for e in entries if e["kind"] == "done"]


def received_bodies(home: Path, terminal_id: str) -> list[str]:
    return [m["body"] for rec in read_records(home, terminal_id) for m in rec["messages"]]


def write_rules(home: Path, profile: str, rules: dict[str, Any]) -> None:
    import json

    (home / "scripted").mkdir(parents=True, exist_ok=True)
    (home / "scripted" / f"{profile}.json").write_text(json.dumps(rules))
