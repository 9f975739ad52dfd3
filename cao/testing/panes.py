"""An in-memory pane backend (the ``PaneIO`` protocol of cao/panes.py) for the fast test tier.

Each pane runs the bundled scripted agent's own ``Agent`` (providers/scripted_agent.py) in this
process, fed the bytes tmux would send it (a bracketed paste, Enter, keys) and drawing into a tiny
line screen, on an injected clock: delivery, recovery, gating, batching and retries run against
the real screens the scripted provider reads, without tmux and without waiting.

What it models of tmux: the pane instance (server pid, pane id, pane pid, the @cao_home tag),
checked on every call like ``if-shell -F`` does; the paste fence (``@cao_fence``); a person's tmux
mode (:meth:`MemoryPanes.enter_mode`); dead panes (:meth:`MemoryPanes.exit`); killed panes; the
pane log (every byte drawn is appended to it). What it does not: real terminals, timing races
inside tmux, the real CLIs. The integration tier covers those.
"""

from __future__ import annotations

import argparse
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cao.clock import Clock
from cao.errors import FenceLost, PaneGone, PaneMismatch, TmuxServerDown
from cao.tmux import PaneInfo, PaneRef, TaggedPane, in_mode_error
from providers.scripted_agent import PASTE_END, PASTE_START, Agent

SERVER_PID = 424242
KEYS = {"Enter": b"\r", "C-c": b"\x03", "Escape": b"\x1b", "Tab": b"\t", "Space": b" ", "C-u": b"\x15"}


class Screen:
    """Just the terminal the scripted agent needs: text, ``\\r``, ``\\n``, ``ESC[K``, modes ignored."""

    def __init__(self) -> None:
        self.lines: list[str] = [""]
        self.col = 0

    def write(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if text.startswith("\x1b[K", i):
                line = self.lines[-1]
                self.lines[-1] = line[: self.col]
                i += 3
                continue
            if ch == "\x1b":  # another control sequence (bracketed-paste mode on/off): nothing drawn
                j = i + 2
                while j < len(text) and not ("@" <= text[j] <= "~"):
                    j += 1
                i = j + 1
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self.lines.append("")
                self.col = 0
            else:
                line = self.lines[-1]
                self.lines[-1] = line[: self.col] + ch + line[self.col + 1 :]
                self.col += 1
            i += 1

    def capture(self, height: int, scrollback: bool) -> str:
        lines = self.lines if scrollback else self.lines[-height:]
        if not scrollback:
            lines = lines + [""] * (height - len(lines))
        return "\n".join(lines) + "\n"


@dataclass
class MemoryPane:
    pane_id: str
    pane_pid: int
    session: str
    window: str
    tags: dict[str, str]
    log_path: Path
    agent: Agent
    screen: Screen = field(default_factory=Screen)
    dead: bool = False
    mode: str = ""  # a person's tmux mode ("copy-mode"…), "" for none
    fence: int | None = None
    piped: bool = True
    received: list[str] = field(default_factory=list)  # bytes fed, decoded: what the pane was sent


class MemoryPanes:
    """``PaneIO`` in memory (see the module docstring). Thread-safe: one lock for all panes."""

    def __init__(self, clock: Clock, *, height: int = 50) -> None:
        self.clock = clock
        self.height = height
        self.panes: dict[str, MemoryPane] = {}
        self.sessions: set[str] = set()
        self.server_pid = SERVER_PID
        self.up = True
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._on_quiet: Callable[[str], None] | None = None
        self.output_wakes = 0
        self.batched_looks = 0  # look_many calls (a listing is one)

    # -- what tests do to the panes ----------------------------------------------------------------
    def pane(self, pane_id: str) -> MemoryPane:
        return self.panes[pane_id]

    def enter_mode(self, pane_id: str, mode: str = "copy-mode") -> None:
        self.panes[pane_id].mode = mode

    def leave_mode(self, pane_id: str) -> None:
        self.panes[pane_id].mode = ""

    def type(self, pane_id: str, text: str) -> None:
        """A person types (no cao involved)."""
        with self._lock:
            self._feed(self.panes[pane_id], text.encode())

    def exit(self, pane_id: str) -> None:
        """The program exits (the pane stays, dead: remain-on-exit)."""
        self.panes[pane_id].dead = True

    def close(self, pane_id: str) -> None:
        """The pane is killed behind cao's back."""
        self.panes.pop(pane_id, None)

    def restart_server(self) -> None:
        """A new tmux server: every pane gone, ids handed out again from %1."""
        self.panes.clear()
        self.sessions.clear()
        self.server_pid += 1
        self._ids = itertools.count(1)

    # -- PaneIO ------------------------------------------------------------------------------------
    def create_window(
        self,
        *,
        session_name: str,
        window_name: str,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        width: int = 200,
        height: int = 50,
        history_limit: int = 50000,
        tags: dict[str, str] | None = None,
    ) -> PaneInfo:
        del cwd, width, history_limit
        self._up()
        with self._lock:
            n = next(self._ids)
            pane_id = f"%{n}"
            args = argparse.Namespace(
                terminal_id=_arg(command, "--terminal-id"), rules=None, record=None, server=None
            )
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.touch()
            holder: list[MemoryPane] = []
            agent = Agent(
                args,
                environ=env,
                now=self.clock.monotonic,
                wall=self.clock.now,
                out=lambda text: self._draw(holder[0], text),
            )
            pane = MemoryPane(
                pane_id, 50_000 + n, session_name, window_name, dict(tags or {}), log_path, agent
            )
            holder.append(pane)
            self.height = height
            self.panes[pane_id] = pane
            self.sessions.add(session_name)
            agent.start(sleep=self.clock.sleep)
            return PaneInfo(pane_id, pane.pane_pid, session_name, window_name, self.server_pid)

    def has_session(self, name: str) -> bool:
        return name in self.sessions and any(p.session == name for p in self.panes.values())

    def list_sessions(self) -> list[str]:
        return sorted({p.session for p in self.panes.values()})

    def is_alive(self) -> bool:
        return self.up

    def list_panes(self) -> list[TaggedPane]:
        if not self.up:
            return []
        return [
            TaggedPane(
                self.server_pid,
                p.pane_id,
                p.pane_pid,
                p.dead,
                p.tags.get("cao_terminal", ""),
                p.tags.get("cao_home", ""),
                piped=p.piped,
                session_name=p.session,
            )
            for p in self.panes.values()
        ]

    def look_checked(self, ref: PaneRef, *, scrollback: bool = False, join: bool = False) -> tuple[str, str]:
        del join
        with self._lock:
            pane = self._checked(ref)
            self._tick(pane)
            return pane.screen.capture(self.height, scrollback), pane.mode

    def capture_checked(self, ref: PaneRef, *, scrollback: bool = False, join: bool = False) -> str:
        return self.look_checked(ref, scrollback=scrollback, join=join)[0]

    def look_many(self, refs: Sequence[PaneRef]) -> dict[str, tuple[str, str] | PaneGone]:
        out: dict[str, tuple[str, str] | PaneGone] = {}
        self.batched_looks += 1
        for ref in refs:
            try:
                out[ref.pane_id] = self.look_checked(ref)
            except PaneGone as exc:
                out[ref.pane_id] = exc
        return out

    def snapshot_checked(self, ref: PaneRef) -> tuple[str, int, int, int, int]:
        screen = self.capture_checked(ref)
        return screen, 0, 0, 200, self.height

    def paste_checked(
        self,
        ref: PaneRef,
        text: str,
        *,
        fence: int | None = None,
        enter_count: int = 1,
        enter_delay: float = 0.0,
    ) -> None:
        with self._lock:
            pane = self._checked(ref, fence=fence)
            if pane.mode:
                raise in_mode_error(pane.mode)
            if fence is not None:
                pane.fence = fence
            self._feed(pane, PASTE_START + text.encode("utf-8", "replace") + PASTE_END)
            if enter_delay <= 0:
                for _ in range(enter_count):
                    self._feed(pane, b"\r")
        if enter_delay > 0:
            for _ in range(enter_count):
                self.clock.sleep(enter_delay)
                self.send_keys_checked(ref, "Enter", fence=fence)

    def send_keys_checked(
        self, ref: PaneRef, *keys: str, fence: int | None = None, literal: bool = False
    ) -> None:
        with self._lock:
            pane = self._checked(ref, fence=fence, fence_op="==")
            if pane.mode:
                raise in_mode_error(pane.mode)
            for key in keys:
                self._feed(pane, key.encode() if literal else KEYS.get(key, key.encode()))

    def fence_pane(self, ref: PaneRef, fence: int) -> None:
        with self._lock:
            pane = self._checked(ref, fence=fence)
            pane.fence = fence

    def kill_checked(self, ref: PaneRef, *, grace: float = 1.0) -> None:
        del grace
        with self._lock:
            pane = self.panes.get(ref.pane_id)
            if pane is None or not self.up:
                return
            self._same(pane, ref, alive=False)
            del self.panes[ref.pane_id]

    def ensure_pipe(self, pane_id: str, log_path: Path) -> bool:
        pane = self.panes.get(pane_id)
        if pane is None:
            raise PaneGone(f"tmux pane {pane_id} no longer exists")
        opened = not pane.piped
        pane.piped, pane.log_path = True, log_path
        return opened

    def reopen_pipe_checked(self, ref: PaneRef, log_path: Path, *, replace: bool = False) -> bool:
        with self._lock:
            pane = self._checked(ref)
            if pane.piped and not replace:
                return False
            pane.piped, pane.log_path = True, log_path
            return True

    # -- inside ------------------------------------------------------------------------------------
    def _up(self) -> None:
        if not self.up:
            raise TmuxServerDown("no tmux server is running (in memory); its terminals are gone")

    def _same(self, pane: MemoryPane, ref: PaneRef, *, alive: bool = True) -> None:
        seen = f"{self.server_pid}/{pane.pane_pid}/{int(pane.dead)}/{pane.tags.get('cao_home', '')}"
        ok = (self.server_pid, pane.pane_pid) == (ref.server_pid, ref.pane_pid)
        ok = ok and (not ref.home or pane.tags.get("cao_home") == ref.home)
        if not ok or (alive and pane.dead):
            raise PaneMismatch(f"pane {ref.pane_id} is not the terminal's ({seen})")

    def _checked(self, ref: PaneRef, *, fence: int | None = None, fence_op: str = "<") -> MemoryPane:
        self._up()
        pane = self.panes.get(ref.pane_id)
        if pane is None:
            raise PaneGone(f"tmux pane {ref.pane_id} no longer exists")
        self._same(pane, ref)
        if fence is not None and pane.fence is not None:
            lost = not pane.fence < fence if fence_op == "<" else pane.fence != fence
            if lost:
                raise FenceLost(
                    f"pane {ref.pane_id}'s input belongs to a newer delivery ({pane.fence}, ours {fence})"
                )
        return pane

    def _feed(self, pane: MemoryPane, data: bytes) -> None:
        if pane.dead:
            return
        pane.received.append(data.decode("utf-8", "replace"))
        self._tick(pane)
        pane.agent.feed(data)
        if not pane.agent.running:
            pane.dead = True

    def _tick(self, pane: MemoryPane) -> None:
        if not pane.dead:
            pane.agent.tick()

    def _draw(self, pane: MemoryPane, text: str) -> None:
        pane.screen.write(text)
        if pane.piped:
            with pane.log_path.open("a", encoding="utf-8") as fh:
                fh.write(text)
        if self._on_quiet is not None:  # tmux's %output, quiet at once: the engine's trigger 2b
            self.output_wakes += 1
            self._on_quiet(pane.pane_id)

    # -- the output watch (tmux: control-mode %output) ----------------------------------------------
    def watch_output(self, on_quiet: Callable[[str], None], quiet: Callable[[str], float]) -> None:
        self._on_quiet = on_quiet

    def refresh_output_watch(self, sessions: Sequence[str] | None = None) -> int:
        return len(self.sessions) if self._on_quiet is not None else 0

    def shutdown(self) -> None:
        self._on_quiet = None

    def check_socket(self) -> bool:
        return False  # no socket file to lose

    def describe(self) -> dict[str, object]:
        return {"client": "memory", "output_wakes": self.output_wakes}


def _arg(command: Sequence[str], flag: str) -> str | None:
    """The value after ``flag`` in a command line (the scripted agent's --terminal-id)."""
    for i, part in enumerate(command):
        if part == flag and i + 1 < len(command):
            return command[i + 1]
    return None
