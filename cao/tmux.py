"""The only module that talks to tmux.

libtmux gives us the server handle (socket name, binary, liveness); the hot path (capture, paste)
runs the tmux binary directly so one process can carry several chained commands (``;``) and the
paste text can go through stdin (no argv length limit, nothing on a command line).

Naming: sessions ``cao-<name>``, one window per terminal, panes addressed by their unique
``%N`` id, sessions by exact name (``=name``) so tmux never prefix-matches another session.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libtmux

from cao.errors import PaneGone, TmuxError, TmuxServerDown

SESSION_PREFIX = "cao-"
_PLACEHOLDER = "__cao_init"
_SERVER_DOWN_WORDS = ("no server running", "error connecting to", "server exited unexpectedly")


@dataclass(frozen=True)
class PaneInfo:
    pane_id: str
    pane_pid: int
    session_name: str
    window_name: str


def session_name_for(name: str) -> str:
    return name if name.startswith(SESSION_PREFIX) else SESSION_PREFIX + name


class Tmux:
    """A tmux server: ``socket_name=None`` is the user's default server (so `tmux attach` just works)."""

    def __init__(self, socket_name: str | None = None, *, tmux_bin: str | None = None) -> None:
        self.socket_name = socket_name
        self.server = libtmux.Server(socket_name=socket_name)
        self.tmux_bin = tmux_bin or self.server.tmux_bin or "tmux"

    # -- plumbing ------------------------------------------------------------------------------
    def argv(self, *args: str) -> list[str]:
        base = [self.tmux_bin]
        if self.socket_name:
            base += ["-L", self.socket_name]
        return base + list(args)

    def run(self, *args: str, input: bytes | None = None, target: str | None = None) -> str:
        try:
            proc = subprocess.run(self.argv(*args), input=input, capture_output=True, timeout=30, check=False)
        except FileNotFoundError:
            raise TmuxError(
                "tmux is not installed; install it (apt-get install tmux / brew install tmux)"
            ) from None
        except subprocess.TimeoutExpired:
            raise TmuxError(f"tmux {args[0]} did not answer within 30 s") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            if any(w in err for w in _SERVER_DOWN_WORDS):
                raise TmuxServerDown(
                    f"no tmux server is running on socket {self.socket_name or 'default'}; "
                    "its terminals are gone"
                )
            if any(w in err for w in ("can't find pane", "can't find window", "no current target")):
                raise PaneGone(f"tmux pane {target or ''} no longer exists ({err})".replace("  ", " "))
            raise TmuxError(f"tmux {args[0]} failed: {err}")
        return proc.stdout.decode("utf-8", "replace")

    def is_alive(self) -> bool:
        return bool(self.server.is_alive())

    def attach_argv(self, session_name: str, *, inside_tmux: bool = False) -> list[str]:
        """The command a person runs to watch a session (``switch-client`` from inside tmux)."""
        verb = "switch-client" if inside_tmux else "attach-session"
        return self.argv(verb, "-t", f"={session_name}")

    # -- sessions and windows ------------------------------------------------------------------
    def has_session(self, name: str) -> bool:
        try:
            self.run("has-session", "-t", f"={name}")
        except TmuxServerDown:
            return False
        except TmuxError:
            return False
        return True

    def list_sessions(self) -> list[str]:
        try:
            out = self.run("list-sessions", "-F", "#{session_name}")
        except TmuxServerDown:
            return []
        return [line for line in out.splitlines() if line]

    def list_panes(self) -> dict[str, int]:
        """Every live pane on the server: ``{pane_id: pane_pid}`` (empty when no server runs)."""
        try:
            out = self.run("list-panes", "-a", "-F", "#{pane_id} #{pane_pid}")
        except TmuxServerDown:
            return {}
        panes: dict[str, int] = {}
        for line in out.splitlines():
            pane_id, _, pid = line.partition(" ")
            if pane_id and pid.isdigit():
                panes[pane_id] = int(pid)
        return panes

    def create_window(
        self,
        *,
        session_name: str,
        window_name: str,
        command: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        width: int = 200,
        height: int = 50,
        history_limit: int = 50000,
    ) -> PaneInfo:
        """Start ``command`` in a new window with exactly ``env`` (nothing inherited).

        Creates the session when missing. The pane's output is piped (appended) to ``log_path``.
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        shell_cmd = "exec env -i " + " ".join(
            [shlex.quote(f"{k}={v}") for k, v in env.items()] + [shlex.quote(c) for c in command]
        )
        fmt = "#{pane_id} #{pane_pid}"
        target = f"={session_name}:"
        new_window = [
            "new-window",
            "-P",
            "-F",
            fmt,
            "-n",
            window_name,
            "-c",
            str(cwd),
            "-t",
            target,
            shell_cmd,
        ]
        # pipe-pane runs in the same command list as new-window, so tmux reads no output of the new
        # pane before the pipe is open (the new window is the session's current one at that point).
        pipe = ["pipe-pane", "-t", target, f"exec cat >> {shlex.quote(str(log_path))}"]
        if self.has_session(session_name):
            args = [*new_window, ";", *pipe]
        else:
            # The first pane of a session is created before we could set its history-limit, so
            # start a short-lived placeholder, set the option, then open the real window.
            args = [
                "new-session",
                "-d",
                "-s",
                session_name,
                "-n",
                _PLACEHOLDER,
                "-x",
                str(width),
                "-y",
                str(height),
                "sleep 5",
                ";",
                "set-option",
                "-t",
                session_name,
                "history-limit",
                str(history_limit),
                ";",
                *new_window,
                ";",
                *pipe,
                ";",
                "kill-window",
                "-t",
                f"={session_name}:{_PLACEHOLDER}",
            ]
        out = self.run(*args).strip().splitlines()
        if not out:
            raise TmuxError(f"tmux did not report the new pane of {window_name}")
        pane_id, _, pid = out[-1].partition(" ")
        return PaneInfo(
            pane_id=pane_id, pane_pid=int(pid), session_name=session_name, window_name=window_name
        )

    def ensure_pipe(self, pane_id: str, log_path: Path) -> bool:
        """Open the log pipe of a pane unless one is open. Returns True if it had to open one.

        (``pipe-pane -o`` would *toggle*: it closes an open pipe, so we ask ``#{pane_pipe}`` first.)
        """
        if self.run("display-message", "-p", "-t", pane_id, "#{pane_pipe}", target=pane_id).strip() == "1":
            return False
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.run("pipe-pane", "-t", pane_id, f"exec cat >> {shlex.quote(str(log_path))}", target=pane_id)
        return True

    # -- screen and input -----------------------------------------------------------------------
    def capture(self, pane_id: str, *, scrollback: bool = False, join: bool = False) -> str:
        args = ["capture-pane", "-p", "-t", pane_id]
        if join:
            args.append("-J")
        if scrollback:
            args += ["-S", "-", "-E", "-"]
        return self.run(*args, target=pane_id)

    def paste(self, pane_id: str, text: str, *, enter_delay: float = 0.0, enter_count: int = 1) -> None:
        """Bracketed paste (``paste-buffer -p``) of ``text``, then Enter after ``enter_delay``."""
        buf = f"cao-{uuid.uuid4().hex[:12]}"
        args = [
            "load-buffer",
            "-b",
            buf,
            "-",
            ";",
            "paste-buffer",
            "-p",
            "-d",
            "-r",
            "-b",
            buf,
            "-t",
            pane_id,
        ]
        immediate_enter = enter_delay <= 0 and enter_count > 0
        if immediate_enter:
            for _ in range(enter_count):
                args += [";", "send-keys", "-t", pane_id, "Enter"]
        try:
            self.run(*args, input=text.encode("utf-8", "replace"), target=pane_id)
        except TmuxError:
            with contextlib.suppress(TmuxError):
                self.run("delete-buffer", "-b", buf)
            raise
        if not immediate_enter:
            for _ in range(enter_count):
                time.sleep(enter_delay)
                self.send_keys(pane_id, "Enter")

    def send_keys(self, pane_id: str, *keys: str, literal: bool = False) -> None:
        args = ["send-keys", "-t", pane_id]
        if literal:
            args.append("-l")
        self.run(*args, *keys, target=pane_id)

    # -- teardown -------------------------------------------------------------------------------
    def kill_pane(self, pane_id: str, pane_pid: int | None, *, grace: float = 1.0) -> None:
        """Kill the pane's processes (its process group and every descendant), then the pane.

        Some CLIs ignore the SIGHUP that closing a pane sends, so we signal them ourselves.
        """
        pids = descendants(pane_pid) if pane_pid else set()
        if pane_pid:
            pids.add(pane_pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pane_pid, signal.SIGTERM)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(PaneGone, TmuxServerDown):
            self.run("kill-pane", "-t", pane_id, target=pane_id)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if pid_alive(p)}
            if pids:
                time.sleep(0.02)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def kill_session(self, session_name: str) -> None:
        with contextlib.suppress(TmuxError):
            self.run("kill-session", "-t", f"={session_name}")

    def kill_server(self) -> None:
        """Stop this tmux server; for a private socket also remove the socket file (tmux 3.3a leaves it)."""
        with contextlib.suppress(TmuxError):
            self.run("kill-server")
        if self.socket_name:
            base = os.environ.get("TMUX_TMPDIR") or "/tmp"
            Path(base, f"tmux-{os.getuid()}", self.socket_name).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def descendants(root: int) -> set[int]:
    """All descendants of ``root`` (from /proc; empty where /proc is missing)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found
