"""Fixtures for the real-CLI end-to-end tests: a bed, a cao-server inside it, and an HTTP client.

How the pieces sit (every packet stays on 127.0.0.1 inside the namespace)::

    test process (outside)                     loopback-only network namespace (tests/realcli/bed.py)
    ──────────────────────                     ─────────────────────────────────────────────────────
    httpx ── unix socket <bed>/cao-*.sock ───► relay (python, below) ──► cao-server 127.0.0.1:9889+
    bed.fake_requests() ── <bed>/fake.sock ──► fake model server 127.0.0.1:18081 ◄── the CLIs
    (nothing else)                             tmux server ──► panes: claude / codex / gemini + MCP

cao-server only listens on TCP, and a TCP port inside the namespace can't be reached from outside,
so a 30-line relay started in the namespace (``nsenter -t <holder> -n``) forwards a Unix socket in
the shared filesystem to it. cao-server runs in the namespace too: it runs tmux commands and would
otherwise start a tmux server (and so the CLIs) outside it if the bed's one died, and the agents'
MCP servers reach it at ``CAO_SERVER_URL=http://127.0.0.1:9889``.

The server gets the knobs a user would set for their own CLIs (docs/providers.md):
``CAO_CLAUDE_BIN``/``CAO_CODEX_BIN``/``CAO_GEMINI_BIN`` (the bed's npm cache), ``CAO_MODEL_BASE_URL``
(the fake) and, for the permission tests, ``CAO_<CLI>_BYPASS=false``.

Skips (never failures) when the bed can't run: no permission for a network namespace, a missing
tool, or the CLIs not installed. Nothing is installed here: ``make test`` runs ``python -m
tests.prepare`` first, which installs the pinned CLIs into the cache (``~/.cache/cao/realcli`` or
``$CAO_REALCLI_CACHE``); that install is the only traffic outside the namespace. Only one bed runs
at a time (a lock file in the cache), and only one CLI runs in it at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.helpers import wait_until
from tests.realcli.bed import (
    REPO_ROOT,
    VENV_CLIS,
    Bed,
    cache_dir,
    installed_bins,
    venv_bin,
    why_bed_cannot_run,
)

# Read at import, before tests/conftest.py's autouse fixture points HOME at a temp dir per test.
CACHE = cache_dir()
PORTS = itertools.count(9889)  # inside the namespace: its own port space, nothing else listens there
COMMANDS = {  # knobs: CAO_CLAUDE_BIN …
    "claude_code": "claude",
    "codex": "codex",
    "gemini_cli": "gemini",
    "opencode": "opencode",
    "qwen_code": "qwen",
    "copilot": "copilot",
    "kimi_cli": "kimi",  # a Python CLI: its own virtualenv (bed.VENV_CLIS)
    "hermes": "hermes",  # another
}
# Seconds to wait for another run's bed (the lock below) before skipping; a CI run can hold it for minutes.
LOCK_WAIT = float(os.environ.get("CAO_REALCLI_LOCK_WAIT", "90"))


def knob(provider: str, what: str) -> str:
    """The provider's ``CAO_<CLI>_<WHAT>`` setting, e.g. ``knob("codex", "BYPASS")``."""
    return f"CAO_{COMMANDS[provider].upper()}_{what}"


RELAY = r"""
import asyncio, sys
path, port = sys.argv[1], int(sys.argv[2])

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()

async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_unix_server(handle, path=path)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something truthy (returned); fail naming ``what`` on timeout."""
    return wait_until(pred, timeout, interval, what)


class CaoServer:
    """``cao-server`` inside the bed's namespace, reached through a Unix-socket relay."""

    def __init__(self, bed: Bed, run_dir: Path, provider: str, **knobs: str) -> None:
        self.bed = bed
        self.provider = provider
        self.home = run_dir / f"cao-{secrets.token_hex(3)}"
        self.work = run_dir / "work"
        self.uds = str(bed.root / f"cao-{secrets.token_hex(3)}.sock")
        self.port = next(PORTS)
        bins = {**{c: venv_bin(c, CACHE) for c in VENV_CLIS}, **(installed_bins(CACHE) or {})}
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(run_dir),
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
            "PYTHONPATH": str(REPO_ROOT),
            "CAO_HOME": str(self.home),
            "CAO_TMUX_SOCKET": bed.socket_name,
            "CAO_API_PORT": str(self.port),
            "CAO_MODEL_BASE_URL": bed.fake_url,
            "CAO_REALCLI_CACHE": str(CACHE),
            knob(provider, "BIN"): str(bins.get(COMMANDS[provider], "")),
            **knobs,
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.client = httpx.Client(
            # the relay hides the port, but the Host header still names the server's loopback address
            transport=httpx.HTTPTransport(uds=self.uds),
            base_url=f"http://127.0.0.1:{self.port}",
            timeout=30,
        )
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 30) -> CaoServer:
        self.home.mkdir(parents=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self._log = (self.home / "server.stderr").open("ab")
        server = [sys.executable, "-m", "cao.server", "--log-level", "debug"]
        relay = [sys.executable, "-c", RELAY, self.uds, str(self.port)]
        for argv in (server, relay):
            self.procs.append(
                subprocess.Popen(
                    self.bed.ns(["env", "-i", *(f"{k}={v}" for k, v in self.env.items()), *argv]),
                    cwd=REPO_ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=self._log,
                    start_new_session=True,
                )
            )
        with quiet_socket_leaks():
            wait_for(self._healthy, timeout, "cao-server /health through the relay", interval=0.1)
        return self

    def _healthy(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"cao-server or its relay exited: {self.log()[-2000:]}")
        try:
            return self.client.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        path = self.home / "server.stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.client.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.uds)

    # -- the API, as a test uses it -------------------------------------------------------------
    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.client.request(method, path, **kwargs)
        assert response.status_code < 400, f"{method} {path} -> {response.status_code}: {response.text}"
        return response.json()

    def status(self, terminal_id: str) -> str:
        return str(self.call("GET", f"/terminals/{terminal_id}")["status"])

    def wait_status(self, terminal_id: str, *wanted: str, timeout: float = 30) -> str:
        return str(
            wait_for(
                lambda: (s := self.status(terminal_id)) in wanted and s,
                timeout,
                f"terminal {terminal_id} ({self.provider}) to be {'/'.join(wanted)}; "
                f"screen:\n{self.screen(terminal_id)}",
                interval=0.02,
            )
        )

    def screen(self, terminal_id: str, mode: str = "full") -> str:
        with contextlib.suppress(AssertionError, httpx.HTTPError):
            return str(self.call("GET", f"/terminals/{terminal_id}/output", params={"mode": mode})["output"])
        return "<no screen>"

    def message(self, message_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.call("GET", f"/messages/{message_id}")
        return result


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    """A started bed (fake model + tmux in a loopback-only namespace), or a skip saying why not."""
    reason = why_bed_cannot_run(cache=CACHE)
    if reason:
        pytest.skip(f"real-CLI bed unavailable: {reason}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".bed.lock").open("w") as lock:
        try:
            wait_for(lambda: _try_lock(lock), LOCK_WAIT, "the real-CLI bed lock", interval=0.5)
        except AssertionError:
            pytest.skip(
                f"another real-CLI bed kept {CACHE / '.bed.lock'} for {LOCK_WAIT:g} s; run one at a time "
                "(CAO_REALCLI_LOCK_WAIT=<seconds> waits longer)"
            )
        with quiet_socket_leaks():
            started = Bed().start()
        try:
            # Like a real tmux: a pane whose program exits goes away (the bed keeps dead panes).
            started.tmux("set-option", "-g", "remain-on-exit", "off")
            yield started
        finally:
            started.close()


@contextlib.contextmanager
def quiet_socket_leaks() -> Iterator[None]:
    """Polling a Unix socket that isn't there yet: httpcore leaks the socket of each failed connect
    (a ResourceWarning, an error under ``filterwarnings = error``). Drop those while we poll."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        yield
        gc.collect()


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@pytest.fixture(scope="module")
def run_dir() -> Iterator[Path]:
    """Throwaway CAO_HOMEs and work dirs, not under /tmp (Codex refuses helper binaries there)."""
    path = CACHE / "runs" / f"e2e-{os.getpid()}-{secrets.token_hex(3)}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_server(bed: Bed, run_dir: Path) -> Iterator[Callable[..., CaoServer]]:
    """``make_server(provider, **knobs)`` starts a cao-server in the bed; all are stopped afterwards."""
    made: list[CaoServer] = []

    def make(provider: str, **knobs: str) -> CaoServer:
        server = CaoServer(bed, run_dir, provider, **knobs)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        with contextlib.suppress(AssertionError, httpx.HTTPError):
            for terminal in server.call("GET", "/terminals"):
                server.call("DELETE", f"/terminals/{terminal['id']}")
        server.stop()
        for line in server.log().splitlines():  # shown with the test's output (-rP, or on failure)
            if "pressing Enter again" in line:
                print(f"cao-server ({server.provider}): {line}")
