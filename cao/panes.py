"""Pane I/O for terminals: the one way anything reads, types into or fences a terminal's pane.

    PaneIO            the protocol a pane backend speaks (identity-checked: each call names the
                      pane instance by its PaneRef and checks it in the same step as the action)
      Tmux            cao/tmux/: the tmux binary (the only module that runs it): forked clients
                      (the default and the fallback), or one control-mode client (opt-in)
      MemoryPanes     cao/testing/panes.py: an in-memory double for the fast tier
    Panes             a terminal's pane I/O over a PaneIO: the pane's identity from the row, a
                      per-terminal lock, and "gone for good" when the pane is gone or not its own

A mismatch (a new tmux server reusing the pane id, a dead program, a vanished pane, another home's
pane) makes the terminal ``gone`` for good and fails its mail with ``receiver_gone``; whoever else
keeps state per terminal hears of it through :meth:`Panes.on_gone`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import providers
from cao.errors import DiskFull, ForeignTerminal, PaneGone, StoreBusy, TmuxServerDown
from cao.events import EventBus
from cao.states import ENDED, Status, TerminalState
from cao.store import Store, Terminal
from cao.tmux import PaneInfo, PaneRef, TaggedPane
from providers.base import Provider

logger = logging.getLogger(__name__)


class PaneIO(Protocol):
    """What a pane backend does. Every call that names a PaneRef checks that identity (server,
    pane id, process, home tag) in the same step as the action, and refuses to type into a pane a
    person is using (a tmux mode, input off, synchronized panes): see cao/tmux/."""

    def create_window(
        self,
        *,
        session_name: str,
        window_name: str,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        width: int,
        height: int,
        history_limit: int,
        tags: dict[str, str],
    ) -> PaneInfo: ...

    def has_session(self, name: str) -> bool: ...

    def list_sessions(self) -> list[str]: ...

    def is_alive(self) -> bool: ...

    def list_panes(self) -> list[TaggedPane]: ...

    def look_checked(
        self, ref: PaneRef, *, scrollback: bool = False, join: bool = False
    ) -> tuple[str, str]: ...

    def capture_checked(self, ref: PaneRef, *, scrollback: bool = False, join: bool = False) -> str: ...

    def look_many(self, refs: Sequence[PaneRef]) -> dict[str, tuple[str, str] | PaneGone]:
        """:meth:`look_checked` of many panes in as few backend calls as it can (tmux: one command
        line for up to ``LOOK_BATCH`` panes): pane id -> (screen, blocker), or the
        :class:`PaneGone` (or mismatch) that pane's own look would have raised."""
        ...

    def snapshot_checked(self, ref: PaneRef) -> tuple[str, int, int, int, int]: ...

    def paste_checked(
        self,
        ref: PaneRef,
        text: str,
        *,
        fence: int | None = None,
        enter_count: int = 1,
        enter_delay: float = 0.0,
    ) -> None: ...

    def send_keys_checked(
        self, ref: PaneRef, *keys: str, fence: int | None = None, literal: bool = False
    ) -> None: ...

    def fence_pane(self, ref: PaneRef, fence: int) -> None: ...

    def kill_checked(self, ref: PaneRef, *, grace: float = 1.0) -> None: ...

    def ensure_pipe(self, pane_id: str, log_path: Path) -> bool: ...

    def reopen_pipe_checked(self, ref: PaneRef, log_path: Path, *, replace: bool = False) -> bool: ...

    def watch_output(self, on_quiet: Callable[[str], None], quiet: Callable[[str], float]) -> None:
        """Call ``on_quiet(pane_id)`` once a pane that printed has been quiet ``quiet(pane_id)`` s."""

    def refresh_output_watch(self, sessions: Sequence[str] | None = None) -> int:
        """Keep the output watch on these sessions (new sessions, a restarted server)."""

    def shutdown(self) -> None:
        """Stop what the backend runs (tmux: the control-mode clients)."""

    def check_socket(self) -> bool:
        """Housekeeping: the server's socket file removed under it is recreated (True: it was)."""
        ...

    def describe(self) -> dict[str, object]:
        """How the backend talks to its panes now, with counters (``GET /info``'s ``tmux``)."""
        ...


class Panes:
    """A terminal's pane I/O: identity from its row, one lock per terminal, gone for good on a
    mismatch. Typed input, inbox delivery, recovery and delete all go through here."""

    def __init__(self, io: PaneIO, store: Store, *, home_tag: str, events: EventBus) -> None:
        self.io = io
        self.store = store
        self.home_tag = home_tag
        self.events = events
        self._gone_listeners: list[Callable[[str], None]] = []
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()

    def on_gone(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(terminal_id)`` when a terminal is found gone (its state is forgotten)."""
        self._gone_listeners.append(listener)

    @staticmethod
    def provider(terminal: Terminal) -> Provider:
        return providers.get(terminal.provider)

    @contextmanager
    def lock(self, terminal_id: str) -> Iterator[None]:
        """Serialise everything that types into one terminal (typed input, inbox delivery,
        recovery, delete): a status read and the paste that depends on it never straddle another."""
        with self._locks_guard:
            lock = self._locks.setdefault(terminal_id, threading.RLock())
        with lock:
            yield

    def check_local(self, terminal: Terminal) -> None:
        """:class:`ForeignTerminal` if another host's tmux runs it: never looked at, typed into or
        killed here (its pane id would name some other pane of ours, and a mismatch would make it
        gone for good)."""
        if terminal.host is not None and self.store.host is not None and terminal.host != self.store.host:
            raise ForeignTerminal(
                f"terminal {terminal.id} runs on host {terminal.host}; only that host reads, types into "
                "or deletes its pane (ask its cao-server, or any host's API, which forwards it there)",
                host=terminal.host,
            )

    def ref(self, terminal: Terminal) -> PaneRef:
        """The terminal's pane identity; :class:`PaneGone` if it has none any more,
        :class:`ForeignTerminal` if another host's tmux runs it (:meth:`check_local`)."""
        self.check_local(terminal)
        if terminal.state in ENDED:
            raise PaneGone(
                f"terminal {terminal.id} is {terminal.state}"
                + (f" ({terminal.gone_reason})" if terminal.gone_reason else "")
            )
        if terminal.pane_id is None or terminal.pane_pid is None or terminal.tmux_server_pid is None:
            raise PaneGone(f"terminal {terminal.id} has no pane yet (state {terminal.state})")
        return PaneRef(terminal.tmux_server_pid, terminal.pane_id, terminal.pane_pid, self.home_tag)

    @contextmanager
    def _pane(self, terminal: Terminal) -> Iterator[PaneRef]:
        """Run pane I/O; a pane that is gone or not the terminal's makes the terminal gone for good."""
        ref = self.ref(terminal)
        try:
            yield ref
        except TmuxServerDown as exc:
            self.lose(terminal, f"the tmux server is not running ({exc.message})")
            raise
        except PaneGone as exc:
            self.lose(terminal, exc.message)
            raise

    def screen(self, terminal: Terminal, *, scrollback: bool = False, join: bool = False) -> str:
        with self._pane(terminal) as ref:
            return self.io.capture_checked(ref, scrollback=scrollback, join=join)

    def screens(self, terminals: Sequence[Terminal]) -> dict[str, str | PaneGone | TmuxServerDown]:
        """The screens of many terminals in one batched look (a listing of 200 terminals is
        four tmux calls, not 200): terminal id -> screen, or the error its own :meth:`screen` would have
        raised; a pane found gone or not its own makes the terminal gone for good, as there."""
        refs: dict[str, PaneRef] = {}
        out: dict[str, str | PaneGone | TmuxServerDown] = {}
        for t in terminals:
            try:
                refs[t.id] = self.ref(t)
            except PaneGone as exc:
                out[t.id] = exc
        if not refs:
            return out
        try:
            looks = self.io.look_many(list(refs.values()))
        except TmuxServerDown as exc:
            for t in terminals:
                if t.id in refs:
                    self.lose(t, f"the tmux server is not running ({exc.message})")
                    out[t.id] = exc
            return out
        for t in terminals:
            ref = refs.get(t.id)
            if ref is None:
                continue
            got = looks.get(ref.pane_id) or PaneGone(f"tmux pane {ref.pane_id} no longer exists")
            if isinstance(got, PaneGone):
                self.lose(t, got.message)
                out[t.id] = got
            else:
                out[t.id] = got[0]
        return out

    def look(self, terminal: Terminal) -> tuple[str, str]:
        """The screen and what keeps input out of the pane (``""``: nothing; else a tmux mode's
        name, ``input-off`` or ``synchronize-panes``), read in one call."""
        with self._pane(terminal) as ref:
            return self.io.look_checked(ref)

    def snapshot(self, terminal: Terminal) -> tuple[str, int, int, int, int]:
        """The screen with colours, cursor and size (for the dashboard's live terminal view)."""
        with self._pane(terminal) as ref:
            return self.io.snapshot_checked(ref)

    def paste(self, terminal: Terminal, text: str, *, fence: int | None = None, enter: bool = True) -> None:
        prov = self.provider(terminal)
        with self._pane(terminal) as ref:
            self.io.paste_checked(
                ref,
                text,
                fence=fence,
                enter_count=prov.enter_count if enter else 0,
                enter_delay=prov.paste_enter_delay,
            )

    def keys(self, terminal: Terminal, *keys: str, fence: int | None = None, literal: bool = False) -> None:
        with self._pane(terminal) as ref:
            self.io.send_keys_checked(ref, *keys, fence=fence, literal=literal)

    def fence(self, terminal: Terminal, fence: int) -> None:
        with self._pane(terminal) as ref:
            self.io.fence_pane(ref, fence)

    def lose(self, terminal: Terminal, reason: str) -> None:
        """The terminal's pane is gone for good: never live again; its undelivered mail fails."""
        if terminal.state in ENDED:
            return
        try:
            failed = self.store.mark_gone(terminal.id, reason)
        except (StoreBusy, DiskFull) as exc:  # known in memory now; the next read records it
            extra = {"terminal_id": terminal.id, "error": exc.message}
            logger.warning("terminal gone, not yet recorded", extra=extra)
            terminal.state, terminal.status, terminal.gone_reason = TerminalState.GONE, Status.GONE, reason
            return
        terminal.state = TerminalState.GONE.value
        terminal.status = Status.GONE.value
        terminal.gone_reason = reason
        logger.warning(
            "terminal gone", extra={"terminal_id": terminal.id, "reason": reason, "failed_messages": failed}
        )
        self.events.publish("terminal.gone", terminal_id=terminal.id, reason=reason, failed_messages=failed)
        for listener in self._gone_listeners:
            listener(terminal.id)
