"""tmux control mode (``tmux -C``): one long-lived client that carries commands, and per-session
clients that report pane output.

A forked ``tmux`` client costs ~3 ms of CPU per command (most of a delivery's cost); a control
client runs the same command for ~0.3 ms. Commands are written one line each, and tmux answers every
command of a line with a ``%begin … %end`` (or ``%error``) block, in the order the lines were sent,
so several threads can have commands in flight at once (pipelined): each request is followed by a
*sync* line (``display-message -p <token>``) and the blocks up to the sync block's answer are that
request's reply — one line may hold several commands (``;``, ``if-shell``), each with its own block.

What goes wrong, and what happens then (``Tmux.run`` in cao/tmux/client.py decides):

- The client dies (tmux restarted, the attached session was killed, a kill -9) or stops answering
  (seen on some tmux releases): every request in flight fails with :class:`ControlLost`, telling
  whether it had been written. A command that only reads is run again by a forked client; one that
  types (paste, keys) is not — its fate is unknown, and the caller treats it as an unconfirmed paste
  (delivery looks for the message's own header before pasting again). Until a new client starts
  (tried again after ``RESTART_BACKOFF``), forked clients carry every command.
- A pane prints ``%end …``: a block ends only at the exact ``%end``/``%error`` guard of its own
  ``%begin`` (time, command number, flags), which a program in a pane does not know.

Arguments are written as tmux's own parser reads them: each one double-quoted, with ``\\``, ``"``,
``$``, a leading ``~`` and every control character escaped (``\\n``, ``\\t``, octal ``\\NNN``); the text
of a paste goes in with ``set-buffer`` the same way (a forked client uses ``load-buffer -`` and
stdin; control mode has no stdin per command).

tmux 3.3a's server can crash (SIGSEGV, every pane gone) with a control client attached
(docs/tmux.md has the table): when a notification reaches a client that is still attaching
(``new-session`` right after ``tmux -C attach``: 4-11% of tries, none in 400 once the client's first
answer was awaited), and when two windows of a session close in one read of the server (20/20 with
three kills on one line). So a client's start waits for its first answer, and an attach or a kill
holds the :class:`Gate` alone: no other command of this process is in flight meanwhile.

Output clients (``OutputWatch``) are attached read-only to one session each (tmux reports
``%output`` only for the panes of the client's own session) and call ``on_quiet(pane_id)`` once a
pane that printed has been quiet for ``quiet(pane_id)`` seconds: the wake that ends a busy turn.
They attach with ``pause-after``, so tmux drops, rather than queues without bound, output a watch
has fallen behind on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from cao.errors import TmuxError

logger = logging.getLogger(__name__)

START_TIMEOUT = 3.0  # seconds for a new client to answer its attach
REPLY_TIMEOUT = 10.0  # seconds without any answer from a client with requests in flight: wedged
RESTART_BACKOFF = 1.0  # seconds between attempts to start a client after one died or failed
PAUSE_AFTER = 1  # seconds an output watch may fall behind before tmux drops a pane's output for it
_SPECIAL = {"\\": "\\\\", '"': '\\"', "$": "\\$", "\n": "\\n", "\t": "\\t"}


class Gate:
    """Commands share the gate; some things hold it alone (see the module notes on tmux 3.3a's
    crashes): a control client's attach, and the kill of a pane or a session, so no other command
    of ours is in the same read of tmux's. A thread holding it alone runs its own commands through
    it; one waiting to hold it alone goes before new commands (a steady stream can't hold it off)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._owner: int | None = None  # the thread holding it alone
        self._waiting = 0

    @contextlib.contextmanager
    def command(self) -> Iterator[None]:
        if self._owner == threading.get_ident():
            yield  # the thread that holds it alone
            return
        with self._cond:
            while self._owner is not None or self._waiting:
                self._cond.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            yield
            return
        with self._cond:
            self._waiting += 1
            try:
                while self._owner is not None or self._running:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._owner = me
        try:
            yield
        finally:
            with self._cond:
                self._owner = None
                self._cond.notify_all()


def _reap(proc: subprocess.Popen[bytes], *, close: bool = False) -> None:
    """Kill a client and collect its exit status (no zombie, no "still running" at exit).
    ``close``: also close its pipes (only the thread that reads them does: a descriptor closed
    under a blocked read could be reused by another file before the read returns)."""
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=2)
    if close:
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


def _attach(argv: Sequence[str], session: str, flags: str) -> subprocess.Popen[bytes] | None:
    """Start ``tmux -C attach`` to ``session`` with client ``flags``; None if it can't be run."""
    try:
        return subprocess.Popen(
            [*argv, "-C", "attach-session", "-f", flags, "-t", f"={session}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a ^C at cao-server's terminal is not the client's
        )
    except OSError:
        return None


class ControlLost(TmuxError):
    """The control client died or wedged before this request's answer: ``sent`` says whether tmux
    may have run it."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def quote(arg: str) -> str:
    """One argument as tmux's command parser reads it back exactly (double quotes, escapes)."""
    out = ['"']
    for i, ch in enumerate(arg):
        code = ord(ch)
        if ch == "\x00":
            continue  # a tmux string ends at NUL: it can't be carried (cao neutralises it before)
        if ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif ch == "~" and i == 0:
            out.append("\\~")  # a leading ~ is the home directory, even inside double quotes
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\{code:03o}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")  # a lone surrogate can't be encoded (the forked path's "replace")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def command_line(args: Sequence[str]) -> str:
    """An argv (``;`` items separate commands, as for a forked client) as one control-mode line."""
    return " ".join(";" if a == ";" else quote(a) for a in args)


class _Request:
    __slots__ = ("blocks", "done", "errors", "lost")

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.errors: list[str] = []
        self.done = threading.Event()
        self.lost: ControlLost | None = None


class _Reader:
    """Splits a control client's stdout into lines and ``%begin/%end`` blocks."""

    def __init__(self, on_block: Callable[[bool, str], None], on_note: Callable[[bytes], None]) -> None:
        self.on_block = on_block  # (is_error, text) of a block our commands caused (flags 1)
        self.on_note = on_note  # a notification line outside any block (%output, %exit…)
        self._buf = b""
        self._guard: bytes | None = None  # b"TIME NUMBER FLAGS" of the block being read
        self._lines: list[bytes] = []

    def feed(self, data: bytes) -> None:
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if self._guard is None:
            if line.startswith(b"%begin "):
                self._guard = line[7:]
                self._lines = []
            else:
                self.on_note(line)
            return
        if line == b"%end " + self._guard or line == b"%error " + self._guard:
            guard, self._guard = self._guard, None
            if guard.endswith(b" 1"):  # flags 1: a command this client sent (0: its own attach)
                text = b"\n".join(self._lines).decode("utf-8", "replace")
                self.on_block(line.startswith(b"%error"), text + ("\n" if self._lines else ""))
            self._lines = []
            return
        self._lines.append(line)


class ControlClient:
    """One ``tmux -C attach`` client: ``run`` sends a command line and waits for its blocks."""

    def __init__(self, argv: Sequence[str], session: str, *, name: str = "cao-tmux-control") -> None:
        self.session = session
        self.token = f"cao-sync-{uuid.uuid4().hex}"
        self._sync = f"display-message -p {self.token}\n".encode()
        self._tmux = list(argv)
        self._name = name
        self._write_lock = threading.Lock()
        self._pending: deque[_Request] = deque()
        self._pending_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._alive = False
        self._last_read = time.monotonic()
        self.reply_timeout = REPLY_TIMEOUT

    # -- life ---------------------------------------------------------------------------------
    def start(self, timeout: float = START_TIMEOUT) -> bool:
        self._proc = _attach(self._tmux, self.session, "ignore-size,no-output")
        if self._proc is None:
            return False
        self._alive = True
        threading.Thread(target=self._read_loop, name=self._name, daemon=True).start()
        # the attach answers with its own block and then %session-changed; a sync proves commands run
        try:
            self.run(f"display-message -p {self.token}", timeout=timeout)
        except TmuxError:
            self.close()
            return False
        return True

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        proc, self._alive = self._proc, False
        if proc is not None:
            _reap(proc)
        self._fail_all("the tmux control client was stopped")

    def _fail_all(self, why: str) -> None:
        with self._pending_lock:
            pending, self._pending = list(self._pending), deque()
        for req in pending:
            req.lost = ControlLost(why, sent=True)
            req.done.set()

    # -- requests -----------------------------------------------------------------------------
    def run(self, line: str, *, timeout: float | None = None) -> tuple[str, list[str]]:
        """Send one command line; returns ``(stdout, errors)`` as a forked client would print them:
        the text of every block, and the text of the ``%error`` ones. Raises :class:`ControlLost`."""
        proc = self._proc
        if not self._alive or proc is None or proc.stdin is None:
            raise ControlLost("the tmux control client is not running", sent=False)
        req = _Request()
        data = line.encode("utf-8", "replace") + b"\n" + self._sync
        with self._write_lock:
            with self._pending_lock:
                self._pending.append(req)
            try:
                proc.stdin.write(data)
                proc.stdin.flush()
            except (OSError, ValueError):
                with self._pending_lock, contextlib.suppress(ValueError):
                    self._pending.remove(req)
                self._lost("its stdin closed")
                raise ControlLost("the tmux control client's stdin closed", sent=False) from None
        timeout = self.reply_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not req.done.wait(0.5):
            # wedged: nothing at all read for ``timeout`` while this request waits
            now = time.monotonic()
            if now >= deadline and now - self._last_read >= timeout:
                self._lost(f"it answered nothing for {timeout:.0f} s")
                break
        if req.lost is not None:
            raise req.lost
        return "".join(req.blocks), req.errors

    # -- reading ------------------------------------------------------------------------------
    def _on_block(self, error: bool, text: str) -> None:
        with self._pending_lock:
            req = self._pending[0] if self._pending else None
            if req is None:
                return  # not ours (a hook's command): nothing waits for it
            if not error and text == self.token + "\n":
                self._pending.popleft()
                req.done.set()
                return
        req.blocks.append(text)
        if error:
            req.errors.append(text.strip())

    def _read_loop(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        reader = _Reader(self._on_block, lambda _line: None)
        try:
            while True:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                self._last_read = time.monotonic()
                reader.feed(data)
        finally:
            self._lost("it exited")
            with self._write_lock:  # no request is being written while its stdin closes
                _reap(proc, close=True)

    def _lost(self, why: str) -> None:
        was = self._alive
        self._alive = False
        if was:
            logger.info("tmux control client lost: %s", why, extra={"session": self.session})
        proc = self._proc
        if proc is not None:
            _reap(proc)
        self._fail_all(f"the tmux control client was lost ({why}); the command's outcome is unknown")


class OutputWatch:
    """A read-only control client on one session: ``%output`` of its panes → quiet timers → wake.

    One thread per session (it sleeps in ``select`` until output or the earliest quiet timer)."""

    def __init__(
        self,
        argv: Sequence[str],
        session: str,
        *,
        on_quiet: Callable[[str], None],
        quiet: Callable[[str], float],
        on_exit: Callable[[OutputWatch], None] | None = None,
    ) -> None:
        self.session = session
        self.on_quiet = on_quiet
        self.quiet = quiet
        self.on_exit = on_exit
        self._tmux = list(argv)
        self._proc: subprocess.Popen[bytes] | None = None
        self._due: dict[str, float] = {}  # pane id -> when its quiet timer fires
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._answered = threading.Event()  # the attach's first answer came (or the client ended)
        self.paused = 0  # how often tmux paused a pane for this watch (it fell behind)

    def start(self, timeout: float = START_TIMEOUT) -> bool:
        """Attach and wait for tmux's first answer (the attach's own block): until then the client
        is half attached, when tmux 3.3a must not be asked to create a session."""
        self._proc = _attach(self._tmux, self.session, f"ignore-size,read-only,pause-after={PAUSE_AFTER}")
        if self._proc is None:
            return False
        self._thread = threading.Thread(target=self._loop, name=f"cao-output-{self.session}", daemon=True)
        self._thread.start()
        if not self._answered.wait(timeout) or not self.alive:
            self.close()
            return False
        return True

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _note(self, line: bytes) -> None:
        # with pause-after, output comes as %extended-output; %pause: tmux stopped sending a pane's
        # output because we were more than PAUSE_AFTER behind (it dropped it, rather than queue it
        # without bound): that pane printed, and it is continued at once
        for prefix in (b"%extended-output %", b"%output %", b"%pause %"):
            if line.startswith(prefix):
                break
        else:
            return
        start = len(prefix) - 1
        end = line.find(b" ", start)
        pane = (line[start:] if end < 0 else line[start:end]).decode("ascii", "replace")
        if prefix == b"%pause %" and pane[1:].isdigit():
            self.paused += 1
            with contextlib.suppress(OSError, ValueError):
                proc = self._proc
                if proc is not None and proc.stdin is not None:
                    os.write(proc.stdin.fileno(), f"refresh-client -A '{pane}:continue'\n".encode())
        self._due[pane] = time.monotonic() + self.quiet(pane)

    def _loop(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        reader = _Reader(lambda _e, _t: None, self._note)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                for pane in [p for p, due in self._due.items() if due <= now]:
                    del self._due[pane]
                    try:
                        self.on_quiet(pane)
                    except Exception:
                        logger.exception("output wake failed", extra={"pane_id": pane})
                wait = max(0.0, min(self._due.values()) - now) if self._due else None
                try:
                    ready, _, _ = select.select([fd], [], [], wait)
                except (OSError, ValueError):
                    break
                if not ready:
                    continue
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                self._answered.set()
                reader.feed(data)
        finally:
            self._answered.set()
            _reap(proc, close=True)
            if self.on_exit is not None and not self._stop.is_set():
                with contextlib.suppress(Exception):
                    self.on_exit(self)
