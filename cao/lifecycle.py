"""A terminal's life: create (row first, pane second, undone on failure), delete (row marked
first, the pane killed only if it is still the terminal's own), adopt after a restart, and the
housekeeping of pane log pipes.

    create:   plan (cao/launch.py) ─► row ``starting`` ─► [worktree] ─► pane (tagged) ─► row ``live``
              a failure in between kills any pane tagged with the id and retires the row; a crash in
              between is cleaned up at the next start (the pane carries the terminal's id and home)
    delete:   row ``deleting`` (mail fails) ─► kill the pane if it is still its own ─► worktree
              retired ─► row ``deleted``, the terminal's home and pane log removed
    restart:  adopt panes whose identity still matches; the rest are gone for good
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator

from cao.errors import CaoError, InvalidInput, NotFound, PaneGone, TmuxError, TmuxServerDown
from cao.events import EventBus
from cao.launch import LaunchPlanner, new_session_name
from cao.names import validate_session_name
from cao.panelog import PaneLogs
from cao.panes import PaneIO, Panes
from cao.settings import Settings
from cao.states import ENDED, HostState, TerminalState
from cao.status import StatusReader
from cao.store import Store, Terminal
from cao.tmux import PaneInfo, PaneRef, TaggedPane, session_name_for
from cao.worktrees import Workspaces

logger = logging.getLogger(__name__)


class Lifecycle:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        io: PaneIO,
        panes: Panes,
        status: StatusReader,
        logs: PaneLogs,
        planner: LaunchPlanner,
        workspaces: Workspaces,
        *,
        events: EventBus,
        fault: Callable[[str], None] = lambda _name: None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.io = io
        self.panes = panes
        self.status = status
        self.logs = logs
        self.planner = planner
        self.workspaces = workspaces
        self.events = events
        self.fault = fault  # test-only crash points (see cao.delivery.Faults)
        self.deleted_listeners = []
        self.retiring: list[Callable[[Terminal], None]] = []  # told before its HOME is removed
        self._new_sessions: set[str] = set()  # sessions a create is making now (``_session``)
        self._new_sessions_lock = threading.Lock()
        self.found_dead = []
        self.orphans: list[TaggedPane] = []  # panes tagged as ours with no row (found at start)

    @property
    def home_tag(self) -> str:
        return self.panes.home_tag

    # -- create ------------------------------------------------------------------------------------
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
        :meth:`adopt` (the pane is tagged with the terminal id), so no agent runs untracked."""
        with self._session(session_name, new_session) as session:
            return self._create(
                session,
                new_session=new_session,
                provider=provider,
                agent_profile=agent_profile,
                working_directory=working_directory,
                supervisor_id=supervisor_id,
                use_worktree=use_worktree,
            )

    def _create(
        self,
        session: str,
        *,
        new_session: bool,
        provider: str | None,
        agent_profile: str | None,
        working_directory: str | None,
        supervisor_id: str | None,
        use_worktree: bool | None,
    ) -> Terminal:
        supervisor = self.store.get_terminal(supervisor_id) if supervisor_id else None
        terminal_id = self._new_id()
        plan = self.planner.plan(
            terminal_id,
            session=session,
            provider=provider,
            agent_profile=agent_profile,
            working_directory=working_directory,
            supervisor=supervisor,
            use_worktree=use_worktree,
            hook_key=self.status.hook_key(terminal_id),
        )
        terminal = plan.terminal
        terminal.host = self.store.host  # this host's tmux runs it: only this host touches its pane
        terminal.turn_channel = plan.spec.turn_channel  # the hook that can hand text to its turns
        try:
            plan.home.mkdir(parents=True, exist_ok=True)
            for path, content in plan.spec.files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            # a new session: no other host may have started one of that name meanwhile (checked in
            # the write itself; the look at tmux above can't see another host's)
            self.store.add_terminal(terminal, new_session=new_session)
        except BaseException:
            shutil.rmtree(plan.home, ignore_errors=True)  # its CLI's config: nothing else has it
            raise
        try:
            command = plan.spec.command
            if plan.worktree is not None:  # the worktree, then its setup in the pane before the agent
                command = self.workspaces.make(plan.worktree, terminal_id, plan.spec.command)
            info: PaneInfo = self.io.create_window(
                session_name=session,
                window_name=terminal.name,
                command=command,
                env=plan.spec.env,
                cwd=plan.agent_dir,
                log_path=self.logs.path(terminal_id),
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
        logger.info("terminal created", extra={"terminal_id": terminal_id, "provider": terminal.provider})
        self.events.publish(
            "terminal.created",
            terminal_id=terminal_id,
            session_name=session,
            provider=terminal.provider,
            agent_profile=terminal.agent_profile,
            supervisor_id=terminal.supervisor_id,
        )
        return terminal

    @contextlib.contextmanager
    def _session(self, session_name: str | None, new_session: bool) -> Iterator[str]:
        """The session a create goes into. A new one is claimed for the whole create, so two
        creates of the same new session at once can't both see it missing and both succeed."""
        if session_name:
            session = session_name_for(validate_session_name(session_name))
        elif new_session:
            session = session_name_for(new_session_name())
        else:
            raise InvalidInput("session_name is required to add a terminal to a session")
        taken = f"session {session} already exists; pick another name or add a terminal to it"
        if new_session:
            with self._new_sessions_lock:
                if session in self._new_sessions:
                    raise InvalidInput(taken)
                self._new_sessions.add(session)
        try:
            # a session may span hosts (a shared store): its name is taken once any host runs it
            exists = self.io.has_session(session) or self.store.session_elsewhere(session)
            if new_session and exists:
                raise InvalidInput(taken)
            if not new_session and not exists:
                raise NotFound(f"session {session} not found; create it first with `cao launch`")
            yield session
        finally:
            if new_session:
                with self._new_sessions_lock:
                    self._new_sessions.discard(session)

    def _undo_create(self, terminal_id: str, exc: BaseException) -> None:
        """A create failed half-way: kill any pane tagged with this terminal, retire the row."""
        for pane in self.io.list_panes():
            if pane.terminal_id == terminal_id and pane.home_tag == self.home_tag:
                try:
                    self.io.kill_checked(pane.ref)
                except CaoError:
                    logger.exception("could not kill a half-created pane", extra={"terminal_id": terminal_id})
        self.workspaces.retire(terminal_id, label=f"terminal {terminal_id}")  # fresh: nothing to keep
        self.store.delete_terminal(terminal_id)
        shutil.rmtree(self.settings.home / "terminals" / terminal_id, ignore_errors=True)
        self.logs.remove(terminal_id)  # the pane's pipe (if it had one) died with it
        logger.warning(
            "terminal creation undone",
            extra={"terminal_id": terminal_id, "error": str(exc) or type(exc).__name__},
        )

    def _new_id(self) -> str:
        while True:
            candidate = secrets.token_hex(4)
            try:
                self.store.get_terminal(candidate, include_deleted=True)
            except NotFound:
                return candidate

    # -- delete ------------------------------------------------------------------------------------
    def delete(self, terminal: Terminal) -> int:
        """Mark the row ``deleting`` (failing its pending mail), kill the pane — only if it is
        still the terminal's own — then mark it ``deleted``.

        A tmux failure (or a crash) after the first step leaves the row ``deleting``; the sweep
        finishes it (:meth:`finish_deletes`). A pane that is not the terminal's is never touched.
        """
        if (
            terminal.state in ENDED
            and self.store.host is not None
            and terminal.host not in (None, self.store.host)
            and self.store.get_host(terminal.host).state == HostState.FAILED
        ):
            # a failed host's terminal: no pane, no files anywhere we can reach: its row goes
            self.store.delete_terminal(terminal.id)
            self.events.publish("terminal.deleted", terminal_id=terminal.id, failed_messages=0)
            return 0
        self.panes.check_local(terminal)  # another host's: only that host kills it (nothing written)
        with self.panes.lock(terminal.id):
            failed = self.store.begin_delete(terminal.id)
            self.fault("after_delete_marked")
            self._kill_and_finish(terminal)
        logger.info("terminal deleted", extra={"terminal_id": terminal.id, "failed_messages": failed})
        self.events.publish("terminal.deleted", terminal_id=terminal.id, failed_messages=failed)
        self.status.deleted(terminal.id)
        for listener in self.deleted_listeners:
            listener(terminal.id)
        return failed

    def _kill_and_finish(self, terminal: Terminal) -> None:
        self.panes.check_local(terminal)
        if terminal.pane_id and terminal.pane_pid and terminal.tmux_server_pid:
            # a pane that is not the terminal's (or none at all) is never touched
            with contextlib.suppress(PaneGone, TmuxServerDown):
                ref = PaneRef(terminal.tmux_server_pid, terminal.pane_id, terminal.pane_pid, self.home_tag)
                self.io.kill_checked(ref)
        # the agent is stopped: its worktree's work is saved and a tree with nothing else removed
        self.workspaces.retire(terminal.id, label=f"{terminal.agent_profile} {terminal.id}")
        for listener in self.retiring:  # its CLI's records are read one last time (cao/usage.py)
            try:
                listener(terminal)
            except Exception:
                logger.exception("a retiring listener failed", extra={"terminal_id": terminal.id})
        self.store.finish_delete(terminal.id)
        shutil.rmtree(self.settings.home / "terminals" / terminal.id, ignore_errors=True)
        self.logs.remove(terminal.id)

    def finish_deletes(self) -> list[str]:
        """Finish deletes that were interrupted (rows left ``deleting``); called by the sweep."""
        done = []
        for t in self.store.list_terminals(
            include_deleted=True, state=TerminalState.DELETING.value, local=True
        ):
            try:
                with self.panes.lock(t.id):
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
        terms = self.store.list_terminals(session_name=session, local=True)
        if not terms:
            if self.io.has_session(session):
                raise NotFound(
                    f"session {session} has no terminals of this cao-server ({self.settings.home}); it "
                    "belongs to another cao-server or a person, and nothing was touched"
                )
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        for t in terms:
            self.delete(t)
        return [t.id for t in terms]

    # -- pane log pipes ----------------------------------------------------------------------------
    found_dead: list[str]  # live terminals the last pipe check found without their pane
    deleted_listeners: list[Callable[[str], None]]  # told of each delete

    def restore_pipes(self) -> list[str]:
        """Reopen the log pipe of every live terminal whose pipe closed (``cat`` exits when the disk
        fills up): without it the watchdog trigger and the dashboard's live view of that pane stop
        silently; and of one whose log file was deleted under it. One ``list-panes`` for all; each
        reopen checks the pane's identity."""
        live = {t.id: t for t in self.store.list_terminals(state=TerminalState.LIVE.value, local=True)}
        if not live:
            return []
        reopened = []
        mine = set()
        for pane in self.io.list_panes():
            t = live.get(pane.terminal_id)
            if t is None or pane.home_tag != self.home_tag:
                continue
            if (t.tmux_server_pid, t.pane_id, t.pane_pid) != (pane.server_pid, pane.pane_id, pane.pane_pid):
                continue
            if pane.dead:
                continue
            mine.add(t.id)
            lost = pane.piped and not self.logs.exists(t.id)  # deleted under the open pipe: writes nowhere
            if pane.piped and not lost:
                continue
            try:
                if self.io.reopen_pipe_checked(pane.ref, self.logs.path(t.id), replace=lost):
                    reopened.append(t.id)
                    what = "pane log was deleted; a new one opened" if lost else "pane log pipe reopened"
                    logger.warning(what, extra={"terminal_id": t.id})
            except (TmuxError, OSError):
                continue
        # its program exited (or its pane went) while nobody read it: the next status read says so
        self.found_dead = [tid for tid, t in live.items() if tid not in mine and t.pane_id is not None]
        return reopened

    # -- restart -----------------------------------------------------------------------------------
    def adopt(self) -> dict[str, list[str]]:
        """After a server restart: re-adopt terminals whose panes are still theirs (server pid, pane
        id, pid and home tag all match); mark the rest gone (for good); kill panes of creations
        that were interrupted (rows still ``starting``) or whose delete was, and finish interrupted
        deletes.

        A pane tagged as this home's whose terminal has **no row at all** is never killed: the
        database was deleted or replaced while its agent ran (a create writes its row before the
        pane, so no crash leaves one). It is kept and listed (:attr:`orphans`) for the operator."""
        panes = self.io.list_panes()
        by_id = {p.pane_id: p for p in panes}
        result: dict[str, list[str]] = {"adopted": [], "gone": [], "orphans_killed": [], "orphans_kept": []}
        rows = {t.id: t for t in self.store.list_terminals(include_deleted=True, local=True)}
        self.orphans = []
        for pane in panes:
            if pane.home_tag != self.home_tag or not pane.terminal_id:
                continue
            row = rows.get(pane.terminal_id)
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
                    self.io.kill_checked(pane.ref)
                    result["orphans_killed"].append(pane.terminal_id)
                except CaoError:
                    extra = {"terminal_id": pane.terminal_id}
                    logger.exception("could not kill an orphaned pane", extra=extra)
        for t in rows.values():
            if t.state == TerminalState.STARTING:
                self.store.delete_terminal(t.id)
                continue
            if t.state != TerminalState.LIVE:
                continue
            found = by_id.get(t.pane_id or "")
            if self._adoptable(t, found):
                result["adopted"].append(t.id)
                self.status.restore_hooks(t)
            else:
                why = "its pane is dead" if found is not None and found.dead else "its pane is gone"
                if found is not None and not found.dead and found.home_tag != self.home_tag:
                    why = "its pane belongs to another cao home (this database is a copy of another's)"
                self.panes.lose(t, f"{why} (found at server start)")
                result["gone"].append(t.id)
        result["finished_deletes"] = self.finish_deletes()
        return result

    def _adoptable(self, t: Terminal, found: TaggedPane | None) -> bool:
        if (
            found is None
            or found.pane_pid != t.pane_pid
            or found.dead
            or t.tmux_server_pid not in (None, found.server_pid)
            or found.home_tag != self.home_tag  # a copy of another home's database: not ours
        ):
            return False
        if t.tmux_server_pid is None:  # a row from before schema 3
            self.store.adopt_identity(t.id, found.server_pid)
        try:
            self.io.ensure_pipe(found.pane_id, self.logs.path(t.id))
        except (PaneGone, TmuxServerDown):
            return False
        return True
