"""A worker is deleted: keep its work, drop what holds none (docs/worktrees.md, "Nothing is ever
lost"). The rule: every commit stays reachable from a named ref, nothing untracked or ignored is
deleted unless the operator asked for it, and cao only ever writes in the worktree it made.

    identify  is it still cao's worktree? (a real folder, not a symlink; its .git and git's entry
              agree: :meth:`Git.identify`) — if not, nothing is touched
    holds     would anything be lost with it? (an operation in progress, conflicts, a lock,
              ignored files, nested repositories, .git entries git can't see into, submodules
              with work, copies of the setup the worker changed, files too big to commit) —
              if so, it is kept exactly as it is
    save      uncommitted work as wip commits on the branch HEAD is on (or a new one), and
              every commit the worktree's reflogs or refs hold that no named ref has onto a
              branch of its own
    remove    git worktree remove; cao's branch deleted only if another named ref has its tip
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cao.states import WorktreeState
from cao.worktrees import scratch
from cao.worktrees.git import Git, Pinned, WorktreeError, dotgit_like, not_the_folder
from cao.worktrees.scratch import MAX_FILE_BYTES, Scratch, size_text
from cao.worktrees.setup import SetupFile, blob_id

IN_PROGRESS = (  # marker in the worktree's git dir → what is going on
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase (or `git am`)"),
    ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("sequencer", "a cherry-pick or revert sequence"),
    ("BISECT_LOG", "a bisect"),
)


@dataclass(frozen=True)
class Snapshot:
    """A worktree's state as trees."""

    head: str | None  # HEAD's commit (None: an unborn branch)
    base: str  # HEAD's tree (the empty tree on an unborn branch)
    staged: str  # the worker's index as a tree
    work: str  # everything in the worktree as a tree


def _some(items: Sequence[str], limit: int = 5) -> str:
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _groups(paths: Sequence[str], limit: int = 8) -> str:
    """Paths summed up by their first directory: ``.env, build/ (2 files), run.log``."""
    groups: dict[str, int] = {}
    for path in paths:
        top, sep, _ = path.partition("/")
        groups[top + sep] = groups.get(top + sep, 0) + 1
    return _some(
        [f"{g} ({n} file{'s' * (n != 1)})" if g.endswith("/") else g for g, n in groups.items()], limit
    )


def holds(
    git: Git, p: Pinned, s: Scratch, discard: Sequence[str], limit: int = MAX_FILE_BYTES
) -> tuple[list[str], list[str]]:
    """Why the worktree can't go without losing something (empty: it can), and notes. Reads
    only: nothing in the worktree or the repository is written."""
    assert p.path is not None
    why: list[str] = []
    locked = p.admin / "locked"
    if locked.exists():
        reason = locked.read_text(encoding="utf-8", errors="replace").strip()[:200]
        why.append(f"it is locked (`git worktree lock`{': ' + reason if reason else ''})")
    doing = [what for marker, what in IN_PROGRESS if (p.admin / marker).exists()]
    why += [f"{what} is in progress (finish or abort it there first)" for what in doing[:1]]
    unmerged = sorted({e.split("\t", 1)[-1] for e in git.lines(p.where, "ls-files", "-u", "-z", env=p.env())})
    if unmerged:
        why.append(f"its index has unresolved conflicts ({_some(unmerged)})")
    ignored = git.lines(p.where, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", env=p.env())
    mine = [x for x in ignored if not s.setup.cao_owns(x) and x.rstrip("/") not in s.setup.changed]
    nested = sorted({*s.nested, *(x.rstrip("/") for x in mine if x.endswith("/"))})
    why += [f"a git repository is nested at {n}/ (its commits and files live only there)" for n in nested]
    submodules = []
    for entry in git.lines(p.where, "ls-files", "-s", "-z", env=p.env()):
        mode, _, rel = entry.partition("\t")
        here = p.path / rel
        if not mode.startswith("160000") or here.is_symlink() or not here.is_dir():
            continue
        submodules.append(rel)
        if (here / ".git").exists():
            why += _submodule_holds(git, p, rel)
        elif any(here.iterdir()):  # git doesn't look inside a submodule that is not checked out
            why.append(f"{rel}/ is a submodule's path with files in it but no .git: git can't see them")
    hidden = _dotgits(p.path, {*nested, *submodules})
    if hidden:
        why.append(
            f"{_some(hidden)}: named like .git but no repository git can use; git never stores a path "
            "named .git nor looks inside one, so what is in it would be deleted unseen"
        )
    changed = _changed_copies(git, p, s)
    if changed:
        why.append(
            f"{len(changed)} file(s) the setup copied in were changed by the worker and not committed: "
            f"{_some(changed)} (cao never commits the setup's copies, which often hold secrets)"
        )
    if s.too_big:
        files = _some([f"{rel} ({size_text(n)})" for rel, n in s.too_big])
        over = f"over cao's {size_text(limit)} limit per file"
        why.append(f"{len(s.too_big)} file(s) too big to commit ({over}): {files}")
    mine = [x for x in mine if not x.endswith("/")]
    notes = []
    if mine and discard:
        let_go = set(
            git.lines(
                p.where,
                "ls-files",
                "-z",
                "--others",
                "--ignored",
                *(f"--exclude={d}" for d in discard),
                env=p.env(),
            )
        )
        mine, gone = [x for x in mine if x not in let_go], len([x for x in mine if x in let_go])
        if gone:
            notes.append(f"discarded {gone} ignored file(s) matching .cao/worktree.yaml's discard: list")
    if mine:
        why.append(f"{len(mine)} ignored file(s) would be deleted with it: {_groups(mine)}")
    return why, notes


def _dotgits(root: Path, skip: set[str]) -> list[str]:
    """Entries named like ``.git`` below ``root`` (not its own ``.git``, not inside the
    repositories and submodules in ``skip``, which are looked at on their own). Never follows a
    symlink."""
    found = []
    for here, dirs, files in os.walk(root):
        rel = Path(here).relative_to(root).as_posix()
        at = "" if rel == "." else rel + "/"
        found += [at + n for n in sorted([*dirs, *files]) if dotgit_like(n) and (at or n != ".git")]
        dirs[:] = [d for d in dirs if not dotgit_like(d) and at + d not in skip]
    return found


def _changed_copies(git: Git, p: Pinned, s: Scratch) -> list[str]:
    """Copies of the setup the worker changed, other than to what HEAD has (committed: kept)."""
    assert p.path is not None
    if not s.setup.changed:
        return []
    committed: dict[str, str] = {}
    if s.head:
        for line in git.lines(p.where, "ls-tree", "-r", "-z", "--full-tree", s.head, env=p.env()):
            meta, _, rel = line.partition("\t")
            if rel in s.setup.changed:
                committed[rel] = meta.split(" ")[-1]
    out = []
    for rel in s.setup.changed:
        here = p.path / rel
        if here.is_dir() and not here.is_symlink():
            continue  # replaced by a directory: its files are the worker's, like any other
        if here.is_file() and not here.is_symlink() and committed.get(rel) == blob_id(here, p.object_format):
            continue
        out.append(rel)
    return out


def _submodule_holds(git: Git, p: Pinned, rel: str) -> list[str]:
    """Why a checked-out submodule (or a committed nested repository) holds work: changes,
    untracked or ignored files, its own submodules, or — when its git directory goes with the
    worktree (a submodule checked out in a linked worktree keeps it in the worktree's entry) —
    a commit that none of its remote-tracking branches has."""
    assert p.path is not None
    sub = p.path / rel
    env = {**git.guard(sub), "GIT_OPTIONAL_LOCKS": "0"}
    probe = git.run(sub, "rev-parse", "--path-format=absolute", "--git-dir", env=env, check=False)
    if probe.returncode != 0:
        return [f"submodule {rel}: git can't read it ({probe.stderr.strip()[:200]})"]
    status = git.run(
        sub,
        "status",
        "--porcelain",
        "--ignored",
        "--untracked-files=all",
        "--ignore-submodules=all",
        env=env,
        check=False,
    )
    if status.returncode != 0 or status.stdout.strip():
        return [f"submodule {rel} has uncommitted changes, untracked or ignored files"]
    inner = git.run(sub, "ls-files", "-s", env=env).stdout
    if any(line.startswith("160000") for line in inner.splitlines()):
        return [f"submodule {rel} has submodules of its own"]
    gitdir = Path(probe.stdout.strip()).resolve()
    if gitdir.is_relative_to(p.path.resolve()) or gitdir.is_relative_to(p.admin.resolve()):
        only = git.run(sub, "rev-list", "-n1", "--all", "--not", "--remotes", env=env, check=False)
        if only.returncode != 0 or only.stdout.strip():
            return [
                f"submodule {rel} has commits none of its remotes has "
                f"({only.stdout.strip()[:10] or 'unreadable'}); they live only in this worktree"
            ]
    return []


def snapshot(git: Git, p: Pinned, s: Scratch) -> Snapshot:
    """The scratch index ``s`` (read with ``staged=True``) as trees."""
    work = git.out(p.where, "write-tree", env=s.env)
    if s.head:
        base = git.out(p.where, "rev-parse", f"{s.head}^{{tree}}", env=s.env)
    else:  # an unborn branch: nothing committed yet
        base = git.run(p.where, "mktree", env=s.env, input="").stdout.strip()
    if s.staged is None:
        raise WorktreeError("the worker's index can't be written as a tree (unresolved conflicts?)")
    return Snapshot(s.head, base, s.staged, work)


def _commit(git: Git, p: Pinned, tree: str, parent: str | None, message: str) -> str:
    parents = ["-p", parent] if parent else []
    return git.out(p.where, "commit-tree", tree, *parents, "-m", message, env=p.env(), commit=True)


def _side(git: Git, p: Pinned, prefix: str, commit: str) -> str:
    """A new branch ``<prefix>-<short sha>`` at ``commit`` (created only if it doesn't exist)."""
    for name in (f"{prefix}-{commit[:10]}", f"{prefix}-{commit}"):
        ref = f"refs/heads/{name}"
        made = git.run(
            p.where,
            "update-ref",
            "-m",
            "cao: work saved at delete",
            ref,
            commit,
            "",
            env=p.env(),
            check=False,
        )
        if made.returncode == 0:
            return name
    raise WorktreeError(f"could not make a branch {prefix}-{commit[:10]} for commit {commit[:10]}")


def _stranded(git: Git, p: Pinned, branch: str) -> list[tuple[str, str]]:
    """Commits that go with the worktree and that no branch, tag or remote branch has: every
    commit of the worktree's HEAD reflog and of cao's branch's reflog (a commit left behind on a
    detached HEAD, dropped by a reset or an amend, on a branch the worker deleted) and those only
    a per-worktree ref (``refs/worktree/*``) holds. Only the independent tips, each as (commit,
    what it was): a branch at a tip keeps everything below it."""
    found: dict[str, str] = {}
    refs = git.run(
        p.where,
        "for-each-ref",
        "--format=%(objecttype) %(objectname) %(refname)",
        "refs/worktree/",
        env=p.env(),
    )
    for kind, _, rest in (line.partition(" ") for line in refs.stdout.splitlines()):
        commit, _, ref = rest.partition(" ")
        if kind == "commit":
            found.setdefault(commit, f"held only by {ref}, which goes with the worktree")
    logs = (
        (
            p.admin / "logs" / "HEAD",
            "on no branch (the worktree's HEAD had it: a reset, amend, checkout or deleted branch)",
        ),
        (p.common / "logs" / "refs" / "heads" / branch, f"on no branch (it was on {branch} before)"),
    )
    for log, what in logs:
        try:
            lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            for commit in line.split(" ")[:2]:
                if len(commit) >= 40 and commit.strip("0"):
                    found.setdefault(commit, what)
    if not found:
        return []
    args = (
        "rev-list",
        "--parents",
        "--ignore-missing",
        "--stdin",
        "--not",
        "--branches",
        "--tags",
        "--remotes",
    )
    out = git.run(p.where, *args, env=p.env(), input="\n".join(found) + "\n").stdout
    unnamed, parents = [], set()
    for line in out.splitlines():
        commit, *above = line.split()
        unnamed.append(commit)
        parents.update(above)
    return [(c, found.get(c, "on no branch")) for c in unnamed if c not in parents]


def save(git: Git, p: Pinned, snap: Snapshot | None, *, branch: str, label: str) -> list[str]:
    """Put the worker's work where a named ref holds it; notes.

    The uncommitted work (staged, then the rest) as wip commits on the worker's branch, or on a
    new branch ``<branch>-wip-<sha>`` when HEAD is on another branch (which is not moved), or
    ``<branch>-detached-<sha>`` when HEAD is detached; then every other commit that would go
    with the worktree gets ``<branch>-saved-<sha>`` (:func:`_stranded`)."""
    notes: list[str] = []
    env = p.env()
    head_ref = git.run(p.where, "symbolic-ref", "-q", "HEAD", env=env, check=False).stdout.strip()
    if snap is None:  # the folder is gone: only HEAD is left to save
        found = git.run(p.where, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env, check=False)
        head = found.stdout.strip() or None
    else:
        head = snap.head
    tip, made = head, None
    if snap and snap.staged not in (snap.base, snap.work):
        tip = _commit(git, p, snap.staged, tip, f"wip: staged changes of {label}, saved by cao at delete")
        notes.append(f"staged changes committed as {tip[:10]}")
    if snap and snap.work != (snap.staged if tip != head else snap.base):
        tip = _commit(git, p, snap.work, tip, f"wip: uncommitted work of {label}, saved by cao at delete")
    if tip != head:
        made = tip
    ours = f"refs/heads/{branch}"
    if head_ref == ours:
        if made:
            git.run(p.where, "update-ref", "-m", "cao: work saved at delete", ours, made, head or "", env=env)
            notes.append(f"uncommitted work committed as {made[:10]} on {branch}")
    elif head_ref:
        name = head_ref.removeprefix("refs/heads/")
        if made:
            side = _side(git, p, f"{branch}-wip", made)
            base = f"on top of {name}, which cao did not move" if head else f"{name} has no commit yet"
            notes.append(
                f"the worker had switched to branch {name}: its uncommitted work committed as "
                f"{made[:10]} on new branch {side} ({base})"
            )
        else:
            notes.append(f"the worker had switched to branch {name}; its commits are there")
    elif tip and not git.named(p.where, tip, env):
        side = _side(git, p, f"{branch}-detached", tip)
        what = f"uncommitted work committed as {made[:10]} and" if made else "its commits"
        notes.append(f"HEAD was detached at {(head or '?')[:10]}: {what} saved as new branch {side}")
    elif tip:
        notes.append(f"HEAD was detached at {tip[:10]}, a commit a branch has already")
    for commit, what in _stranded(git, p, branch):
        side = _side(git, p, f"{branch}-saved", commit)
        notes.append(f"commit {commit[:10]}, {what}, saved as new branch {side}")
    return notes


def retire(
    git: Git,
    *,
    common_dir: Path,
    path: Path,
    branch: str,
    setup: Sequence[SetupFile],
    label: str,
    discard: Sequence[str] = (),
    since: float = 0.0,
    limit: int = MAX_FILE_BYTES,
) -> tuple[str, str]:
    """A worker is deleted: keep its work, drop what holds none. Returns (state, note): ``kept``
    (nothing touched, the note says why) or ``removed`` (the note says where its work went)."""
    if not os.path.lexists(path):
        return _retire_gone(git, common_dir, path, branch)
    problem = not_the_folder(path)
    if problem:
        return WorktreeState.KEPT, f"worktree kept, nothing was touched: {problem}"
    try:
        p = git.identify(common_dir, path)
    except WorktreeError as exc:
        return WorktreeState.KEPT, f"worktree kept at {path}, not touched: {exc.message}"
    try:
        with tempfile.TemporaryDirectory(prefix="cao-retire-") as tmp:
            (Path(tmp) / "a").mkdir()
            (Path(tmp) / "b").mkdir()
            first = scratch.read(git, p, setup, Path(tmp) / "a", limit=limit, strict=True, staged=True)
            why, notes = holds(git, p, first, discard, limit)
            if why:
                return WorktreeState.KEPT, _kept_note(git, p, first, why)
            if (p.admin / "index.lock").exists():
                notes.append(
                    "an index.lock was left in it (a git command crashed or was killed): the work was "
                    "saved without the worker's index"
                )
            snap = snapshot(git, p, first)
            second = scratch.read(git, p, setup, Path(tmp) / "b", limit=limit, strict=True, staged=True)
            if snapshot(git, p, second) != snap or second.too_big or second.refused:
                return WorktreeState.KEPT, f"worktree kept at {path}: it changed while cao was saving it"
        notes = save(git, p, snap, branch=branch, label=label) + notes
    except WorktreeError as exc:
        return WorktreeState.KEPT, f"worktree kept at {path}: its work could not be committed ({exc.message})"
    notes += _stashes(git, p, since)
    problem = not_the_folder(path)  # once more, right before the one destructive step
    removed = None
    if not problem:
        removed = git.run(p.common, "worktree", "remove", "--force", str(path), check=False)
    if removed is None or removed.returncode != 0:
        failed = problem or (removed.stderr.strip()[:300] if removed else "")
        return WorktreeState.KEPT, "; ".join(
            [*notes, f"worktree kept at {path}: git worktree remove failed ({failed})"]
        )
    notes.append("worktree removed")
    notes.append(_branch_fate(git, p.common, branch))
    return WorktreeState.REMOVED, "; ".join(notes)


def _retire_gone(git: Git, common_dir: Path, path: Path, branch: str) -> tuple[str, str]:
    """The worktree's folder is gone: what its entry in the repository still holds (a detached
    HEAD, commits in its reflog) goes on named refs, then that entry is removed (only it: ``git
    worktree prune`` would drop other workers' entries too)."""
    common = common_dir.resolve()
    admin = git.admin_of(common, path)
    notes = []
    if admin is None:
        notes.append(f"its folder {path} was already gone and git knows no worktree there (moved?)")
    elif (admin / "locked").exists():
        return (
            WorktreeState.KEPT,
            f"worktree {path} kept: its folder is gone but it is locked (`git worktree lock`)",
        )
    else:
        p = Pinned(None, admin, common, {})
        probe = git.run(
            admin, "rev-parse", "--path-format=absolute", "--git-common-dir", env=p.env(), check=False
        )
        if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != common:
            seen = (probe.stdout or probe.stderr).strip()[:300]
            return WorktreeState.KEPT, (
                f"worktree entry {admin} kept, not touched: its folder {path} is gone and the entry "
                f"points at another repository ({seen})"
            )
        p = Pinned(None, admin, common, git.guard(admin, p.env()))
        try:
            notes += save(git, p, None, branch=branch, label="")
        except WorktreeError as exc:
            return (
                WorktreeState.KEPT,
                f"worktree entry {admin} kept: its commits could not be saved ({exc.message})",
            )
        git.run(common, "worktree", "remove", "--force", str(path))
        notes.append("its folder was already gone; git's entry for it removed")
    notes.append(_branch_fate(git, common, branch))
    return WorktreeState.REMOVED, "; ".join(notes)


def _kept_note(git: Git, p: Pinned, s: Scratch, why: Sequence[str]) -> str:
    """What a kept worktree holds, and why it was kept."""
    env = p.env()
    head = git.run(p.where, "rev-parse", "-q", "--verify", "HEAD", env=env, check=False).stdout.strip()
    on = git.run(p.where, "symbolic-ref", "-q", "--short", "HEAD", env=env, check=False).stdout.strip()
    changed = scratch.changes(git, p, s)
    where = f"it is on branch {on}" if on else f"its HEAD is detached at {head[:10]}"
    if head and not on and not git.named(p.where, head, env):
        where += f" (on no branch: `git branch <name> {head[:10]}` keeps it)"
    return (
        f"worktree kept at {p.path} as it was, nothing committed or removed: {'; '.join(why)}. "
        f"{where[0].upper()}{where[1:]}, with {len(changed)} uncommitted change(s). Keep what you "
        f"need, then `git worktree remove --force {p.path}`"
    )


def _stashes(git: Git, p: Pinned, since: float) -> list[str]:
    """Stashes live in the repository, shared by every worktree: they stay. Say so."""
    done = git.run(p.where, "log", "-g", "--format=%ct", "refs/stash", env=p.env(), check=False)
    n = sum(1 for t in done.stdout.split() if t.isdigit() and int(t) >= int(since))
    if not n:
        return []
    entries = "1 stash entry was" if n == 1 else f"{n} stash entries were"
    return [
        f"{entries} made in the repository while it worked; stashes are shared by all worktrees "
        "and stay (`git stash list`)"
    ]


def _branch_fate(git: Git, common: Path, branch: str) -> str:
    """cao's branch is deleted only when another branch, tag or remote branch has its tip (and
    no worktree has it checked out); never when only the stash has it."""
    ref = f"refs/heads/{branch}"
    tip = git.run(common, "rev-parse", "-q", "--verify", ref, check=False).stdout.strip()
    if not tip:
        return f"branch {branch} no longer exists"
    where = next((w for w, b in git.registered(common).items() if b == branch), None)
    if where is not None:
        return f"branch {branch} kept: it is checked out at {where}"
    other = git.contained_elsewhere(common, branch)
    if other is None:
        return f"branch {branch} kept: it has commits not merged anywhere"
    git.run(common, "update-ref", "-m", "cao: worker deleted", "-d", ref, tip)
    short = other.removeprefix("refs/heads/")
    return f"branch {branch} deleted (merged: no commit of its own left, {short} has them)"
