"""A loopback-only test bed for the real agent CLIs (Claude Code, Codex, Gemini CLI).

Everything that talks to a model runs inside a network namespace whose only interface is ``lo``:
a holder process (``setsid unshare -n sleep infinity``) owns the namespace, the fake model server
(``python -m cao.testing.fakemodel``) and a private tmux server (``tmux -L <name>``) are started in it
with ``nsenter -t <holder> -n``, and every pane the tmux server spawns inherits it. tmux clients
outside the namespace drive that server through its socket file, and the fake server also listens on
a Unix socket so its request log can be read from outside.

    reason = why_bed_cannot_run()
    if reason:
        pytest.skip(reason)
    bins = install_clis()
    with Bed() as bed:
        pane = bed.new_window("claude", [...argv...], cwd=workdir)
        bed.paste(pane, "hello")
        bed.wait_for(lambda: "fake answer" in bed.capture(pane), timeout=20)

Teardown (``Bed.close``) kills each pane's process group, the tmux server, the fake server, then
every process still living in the namespace (found by its ``/proc/<pid>/ns/net`` link) and finally
the holder, so nothing outlives the bed: not Gemini (which ignores SIGHUP), not a Codex daemon,
not an MCP server child.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tests.prepare import (
    CLI_PACKAGES,
    VENV_CLIS,
    cli_bin,
    holder_argv,
    join_argv,
    missing_hint,
    netns_mode,
    netns_problem,
    node_problem,
    realcli_cache,
    venv_bin,
    version_bin,
)

__all__ = ["CLI_PACKAGES", "VENV_CLIS", "venv_bin", "version_bin"]

REPO_ROOT = Path(__file__).resolve().parents[2]

WINDOW_SIZE = (200, 50)


class BedUnavailable(RuntimeError):
    """The bed cannot run here; the message says why (use it as a pytest skip reason)."""


# --------------------------------------------------------------------------------------------------
# Where the CLIs are (tests/prepare.py installs them before pytest starts; nothing installs here)
# --------------------------------------------------------------------------------------------------


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$CAO_REALCLI_CACHE``, else ``<test cache>/realcli`` (tests/prepare.py)."""
    return realcli_cache(environ)


def cli_bins(cache: Path) -> dict[str, Path]:
    return {name: cli_bin(name, cache) for name in CLI_PACKAGES}


def installed_bins(cache: Path | None = None) -> dict[str, Path] | None:
    """The bin paths when every npm CLI is installed in ``cache``, else None."""
    bins = cli_bins(cache or cache_dir())
    return bins if all(p.exists() for p in bins.values()) else None


def say(text: str) -> None:
    """Shown on the terminal even while pytest captures output."""
    print(f"[realcli] {text}", file=sys.__stderr__, flush=True)


def why_bed_cannot_run(cache: Path | None = None) -> str | None:
    """None when the bed can run; else a reason for ``pytest.skip``."""
    if (problem := netns_problem()) is not None:
        return problem
    if (problem := node_problem()) is not None:
        return problem
    if installed_bins(cache) is None:
        return missing_hint(f"the agent CLIs (in {cache or cache_dir()})", "realcli")
    return None


# --------------------------------------------------------------------------------------------------
# The bed
# --------------------------------------------------------------------------------------------------


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``pred`` until it returns something truthy (returned) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


class Bed:
    """A loopback-only network namespace with a fake model server and a private tmux server."""

    def __init__(
        self,
        *,
        port: int = 18081,
        name: str | None = None,
        python: str = sys.executable,
        root: Path | None = None,
        fake_verbose: bool = False,
    ) -> None:
        self.port = port
        self.socket_name = name or f"cao-realcli-{os.getpid()}-{secrets.token_hex(3)}"
        self.python = python
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="cao-realcli-bed-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.fake_verbose = fake_verbose
        self.holder: subprocess.Popen[bytes] | None = None
        self.fake: subprocess.Popen[bytes] | None = None
        self.fake_uds = str(self.root / "fake.sock")
        self.fake_log = self.root / "fakemodel.log"
        self._netns: str | None = None
        self.tmux_socket = ""
        self._panes: list[str] = []
        self._http: httpx.Client | None = None
        self.mode = netns_mode()

    # ----- lifecycle ------------------------------------------------------------------------------

    @property
    def fake_url(self) -> str:
        """The fake model server's address as seen from inside the namespace."""
        return f"http://127.0.0.1:{self.port}"

    def ns(self, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside the namespace."""
        assert self.holder is not None, "bed not started"
        return [*join_argv(self.holder.pid, self.mode), *argv]

    def start(self, timeout: float = 20) -> Bed:
        try:
            self._start(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout: float) -> None:
        # root: a plain network namespace; another user: one inside a user namespace that keeps
        # the user's uid (tests/prepare.py). Either way the holder brings lo up before it sleeps.
        self.holder = subprocess.Popen(holder_argv(self.mode), start_new_session=True)
        link = f"/proc/{self.holder.pid}/ns/net"

        def isolated() -> bool:
            if self.holder is not None and self.holder.poll() is not None:
                raise BedUnavailable(f"the namespace holder exited with {self.holder.returncode}")
            if not (os.path.exists(link) and os.readlink(link) != os.readlink("/proc/self/ns/net")):
                return False
            up = subprocess.run(self.ns(["ip", "-o", "link", "show", "lo"]), capture_output=True, text=True)
            flags = up.stdout.partition("<")[2].partition(">")[0].split(",")
            return up.returncode == 0 and "UP" in flags

        if wait_until(isolated, timeout) is None:
            raise BedUnavailable("the namespace holder did not start")
        self._netns = os.readlink(link)

        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        argv = [self.python, "-m", "cao.testing.fakemodel", "--port", str(self.port), "--uds", self.fake_uds]
        if self.fake_verbose:
            argv.append("--verbose")
        with open(self.fake_log, "wb") as log:
            self.fake = subprocess.Popen(
                self.ns(argv),
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._http = httpx.Client(
            transport=httpx.HTTPTransport(uds=self.fake_uds), base_url="http://fake", timeout=10
        )
        if wait_until(self._fake_up, timeout) is None:
            raise BedUnavailable(f"the fake model server did not start: {self.fake_log.read_text()[-500:]}")

        width, height = WINDOW_SIZE
        subprocess.run(
            self.ns(
                [
                    "tmux",
                    "-L",
                    self.socket_name,
                    "-f",
                    "/dev/null",
                    "new-session",
                    "-d",
                    "-s",
                    "keep",
                    "-x",
                    str(width),
                    "-y",
                    str(height),
                    "sleep infinity",
                ]
            ),
            check=True,
            timeout=timeout,
            env=_tmux_env(),
        )
        self.tmux_socket = self.tmux("display-message", "-p", "#{socket_path}").strip()
        # Not `window-size manual`: with it, tmux 3.3a crashes on new-window in a client-less server.
        for option in (
            ["default-size", f"{width}x{height}"],
            ["remain-on-exit", "on"],
            ["history-limit", "5000"],
        ):
            self.tmux("set-option", "-g", *option)

    def _fake_up(self) -> bool:
        if self.fake is not None and self.fake.poll() is not None:
            raise BedUnavailable(f"the fake model server exited: {self.fake_log.read_text()[-500:]}")
        if not os.path.exists(self.fake_uds):
            return False  # not listening yet; a connect now would fail (and leak its socket)
        try:
            return self.fake_get("/_fake/health").get("ok") is True
        except (httpx.HTTPError, OSError):
            return False

    def __enter__(self) -> Bed:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill every pane's process group, tmux, the fake server, all else in the namespace, the holder."""
        for pane in list(self._panes):
            with contextlib.suppress(Exception):
                self.kill_pane(pane, grace=1.0)
        if self.holder is not None:
            with contextlib.suppress(Exception):
                self.tmux("kill-server", check=False)
        if self._http is not None:
            self._http.close()
            self._http = None
        for proc in (self.fake,):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=3)
        self._sweep_namespace()
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()
            self.holder.wait(timeout=5)
        for proc in (self.fake,):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.fake_uds)
        if self.tmux_socket:  # the server exits without removing it here
            with contextlib.suppress(OSError):
                os.unlink(self.tmux_socket)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def namespace_pids(self) -> list[int]:
        """Every process (but the holder) whose network namespace is the bed's."""
        if self._netns is None:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or (self.holder is not None and int(entry) == self.holder.pid):
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == self._netns:
                    pids.append(int(entry))
        return pids

    def _sweep_namespace(self, grace: float = 3.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.namespace_pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            wait_until(lambda: not self.namespace_pids(), grace)

    # ----- fake model server ----------------------------------------------------------------------

    def fake_get(self, path: str) -> Any:
        assert self._http is not None, "bed not started"
        response = self._http.get(path)
        response.raise_for_status()
        return response.json()

    def fake_requests(self, bodies: bool = False) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.fake_get(f"/_fake/requests?bodies={int(bodies)}")
        return result

    def fake_clear(self) -> None:
        assert self._http is not None, "bed not started"
        self._http.delete("/_fake/requests").raise_for_status()

    # ----- tmux -----------------------------------------------------------------------------------

    def tmux(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["tmux", "-L", self.socket_name, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=20,
            env=_tmux_env(),
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def new_window(self, name: str, argv: Sequence[str], cwd: Path | str) -> str:
        """Start ``argv`` (exec'd directly, no shell) in a new 200x50 window; return its pane id."""
        pane = self.tmux(
            "new-window", "-d", "-P", "-F", "#{pane_id}", "-t", "keep", "-n", name, "-c", str(cwd), *argv
        ).strip()
        width, height = WINDOW_SIZE
        self.tmux("resize-window", "-t", pane, "-x", str(width), "-y", str(height), check=False)
        self._panes.append(pane)
        return pane

    def pane_pid(self, pane: str) -> int | None:
        out = self.tmux("display-message", "-p", "-t", pane, "#{pane_pid}", check=False).strip()
        return int(out) if out.isdigit() else None

    def pane_dead(self, pane: str) -> bool:
        return self.tmux("display-message", "-p", "-t", pane, "#{pane_dead}", check=False).strip() != "0"

    def capture(self, pane: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", pane)

    def paste(self, pane: str, text: str, enter_delay: float = 0.2, enter: bool = True) -> None:
        """Bracketed paste of ``text`` then (after ``enter_delay``) Enter, as cao delivers."""
        buffer = f"cao-{secrets.token_hex(4)}"
        self.tmux("load-buffer", "-b", buffer, "-", input=text)
        self.tmux("paste-buffer", "-p", "-d", "-b", buffer, "-t", pane)
        if enter:
            time.sleep(enter_delay)
            self.send_keys(pane, "Enter")

    def send_keys(self, pane: str, *keys: str) -> None:
        self.tmux("send-keys", "-t", pane, *keys)

    def wait_for(
        self, pane: str, pred: Callable[[str], Any], timeout: float, interval: float = 0.05
    ) -> str | None:
        """Capture ``pane`` until ``pred(screen)`` is truthy; return that screen, or None on timeout."""
        found: list[str] = []

        def check() -> bool:
            screen = self.capture(pane)
            if pred(screen):
                found.append(screen)
                return True
            return False

        wait_until(check, timeout, interval)
        return found[0] if found else None

    def kill_pane(self, pane: str, grace: float = 3.0) -> str | None:
        """TERM the pane's process group (Gemini ignores SIGHUP), KILL after ``grace``, drop the window.

        Returns the signal that ended the group ("SIGTERM"/"SIGKILL"), or None if it was already gone.
        """
        pid = self.pane_pid(pane)
        ended_by = None
        if pid is not None and not self.pane_dead(pane):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)
                ended_by = sig.name
                if wait_until(lambda: not _group_alive(pid), grace):
                    break
        self.tmux("kill-window", "-t", pane, check=False)
        if pane in self._panes:
            self._panes.remove(pane)
        return ended_by

    def run_in_ns(
        self, argv: Sequence[str], env: Mapping[str, str], timeout: float = 60, cwd: Path | str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace with exactly ``env`` (e.g. ``claude --version``)."""
        return subprocess.run(
            self.ns(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            start_new_session=True,
        )


def _group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process is left in process group ``pgid``.

    ``killpg(pgid, 0)`` also succeeds for zombies, and here PID 1 can take seconds to reap orphans.
    """
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _tmux_env() -> dict[str, str]:
    """The caller's environment without TMUX*, so tmux never talks to a surrounding session."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}


@contextlib.contextmanager
def bed(**kwargs: Any) -> Iterator[Bed]:
    """``with bed() as b:`` — a started Bed, always torn down."""
    instance = Bed(**kwargs)
    try:
        yield instance.start()
    finally:
        instance.close()
