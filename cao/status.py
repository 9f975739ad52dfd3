"""What a terminal is doing: its status, read live from its screen and from what its CLI's own
lifecycle hooks reported (cao/hookstate.py), and the view of it the API shows.

The screen is the state: every read is an identity-checked capture (cao/panes.py) that the
terminal's provider interprets; the row only keeps the last status seen (for listings and the
moment it first looked ready). The hook state — the latest event each CLI reported, and who may
report for a terminal (its own hook key) — is owned here.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cao.errors import DiskFull, Forbidden, InvalidInput, PaneGone, StoreBusy, TmuxServerDown
from cao.events import EventBus
from cao.hookstate import Hooks, combine, hook_key, keep_secret, load_secret
from cao.panes import Panes
from cao.settings import Settings
from cao.states import ENDED, READY, HookPhase, Status, TerminalState
from cao.store import Store, Terminal
from cao.timefmt import iso
from providers.base import Reading, TerminalStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TerminalView:
    """A terminal row plus its live status, as the API shows it."""

    terminal: Terminal
    status: str
    mcp_ready: bool | None = None  # None: this provider doesn't wait for cao's MCP server
    status_reason: str | None = None  # why: an unknown screen, hooks, or why the terminal is gone
    hook: dict[str, object] | None = None  # the CLI's latest lifecycle hook event (cao/hookstate.py)

    def as_dict(self) -> dict[str, object]:
        t = self.terminal
        return {
            "id": t.id,
            "name": t.name,
            "provider": t.provider,
            "session_name": t.session_name,
            "agent_profile": t.agent_profile,
            "working_directory": t.working_directory,
            "status": self.status,
            "state": t.state,
            "pane_id": t.pane_id,
            "supervisor_id": t.supervisor_id,
            "mcp_ready": self.mcp_ready,
            "status_reason": self.status_reason,
            "hook": self.hook,
            "created_at": iso(t.created_at),
            "last_active": iso(t.last_active),
        }


class StatusReader:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        panes: Panes,
        *,
        events: EventBus,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.panes = panes
        self.events = events
        self.clock = clock
        self.hooks = Hooks(clock)  # what the CLIs' own lifecycle hooks reported (cao/hookstate.py)
        self._hooks_lock = threading.Lock()  # one hook report (memory + row) at a time
        self._hook_secret = load_secret(settings.home)
        self._seen_status: dict[str, str] = {}  # last status published per terminal
        self._reasons: dict[str, str] = {}  # why a terminal reads unknown (shown with its status)
        # told of every live status read (cao/coordination.py follows workers' work with it)
        self.on_status: Callable[[Terminal, str], None] | None = None
        # statuses of other hosts' terminals (cao/hosts.py asks their hosts; their panes aren't ours)
        self.remote: Callable[[Sequence[Terminal]], dict[str, str]] = lambda ts: {
            t.id: Status.HOST_UNREACHABLE.value for t in ts
        }
        panes.on_gone(self._gone)

    def _foreign(self, terminal: Terminal) -> bool:
        return terminal.host is not None and self.store.host is not None and terminal.host != self.store.host

    def keep_secret(self) -> None:
        """Write the hook secret again if it was deleted or changed under the running server."""
        keep_secret(self.settings.home, self._hook_secret)

    def _gone(self, terminal_id: str) -> None:
        self.note_status(terminal_id, Status.GONE)
        self.forget(terminal_id)

    def forget(self, terminal_id: str) -> None:
        """The terminal ended: its hook state goes for good (a late report can't revive it)."""
        with self._hooks_lock:
            self.hooks.forget(terminal_id)

    def deleted(self, terminal_id: str) -> None:
        self._seen_status.pop(terminal_id, None)
        self._reasons.pop(terminal_id, None)
        self.forget(terminal_id)

    # -- status ------------------------------------------------------------------------------------
    def status(self, terminal: Terminal, *, screen: str | None = None) -> str:
        """Live status from the screen (``screen``: one just captured, by :meth:`statuses`);
        ``gone`` when the pane is gone or not the terminal's."""
        if terminal.state in ENDED:
            return Status.GONE
        if terminal.state == TerminalState.STARTING:
            return Status.STARTING
        if screen is None and self._foreign(terminal):
            return self.remote([terminal])[terminal.id]
        if screen is None:
            try:
                screen = self.panes.screen(terminal)
            except (PaneGone, TmuxServerDown):
                return Status.GONE
        status = self.read(terminal, screen).status.value
        if terminal.ready_at is None and status == TerminalStatus.PROCESSING:
            status = Status.STARTING  # never ready yet: starting, not working
        self.remember_status(terminal, status)
        self.note_status(terminal.id, status)
        if self.on_status is not None:
            try:
                self.on_status(terminal, status)
            except Exception:  # following the work must never fail a status read
                logger.exception("status listener failed", extra={"terminal_id": terminal.id})
        return status

    def read(self, terminal: Terminal, screen: str) -> Reading:
        """The status of ``screen`` as the provider reads it, combined with what the CLI's own
        lifecycle hooks reported (cao/hookstate.py); the reason is kept for the operator when the
        status is unknown or the hooks decided or annotated it."""
        reading, by_hooks = combine(
            self.panes.provider(terminal).detect(screen),
            self.hooks.state(terminal.id),
            self.clock(),
            settle=self.settings.hook_settle,
        )
        unknown = reading.status == TerminalStatus.UNKNOWN
        if unknown and terminal.status != reading.status:
            logger.warning("terminal status unknown: %s", reading.reason, extra={"terminal_id": terminal.id})
        self._reasons[terminal.id] = reading.reason if unknown or by_hooks else ""
        return reading

    def explain(self, terminal: Terminal) -> tuple[dict[str, object], str]:
        """Why ``terminal`` reads the status it does (cao/explain.py), made the way ``status``
        makes a reading, from one fresh look at its pane; and the screen it was made from. Read
        only: nothing is recorded or published."""
        from cao import explain  # the tracing module: only for this

        pane = explain.Pane(pane_id=terminal.pane_id, state=terminal.state, gone_reason=terminal.gone_reason)
        screen, mode = "", ""
        if terminal.state not in ENDED and terminal.state != TerminalState.STARTING:
            try:
                screen, mode = self.panes.look(terminal)
            except (PaneGone, TmuxServerDown) as exc:
                pane = explain.Pane(terminal.pane_id, state=Status.GONE, gone_reason=str(exc))
            else:
                pane = explain.Pane(terminal.pane_id, mode=mode, state=terminal.state)
        out = explain.explain_screen(
            self.panes.provider(terminal),
            screen,
            hook=self.hooks.state(terminal.id),
            now=self.clock(),
            settle=self.settings.hook_settle,
            pane=pane,
            never_ready=terminal.ready_at is None,
        )
        return out, screen

    def note_status(self, terminal_id: str, status: str) -> None:
        """Publish a status change (the screen is the state; this is where it is read)."""
        previous = self._seen_status.get(terminal_id)
        if previous != status:
            self._seen_status[terminal_id] = status
            self.events.publish("terminal.status", terminal_id=terminal_id, status=status, previous=previous)

    def remember_status(self, terminal: Terminal, status: str) -> None:
        fields: dict[str, object] = {}
        if status != terminal.status:
            fields["status"] = status
            fields["last_active"] = self.clock()
        if terminal.ready_at is None and status in READY:
            fields["ready_at"] = self.clock()
        if fields and terminal.state == TerminalState.LIVE:
            try:
                self.store.update_terminal(terminal.id, **fields)
            except (StoreBusy, DiskFull):  # a note made while reading: the read must still answer
                return
            for key, value in fields.items():
                setattr(terminal, key, value)

    def statuses(self, terminals: Sequence[Terminal]) -> dict[str, str]:
        """:meth:`status` of many terminals from one batched look at their panes (a listing of 200
        terminals is four tmux calls, not 200)."""
        foreign = [t for t in terminals if self._foreign(t) and t.state not in ENDED]
        out: dict[str, str] = self.remote(foreign) if foreign else {}
        terminals = [t for t in terminals if t.id not in out]
        live = [t for t in terminals if t.state not in ENDED and t.state != TerminalState.STARTING]
        screens = self.panes.screens(live) if live else {}
        for t in terminals:
            got = screens.get(t.id)
            if isinstance(got, (PaneGone, TmuxServerDown)):
                out[t.id] = Status.GONE
            else:  # a screen, or None: ended or starting (read without a look)
                out[t.id] = self.status(t, screen=got)
        return out

    def view(self, terminal: Terminal, *, status: str | None = None) -> TerminalView:
        """The terminal as the API shows it (``status``: already read, by :meth:`statuses`)."""
        waits = self.panes.provider(terminal).waits_for_mcp
        status = self.status(terminal) if status is None else status
        reason = terminal.gone_reason if status == Status.GONE else self._reasons.get(terminal.id)
        hook = self.hooks.state(terminal.id)
        return TerminalView(
            terminal,
            status,
            self.mcp_ready(terminal) if waits else None,
            reason or None,
            hook.as_dict(iso) if hook is not None and hook.phase is not None else None,
        )

    def output(self, terminal: Terminal, mode: str = "full") -> str:
        if mode not in ("full", "last"):
            raise InvalidInput(f"output mode {mode!r} is unknown; use full or last")
        if mode == "full":
            return self.panes.screen(terminal, scrollback=True).rstrip("\n") + "\n"
        last = self.panes.provider(terminal).extract_last_message(self.panes.screen(terminal))
        if not last.strip():  # a screen the provider can't read: the answer the CLI's hook reported
            hook = self.hooks.state(terminal.id)
            last = hook.last_message if hook is not None else ""
        return last

    # -- the agent's cao tools ---------------------------------------------------------------------
    def mcp_ready(self, terminal: Terminal) -> bool:
        """Has the agent's cao MCP server reported in (or have we waited long enough)?"""
        if terminal.mcp_ready_at is not None or not self.panes.provider(terminal).waits_for_mcp:
            return True
        return self.clock() - terminal.created_at > self.settings.mcp_ready_timeout

    def note_mcp_ready(self, terminal: Terminal) -> None:
        if terminal.mcp_ready_at is None:
            terminal.mcp_ready_at = self.clock()
            self.store.update_terminal(terminal.id, mcp_ready_at=terminal.mcp_ready_at)
            logger.info("agent's MCP server reported in", extra={"terminal_id": terminal.id})

    # -- lifecycle hooks ---------------------------------------------------------------------------
    def hook_key(self, terminal_id: str) -> str:
        """The key only this terminal's hook program is given (``POST /terminals/{id}/hooks``)."""
        return hook_key(self._hook_secret, terminal_id)

    def check_hook_key(self, terminal_id: str, key: str | None) -> None:
        expected = self.hook_key(terminal_id).encode()
        if not key or not hmac.compare_digest(key.encode("utf-8", "surrogateescape"), expected):
            raise Forbidden(
                f"a hook report for terminal {terminal_id} must carry that terminal's own hook key "
                f"({'none was sent' if not key else 'this one is another'}); only the hook program cao "
                "configured in that terminal's CLI has it"
            )

    def note_hook(self, terminal: Terminal, event: str, report: Mapping[str, object]) -> HookPhase | None:
        """Record one lifecycle event the CLI reported (``POST /terminals/{id}/hooks``).

        One report at a time (``_hooks_lock``: the row and memory never disagree on the latest
        phase), and none for a terminal that ended meanwhile (its state was forgotten for good)."""
        phase = self.panes.provider(terminal).hook_phase(event, report)
        prompts = report.get("prompts")
        with self._hooks_lock:
            if self.store.get_terminal(terminal.id, include_deleted=True).state in ENDED:
                return None
            self.hooks.record(
                terminal.id,
                phase,
                event,
                prompts=[p for p in prompts if isinstance(p, str)] if isinstance(prompts, list) else None,
                detail=str(report.get("message") or ""),
                last_message=str(report.get("last_message") or ""),
                transcript=str(report.get("transcript_path") or "") or None,
            )
            state = self.hooks.state(terminal.id)
            if phase is not None and state is not None:  # kept with the row: an idle CLI may not
                self.store.update_terminal(  # report again after a restart
                    terminal.id,
                    hook_phase=phase.value,
                    hook_event=event,
                    hook_at=state.at,
                    hook_starts=int(state.starts),
                )
        self.events.publish(
            "terminal.hook", terminal_id=terminal.id, event=event, phase=phase.value if phase else None
        )
        return phase

    def restore_hooks(self, terminal: Terminal) -> None:
        """At restart: the latest hook report kept with the row (an idle CLI may not report again)."""
        if terminal.hook_phase in set(HookPhase) and terminal.hook_at is not None:
            phase, event = HookPhase(terminal.hook_phase), terminal.hook_event or ""
            self.hooks.restore(terminal.id, phase, event, terminal.hook_at, bool(terminal.hook_starts))
