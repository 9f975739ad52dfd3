"""Terminals: create, find, read, type into and delete agent terminals (one tmux window each).

This layer joins the store (rows), the tmux layer (panes) and the providers (screen meaning), and
it is the **only owner of pane I/O**: every capture, paste, key and kill for a terminal goes
through it, and each one checks the pane's identity (tmux server pid, pane id, pane pid) in the
same tmux call as the action. A mismatch (a new tmux server reusing the pane id, a dead program,
a vanished pane) makes the terminal ``gone`` for good and fails its mail with ``receiver_gone``.

Typed input and inbox delivery for one terminal are serialised by :meth:`Terminals.lock`, so a
status read and the paste that depends on it can't straddle another paste.

Status is always read live from the rendered screen; the row keeps the last value seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import providers
from cao import profiles
from cao.errors import (
    BoxOccupied,
    CaoError,
    DiskFull,
    Forbidden,
    InvalidInput,
    NotFound,
    NotReady,
    PaneGone,
    PaneInMode,
    PayloadTooLarge,
    ProviderError,
    StoreBusy,
    TmuxError,
    TmuxServerDown,
)
from cao.events import EventBus
from cao.hooks import Hooks, combine, hook_key, load_secret
from cao.paste import is_blank, neutralise
from cao.profiles import Profile
from cao.settings import Settings
from cao.states import ENDED, HookPhase, TerminalState
from cao.store import MAX_BODY_BYTES, Store, Terminal
from cao.timefmt import iso
from cao.tmux import PaneInfo, PaneRef, TaggedPane, Tmux, in_mode_error, session_name_for
from cao.worktrees import Git, Workspaces
from providers.base import LaunchContext, Provider, Reading, TerminalStatus
from providers.scripted import ScriptedProvider

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TERMINAL_ID_RE = re.compile(r"^[0-9a-f]{8}$")
# Host variables a pane may inherit; everything else is left out on purpose.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
GONE = "gone"
READY = (TerminalStatus.IDLE, TerminalStatus.COMPLETED, TerminalStatus.ERROR)


def validate_terminal_id(value: str) -> str:
    if not TERMINAL_ID_RE.fullmatch(value or ""):
        raise InvalidInput(f"terminal id {value!r} is malformed; ids are 8 hex digits, e.g. 1a2b3c4d")
    return value


def validate_name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value or ""):
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
    status_reason: str | None = None  # why: an unknown screen, hooks, or why the terminal is gone
    hook: dict[str, object] | None = None  # the CLI's latest lifecycle hook event (cao/hooks.py)

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
        fault: Callable[[str], None] = lambda _name: None,
        events: EventBus | None = None,
        workspaces: Workspaces | None = None,
    ) -> None:
        self.sleep = sleep
        self.settings = settings
        self.store = store
        self.tmux = tmux
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.fault = fault  # test-only crash points (see cao.delivery.Faults)
        self.events = events or EventBus()
        self._seen_status: dict[str, str] = {}  # last status published per terminal
        self._reasons: dict[str, str] = {}  # why a terminal reads unknown (shown with its status)
        self.hooks = Hooks(clock)  # what the CLIs' own lifecycle hooks reported (cao/hooks.py)
        self._hooks_lock = threading.Lock()  # one hook report (memory + row) at a time
        self.home_tag = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:12]
        self._hook_secret = load_secret(settings.home)
        self._locks: dict[str, threading.RLock] = {}
        self._locks_guard = threading.Lock()
        self.orphans: list[TaggedPane] = []  # panes tagged as ours with no row (found at start)
        self.workspaces = workspaces or Workspaces(
            settings, store, Git(self.environ), events=self.events, clock=clock
        )

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

    # -- lookup ----------------------------------------------------------------------------------
    def get(self, terminal_id: str) -> Terminal:
        return self.store.get_terminal(validate_terminal_id(terminal_id))

    def provider(self, terminal: Terminal) -> Provider:
        return providers.get(terminal.provider)

    def log_path(self, terminal_id: str) -> Path:
        return self.settings.logs_dir / f"{terminal_id}.log"

    @contextmanager
    def lock(self, terminal_id: str) -> Iterator[None]:
        """Serialise everything that types into one terminal (typed input, inbox delivery,
        recovery): a status read and the paste that depends on it never straddle another paste."""
        with self._locks_guard:
            lock = self._locks.setdefault(terminal_id, threading.RLock())
        with lock:
            yield

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
        use_worktree: bool | None = None,
    ) -> Terminal:
        """Row first (``starting``), pane second, then the row goes ``live`` with the pane's
        identity. A tmux failure in between undoes both; a crash in between is cleaned up by
        :meth:`adopt` (the pane is tagged with the terminal id), so no agent runs untracked.

        ``use_worktree`` (default: the profile's ``use_worktree``): the agent runs in a new git
        worktree on its own branch, made from the working directory's checkout after the row is
        written (docs/worktrees.md); whether one can be made is checked before anything is."""
        profile = validate_name(agent_profile or "developer", "agent_profile")
        loaded = self.resolve_profile(profile, provider)
        provider_name = provider or (loaded.provider if loaded else None) or providers.default_name()
        prov = providers.get(provider_name)
        if working_directory is not None and (len(working_directory) > 4096 or "\x00" in working_directory):
            raise InvalidInput(
                "working_directory is not a usable path (too long or has a NUL); pass a directory"
            )
        workdir = Path(working_directory or os.getcwd()).expanduser()
        try:
            is_dir = workdir.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            raise InvalidInput(f"working_directory {str(workdir)!r} is not a directory; pass an existing one")
        if session_name:
            if "." in session_name:  # tmux turns '.' in a session name into '_'
                raise InvalidInput(
                    f"session_name {session_name!r} is not allowed: tmux rewrites '.' in session names; "
                    "use letters, digits, '_' or '-'"
                )
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
        wants_worktree = use_worktree if use_worktree is not None else bool(loaded and loaded.use_worktree)
        plan = self.workspaces.plan(workdir, profile, terminal_id) if wants_worktree else None
        agent_dir = plan.agent_dir if plan is not None else workdir
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
            working_directory=agent_dir.resolve(),
            cao_home=self.settings.home,
            server_url=self.settings.server_url,
            terminal_home=home,
            base_env=base_env,
            settings_env=settings_env,
            profile=loaded,
            hooks=self.settings.hooks,
            hook_key=self.hook_key(terminal_id),
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
        terminal = Terminal(
            id=terminal_id,
            name=window,
            session_name=session,
            provider=provider_name,
            agent_profile=profile,
            working_directory=str(agent_dir),
            state=TerminalState.STARTING.value,
            status=TerminalStatus.PROCESSING.value,
            supervisor_id=supervisor_id,
            created_at=now,
            last_active=now,
        )
        self.store.add_terminal(terminal)
        try:
            command = spec.command
            if plan is not None:  # the worktree, then its setup in the pane before the agent
                command = self.workspaces.make(plan, terminal_id, spec.command)
            info: PaneInfo = self.tmux.create_window(
                session_name=session,
                window_name=window,
                command=command,
                env=spec.env,
                cwd=agent_dir,
                log_path=self.log_path(terminal_id),
                width=self.settings.pane_width,
                height=self.settings.pane_height,
                history_limit=self.settings.history_limit,
                tags={"cao_terminal": terminal_id, "cao_home": self.home_tag},
            )
            self.fault("after_pane_created")
            if not self.store.set_pane(
                terminal_id, server_pid=info.server_pid, pane_id=info.pane_id, pane_pid=info.pane_pid
            ):
                raise TmuxError(f"terminal {terminal_id} was removed while its pane was being created")
        except BaseException as exc:
            self._undo_create(terminal_id, exc)
            raise
        terminal.state = TerminalState.LIVE.value
        terminal.tmux_server_pid, terminal.pane_id, terminal.pane_pid = (
            info.server_pid,
            info.pane_id,
            info.pane_pid,
        )
        logger.info("terminal created", extra={"terminal_id": terminal_id, "provider": provider_name})
        self.events.publish(
            "terminal.created",
            terminal_id=terminal_id,
            session_name=session,
            provider=provider_name,
            agent_profile=profile,
            supervisor_id=supervisor_id,
        )
        return terminal

    def _undo_create(self, terminal_id: str, exc: BaseException) -> None:
        """A create failed half-way: kill any pane tagged with this terminal, retire the row."""
        for pane in self.tmux.list_panes():
            if pane.terminal_id == terminal_id and pane.home_tag == self.home_tag:
                try:
                    self.tmux.kill_checked(pane.ref)
                except CaoError:
                    logger.exception("could not kill a half-created pane", extra={"terminal_id": terminal_id})
        self.workspaces.retire(terminal_id, label=f"terminal {terminal_id}")  # fresh: nothing to keep
        self.store.delete_terminal(terminal_id)
        logger.warning(
            "terminal creation undone",
            extra={"terminal_id": terminal_id, "error": str(exc) or type(exc).__name__},
        )

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

    # -- identity-checked pane I/O -----------------------------------------------------------------
    def ref(self, terminal: Terminal) -> PaneRef:
        """The terminal's pane identity; :class:`PaneGone` if it has none any more."""
        if terminal.state in ENDED:
            raise PaneGone(
                f"terminal {terminal.id} is {terminal.state}"
                + (f" ({terminal.gone_reason})" if terminal.gone_reason else "")
            )
        if terminal.pane_id is None or terminal.pane_pid is None or terminal.tmux_server_pid is None:
            raise PaneGone(f"terminal {terminal.id} has no pane yet (state {terminal.state})")
        return PaneRef(terminal.tmux_server_pid, terminal.pane_id, terminal.pane_pid)

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
            return self.tmux.capture_checked(ref, scrollback=scrollback, join=join)

    def look(self, terminal: Terminal) -> tuple[str, str]:
        """The screen and the tmux mode the pane is in (``""``: none), read in one tmux call."""
        with self._pane(terminal) as ref:
            return self.tmux.look_checked(ref)

    def snapshot(self, terminal: Terminal) -> tuple[str, int, int, int, int]:
        """The screen with colours, cursor and size (for the dashboard's live terminal view)."""
        with self._pane(terminal) as ref:
            return self.tmux.snapshot_checked(ref)

    def paste(
        self,
        terminal: Terminal,
        text: str,
        *,
        fence: int | None = None,
        enter: bool = True,
    ) -> None:
        prov = self.provider(terminal)
        with self._pane(terminal) as ref:
            self.tmux.paste_checked(
                ref,
                text,
                fence=fence,
                enter_count=prov.enter_count if enter else 0,
                enter_delay=prov.paste_enter_delay,
            )

    def keys(self, terminal: Terminal, *keys: str, fence: int | None = None, literal: bool = False) -> None:
        with self._pane(terminal) as ref:
            self.tmux.send_keys_checked(ref, *keys, fence=fence, literal=literal)

    def fence(self, terminal: Terminal, fence: int) -> None:
        with self._pane(terminal) as ref:
            self.tmux.fence_pane(ref, fence)

    def lose(self, terminal: Terminal, reason: str) -> None:
        """The terminal's pane is gone for good: never live again; its undelivered mail fails."""
        if terminal.state in ENDED:
            return
        failed = self.store.mark_gone(terminal.id, reason)
        terminal.state = TerminalState.GONE.value
        terminal.status = GONE
        terminal.gone_reason = reason
        logger.warning(
            "terminal gone", extra={"terminal_id": terminal.id, "reason": reason, "failed_messages": failed}
        )
        self.events.publish("terminal.gone", terminal_id=terminal.id, reason=reason, failed_messages=failed)
        self.note_status(terminal.id, GONE)
        with self._hooks_lock:
            self.hooks.forget(terminal.id)

    def mark_gone(self, terminal: Terminal) -> None:
        self.lose(terminal, "its pane is gone")

    # -- status and screens ---------------------------------------------------------------------
    def status(self, terminal: Terminal) -> str:
        """Live status from the screen; ``gone`` when the pane is gone or not the terminal's."""
        if terminal.state in ENDED:
            return GONE
        if terminal.state == TerminalState.STARTING:
            return TerminalState.STARTING.value
        try:
            screen = self.screen(terminal)
        except (PaneGone, TmuxServerDown):
            return GONE
        reading = self.read(terminal, screen)
        status = reading.status.value
        if terminal.ready_at is None and status == TerminalStatus.PROCESSING:
            status = TerminalState.STARTING.value  # never ready yet: starting, not working
        self.remember_status(terminal, status)
        self.note_status(terminal.id, status)
        return status

    def read(self, terminal: Terminal, screen: str) -> Reading:
        """The status of ``screen`` as the provider reads it, combined with what the CLI's own
        lifecycle hooks reported (cao/hooks.py); the reason is kept for the operator when the
        status is unknown or the hooks decided or annotated it."""
        prov = self.provider(terminal)
        reading, by_hooks = combine(
            prov.detect(screen),
            self.hooks.state(terminal.id),
            self.clock(),
            settle=self.settings.hook_settle,
        )
        unknown = reading.status == TerminalStatus.UNKNOWN
        if unknown and terminal.status != reading.status:
            logger.warning("terminal status unknown: %s", reading.reason, extra={"terminal_id": terminal.id})
        self._reasons[terminal.id] = reading.reason if unknown or by_hooks else ""
        return reading

    def note_hook(self, terminal: Terminal, event: str, report: Mapping[str, object]) -> HookPhase | None:
        """Record one lifecycle event the CLI reported (``POST /terminals/{id}/hooks``).

        One report at a time (``_hooks_lock``: the row and memory never disagree on the latest
        phase), and none for a terminal that ended meanwhile (its state was forgotten for good)."""
        phase = self.provider(terminal).hook_phase(event, report)
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
            self.store.update_terminal(terminal.id, **fields)
            for key, value in fields.items():
                setattr(terminal, key, value)

    def view(self, terminal: Terminal) -> TerminalView:
        waits = self.provider(terminal).waits_for_mcp
        status = self.status(terminal)
        reason = terminal.gone_reason if status == GONE else self._reasons.get(terminal.id)
        hook = self.hooks.state(terminal.id)
        return TerminalView(
            terminal,
            status,
            self.mcp_ready(terminal) if waits else None,
            reason or None,
            hook.as_dict(iso) if hook is not None and hook.phase is not None else None,
        )

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
        if mode == "full":
            return self.screen(terminal, scrollback=True).rstrip("\n") + "\n"
        last = self.provider(terminal).extract_last_message(self.screen(terminal))
        if not last.strip():  # a screen the provider can't read: the answer the CLI's hook reported
            hook = self.hooks.state(terminal.id)
            last = hook.last_message if hook is not None else ""
        return last

    # -- typed input -------------------------------------------------------------------------------
    def send_input(self, terminal: Terminal, text: str, *, ready_timeout: float | None = None) -> bool:
        """Type ``text`` into the agent (neutralised, bracketed paste + Enter), whatever its status
        once it is ready: input to an agent that is still starting is held until it first shows
        its prompt (and its cao MCP tools are up), at most ``ready_timeout`` seconds, else
        :class:`NotReady` and nothing is typed. Serialised with inbox delivery to the same agent.

        Never typed over a person: while the input box holds someone's text, or a person has the
        pane in a tmux mode (scrolling), it waits up to ``input_wait_timeout`` seconds, then
        :class:`BoxOccupied` / :class:`PaneInMode` (409) with nothing typed.

        Returns whether the submit was confirmed on screen (see :meth:`submit`).
        """
        if not text or is_blank(text):
            raise InvalidInput("message is empty (only whitespace or invisible characters); send some text")
        if (size := len(text.encode("utf-8", "surrogatepass"))) > MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"input is {size} bytes, over the {MAX_BODY_BYTES}-byte (256 KiB) limit of what cao types "
                "(the inbox's); nothing was typed; send it in parts, or point the agent at a file"
            )
        self.wait_ready(
            terminal, self.settings.input_ready_timeout if ready_timeout is None else ready_timeout
        )
        deadline = time.monotonic() + self.settings.input_wait_timeout
        delay = 0.02
        while True:
            with self.lock(terminal.id):
                screen, mode = self.look(terminal)
                box = self.provider(terminal).input_text(screen)
                if not mode and not (box or "").strip():
                    try:
                        confirmed = self.submit(terminal, neutralise(text), before=screen)
                    except PaneInMode as exc:
                        if exc.typed:  # in the box, its Enter held back by a mode that began meanwhile
                            raise PaneInMode(
                                f"{exc.message}; the text is in terminal {terminal.id}'s input box, not "
                                "submitted",
                                mode=exc.mode,
                                typed=True,
                            ) from None
                        raise
                    break
            if time.monotonic() > deadline:
                if mode:
                    raise in_mode_error(mode)
                raise BoxOccupied(
                    f"terminal {terminal.id}'s input box holds someone's text; nothing was typed (typing "
                    "would append to it and submit both as one turn). Clear the box or let them submit "
                    f"it (`tmux attach -t {terminal.session_name}`), then retry"
                )
            self.sleep(delay)
            delay = min(delay * 2, 0.25)
        with contextlib.suppress(StoreBusy, DiskFull):  # typed already: a note must not turn it into an error
            self.store.update_terminal(terminal.id, last_active=self.clock())
        return confirmed

    def send_key(self, terminal: Terminal, key: str) -> None:
        """Press one named key (Escape, C-c, Enter, Up…) in the agent, serialised with delivery."""
        with self.lock(terminal.id):
            self.keys(terminal, key)

    def wait_ready(self, terminal: Terminal, timeout: float) -> None:
        """Until the agent has shown its prompt once (``ready_at``) and its MCP tools are up."""
        if terminal.ready_at is not None and self.mcp_ready(terminal):
            return  # ready before: no screen read here (the paste checks the pane anyway)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            status = self.status(terminal)
            if status == GONE:
                raise PaneGone(
                    f"terminal {terminal.id} is gone ({terminal.gone_reason or 'its pane closed'}); "
                    "nothing was typed"
                )
            if terminal.ready_at is not None and self.mcp_ready(terminal):
                return
            if time.monotonic() > deadline:
                raise NotReady(
                    f"terminal {terminal.id} did not become ready within {timeout:g} s (status {status}: "
                    "still starting, or a start-up dialog waits for an answer); nothing was typed. "
                    f"Look at it with `tmux attach -t {terminal.session_name}`, then retry"
                )
            self.sleep(delay)
            delay = min(delay * 2, 0.1)
            terminal = self.store.get_terminal(terminal.id, include_deleted=True)

    def submit(
        self,
        terminal: Terminal,
        text: str | None,
        *,
        before: str | None = None,
        after_paste: Callable[[], None] | None = None,
        fence: int | None = None,
        renew: Callable[[], None] | None = None,
        evidence: Callable[[], bool] | None = None,
    ) -> bool:
        """Paste ``text``, press Enter, and confirm the agent took it (the one paste path; the
        caller holds :meth:`lock` and has neutralised ``text``).

        ``before`` is the screen before the paste (captured when not given). The provider judges
        fresh screens (``submit_confirmed``); if the text still sits in the input box halfway
        through its ``submit_timeout``, Enter is pressed once more. ``fence``: the paste and that
        Enter happen only while the claim with this fence owns the pane (see cao/tmux.py).
        ``renew`` is called while waiting (a delivery renews its lease). ``text=None``: the text
        is already in the box (cao's own, proven by its header): only press Enter. ``evidence``:
        a check that proves the submit without the screen (the CLI's hook reported a prompt with
        the message's own header). Returns whether confirmed.
        """
        prov = self.provider(terminal)
        if before is None:
            before = self.screen(terminal)
        if text is None:
            self.keys(terminal, "Enter", fence=fence)
        else:
            try:
                self.paste(terminal, text, fence=fence)
            except PaneInMode as exc:
                if not exc.typed:
                    raise  # nothing reached the pane
                # the text is in, its delayed Enter was held back by a mode: confirming looks again
        if after_paste is not None:
            after_paste()
        try:
            return self._confirm(terminal, prov, before, fence, renew, evidence)
        except (PaneGone, TmuxServerDown):
            # The agent took the input and its pane went away (an exit command, a crash) while we
            # looked: the input did reach it. (Its undelivered mail was failed by lose().)
            return True

    def _confirm(
        self,
        terminal: Terminal,
        prov: Provider,
        before: str,
        fence: int | None,
        renew: Callable[[], None] | None,
        evidence: Callable[[], bool] | None = None,
    ) -> bool:
        deadline = time.monotonic() + prov.submit_timeout
        retried = False
        delay = 0.005
        # A screen the provider can't read (the hooks opened the gate) proves nothing either way:
        # only the evidence (the CLI's hook reporting the message's own header) confirms then.
        readable = prov.can_read(before)
        while True:
            self.sleep(delay)
            delay = min(delay * 2, 0.05)
            screen = self.screen(terminal)
            verdict = prov.submit_confirmed(before, screen) if readable else None
            if verdict is True or (evidence is not None and evidence()):
                return True
            if renew is not None:
                renew()
            now = time.monotonic()
            if verdict is False and not retried and now > deadline - prov.submit_timeout / 2:
                logger.info("submit not seen; pressing Enter again", extra={"terminal_id": terminal.id})
                try:
                    self.keys(terminal, "Enter", fence=fence)
                except PaneInMode:
                    return False  # a person scrolls: the text waits in the box (its header proves it)
                retried = True
            if now > deadline:
                return False

    def exit(self, terminal: Terminal) -> bool:
        """Type the provider's exit command; a pane that closes (or dies) once it is typed has
        exited (confirmed). A terminal that is gone already raises :class:`PaneGone` (410):
        nothing was there to exit."""
        return self.send_input(terminal, self.provider(terminal).exit_command)

    # -- delete ----------------------------------------------------------------------------------
    def delete(self, terminal: Terminal) -> int:
        """Mark the row ``deleting`` (failing its pending mail), kill the pane — only if it is
        still the terminal's own — then mark it ``deleted``.

        A tmux failure (or a crash) after the first step leaves the row ``deleting``; the sweep
        finishes it (:meth:`finish_deletes`). A pane that is not the terminal's is never touched.
        """
        with self.lock(terminal.id):
            failed = self.store.begin_delete(terminal.id)
            self.fault("after_delete_marked")
            self._kill_and_finish(terminal)
        logger.info("terminal deleted", extra={"terminal_id": terminal.id, "failed_messages": failed})
        self.events.publish("terminal.deleted", terminal_id=terminal.id, failed_messages=failed)
        self._seen_status.pop(terminal.id, None)
        with self._hooks_lock:
            self.hooks.forget(terminal.id)
        return failed

    def _kill_and_finish(self, terminal: Terminal) -> None:
        if terminal.pane_id and terminal.pane_pid and terminal.tmux_server_pid:
            # a pane that is not the terminal's (or none at all) is never touched
            with contextlib.suppress(PaneGone, TmuxServerDown):
                self.tmux.kill_checked(PaneRef(terminal.tmux_server_pid, terminal.pane_id, terminal.pane_pid))
        # the agent is stopped: its worktree's work is committed and the clean tree removed
        self.workspaces.retire(terminal.id, label=f"{terminal.agent_profile} {terminal.id}")
        self.store.finish_delete(terminal.id)
        shutil.rmtree(self.settings.home / "terminals" / terminal.id, ignore_errors=True)
        with contextlib.suppress(OSError):  # its pane is gone: nothing writes it any more
            self.log_path(terminal.id).unlink()

    def finish_deletes(self) -> list[str]:
        """Finish deletes that were interrupted (rows left ``deleting``); called by the sweep."""
        done = []
        for t in self.store.list_terminals(include_deleted=True, state=TerminalState.DELETING.value):
            try:
                with self.lock(t.id):
                    self._kill_and_finish(t)
                done.append(t.id)
            except CaoError as exc:
                logger.warning("delete still unfinished", extra={"terminal_id": t.id, "error": exc.message})
        return done

    def delete_session(self, session_name: str) -> list[str]:
        """Delete this server's terminals in the session. A tmux session is never killed by its
        name: one called ``cao-<name>`` may hold another cao-server's agents (another CAO_HOME on
        the same tmux server) or a person's windows; tmux removes the session itself when its last
        pane goes."""
        session = session_name_for(session_name)
        terms = self.store.list_terminals(session_name=session)
        if not terms:
            if self.tmux.has_session(session):
                raise NotFound(
                    f"session {session} has no terminals of this cao-server ({self.settings.home}); it "
                    "belongs to another cao-server or a person, and nothing was touched"
                )
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        for t in terms:
            self.delete(t)
        return [t.id for t in terms]

    def restore_pipes(self) -> list[str]:
        """Reopen the log pipe of every live terminal whose pipe closed (``cat`` exits when the disk
        fills up): without it the watchdog trigger and the dashboard's live view of that pane stop
        silently. One ``list-panes`` for all; each reopen checks the pane's identity."""
        live = {t.id: t for t in self.store.list_terminals(state=TerminalState.LIVE.value)}
        if not live:
            return []
        reopened = []
        for pane in self.tmux.list_panes():
            t = live.get(pane.terminal_id)
            if t is None or pane.piped or pane.dead or pane.home_tag != self.home_tag:
                continue
            if (t.tmux_server_pid, t.pane_id, t.pane_pid) != (pane.server_pid, pane.pane_id, pane.pane_pid):
                continue
            try:
                if self.tmux.reopen_pipe_checked(pane.ref, self.log_path(t.id)):
                    reopened.append(t.id)
                    logger.warning("pane log pipe was closed; reopened", extra={"terminal_id": t.id})
            except TmuxError:
                continue
        return reopened

    # -- restart ---------------------------------------------------------------------------------
    def adopt(self) -> dict[str, list[str]]:
        """After a server restart: re-adopt terminals whose panes are still theirs (server pid, pane
        id and pid all match); mark the rest gone (for good); kill panes of creations that were
        interrupted (rows still ``starting``) or whose delete was, and finish interrupted deletes.

        A pane tagged as this home's whose terminal has **no row at all** is never killed: the
        database was deleted or replaced while its agent ran (a create writes its row before the
        pane, so no crash leaves one). It is kept and listed (:attr:`orphans`) for the operator."""
        panes = self.tmux.list_panes()
        by_id = {p.pane_id: p for p in panes}
        result: dict[str, list[str]] = {"adopted": [], "gone": [], "orphans_killed": [], "orphans_kept": []}
        rows = {t.id: t for t in self.store.list_terminals(include_deleted=True)}
        self.orphans = []
        for pane in panes:
            row = rows.get(pane.terminal_id)
            if pane.home_tag != self.home_tag or not pane.terminal_id:
                continue
            if row is None and not pane.dead:
                self.orphans.append(pane)
                result["orphans_kept"].append(pane.terminal_id)
                logger.warning(
                    "a pane of this home has no row in the database; kept",
                    extra={"terminal_id": pane.terminal_id, "pane_id": pane.pane_id},
                )
                continue
            if row is None or row.state in (TerminalState.STARTING, TerminalState.DELETED):
                try:
                    self.tmux.kill_checked(pane.ref)
                    result["orphans_killed"].append(pane.terminal_id)
                except CaoError:
                    logger.exception(
                        "could not kill an orphaned pane", extra={"terminal_id": pane.terminal_id}
                    )
        for t in rows.values():
            if t.state == TerminalState.STARTING:
                self.store.delete_terminal(t.id)
                continue
            if t.state != TerminalState.LIVE:
                continue
            found = by_id.get(t.pane_id or "")
            same = (
                found is not None
                and found.pane_pid == t.pane_pid
                and not found.dead
                and t.tmux_server_pid in (None, found.server_pid)
            )
            if same and found is not None:
                if t.tmux_server_pid is None:  # a row from before schema 3
                    self.store.adopt_identity(t.id, found.server_pid)
                try:
                    self.tmux.ensure_pipe(found.pane_id, self.log_path(t.id))
                except (PaneGone, TmuxServerDown):
                    same = False
            if same:
                result["adopted"].append(t.id)
                if t.hook_phase in set(HookPhase) and t.hook_at is not None:
                    phase, event = HookPhase(t.hook_phase), t.hook_event or ""
                    self.hooks.restore(t.id, phase, event, t.hook_at, bool(t.hook_starts))
            else:
                why = "its pane is dead" if found is not None and found.dead else "its pane is gone"
                self.lose(t, f"{why} (found at server start)")
                result["gone"].append(t.id)
        result["finished_deletes"] = self.finish_deletes()
        return result
