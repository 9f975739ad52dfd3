"""Review and merge a worker's branch.

    diff       the branch against its fork point, plus, while its worktree exists, what it has
               not committed yet (read through a scratch index, :mod:`cao.worktrees.scratch`)
    shortstat  the same as numbers, for the views (files, insertions, deletions, untracked)
    merge      ``git merge-tree`` first (no side effects): a conflict stops there and is shown;
               else the target is updated (``git merge`` in the checkout that has it, or
               ``commit-tree`` + a conditional ``update-ref`` when none has it checked out)

Every call runs under the guard (:meth:`Git.guard`): no hook, fsmonitor, filter, merge or diff
driver of the repository's own config runs, in the worker's tree or in the supervisor's checkout.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from cao.errors import Conflict
from cao.worktrees import scratch
from cao.worktrees.git import Git, Pinned, WorktreeError
from cao.worktrees.setup import SetupFile

MAX_DIFF_BYTES = 2 * 1024 * 1024
MAX_CONFLICT_TEXT = 8000
DIFF_FLAGS = ("--no-color", "--no-ext-diff", "--no-textconv")


class NotMergeable(Conflict):
    """409: a merge can't start (dirty target checkout, uncommitted work in the worker's tree)."""


class MergeConflict(Conflict):
    """409: the merge would conflict; nothing was changed. ``fields`` lists the conflicts."""

    def __init__(self, message: str, *, conflicts: list[dict[str, str]], target: str, branch: str):
        super().__init__(message)
        self.fields = {"conflicts": conflicts, "target": target, "branch": branch}


@dataclass
class MergeResult:
    merged: bool
    commit: str | None
    target: str
    branch: str
    already: bool = False
    where: str | None = None  # the checkout that was updated, if any
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "merged": self.merged,
            "already_merged": self.already,
            "commit": self.commit,
            "target": self.target,
            "branch": self.branch,
            "updated_checkout": self.where,
        }


def fork_point(git: Git, common_dir: Path, target: str, branch: str) -> str:
    done = git.run(common_dir, "merge-base", target, f"refs/heads/{branch}", check=False)
    if done.returncode != 0:
        raise WorktreeError(f"branch {branch} has no common history with {target}")
    return done.stdout.strip()


def diff(
    git: Git,
    *,
    common_dir: Path,
    pinned: Pinned | None,
    base: str,
    branch: str,
    setup: Sequence[SetupFile],
    stat: bool,
) -> str:
    """Everything the worker changed since ``base``: its branch's commits and, with its
    worktree (``pinned``), what it has not committed yet (new files included, the setup's files
    left out while they are what cao put there); ``stat`` or the full patch."""
    fmt = ["--stat=120"] if stat else ["--patch"]
    if pinned is None:
        env = git.guard(common_dir)
        out = git.run(common_dir, "diff", *DIFF_FLAGS, *fmt, base, f"refs/heads/{branch}", env=env).stdout
        return out[:MAX_DIFF_BYTES]
    with tempfile.TemporaryDirectory(prefix="cao-diff-") as tmp:
        s = scratch.read(git, pinned, setup, Path(tmp))
        out = git.run(pinned.where, "diff", "--cached", *DIFF_FLAGS, *fmt, base, env=s.env).stdout
    notes = "".join(f"\n(not shown: {line})" for line in scratch.left_out(s))
    return out[: MAX_DIFF_BYTES - len(notes)] + notes


def shortstat(git: Git, p: Pinned, base: str, setup: Sequence[SetupFile]) -> dict[str, int]:
    """Files, insertions, deletions of the worktree (committed and not, new files included) vs
    ``base``, and how many new files it has (``untracked``)."""
    with tempfile.TemporaryDirectory(prefix="cao-stat-") as tmp:
        s = scratch.read(git, p, setup, Path(tmp))
        out = git.run(p.where, "diff", "--cached", "--shortstat", *DIFF_FLAGS, base, env=s.env).stdout
    nums = {k: 0 for k in ("files", "insertions", "deletions")}
    for n, word in re.findall(r"(\d+) (file|insertion|deletion)", out):
        nums[{"file": "files", "insertion": "insertions", "deletion": "deletions"}[word]] = int(n)
    return {**nums, "untracked": len(s.untracked)}


def dirty(git: Git, p: Pinned, setup: Sequence[SetupFile]) -> list[str]:
    """The paths of uncommitted work (tracked changes and new files; the setup's own files left
    out while they are what cao put there)."""
    with tempfile.TemporaryDirectory(prefix="cao-dirty-") as tmp:
        s = scratch.read(git, p, setup, Path(tmp))
        return scratch.changes(git, p, s)


def merge(git: Git, *, common_dir: Path, branch: str, target: str, label: str) -> MergeResult:
    """Merge ``branch`` into the local branch ``target``; never leaves a half merge.

    ``git merge-tree --write-tree`` decides first, touching nothing: a conflict raises
    :class:`MergeConflict` with each conflicted file's text. A clean result is then applied:
    in the checkout that has ``target`` checked out (``git merge``; its tracked files must be
    clean, and a surprise conflict is aborted), or, when none has, as a merge commit that moves
    ``target`` only if it still points where it did (``update-ref <new> <old>``).
    """
    env = git.guard(common_dir)
    target_ref = f"refs/heads/{target}"
    old = git.run(common_dir, "rev-parse", "--verify", "-q", target_ref, env=env, check=False).stdout.strip()
    if not old:
        raise WorktreeError(f"merge: there is no local branch {target!r}; name an existing branch")
    tip = git.run(
        common_dir, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", env=env, check=False
    ).stdout.strip()
    if not tip:
        raise WorktreeError(f"merge: the worker's branch {branch} no longer exists")
    if git.run(common_dir, "merge-base", "--is-ancestor", tip, old, env=env, check=False).returncode == 0:
        return MergeResult(True, old, target, branch, already=True)
    trial = git.run(
        common_dir, "merge-tree", "--write-tree", "--name-only", "-z", old, tip, env=env, check=False
    )
    if trial.returncode not in (0, 1):
        raise WorktreeError(f"merge: git merge-tree failed: {trial.stderr.strip()[:800]}")
    parts = trial.stdout.split("\0")
    tree = parts[0]
    if trial.returncode == 1:
        files = []
        for name in parts[1:]:
            if not name:
                break
            if name not in files:
                files.append(name)
        info = "\0".join(parts[len(files) + 2 :]).replace("\0", " ").strip()
        conflicts = [{"path": f, "text": _conflict_text(git, common_dir, tree, f)} for f in files]
        raise MergeConflict(
            f"merging {branch} into {target} would conflict in {', '.join(files) or 'some files'}; "
            f"nothing was changed. {info[:600]} Resolve it in the worker's worktree (merge {target} "
            "there and commit), then merge again",
            conflicts=conflicts,
            target=target,
            branch=branch,
        )
    message = f"Merge {branch} into {target} ({label})"
    rebasing = _rebasing(common_dir, target_ref)
    if rebasing is not None:
        raise NotMergeable(
            f"merge: {target} is being rebased in {rebasing} (its HEAD is detached meanwhile); finish "
            "or abort the rebase there first (nothing was changed): moving the branch under it would "
            "make `git rebase --continue` fail and `git rebase --abort` drop the merge"
        )
    checkout = next((p for p, b in git.registered(common_dir, env).items() if b == target), None)
    if checkout is None:
        done = git.run(
            common_dir, "commit-tree", tree, "-p", old, "-p", tip, "-m", message, env=env, commit=True
        )
        commit = done.stdout.strip()
        moved = git.run(
            common_dir, "update-ref", "-m", message, target_ref, commit, old, env=env, check=False
        )
        if moved.returncode != 0:
            raise NotMergeable(f"merge: {target} moved while merging; nothing was changed, merge again")
        return MergeResult(True, commit, target, branch)
    where = Path(checkout)
    here = git.guard(where)
    changed = git.run(where, "status", "--porcelain", "--untracked-files=no", env=here).stdout.strip()
    if changed:
        raise NotMergeable(
            f"merge: {target} is checked out at {where} with uncommitted changes; commit or stash them "
            "there first (nothing was changed)"
        )
    _nothing_in_the_way(git, where, here, old, tree)
    done = git.run(
        where,
        "merge",
        "--no-ff",
        "--no-verify",
        "--no-edit",
        "-m",
        message,
        tip,
        env=here,
        check=False,
        commit=True,
    )
    if done.returncode != 0:
        aborted = git.run(where, "merge", "--abort", env=here, check=False)
        raise NotMergeable(
            f"merge: git merge stopped in {where}: {(done.stdout + done.stderr).strip()[:600]}; "
            + ("it was aborted, nothing was changed" if aborted.returncode == 0 else "check the checkout")
        )
    head = git.out(where, "rev-parse", "HEAD", env=here)
    return MergeResult(True, head, target, branch, where=str(where))


def _rebasing(common_dir: Path, target_ref: str) -> Path | None:
    """The checkout where ``target_ref`` is being rebased (its HEAD detached meanwhile), or None."""
    gitdirs = [common_dir.resolve()]
    root = common_dir / "worktrees"
    gitdirs += sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    for gitdir in gitdirs:
        for state in ("rebase-merge", "rebase-apply"):
            try:
                named = (gitdir / state / "head-name").read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if named == target_ref:
                if gitdir == gitdirs[0]:
                    return gitdir.parent if gitdir.name == ".git" else gitdir
                try:
                    return Path((gitdir / "gitdir").read_text(encoding="utf-8").strip()).parent
                except OSError:
                    return gitdir
    return None


def _nothing_in_the_way(git: Git, where: Path, env: dict[str, str], old: str, tree: str) -> None:
    """Refuse (409, nothing changed) a merge into the checkout ``where`` that would replace what
    git doesn't count as a change there: an untracked or ignored file or directory where the merge
    adds a path (git overwrites ignored ones without asking: the operator's own `.env`, a build),
    and a local edit of a file hidden with ``--assume-unchanged`` that the merge changes (git
    replaces it, even when it then stops)."""
    added = git.lines(
        where, "diff-tree", "-r", "-z", "--name-only", "--no-renames", "--diff-filter=A", old, tree, env=env
    )
    in_way: list[str] = []
    for rel in added:
        here = where / rel
        if os.path.lexists(here):
            if not here.is_dir() or here.is_symlink():
                in_way.append(rel)
            elif git.lines(where, "ls-files", "-z", "--others", "--", rel, env=env):
                in_way.append(rel + "/")
            continue
        for parent in PurePosixPath(rel).parents:
            up = where / parent
            if str(parent) == "." or not os.path.lexists(up) or (up.is_dir() and not up.is_symlink()):
                continue
            if git.run(where, "cat-file", "-e", f"{old}:{parent}", env=env, check=False).returncode != 0:
                in_way.append(str(parent))
            break
    if in_way:
        raise NotMergeable(
            f"merge: the merge would write {_listed(sorted(set(in_way)))} in {where}, where untracked or "
            "ignored files are in the way (git would overwrite ignored ones without asking); move them "
            "away first (nothing was changed)"
        )
    flagged = [e[2:] for e in git.lines(where, "ls-files", "-v", "-z", env=env) if e[:1].islower()]
    if not flagged:
        return
    touched = set(
        git.lines(where, "diff-tree", "-r", "-z", "--name-only", "--no-renames", old, tree, env=env)
    )
    edited = []
    for rel in (r for r in flagged if r in touched and os.path.lexists(where / r)):
        disk = git.run(where, "hash-object", "--path", rel, "--", str(where / rel), env=env, check=False)
        staged = git.run(where, "rev-parse", "-q", "--verify", f":{rel}", env=env, check=False)
        if disk.returncode != 0 or disk.stdout.strip() != staged.stdout.strip():
            edited.append(rel)
    if edited:
        raise NotMergeable(
            f"merge: {_listed(edited)} in {where} is marked assume-unchanged and has a local edit the "
            "merge would replace (git doesn't show it as a change); commit or save it, or `git "
            "update-index --no-assume-unchanged` it and commit or stash, then merge (nothing was changed)"
        )


def _listed(paths: Sequence[str], limit: int = 5) -> str:
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(paths[:limit]) + more


def _conflict_text(git: Git, cwd: Path, tree: str, name: str) -> str:
    done = git.run(cwd, "cat-file", "-p", f"{tree}:{name}", check=False)
    text = done.stdout if done.returncode == 0 else ""
    if len(text) > MAX_CONFLICT_TEXT:
        start = max(0, text.find("<<<<<<<") - 200)
        text = text[start : start + MAX_CONFLICT_TEXT]
    return text
