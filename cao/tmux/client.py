"""The only module that talks to tmux.

Every command goes through :meth:`Tmux.run`: by default by forking the tmux binary (~4 ms), which
carries the paste text through stdin; with ``CAO_TMUX_CONTROL=true`` over one persistent
control-mode client (cao/tmux/control.py, ~0.3 ms a command, pipelined across threads), falling
back to forks with tmux older than 3.2, no session to attach to yet, or a client that died or
wedged. Control mode is opt-in because tmux 3.3a can crash with a control client attached
(docs/tmux.md); the crashes cao's own commands could cause are held off by a gate.
One call carries several chained commands (``;``) either way, so a check and the action it guards
run in one step. libtmux gives the server handle (binary, version, liveness) on the cold path.

Naming: sessions ``cao-<name>``, one window per terminal, panes addressed by their unique
``%N`` id, sessions by exact name (``=name``) so tmux never prefix-matches another session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import libtmux

from cao.errors import FenceLost, PaneGone, PaneInMode, TmuxError, TmuxServerDown
from cao.tmux.control import (
    RESTART_BACKOFF,
    ControlClient,
    ControlLost,
    Gate,
    OutputWatch,
    command_line,
)
from cao.tmux.procs import descendants, pid_alive
from cao.tmux.refs import (
    _ID_FMT,
    _MODE_FMT,
    _PLACEHOLDER,
    _REFUSED,
    _SERVER_DOWN_WORDS,
    SESSION_PREFIX,
    PaneInfo,
    PaneRef,
    TaggedPane,
    _blocker,
    _mismatch,
    in_mode_error,
)

logger = logging.getLogger(__name__)
LOOK_BATCH = 50  # panes looked at in one tmux call (``look_many``)
NO_SESSION_RETRY = 0.25  # seconds: with no session to attach a control client to, look again after


def _link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _judged(ref: PaneRef, head: str, screen: str) -> tuple[str, str]:
    """A look's answer: its identity line (``ref.fmt`` then the mode) checked against ``ref``;
    (screen, what keeps input out), or the mismatch raised."""
    seen, _, mode = head.partition(" ")
    if seen != ref.expected:
        raise _mismatch(ref, seen)
    return screen, _blocker(mode)


def _control_capable(tmux_bin: str) -> bool:
    """Control mode with client flags (``attach -f ignore-size,no-output``) needs tmux 3.2+."""
    try:
        from libtmux.common import get_version

        version = str(get_version(tmux_bin=tmux_bin))
    except Exception:
        return False
    found = re.match(r"(\d+)\.(\d+)", version)
    return found is not None and (int(found.group(1)), int(found.group(2))) >= (3, 2)


class Tmux:
    """A tmux server: ``socket_name=None`` is the user's default server (so `tmux attach` just works)."""

    def __init__(
        self, socket_name: str | None = None, *, tmux_bin: str | None = None, control: bool = False
    ) -> None:
        self.socket_name = socket_name
        self.server = libtmux.Server(socket_name=socket_name)
        self.tmux_bin = tmux_bin or self.server.tmux_bin or "tmux"
        # control mode (cao/tmux/control.py): one client for commands, started on first use
        self.control = control and _control_capable(self.tmux_bin)
        self._client: ControlClient | None = None
        self._client_lock = threading.Lock()
        self._gate = Gate()  # attaches and kills alone (tmux 3.3a crashes: cao/tmux/control.py)
        self._client_next = 0.0  # monotonic time of the next start attempt
        self._client_backoff = RESTART_BACKOFF
        self._socket_path: str | None = None  # what the server said (``check_socket``)
        self.stats: dict[str, int] = {
            "control": 0,
            "forked": 0,
            "control_lost": 0,
            "control_started": 0,
            "output_wakes": 0,
        }
        # output watch: one read-only control client per cao session (``watch_output``)
        self._on_quiet: Callable[[str], None] | None = None
        self._quiet: Callable[[str], float] = lambda _pane: 0.01
        self._watches: dict[str, OutputWatch] = {}
        self._watches_lock = threading.Lock()

    # -- plumbing ------------------------------------------------------------------------------
    def argv(self, *args: str) -> list[str]:
        base = [self.tmux_bin]
        if self.socket_name:
            base += ["-L", self.socket_name]
        return base + list(args)

    def run(
        self,
        *args: str,
        input: bytes | None = None,
        target: str | None = None,
        revive: bool = True,
        buffer: tuple[str, str] | None = None,
        repeatable: bool = True,
    ) -> str:
        """Run one command line (``;`` items chain commands) and return what it printed.

        ``buffer=(name, text)``: load ``text`` into paste buffer ``name`` first, in the same call.
        ``repeatable=False``: the command types or creates something, so when a control client is
        lost after it was sent (its fate unknown) it is not run again by a forked client: the
        caller gets a :class:`TmuxError` and treats it as unconfirmed."""
        client = self._control_client() if input is None else None
        if client is not None and (buffer is None or buffer[1]):
            cmd = (
                list(args) if buffer is None else ["set-buffer", "-b", buffer[0], "--", buffer[1], ";", *args]
            )
            try:
                with self._gate.command():
                    out, errors = client.run(command_line(cmd))
            except ControlLost as exc:
                self.stats["control_lost"] += 1
                if exc.sent and not repeatable:
                    raise TmuxError(f"tmux {args[0]}: {exc.message}") from None
            else:
                self.stats["control"] += 1
                if errors:
                    self._raise_for(errors[0], args, target)
                return out
        if buffer is not None:
            args = ("load-buffer", "-b", buffer[0], "-", ";", *args)
            input = buffer[1].encode("utf-8", "replace")
        return self._fork(*args, input=input, target=target, revive=revive)

    def _fork(
        self, *args: str, input: bytes | None = None, target: str | None = None, revive: bool = True
    ) -> str:
        self.stats["forked"] += 1
        try:
            with self._gate.command():
                proc = subprocess.run(
                    self.argv(*args), input=input, capture_output=True, timeout=30, check=False
                )
        except FileNotFoundError:
            raise TmuxError(
                "tmux is not installed; install it (apt-get install tmux / brew install tmux)"
            ) from None
        except subprocess.TimeoutExpired:
            raise TmuxError(f"tmux {args[0]} did not answer within 30 s") from None
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip()
            if revive and self._recreate_socket(err):
                return self._fork(*args, input=input, target=target, revive=False)
            self._raise_for(err, args, target)
        return proc.stdout.decode("utf-8", "replace")

    def _raise_for(self, err: str, args: Sequence[str], target: str | None) -> None:
        """The error a failed command means (the same words from a forked or a control client)."""
        if any(w in err for w in _SERVER_DOWN_WORDS):
            raise TmuxServerDown(
                f"no tmux server is running on socket {self.socket_name or 'default'}; its terminals are gone"
            )
        if any(w in err for w in ("can't find pane", "can't find window", "no current target")):
            raise PaneGone(f"tmux pane {target or ''} no longer exists ({err})".replace("  ", " "))
        raise TmuxError(f"tmux {args[0]} failed: {err}")

    # -- the control-mode client -----------------------------------------------------------------
    def _control_client(self) -> ControlClient | None:
        """The live control client, starting one when due; None: fork this command."""
        if not self.control:
            return None
        client = self._client
        if client is not None and client.alive:
            return client
        if time.monotonic() < self._client_next or not self._client_lock.acquire(blocking=False):
            return None  # another thread is starting one, or the last attempt was just now
        try:
            client = self._client
            if client is not None and client.alive:
                return client
            if client is not None:
                self._client = None
                client.close()
            session = self._control_session()
            if session is None:  # nothing to attach to yet: fork, and look again soon
                self._client_next = time.monotonic() + NO_SESSION_RETRY
                return None
            started = ControlClient(self.argv(), session)
            with self._gate.alone():
                ok = started.start()
            if not ok:  # tmux refused or did not answer: fork, and back off
                self._client_next = time.monotonic() + self._client_backoff
                self._client_backoff = min(self._client_backoff * 2, 30.0)
                return None
            self._client_backoff = RESTART_BACKOFF
            self._client_next = time.monotonic() + RESTART_BACKOFF
            self._client = started
            self.stats["control_started"] += 1
            return started
        finally:
            self._client_lock.release()

    def _control_session(self) -> str | None:
        """A session to attach the control client to: one of cao's (on a private socket any)."""
        try:
            names = [n for n in self._fork("list-sessions", "-F", "#{session_name}").splitlines() if n]
        except TmuxError:
            return None
        ours = [n for n in names if n.startswith(SESSION_PREFIX)]
        if ours:
            return ours[0]
        return names[0] if names and self.socket_name else None

    def describe(self) -> dict[str, object]:
        """``control`` (a control-mode client carries commands now) or ``forked``; the watches;
        how many commands each way, clients lost and started, output wakes."""
        pid = self.control_pid
        return {
            "client": "control" if pid is not None else "forked",
            "control_enabled": self.control,
            "control_pid": pid,
            "output_watches": self.output_watches,
            **self.stats,
        }

    @property
    def control_pid(self) -> int | None:
        """The pid of the running control client (None: commands are forked now)."""
        client = self._client
        return client.pid if client is not None and client.alive else None

    def shutdown(self) -> None:
        """Stop the control client and the output watches (cao-server's shutdown)."""
        self.control = False
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        with self._watches_lock:
            watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            watch.close()

    # -- pane output: read-only control clients, one per cao session -------------------------------
    def watch_output(self, on_quiet: Callable[[str], None], quiet: Callable[[str], float]) -> None:
        """Call ``on_quiet(pane_id)`` once a pane that printed has been quiet ``quiet(pane_id)`` s.
        Watches start with :meth:`refresh_output_watch` (one per cao session)."""
        self._on_quiet = on_quiet
        self._quiet = quiet

    def refresh_output_watch(self, sessions: Sequence[str] | None = None) -> int:
        """Keep one output watch on each cao session (``sessions``; default: every ``cao-`` session
        on the server): start the missing ones, drop those whose session is gone. Returns how many
        run."""
        if self._on_quiet is None or not self.control:
            return 0
        if sessions is None:
            sessions = [n for n in self.list_sessions() if n.startswith(SESSION_PREFIX)]
        wanted = set(sessions)
        with self._watches_lock:
            for name in [n for n, w in self._watches.items() if n not in wanted or not w.alive]:
                self._watches.pop(name).close()
        for name in wanted:
            self._ensure_watch(name)
        with self._watches_lock:
            return len(self._watches)

    def _ensure_watch(self, session_name: str) -> None:
        if self._on_quiet is None or not self.control:
            return
        with self._watches_lock:
            current = self._watches.get(session_name)
            if current is not None and current.alive:
                return
            watch = OutputWatch(
                self.argv(),
                session_name,
                on_quiet=self._output_quiet,
                quiet=self._quiet,
                on_exit=self._watch_ended,
            )
            with self._gate.alone():
                ok = watch.start()
            if ok:
                self._watches[session_name] = watch

    def _output_quiet(self, pane_id: str) -> None:
        self.stats["output_wakes"] += 1
        if self._on_quiet is not None:
            self._on_quiet(pane_id)

    def _watch_ended(self, watch: OutputWatch) -> None:
        with self._watches_lock:
            if self._watches.get(watch.session) is watch:
                del self._watches[watch.session]

    @property
    def output_watches(self) -> list[str]:
        with self._watches_lock:
            return sorted(n for n, w in self._watches.items() if w.alive)

    @staticmethod
    def _recreate_socket(err: str) -> bool:
        """The server's socket file is gone (a /tmp cleaner, an ``rm``) while the server still runs:
        tmux answers "no server running" / "error connecting to", and every agent on it would be
        taken for gone for good. Ask that server to recreate its socket (``SIGUSR1``, as tmux(1)
        says) and say whether it did. Only a connect that failed (nothing reached a server) is
        answered so, so the command can be run again. Linux only (``/proc``); elsewhere False."""
        found = re.search(r"(?:no server running on|error connecting to) (/\S+)", err)
        if found is None or os.path.exists(found.group(1)):
            return False
        path = found.group(1)
        try:
            with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
                # Num RefCount Protocol Flags Type St Inode Path: a listening socket still shows
                # the path it was bound to after the file was removed
                inodes = {
                    f"socket:[{cols[6]}]"
                    for cols in (line.split() for line in table)
                    if len(cols) >= 8 and cols[7] == path and cols[5] == "01"
                }
        except OSError:
            return False
        if not inodes:
            return False  # nothing listens there: the server is really gone
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if not (entry / "comm").read_text().startswith("tmux"):
                    continue
                fds = list((entry / "fd").iterdir())
            except OSError:
                continue
            if not any(_link(fd) in inodes for fd in fds):
                continue
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGUSR1)
                deadline = time.monotonic() + 2.0
                while not os.path.exists(path) and time.monotonic() < deadline:
                    time.sleep(0.01)
            if os.path.exists(path):
                logger.warning(
                    "the tmux server's socket had been removed; it was asked to recreate it (SIGUSR1)",
                    extra={"socket": path, "tmux_server_pid": int(entry.name)},
                )
                return True
            return False
        return False

    def check_socket(self) -> bool:
        """Housekeeping: while a control client (or a watch) carries the commands, nothing forks,
        so a removed socket file would go unnoticed until the next forked command failed, and in
        the meantime ``tmux attach``, an agent's own ``tmux`` and any new client could not connect.
        Look for the file and, gone, ask the server to recreate it. True: it was recreated."""
        if self._client is None or not self._client.alive:
            return False  # forked commands find out on their own (``_recreate_socket``)
        if self._socket_path is None:
            with contextlib.suppress(TmuxError):
                self._socket_path = self.run("display-message", "-p", "#{socket_path}").strip() or None
        path = self._socket_path
        if path is None or os.path.exists(path):
            return False
        return self._recreate_socket(f"no server running on {path}")

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

    def list_panes(self) -> list[TaggedPane]:
        """Every pane on the server with cao's tags (empty when no server runs)."""
        try:
            out = self.run(
                "list-panes",
                "-a",
                "-F",
                "#{pid} #{pane_id} #{pane_pid} #{pane_dead} #{pane_pipe} #{@cao_terminal}. #{@cao_home}. "
                "#{session_name}",
            )
        except TmuxServerDown:
            return []
        panes: list[TaggedPane] = []
        for line in out.splitlines():
            parts = line.split(" ", 7)
            if len(parts) != 8 or not (parts[0].isdigit() and parts[2].isdigit()):
                continue
            panes.append(
                TaggedPane(
                    server_pid=int(parts[0]),
                    pane_id=parts[1],
                    pane_pid=int(parts[2]),
                    dead=parts[3] == "1",
                    piped=parts[4] == "1",
                    terminal_id=parts[5][:-1],
                    home_tag=parts[6][:-1],
                    session_name=parts[7],
                )
            )
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
        tags: Mapping[str, str] | None = None,
    ) -> PaneInfo:
        """Start ``command`` in a new window with exactly ``env`` (nothing inherited).

        Creates the session when missing. The pane's output is piped (appended) to ``log_path``.
        ``tags`` become pane options (``@cao_terminal``…) so an interrupted create can be found.
        The window keeps a pane whose program exited (``remain-on-exit``): a dead pane reads as
        dead (``#{pane_dead}``) instead of vanishing, and the last agent's exit does not end the
        tmux server (whose successor would hand out the same pane ids again).
        """
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        shell_cmd = "exec env -i " + " ".join(
            [shlex.quote(f"{k}={v}") for k, v in env.items()] + [shlex.quote(c) for c in command]
        )
        fmt = "#{pane_id} #{pane_pid} #{pid}"
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
        pipe += [";", "set-option", "-w", "-t", target, "remain-on-exit", "on"]
        for key, value in (tags or {}).items():
            pipe += [";", "set-option", "-p", "-t", target, f"@{key}", value]
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
        out = self.run(*args, repeatable=False).strip().splitlines()
        if not out:
            raise TmuxError(f"tmux did not report the new pane of {window_name}")
        pane_id, pid, server_pid = out[-1].split(" ")
        if self.control and self._client is None:
            self._client_next = 0.0  # there is a session to attach to now
        self._ensure_watch(session_name)
        return PaneInfo(
            pane_id=pane_id,
            pane_pid=int(pid),
            session_name=session_name,
            window_name=window_name,
            server_pid=int(server_pid),
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

    def reopen_pipe_checked(self, ref: PaneRef, log_path: Path, *, replace: bool = False) -> bool:
        """Reopen the log pipe of ``ref``'s pane if it closed (``cat`` dies on a full disk), in one
        tmux call that checks the pane's identity and that no pipe is open (``pipe-pane`` would
        close an open one). ``replace``: the log file was deleted under an open pipe (which goes on
        writing into the unlinked file): close that pipe and open a new one. Returns True if it did."""
        cmd = f"pipe-pane -t {ref.pane_id} {shlex.quote('exec cat >> ' + shlex.quote(str(log_path)))}"
        if replace:
            cond = ref.condition()
            cmd = f"pipe-pane -t {ref.pane_id} ; {cmd}"  # no command: closes the open pipe
        else:
            cond = f"#{{&&:{ref.condition()},#{{==:#{{pane_pipe}},0}}}}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        then = f"{cmd} ; display-message -p -t {ref.pane_id} cao-reopened"
        out = self.run("if-shell", "-F", "-t", ref.pane_id, cond, then, target=ref.pane_id)
        return "cao-reopened" in out

    # -- identity-checked pane I/O (what the terminal layer uses) --------------------------------
    def identity(self, pane_id: str) -> tuple[int, int, bool, str]:
        """``(server pid, pane pid, dead, @cao_home tag)`` of the pane answering at ``pane_id`` now."""
        out = self.run(
            "display-message", "-p", "-t", pane_id, f"{_ID_FMT}/#{{@cao_home}}", target=pane_id
        ).strip()
        server, _, rest = out.partition("/")
        pid, _, rest = rest.partition("/")
        dead, _, home = rest.partition("/")
        if not (server.isdigit() and pid.isdigit()):
            # tmux 3.3a answers a pane that closed with empty fields and exit code 0
            raise PaneGone(f"tmux pane {pane_id} no longer exists")
        return int(server), int(pid), dead == "1", home

    def capture_checked(self, ref: PaneRef, *, scrollback: bool = False, join: bool = False) -> str:
        """``capture-pane`` of ``ref``'s pane, in the same tmux call as a check of its identity.

        Raises :class:`PaneMismatch` (a subclass of :class:`PaneGone`) when another pane answers
        at that id or the program exited, :class:`PaneGone` when no pane does.
        """
        return self.look_checked(ref, scrollback=scrollback, join=join)[0]

    def look_checked(self, ref: PaneRef, *, scrollback: bool = False, join: bool = False) -> tuple[str, str]:
        """Like :meth:`capture_checked`, plus the tmux mode the pane is in (``""`` for none, else
        e.g. ``copy-mode``), read in the same call. The screen is the program's, not the mode's."""
        args = [
            "display-message",
            "-p",
            "-t",
            ref.pane_id,
            f"{ref.fmt} {_MODE_FMT}",
            ";",
            "capture-pane",
            "-p",
            "-t",
            ref.pane_id,
        ]
        if join:
            args.append("-J")
        if scrollback:
            args += ["-S", "-", "-E", "-"]
        out = self.run(*args, target=ref.pane_id)
        first, _, screen = out.partition("\n")
        return _judged(ref, first, screen)

    def look_many(self, refs: Sequence[PaneRef]) -> dict[str, tuple[str, str] | PaneGone]:
        """:meth:`look_checked` of many panes, ``LOOK_BATCH`` to a tmux call: each pane's identity
        line (tagged with a token made for this call, which no pane can have printed) and then its
        capture. tmux stops a command list at its first failing command, so a batch with a pane
        that is gone is looked at again one pane at a time."""
        out: dict[str, tuple[str, str] | PaneGone] = {}
        for start in range(0, len(refs), LOOK_BATCH):
            batch = refs[start : start + LOOK_BATCH]
            token = f"cao-look-{uuid.uuid4().hex}"
            args: list[str] = []
            for i, ref in enumerate(batch):
                args += [
                    "display-message",
                    "-p",
                    "-t",
                    ref.pane_id,
                    f"{token} {i} {ref.fmt} {_MODE_FMT}",
                    ";",
                ]
                args += ["capture-pane", "-p", "-t", ref.pane_id, ";"]
            try:
                text = self.run(*args[:-1])
            except PaneGone:
                for ref in batch:
                    try:
                        out[ref.pane_id] = self.look_checked(ref)
                    except PaneGone as exc:
                        out[ref.pane_id] = exc
                continue
            sections: dict[int, tuple[str, list[str]]] = {}
            current: list[str] | None = None
            for line in text.split("\n"):
                if line.startswith(token + " "):
                    index, _, head = line[len(token) + 1 :].partition(" ")
                    current = []
                    sections[int(index)] = (head, current)
                elif current is not None:
                    current.append(line)
            for i, ref in enumerate(batch):
                if i not in sections:
                    out[ref.pane_id] = PaneGone(f"tmux pane {ref.pane_id} did not answer a look")
                    continue
                head, lines = sections[i]
                if i == len(batch) - 1 and lines and lines[-1] == "":
                    lines = lines[:-1]  # the text's final newline
                try:
                    out[ref.pane_id] = _judged(ref, head, "".join(line + "\n" for line in lines))
                except PaneGone as exc:
                    out[ref.pane_id] = exc
        return out

    def snapshot_checked(self, ref: PaneRef) -> tuple[str, int, int, int, int]:
        """The visible screen with its colours (``capture-pane -e``), the cursor and the pane size,
        for a viewer that then follows the pane log: ``(screen, cursor_x, cursor_y, cols, rows)``."""
        fmt = f"{ref.fmt} #{{cursor_x}} #{{cursor_y}} #{{pane_width}} #{{pane_height}}"
        out = self.run(
            "display-message",
            "-p",
            "-t",
            ref.pane_id,
            fmt,
            ";",
            "capture-pane",
            "-e",
            "-p",
            "-t",
            ref.pane_id,
            target=ref.pane_id,
        )
        first, _, screen = out.partition("\n")
        seen, x, y, cols, rows = first.split(" ")
        if seen != ref.expected:
            raise _mismatch(ref, seen)
        return screen, int(x), int(y), int(cols), int(rows)

    def paste_checked(
        self,
        ref: PaneRef,
        text: str,
        *,
        fence: int | None = None,
        enter_count: int = 1,
        enter_delay: float = 0.0,
    ) -> None:
        """Bracketed paste of ``text`` into ``ref``'s pane, then Enter — only if the pane is still
        ``ref`` and, with ``fence``, only if no paste with a newer fence reached it (tmux checks
        both and records the fence, all in one call, so nothing can slip in between).

        Raises :class:`PaneMismatch` / :class:`PaneGone` for the wrong or no pane, and
        :class:`FenceLost` when a newer claim (a recovery) owns the pane's input.
        """
        buf = f"cao-{uuid.uuid4().hex[:12]}"
        pane = ref.pane_id
        then = f"paste-buffer -p -d -r -b {buf} -t {pane}"
        if fence is not None:
            then = f"set-option -p -t {pane} @cao_fence {fence} ; {then}"
        immediate_enter = enter_delay <= 0 and enter_count > 0
        if immediate_enter:
            then += f" ; send-keys -t {pane} Enter" * enter_count
        refused = f"delete-buffer -b {buf} ; display-message -p -t {pane} '{ref.refused}'"
        args = ["if-shell", "-F", "-t", pane, ref.condition(fence, typing=True), then, refused]
        try:
            out = self.run(*args, buffer=(buf, text), target=pane, repeatable=False)
        except TmuxError:
            with contextlib.suppress(TmuxError):
                self.run("delete-buffer", "-b", buf)
            raise
        self._raise_refused(ref, out, fence)
        if not immediate_enter:
            for _ in range(enter_count):
                time.sleep(enter_delay)
                try:
                    self.send_keys_checked(ref, "Enter", fence=fence)
                except PaneInMode as exc:  # the text is in; only its Enter waits for the mode to end
                    raise in_mode_error(exc.mode, typed=True) from None

    def send_keys_checked(
        self, ref: PaneRef, *keys: str, fence: int | None = None, literal: bool = False
    ) -> None:
        """``send-keys`` to ``ref``'s pane only (with ``fence``: only while that fence owns it)."""
        then = " ".join(
            ["send-keys", "-t", ref.pane_id, *(["-l"] if literal else []), *(shlex.quote(k) for k in keys)]
        )
        refused = f"display-message -p -t {ref.pane_id} '{ref.refused}'"
        cond = ref.condition(fence, fence_op="==", typing=True)
        out = self.run(
            "if-shell", "-F", "-t", ref.pane_id, cond, then, refused, target=ref.pane_id, repeatable=False
        )
        self._raise_refused(ref, out, fence)

    def fence_pane(self, ref: PaneRef, fence: int) -> None:
        """Raise the pane's fence (recovery takes over its input): older claims can't paste now."""
        then = f"set-option -p -t {ref.pane_id} @cao_fence {fence}"
        refused = f"display-message -p -t {ref.pane_id} '{ref.refused}'"
        out = self.run(
            "if-shell", "-F", "-t", ref.pane_id, ref.condition(fence), then, refused, target=ref.pane_id
        )
        self._raise_refused(ref, out, fence)

    @staticmethod
    def _raise_refused(ref: PaneRef, out: str, fence: int | None) -> None:
        line = next((x for x in out.splitlines() if x.startswith(_REFUSED)), None)
        if line is None:
            return
        _, seen, pane_fence, mode = ([*line.split(" ", 3), "", "", ""])[:4]
        if seen != ref.expected:
            raise _mismatch(ref, seen)
        if blocker := _blocker(mode):
            raise in_mode_error(blocker)
        raise FenceLost(
            f"pane {ref.pane_id}'s input belongs to a newer delivery (fence {pane_fence}, ours {fence}); "
            "this one lost its claim"
        )

    def kill_checked(self, ref: PaneRef, *, grace: float = 1.0) -> None:
        """Kill ``ref``'s pane and its processes, after verifying it is that pane (a reused pane id
        belongs to someone else: :class:`PaneMismatch` is raised and nothing is signalled).

        A pane that no longer exists is fine (nothing to kill)."""
        try:
            server, pid, dead, home = self.identity(ref.pane_id)
        except (PaneGone, TmuxServerDown):
            return
        if (server, pid) != (ref.server_pid, ref.pane_pid) or (ref.home and home != ref.home):
            raise _mismatch(ref, f"{server}/{pid}/0/{home}")
        if dead:
            # the program exited: its pid may belong to an unrelated process by now, so nothing is
            # signalled; only the (dead) pane goes
            with contextlib.suppress(PaneGone, TmuxServerDown), self._gate.alone():
                cond = ref.condition(alive=False)
                self.run(
                    "if-shell",
                    "-F",
                    "-t",
                    ref.pane_id,
                    cond,
                    f"kill-pane -t {ref.pane_id}",
                    target=ref.pane_id,
                )
            return
        self.kill_pane(ref.pane_id, ref.pane_pid, grace=grace, condition=ref.condition(alive=False))

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
        args = ["paste-buffer", "-p", "-d", "-r", "-b", buf, "-t", pane_id]
        immediate_enter = enter_delay <= 0 and enter_count > 0
        if immediate_enter:
            for _ in range(enter_count):
                args += [";", "send-keys", "-t", pane_id, "Enter"]
        try:
            self.run(*args, buffer=(buf, text), target=pane_id, repeatable=False)
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
        self.run(*args, *keys, target=pane_id, repeatable=False)

    # -- teardown -------------------------------------------------------------------------------
    def kill_pane(
        self, pane_id: str, pane_pid: int | None, *, grace: float = 1.0, condition: str | None = None
    ) -> None:
        """Kill the pane's processes (its process group and every descendant), then the pane
        (with ``condition``: only if that tmux format is still true for it).

        Some CLIs ignore the SIGHUP that closing a pane sends, so we signal them ourselves.
        """
        pids = descendants(pane_pid) if pane_pid else set()
        # alone: with a control client attached, tmux 3.3a crashes when two windows of a session
        # close in one of its reads (cao/tmux/control.py); its processes are signalled in the same
        # section, so a pane that exits on the signal closes before another of ours can
        with self._gate.alone():
            if pane_pid:
                pids.add(pane_pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pane_pid, signal.SIGTERM)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(PaneGone, TmuxServerDown):
                if condition is None:
                    self.run("kill-pane", "-t", pane_id, target=pane_id)
                else:
                    self.run(
                        "if-shell", "-F", "-t", pane_id, condition, f"kill-pane -t {pane_id}", target=pane_id
                    )
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if pid_alive(p)}
            if pids:
                time.sleep(0.02)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def kill_session(self, session_name: str) -> None:
        with contextlib.suppress(TmuxError), self._gate.alone():
            self.run("kill-session", "-t", f"={session_name}")

    def kill_server(self) -> None:
        """Stop this tmux server; for a private socket also remove the socket file (tmux 3.3a leaves it).

        The server says where its socket is (``#{socket_path}``), so the right file goes even when
        ``TMUX_TMPDIR`` differs between whoever started the server and whoever stops it."""
        path: str | None = None
        with contextlib.suppress(TmuxError):
            path = self.run("display-message", "-p", "#{socket_path}").strip() or None
        with contextlib.suppress(TmuxError):
            self.run("kill-server")
        if self.socket_name:
            base = os.environ.get("TMUX_TMPDIR") or "/tmp"
            for candidate in {path, str(Path(base, f"tmux-{os.getuid()}", self.socket_name))}:
                if candidate and Path(candidate).name == self.socket_name:
                    Path(candidate).unlink(missing_ok=True)
