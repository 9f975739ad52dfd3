"""A worker's tree read through a scratch index: what the worker has, committed or not.

Delete, diff, the diffstat and the merge check all read a worktree the same way, so they agree
on what the worker's work is: a copy of the worker's index (the worker's own is never written; a
leftover ``index.lock`` doesn't block it), files hidden with ``--assume-unchanged`` or
``--skip-worktree`` un-hidden, then every changed tracked file and every new file that is not
ignored put into it with ``git update-index`` (paths, never patterns) — except:

- the setup's files while they are what cao put there (:func:`cao.worktrees.setup.classify`);
  if the worker staged one, its entry goes back to HEAD's;
- files over :data:`MAX_FILE_BYTES` (``too_big``): hashing a 20 GB file would take minutes;
- paths git refuses to store (a ``.git``-like part, ``refused``).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cao.worktrees.git import Git, Pinned, dotgit_like
from cao.worktrees.setup import Classified, SetupFile, classify

MAX_FILE_BYTES = 100 * 1024 * 1024  # per file: GitHub's limit too, and hashing more takes a while


@dataclass(frozen=True)
class Scratch:
    """The worktree as :func:`read` found it."""

    env: dict[str, str]  # git's environment with the scratch index (``GIT_INDEX_FILE``)
    head: str | None  # HEAD's commit (None: an unborn branch)
    staged: str | None  # the worker's index as a tree (when asked for and it has no conflict)
    untracked: tuple[str, ...]  # new files, not ignored, not the setup's (too big ones included)
    nested: tuple[str, ...]  # new directories that are git repositories of their own
    too_big: tuple[tuple[str, int], ...]  # (path, size) left out: over the limit
    refused: tuple[str, ...]  # left out: paths git refuses to store
    setup: Classified


def size_text(n: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{round(n / scale, 1):g} {unit}"
    return f"{n} bytes"


def read(
    git: Git,
    p: Pinned,
    setup: Sequence[SetupFile],
    tmp: Path,
    *,
    limit: int = MAX_FILE_BYTES,
    strict: bool = False,
    staged: bool = False,
) -> Scratch:
    """The worktree ``p`` read into a scratch index in ``tmp`` (see the module's docstring).
    ``strict``: every setup copy is hashed again (at delete). ``staged``: also the worker's own
    index as a tree (a delete commits what was staged on its own)."""
    assert p.path is not None
    root = p.path
    index = tmp / "index"
    env = p.env(GIT_INDEX_FILE=str(index))
    head = git.run(p.where, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env, check=False)
    commit = head.stdout.strip() or None
    if (p.admin / "index").is_file():
        shutil.copyfile(p.admin / "index", index)
    elif commit:
        git.run(p.where, "read-tree", commit, env=env)
    mine = classify(root, setup, object_format=p.object_format, strict=strict)
    if setup:
        _unstage_setup(git, p, env, commit, mine)
    # unmerged entries (a conflict) can't be written: None, and the delete keeps the worktree
    tree = git.run(p.where, "write-tree", env=env, check=False).stdout.strip() or None if staged else None
    _unhide(git, p, env)
    tracked = git.lines(p.where, "diff-files", "-z", "--name-only", env=env)
    others = git.lines(p.where, "ls-files", "-z", "--others", "--exclude-standard", env=env)
    nested = tuple(x.rstrip("/") for x in others if x.endswith("/") and not mine.cao_owns(x))
    new = [x for x in others if not x.endswith("/") and not mine.cao_owns(x)]
    refused = tuple(x for x in new if any(dotgit_like(part) for part in PurePosixPath(x).parts))
    todo, too_big = [], []
    for rel in dict.fromkeys([*tracked, *new]):
        if mine.cao_owns(rel) or rel in refused:
            continue
        try:
            st = os.lstat(root / rel)
        except OSError:
            st = None  # deleted: its removal is staged
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_size > limit:
            too_big.append((rel, st.st_size))
            continue
        todo.append(rel)
    if todo:
        git.run(
            p.where,
            "update-index",
            "--add",
            "--remove",
            "--replace",
            "-z",
            "--stdin",
            env=env,
            input="\0".join(todo) + "\0",
            paths=True,
        )
    untracked = tuple(x for x in new if x not in refused)
    return Scratch(env, commit, tree, untracked, nested, tuple(too_big), refused, mine)


def _unstage_setup(git: Git, p: Pinned, env: dict[str, str], commit: str | None, mine: Classified) -> None:
    """A setup file the worker staged while it was still cao's goes back to HEAD's entry."""
    if commit:
        staged = git.lines(p.where, "diff-index", "--cached", "-z", "--name-only", commit, env=env)
    else:
        staged = git.lines(p.where, "ls-files", "-z", env=env)
    back = {rel for rel in staged if mine.cao_owns(rel)}
    if not back:
        return
    entries = {}
    if commit:
        for line in git.lines(p.where, "ls-tree", "-r", "-z", "--full-tree", commit, env=env):
            meta, _, rel = line.partition("\t")
            if rel in back:
                mode, _, rest = meta.partition(" ")
                entries[rel] = f"{mode} {rest.partition(' ')[2]}"
    zero = "0" * (64 if p.object_format == "sha256" else 40)
    info = "".join(f"{entries.get(rel, '0 ' + zero)}\t{rel}\0" for rel in sorted(back))
    git.run(p.where, "update-index", "-z", "--index-info", env=env, input=info, paths=True)


def _unhide(git: Git, p: Pinned, env: dict[str, str]) -> None:
    """Files the worker hid from git (``--assume-unchanged``, ``--skip-worktree``) are read too,
    if they exist on disk."""
    assert p.path is not None
    entries = [
        e
        for e in git.lines(p.where, "ls-files", "-v", "-z", env=env)
        if (e[0].islower() or e[0] in "Ss") and os.path.lexists(p.path / e[2:])
    ]
    # one flag per call: update-index applies only the first of --no-assume-unchanged and
    # --no-skip-worktree to a path
    for flag, hidden in (("--no-assume-unchanged", str.islower), ("--no-skip-worktree", lambda t: t in "Ss")):
        paths = [e[2:] for e in entries if hidden(e[0])]
        if paths:
            git.run(
                p.where,
                "update-index",
                flag,
                "-z",
                "--stdin",
                env=env,
                input="\0".join(paths) + "\0",
                paths=True,
            )


def changes(git: Git, p: Pinned, s: Scratch) -> list[str]:
    """The paths whose content differs from HEAD (tracked changes and new files), and those
    left out for their size."""
    if s.head:
        names = git.lines(p.where, "diff-index", "--cached", "-z", "--name-only", s.head, env=s.env)
    else:
        names = git.lines(p.where, "ls-files", "-z", env=s.env)
    return names + [rel for rel, _ in s.too_big]


def left_out(s: Scratch, limit: int = MAX_FILE_BYTES) -> list[str]:
    """What a reader of the scratch index should be told it does not hold."""
    out = []
    if s.too_big:
        files = ", ".join(f"{rel} ({size_text(n)})" for rel, n in s.too_big[:5])
        more = f" and {len(s.too_big) - 5} more" if len(s.too_big) > 5 else ""
        out.append(f"{len(s.too_big)} file(s) over cao's {size_text(limit)} limit: {files}{more}")
    if s.refused:
        out.append(f"{len(s.refused)} file(s) in a path git refuses to store: {', '.join(s.refused[:5])}")
    return out
