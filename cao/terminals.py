"""Terminals: create, find, read and delete agent terminals (one tmux window each).

This layer joins the store (rows), the tmux layer (panes) and the providers (screen meaning).
Status is always read live from the rendered screen; the row keeps the last value seen.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import providers
from cao import profiles
from cao.errors import InvalidInput, NotFound, PaneGone, ProviderError, TmuxServerDown
from cao.profiles import Profile
from cao.settings import Settings
from cao.store import Store, Terminal
from cao.tmux import PaneInfo, Tmux, session_name_for
from providers.base import LaunchContext, Provider, TerminalStatus
from providers.scripted import ScriptedProvider

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TERMINAL_ID_RE = re.compile(r"^[0-9a-f]{8}$")
# Host variables a pane may inherit; everything else is left out on purpose.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
GONE = "gone"


def validate_terminal_id(value: str) -> str:
    if not TERMINAL_ID_RE.match(value or ""):
        raise InvalidInput(f"terminal id {value!r} is malformed; ids are 8 hex digits, e.g. 1a2b3c4d")
    return value


def validate_name(value: str, what: str) -> str:
    if not NAME_RE.match(value or ""):
        raise InvalidInput(
            f"{what} {value!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class TerminalView:
    """A terminal row plus its live status, as the API shows it."""

    terminal: Terminal
    status: str
    mcp_ready: bool | None = None  # None: this provider doesn't wait for cao's MCP server

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
            "created_at": _iso(t.created_at),
            "last_active": _iso(t.last_active),
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}Z"


class Terminals:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        tmux: Tmux,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.sleep = sleep
        self.settings = settings
        self.store = store
        self.tmux = tmux
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock

    # -- lookup ----------------------------------------------------------------------------------
    def get(self, terminal_id: str) -> Terminal:
        return self.store.get_terminal(validate_terminal_id(terminal_id))

    def provider(self, terminal: Terminal) -> Provider:
        return providers.get(terminal.provider)

    def log_path(self, terminal_id: str) -> Path:
        return self.settings.logs_dir / f"{terminal_id}.log"

    # -- create ----------------------------------------------------------------------------------
    def create(
        self,
        *,
        provider: str | None = None,
        agent_profile: str | None = None,
        session_name: str | None = None,
        working_directory: str | None = None,
        new_session: bool = True,
        supervisor_id: str | None = None,
    ) -> Terminal:
        profile = validate_name(agent_profile or "developer", "agent_profile")
        loaded = self.resolve_profile(profile, provider)
        provider_name = provider or (loaded.provider if loaded else None) or providers.default_name()
        prov = providers.get(provider_name)
        workdir = Path(working_directory or os.getcwd()).expanduser()
        if not workdir.is_dir():
            raise InvalidInput(f"working_directory {str(workdir)!r} is not a directory; pass an existing one")
        if session_name:
            session = session_name_for(validate_name(session_name, "session_name"))
        elif new_session:
            session = session_name_for(secrets.token_hex(4))
        else:
            raise InvalidInput("session_name is required to add a terminal to a session")
        exists = self.tmux.has_session(session)
        if new_session and exists:
            raise InvalidInput(f"session {session} already exists; pick another name or add a terminal to it")
        if not new_session and not exists:
            raise NotFound(f"session {session} not found; create it first with `cao launch`")
        terminal_id = self._new_id()
        window = f"{profile}-{terminal_id[:4]}"
        home = self.settings.home / "terminals" / terminal_id
        home.mkdir(parents=True, exist_ok=True)
        base_env = {k: self.environ[k] for k in ENV_ALLOW if self.environ.get(k)}
        base_env.update(
            {
                "HOME": self.environ.get("HOME", str(home)),
                "TERM": "xterm-256color",
                "LANG": self.environ.get("LANG") or "C.UTF-8",
                "CAO_TERMINAL_ID": terminal_id,
                "CAO_SERVER_URL": self.settings.server_url,
                "CAO_AGENT_PROFILE": profile,
                "CAO_HOME": str(self.settings.home),
            }
        )
        settings_env = {k: v for k, v in self.environ.items() if k.startswith("CAO_")}
        if self.settings.scripted_record:
            settings_env["CAO_SCRIPTED_RECORD"] = "1"
        ctx = LaunchContext(
            terminal_id=terminal_id,
            agent_profile=profile,
            working_directory=workdir.resolve(),
            cao_home=self.settings.home,
            server_url=self.settings.server_url,
            terminal_home=home,
            base_env=base_env,
            settings_env=settings_env,
            profile=loaded,
        )
        try:
            spec = prov.launch(ctx)
        except ProviderError:
            raise
        except Exception as exc:  # a provider bug must not take the server down
            raise ProviderError(
                f"provider {provider_name} could not build its launch command: {exc}"
            ) from exc
        for path, content in spec.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        now = self.clock()
        info: PaneInfo = self.tmux.create_window(
            session_name=session,
            window_name=window,
            command=spec.command,
            env=spec.env,
            cwd=workdir,
            log_path=self.log_path(terminal_id),
            width=self.settings.pane_width,
            height=self.settings.pane_height,
            history_limit=self.settings.history_limit,
        )
        terminal = Terminal(
            id=terminal_id,
            name=window,
            session_name=session,
            provider=provider_name,
            agent_profile=profile,
            working_directory=str(workdir),
            pane_id=info.pane_id,
            pane_pid=info.pane_pid,
            state="live",
            status=TerminalStatus.PROCESSING.value,
            supervisor_id=supervisor_id,
            created_at=now,
            last_active=now,
        )
        self.store.add_terminal(terminal)
        logger.info("terminal created", extra={"terminal_id": terminal_id, "provider": provider_name})
        return terminal

    def resolve_profile(self, name: str, provider: str | None) -> Profile | None:
        """The agent profile ``name`` (store, then built-ins); 422 naming the choices if unknown.

        A name that isn't a profile is still valid for the scripted agent when it has a rules file
        (``$CAO_HOME/scripted/<name>.json``): tests and the demo name their scripted agents that way.
        """
        try:
            return profiles.load(name, self.settings.profiles_dir)
        except NotFound:
            pass
        rules = self.settings.scripted_dir / f"{name}.json"
        scripted = isinstance(providers.get(provider or providers.default_name()), ScriptedProvider)
        if scripted and rules.is_file():
            return None
        raise InvalidInput(
            f"agent profile {name!r} not found; available: "
            f"{', '.join(profiles.names(self.settings.profiles_dir))}. Install one with `cao install PATH.md`"
            + (f" (or give the scripted agent rules at {rules})" if scripted else "")
        )

    def _new_id(self) -> str:
        while True:
            candidate = secrets.token_hex(4)
            try:
                self.store.get_terminal(candidate, include_deleted=True)
            except NotFound:
                return candidate

    # -- status and screens ---------------------------------------------------------------------
    def screen(self, terminal: Terminal) -> str:
        if terminal.state == "deleted" or not terminal.pane_id:
            raise PaneGone(f"terminal {terminal.id} has no pane")
        return self.tmux.capture(terminal.pane_id)

    def status(self, terminal: Terminal) -> str:
        """Live status from the screen; ``gone`` when the pane (or tmux server) is missing."""
        try:
            screen = self.screen(terminal)
        except (PaneGone, TmuxServerDown):
            self.mark_gone(terminal)
            return GONE
        status = self.provider(terminal).detect_status(screen).value
        self.remember_status(terminal, status)
        return status

    def remember_status(self, terminal: Terminal, status: str) -> None:
        fields: dict[str, object] = {}
        if status != terminal.status:
            fields["status"] = status
            fields["last_active"] = self.clock()
        if terminal.state == GONE:
            fields["state"] = "live"
        if terminal.ready_at is None and status in (TerminalStatus.IDLE, TerminalStatus.COMPLETED):
            fields["ready_at"] = self.clock()
        if fields:
            self.store.update_terminal(terminal.id, **fields)
            for key, value in fields.items():
                setattr(terminal, key, value)

    def mark_gone(self, terminal: Terminal) -> None:
        if terminal.state == "live":
            self.store.update_terminal(terminal.id, state=GONE, status=GONE)
            terminal.state = GONE
            terminal.status = GONE
            logger.warning("terminal pane gone", extra={"terminal_id": terminal.id})

    def view(self, terminal: Terminal) -> TerminalView:
        waits = self.provider(terminal).waits_for_mcp
        return TerminalView(terminal, self.status(terminal), self.mcp_ready(terminal) if waits else None)

    def mcp_ready(self, terminal: Terminal) -> bool:
        """Has the agent's cao MCP server reported in (or have we waited long enough)?"""
        if terminal.mcp_ready_at is not None or not self.provider(terminal).waits_for_mcp:
            return True
        return self.clock() - terminal.created_at > self.settings.mcp_ready_timeout

    def note_mcp_ready(self, terminal: Terminal) -> None:
        if terminal.mcp_ready_at is None:
            terminal.mcp_ready_at = self.clock()
            self.store.update_terminal(terminal.id, mcp_ready_at=terminal.mcp_ready_at)
            logger.info("agent's MCP server reported in", extra={"terminal_id": terminal.id})

    def output(self, terminal: Terminal, mode: str = "full") -> str:
        if mode not in ("full", "last"):
            raise InvalidInput(f"output mode {mode!r} is unknown; use full or last")
        if terminal.pane_id is None:
            raise PaneGone(f"terminal {terminal.id} has no pane")
        if mode == "full":
            return self.tmux.capture(terminal.pane_id, scrollback=True)
        return self.provider(terminal).extract_last_message(self.tmux.capture(terminal.pane_id))

    def send_input(self, terminal: Terminal, text: str) -> bool:
        """Type ``text`` into the agent (bracketed paste + Enter), whatever its status.

        Returns whether the submit was confirmed on screen (see :meth:`submit`).
        """
        if not text:
            raise InvalidInput("message is empty; send some text")
        confirmed = self.submit(terminal, text)
        self.store.update_terminal(terminal.id, last_active=self.clock())
        return confirmed

    def submit(
        self,
        terminal: Terminal,
        text: str,
        *,
        before: str | None = None,
        after_paste: Callable[[], None] | None = None,
    ) -> bool:
        """Paste ``text``, press Enter, and confirm the agent took it (the one paste path).

        ``before`` is the screen before the paste (captured when not given). The provider judges
        fresh screens (``submit_confirmed``); if the text still sits in the input box halfway
        through its ``submit_timeout``, Enter is pressed once more. Returns whether confirmed.
        """
        if terminal.pane_id is None:
            raise PaneGone(f"terminal {terminal.id} has no pane")
        pane, prov = terminal.pane_id, self.provider(terminal)
        if before is None:
            before = self.tmux.capture(pane)
        self.tmux.paste(pane, text, enter_delay=prov.paste_enter_delay, enter_count=prov.enter_count)
        if after_paste is not None:
            after_paste()
        deadline = time.monotonic() + prov.submit_timeout
        retried = False
        delay = 0.005
        while True:
            self.sleep(delay)
            delay = min(delay * 2, 0.05)
            verdict = prov.submit_confirmed(before, self.tmux.capture(pane))
            if verdict is True:
                return True
            now = time.monotonic()
            if verdict is False and not retried and now > deadline - prov.submit_timeout / 2:
                logger.info("submit not seen; pressing Enter again", extra={"terminal_id": terminal.id})
                self.tmux.send_keys(pane, "Enter")
                retried = True
            if now > deadline:
                return False

    def exit(self, terminal: Terminal) -> bool:
        """Type the provider's exit command; a pane that closes while we confirm has exited."""
        try:
            return self.send_input(terminal, self.provider(terminal).exit_command)
        except (PaneGone, TmuxServerDown):
            return True

    # -- delete ----------------------------------------------------------------------------------
    def delete(self, terminal: Terminal) -> int:
        """Mark the terminal deleted (failing its pending mail), then kill its pane and processes.

        In that order, so no delivery attempt races the kill and reports a spurious failure.
        """
        failed = self.store.delete_terminal(terminal.id, reason="receiver_gone")
        if terminal.pane_id:
            self.tmux.kill_pane(terminal.pane_id, terminal.pane_pid)
        home = self.settings.home / "terminals" / terminal.id
        shutil.rmtree(home, ignore_errors=True)
        logger.info("terminal deleted", extra={"terminal_id": terminal.id, "failed_messages": failed})
        return failed

    def delete_session(self, session_name: str) -> list[str]:
        session = session_name_for(session_name)
        terms = self.store.list_terminals(session_name=session)
        if not terms and not self.tmux.has_session(session):
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        for t in terms:
            self.delete(t)
        self.tmux.kill_session(session)
        return [t.id for t in terms]

    # -- restart ---------------------------------------------------------------------------------
    def adopt(self) -> dict[str, list[str]]:
        """Re-adopt terminals whose panes are alive after a server restart; mark the rest gone."""
        panes = self.tmux.list_panes()
        result: dict[str, list[str]] = {"adopted": [], "gone": []}
        for t in self.store.list_terminals():
            alive = t.pane_id is not None and panes.get(t.pane_id) == t.pane_pid
            if alive:
                assert t.pane_id is not None
                try:
                    self.tmux.ensure_pipe(t.pane_id, self.log_path(t.id))
                except (PaneGone, TmuxServerDown):
                    alive = False
            if alive:
                if t.state != "live":
                    self.store.update_terminal(t.id, state="live")
                result["adopted"].append(t.id)
            else:
                if t.state != GONE:
                    self.store.update_terminal(t.id, state=GONE, status=GONE)
                result["gone"].append(t.id)
        return result
