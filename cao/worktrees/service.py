"""A worker's git worktree through its life — the service the terminal layer calls: made when
the terminal is created, retired when it is deleted, adopted (or listed as an orphan) when the
server starts, reviewed and merged on request. The rows are in the store (``worktree`` table),
the git work in the other modules of :mod:`cao.worktrees`.

    create ──► plan()      422 before anything exists: not a repository, no commit, bad setup file
           ──► make()      after the terminal's row: git worktree add, copy/link setup files;
                           returns the agent's command wrapped so the setup commands run in its pane
    delete ──► retire()    every commit onto a named ref, uncommitted work as wip commits, the
                           worktree removed — or ``kept`` untouched when something would be lost
                           or it is not cao's any more; an unmerged branch kept (never raises:
                           a failure leaves the row ``active``)
    start  ──► adopt()     worktrees of live terminals are adopted; the rest are listed as orphans
    review ──► diff(), merge()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cao.errors import CaoError, InvalidInput
from cao.events import EventBus
from cao.settings import Settings
from cao.states import TerminalState, WorktreeState
from cao.store import Store, Terminal, Worktree
from cao.worktrees import retire as retiring
from cao.worktrees import review
from cao.worktrees.git import Git, Pinned, Repo, WorktreeError, not_the_folder, shown, validate_branch
from cao.worktrees.review import NotMergeable
from cao.worktrees.scratch import MAX_FILE_BYTES
from cao.worktrees.setup import SetupFile, SetupPlan, dumps, load_plan, loads, prepare, setup_command

logger = logging.getLogger(__name__)

STAT_TTL = 2.0  # seconds a worktree's diffstat is reused (views are polled often)


@dataclass(frozen=True)
class Plan:
    """Where a worker's worktree will go, decided before anything is written."""

    repo: Repo
    setup: SetupPlan
    path: Path
    branch: str

    @property
    def agent_dir(self) -> Path:
        return self.path / self.repo.subdir if self.repo.subdir else self.path


class Workspaces:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        git: Git,
        *,
        events: EventBus | None = None,
        clock: Callable[[], float] = time.time,
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        self.settings = settings
        self.store = store
        self.git = git
        self.events = events or EventBus()
        self.clock = clock
        self.max_file_bytes = max_file_bytes  # a new file over it keeps the worktree at delete
        self.orphans: list[dict[str, object]] = []
        self._stats: dict[str, tuple[float, dict[str, int]]] = {}
        self._lock = threading.Lock()

    # -- create ----------------------------------------------------------------------------------
    def plan(self, directory: Path, profile: str, terminal_id: str) -> Plan:
        repo = self.git.inspect(directory)
        setup = load_plan(repo.toplevel)
        # the path as it really is: at delete it must still resolve to itself (no symlink)
        root = Path(os.path.realpath(self.settings.worktrees_dir))
        path = root / repo.name / f"{profile}-{terminal_id}"
        if path.resolve().is_relative_to(repo.toplevel.resolve()):
            raise WorktreeError(
                f"use_worktree: the worktrees directory {self.settings.worktrees_dir} is inside the "
                f"checkout {repo.toplevel}; set CAO_WORKTREES_DIR to a directory outside it"
            )
        return Plan(repo, setup, path, f"cao/{profile}-{terminal_id}")

    def make(self, plan: Plan, terminal_id: str, command: Sequence[str]) -> list[str]:
        """Make the worktree (the terminal's row exists already) and return the agent's command,
        preceded by the setup. Raises :class:`WorktreeError` with nothing left behind."""
        repo = plan.repo
        self.git.add(repo, plan.path, plan.branch)
        self.store.add_worktree(
            Worktree(
                terminal_id=terminal_id,
                repo_dir=str(repo.toplevel),
                common_dir=str(repo.common_dir),
                path=str(plan.path),
                branch=plan.branch,
                base_commit=repo.head,
                base_branch=repo.branch,
                subdir=repo.subdir,
                created_at=self.clock(),
            )
        )
        # the paths the setup will copy or link are cao's, not the worker's, from the start: a
        # copy that fails half-way is not kept as if it were the worker's ignored files
        self.store.update_worktree_paths(
            terminal_id, dumps(SetupFile(p) for p in plan.setup.copy + plan.setup.link)
        )
        try:
            prepared = prepare(self.git, repo, plan.path, plan.setup)
        except WorktreeError:
            self.retire(terminal_id, label=f"terminal {terminal_id}")
            raise
        except OSError as exc:
            self.retire(terminal_id, label=f"terminal {terminal_id}")
            raise WorktreeError(f"use_worktree: copying the setup files failed: {exc}") from None
        self.store.update_worktree_paths(terminal_id, dumps(prepared.files))
        logger.info("worktree created", extra={"terminal_id": terminal_id, "branch": plan.branch})
        self.events.publish(
            "terminal.worktree",
            terminal_id=terminal_id,
            state=WorktreeState.ACTIVE,
            branch=plan.branch,
            path=str(plan.path),
            note=f"from {repo.branch or repo.head[:10]}",
        )
        commands, notes = plan.setup.setup, list(prepared.notes)
        if commands and not self.settings.worktree_setup_commands:
            # A repository's commands are its code: a checkout you cloned must not run anything on
            # your machine just because a worker started in it. The operator opts in.
            notes.append(
                f"setup commands skipped ({len(commands)}): a repository's commands run only with "
                "CAO_WORKTREE_SETUP_COMMANDS=true in cao-server's environment"
            )
            commands = ()
        return setup_command(command, root=plan.path, notes=notes, setup=commands)

    # -- delete ----------------------------------------------------------------------------------
    def retire(self, terminal_id: str, *, label: str) -> Worktree | None:
        """The terminal is being deleted: keep its work, drop what holds none (see
        :func:`cao.worktrees.retire.retire`). Never raises; a failure leaves the row ``active``
        (an orphan)."""
        wt = self.store.get_worktree(terminal_id)
        if wt is None or wt.state != WorktreeState.ACTIVE:
            return wt
        try:
            # `discard:` is read now, from the checkout (the operator's), not from the worktree
            discard = load_plan(Path(wt.repo_dir)).discard if Path(wt.repo_dir).is_dir() else ()
        except WorktreeError:
            discard = ()  # an unreadable file lets nothing go
        try:
            state, note = retiring.retire(
                self.git,
                common_dir=Path(wt.common_dir),
                path=Path(wt.path),
                branch=wt.branch,
                setup=loads(wt.setup_paths),
                label=label,
                discard=discard,
                since=wt.created_at,
                limit=self.max_file_bytes,
            )
        except (CaoError, OSError) as exc:
            why = exc.message if isinstance(exc, CaoError) else str(exc)
            logger.warning("worktree not retired", extra={"terminal_id": terminal_id, "error": why})
            return wt
        note = shown(note)  # it names files, byte for byte
        self.store.finish_worktree(terminal_id, state, note)
        self._stats.pop(terminal_id, None)
        logger.info("worktree retired: %s", note, extra={"terminal_id": terminal_id})
        self.events.publish(
            "terminal.worktree",
            terminal_id=terminal_id,
            state=state,
            branch=wt.branch,
            path=wt.path,
            note=note,
        )
        return self.store.get_worktree(terminal_id)

    # -- restart ---------------------------------------------------------------------------------
    def adopt(self, terminals: dict[str, Terminal]) -> dict[str, list[str]]:
        """At server start: worktrees of live terminals are adopted; active worktrees whose
        terminal is not live, and folders in the worktrees directory no row knows, are listed
        as orphans (never removed: they may hold work)."""
        adopted: list[str] = []
        orphans: list[dict[str, object]] = []
        known: set[str] = set()
        for wt in self.store.list_worktrees():
            known.add(str(Path(wt.path).resolve()))
            if wt.state == WorktreeState.REMOVED:
                continue
            term = terminals.get(wt.terminal_id)
            real = not_the_folder(Path(wt.path)) is None
            live = term is not None and term.state == TerminalState.LIVE and real
            if live and wt.state == WorktreeState.ACTIVE:
                adopted.append(wt.terminal_id)
                continue
            why = (
                f"kept at delete: {wt.note}"
                if wt.state == WorktreeState.KEPT
                else f"its terminal is {term.state if term else 'unknown'}"
            )
            if not os.path.lexists(wt.path):
                why += "; its folder is missing"
            elif not real:
                why += f"; {not_the_folder(Path(wt.path))}"
            orphans.append({**self._row_view(wt), "reason": why})
        root = self.settings.worktrees_dir
        if root.is_dir():
            for repo_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                for path in sorted(p for p in repo_dir.iterdir() if p.is_dir()):
                    if str(path.resolve()) not in known:
                        orphans.append(
                            {
                                "terminal_id": None,
                                "path": str(path),
                                "branch": self._branch(path),
                                "reason": "no terminal knows it",
                            }
                        )
        self.orphans = orphans
        for o in orphans:
            logger.warning(
                "orphaned worktree: %s (%s)", o["path"], o["reason"], extra={"terminal_id": o["terminal_id"]}
            )
        return {"adopted": adopted, "orphans": [str(o["path"]) for o in orphans]}

    def _branch(self, path: Path) -> str | None:
        if not_the_folder(path):  # a symlink: git is not run where it points
            return None
        try:
            return self.git.branch_of(path)
        except CaoError:
            return None

    # -- views -----------------------------------------------------------------------------------
    def _row_view(self, wt: Worktree) -> dict[str, object]:
        return {
            "terminal_id": wt.terminal_id,
            "path": wt.path,
            "branch": wt.branch,
            "base_branch": wt.base_branch,
            "base_commit": wt.base_commit,
            "repository": wt.repo_dir,
            "state": wt.state,
            "note": wt.note,
        }

    def view(self, terminal_id: str) -> dict[str, object] | None:
        """A terminal's worktree for its view (``None``: it has none), with a diffstat."""
        wt = self.store.get_worktree(terminal_id)
        if wt is None:
            return None
        out = self._row_view(wt)
        out["diffstat"] = self._diffstat(wt)
        return out

    def _diffstat(self, wt: Worktree) -> dict[str, int] | None:
        if wt.state != WorktreeState.ACTIVE:
            return None
        now = time.monotonic()
        with self._lock:
            cached = self._stats.get(wt.terminal_id)
        if cached is not None and now - cached[0] < STAT_TTL:
            return cached[1]
        pinned = self._pinned(wt)
        if pinned is None:
            return None
        try:
            stat = review.shortstat(self.git, pinned, wt.base_commit, loads(wt.setup_paths))
        except CaoError:
            return None
        with self._lock:
            self._stats[wt.terminal_id] = (now, stat)
        return stat

    def listing(self) -> list[dict[str, object]]:
        rows = [self.view(wt.terminal_id) or {} for wt in self.store.list_worktrees()]
        reasons = {o["path"]: o["reason"] for o in self.orphans}
        for row in rows:
            row["orphan"] = row["path"] in reasons
            row["reason"] = reasons.get(row["path"])
        known = {row["path"] for row in rows}
        rows += [{**o, "orphan": True} for o in self.orphans if o["path"] not in known]
        return rows

    # -- review ----------------------------------------------------------------------------------
    def get(self, terminal_id: str) -> Worktree:
        wt = self.store.get_worktree(terminal_id)
        if wt is None:
            raise InvalidInput(
                f"terminal {terminal_id} has no worktree (it was not created with use_worktree); "
                "there is no branch to diff or merge"
            )
        return wt

    def target(self, wt: Worktree, into: str | None) -> str:
        target = validate_branch(into) if into is not None else wt.base_branch
        if not target:
            raise InvalidInput(
                f"the checkout terminal {wt.terminal_id} came from had no branch checked out (detached "
                "HEAD); name the branch to merge into (`cao merge ID --into BRANCH`, into=...)"
            )
        return target

    def diff(self, terminal_id: str, *, stat: bool, into: str | None = None) -> dict[str, object]:
        wt = self.get(terminal_id)
        common = Path(wt.common_dir)
        target = (validate_branch(into) if into is not None else None) or wt.base_branch or wt.base_commit
        try:
            base = review.fork_point(self.git, common, target, wt.branch)
        except WorktreeError:
            base = wt.base_commit
        pinned = self._pinned(wt)
        text = review.diff(
            self.git,
            common_dir=common,
            pinned=pinned,
            base=base,
            branch=wt.branch,
            setup=loads(wt.setup_paths),
            stat=stat,
        )
        return {
            "terminal_id": terminal_id,
            "branch": wt.branch,
            "base": base,
            "against": target,
            "includes_uncommitted": pinned is not None,
            "mode": "stat" if stat else "full",
            "diff": shown(text),
        }

    def _pinned(self, wt: Worktree) -> Pinned | None:
        """The worker's worktree while it holds work cao can read: active, or kept at delete
        (its uncommitted work is still only there), and still the worktree cao made (a real
        folder, no symlink, its .git and git's entry agree: :meth:`Git.identify`)."""
        if wt.state not in (WorktreeState.ACTIVE, WorktreeState.KEPT) or not os.path.lexists(wt.path):
            return None
        try:
            return self.git.identify(Path(wt.common_dir), Path(wt.path))
        except CaoError:
            return None

    def merge(self, terminal_id: str, *, into: str | None, label: str) -> dict[str, object]:
        wt = self.get(terminal_id)
        target = self.target(wt, into)
        pinned = self._pinned(wt)
        if (
            pinned is None
            and os.path.lexists(wt.path)
            and wt.state in (WorktreeState.ACTIVE, WorktreeState.KEPT)
        ):
            how = (
                f"was kept at delete ({wt.note})"
                if wt.state == WorktreeState.KEPT
                else "is no longer the one cao made"
            )
            raise NotMergeable(
                f"worker {terminal_id}'s worktree {how} and cao can't tell what it holds; merge its "
                f"branch {wt.branch} with git yourself once you have reviewed it"
            )
        if pinned is not None:
            dirty = review.dirty(self.git, pinned, loads(wt.setup_paths))
            if dirty:
                todo = (
                    "The worker is gone and its worktree was kept at delete: commit them there yourself"
                    if wt.state == WorktreeState.KEPT
                    else "Ask it to commit, or delete the worker (its work is committed as a wip commit)"
                )
                raise NotMergeable(
                    f"worker {terminal_id} has uncommitted changes in {wt.path} ({len(dirty)} file(s): "
                    f"{', '.join(dirty[:5])}); they would not be merged. {todo}, "
                    "then merge"
                )
        result = review.merge(
            self.git, common_dir=Path(wt.common_dir), branch=wt.branch, target=target, label=label
        )
        self._stats.pop(terminal_id, None)
        self.events.publish(
            "terminal.worktree",
            terminal_id=terminal_id,
            state=wt.state,
            branch=wt.branch,
            path=wt.path,
            note=f"merged into {target}" + (" (already)" if result.already else ""),
        )
        return {"terminal_id": terminal_id, **result.as_dict()}
