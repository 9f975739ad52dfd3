"""Git worktrees for workers: one worktree on its own branch per worker, review and merge.

The only module that runs ``git``. Every call goes through :meth:`Git.run`: the git CLI with an
explicit ``cwd``, a clean environment (no ``GIT_*`` variable of the host leaks in, prompts off,
``LC_ALL=C`` so messages read the same everywhere) and ``-c`` overrides for what a user's config
could change under us (colours, signing, the committer of cao's own commits). Hooks are skipped
for cao's commits and merges (``--no-verify``): they are the operator's, not cao's, to run. At
delete, the repository's own config runs nothing at all (:data:`GUARD`, :meth:`Git.guard`).

    create    Repo.inspect(dir) → git worktree add -b cao/<profile>-<id> <worktrees>/<repo>/<…> HEAD
              then the setup: files copied/linked from the checkout, commands run in the pane
    retire    on delete: identify (is it still cao's worktree?) → holds (would anything be lost?
              then it is kept as it is) → save (every commit onto a named ref, uncommitted work
              as wip commits) → git worktree remove; the branch is deleted only if another
              branch, tag or remote branch contains its tip
    diff      the branch against its fork point, plus what is not committed yet (stat or full)
    merge     ``git merge-tree`` first (no side effects): a conflict stops there and is shown;
              else the target is updated (``git merge`` in the checkout that has it, or
              ``commit-tree`` + a conditional ``update-ref`` when none has it checked out)

Setup comes from ``.cao/worktree.yaml`` in the checkout the worker was started from::

    copy: [.env, config/local.toml]   # copied into the worktree (missing ones are skipped)
    link: [node_modules]              # symlinked to the checkout's copy
    setup: ["npm ci", "make prepare"] # run once, in the worker's pane, before the agent starts
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from cao.errors import Conflict, InvalidInput

logger = logging.getLogger(__name__)

GIT_TIMEOUT = 300.0
CONFIG_FILE = Path(".cao") / "worktree.yaml"
CONFIG_KEYS = ("copy", "link", "setup", "discard")
# What a user's config could change under cao's own git calls.
OVERRIDES = (
    "color.ui=false",
    "core.quotepath=false",
    "core.pager=cat",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "merge.ff=true",
    "advice.detachedHead=false",
)
ENV_KEEP = ("PATH", "HOME", "TMPDIR", "USER", "LOGNAME")
MAX_DIFF_BYTES = 2 * 1024 * 1024
MAX_CONFLICT_TEXT = 8000
# What a repository's own config (which a worker can write) could run, or change, in cao's git
# calls on a worker's tree at delete: hooks (commit-msg, reference-transaction, post-index-change:
# the wip commit is plumbing, so none of those would run anyway, but no hook at all is the rule),
# the fsmonitor, lazy fetches of a partial clone. Filter drivers: see :meth:`Git.guard`.
GUARD = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.splitIndex", "false"),
    ("core.untrackedCache", "false"),
    ("submodule.recurse", "false"),
    ("gc.auto", "0"),
    ("protocol.allow", "never"),
    *((f"protocol.{name}.allow", "never") for name in ("file", "git", "ssh", "http", "https", "ext")),
)
TRUSTED_SCOPES = ("system", "global")  # the operator's config; local and worktree are the repository's
FILTER_KEYS = ("clean", "smudge", "process", "required")
NAMED_REFS = ("refs/heads", "refs/tags", "refs/remotes")  # where work is kept (not refs/stash)
IN_PROGRESS = (  # marker in the worktree's git dir → what is going on
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase (or `git am`)"),
    ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
    ("sequencer", "a cherry-pick or revert sequence"),
    ("BISECT_LOG", "a bisect"),
)


class WorktreeError(InvalidInput):
    """422: no worktree can be made here (not a git repository, no commit yet, git failed...)."""


class NotMergeable(Conflict):
    """409: a merge can't start (dirty target checkout, uncommitted work in the worker's tree)."""


class MergeConflict(Conflict):
    """409: the merge would conflict; nothing was changed. ``fields`` lists the conflicts."""

    def __init__(self, message: str, *, conflicts: list[dict[str, str]], target: str, branch: str):
        super().__init__(message)
        self.fields = {"conflicts": conflicts, "target": target, "branch": branch}


@dataclass(frozen=True)
class Repo:
    """The checkout a worker's worktree is made from (the supervisor's, or the request's directory)."""

    toplevel: Path  # that checkout's root
    common_dir: Path  # the repository's shared git directory
    name: str  # the main checkout's directory name (the worktrees folder per repository)
    head: str  # the commit the worker starts from
    branch: str | None  # the branch checked out there (None: detached HEAD)
    subdir: str  # the requested directory relative to toplevel ('' = the root)


@dataclass(frozen=True)
class SetupPlan:
    copy: tuple[str, ...] = ()
    link: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()  # gitignore patterns of ignored files a delete may remove
    source: str = ""  # the config file it came from ('' = none)


@dataclass(frozen=True)
class Pinned:
    """A worktree whose identity :meth:`Git.identify` checked. Every git call on it names its
    directories (``GIT_DIR``, ``GIT_WORK_TREE``), so a ``.git`` file rewritten since can't
    redirect them, and carries ``config`` (:meth:`Git.guard`). ``path`` is None when the
    worktree's folder is gone and only its entry in the repository is left."""

    path: Path | None
    admin: Path  # its entry in the repository, <common>/worktrees/<name>
    common: Path
    config: Mapping[str, str]

    @property
    def where(self) -> Path:
        return self.path or self.admin

    def env(self, **more: str) -> dict[str, str]:
        env = {**self.config, "GIT_DIR": str(self.admin), "GIT_OPTIONAL_LOCKS": "0", **more}
        if self.path is not None:
            env["GIT_WORK_TREE"] = str(self.path)
        return env


@dataclass(frozen=True)
class Snapshot:
    """A worktree's state as trees (:meth:`Git.snapshot`)."""

    head: str | None  # HEAD's commit (None: an unborn branch)
    base: str  # HEAD's tree (the empty tree on an unborn branch)
    staged: str  # the worker's index as a tree
    work: str  # everything in the worktree as a tree


@dataclass(frozen=True)
class Prepared:
    """What :meth:`Git.prepare` did: the paths it put into the worktree (never committed by cao)
    and lines to show in the pane."""

    paths: tuple[str, ...]
    notes: tuple[str, ...]


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


BRANCH_RE = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)[A-Za-z0-9._/-]{1,200}(?<![./])$")


def validate_branch(name: str, what: str = "into") -> str:
    """A local branch name that can't be read as an option or a revision expression."""
    if not BRANCH_RE.match(name or "") or name.endswith(".lock"):
        raise InvalidInput(
            f"{what} {name[:80]!r} is not a branch name; use letters, digits, '.', '_', '-' and '/', "
            "e.g. main or feature/parser"
        )
    return name


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _through_symlink(root: Path, rel: str) -> bool:
    """Is any directory on the way from ``root`` to ``root/rel`` (excluding the last part) a symlink?"""
    here = root
    for part in PurePosixPath(rel).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return True
    return False


def _under(path: str, roots: Sequence[str]) -> bool:
    """Is ``path`` (relative, '/'-separated) one of ``roots`` or inside one?"""
    return any(path.rstrip("/") == r or path.startswith(r.rstrip("/") + "/") for r in roots)


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


def config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``-c key=value`` for each pair, as environment (no quoting or '=' in a key can break it,
    and git passes it on to the git processes it starts)."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def _rel(path: str, what: str, source: str) -> str:
    """A path inside the checkout: relative, no '..', no '.git'."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or (p.parts and p.parts[0] == ".git"):
        raise WorktreeError(f"{source}: {what} entry {path!r} must be a relative path inside the checkout")
    return str(p)


def load_plan(toplevel: Path) -> SetupPlan:
    """The setup in ``<checkout>/.cao/worktree.yaml`` (empty when there is none)."""
    path = toplevel / CONFIG_FILE
    if not path.is_file():
        return SetupPlan()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise WorktreeError(f"{path}: not readable YAML ({exc}); fix or remove it") from None
    if not isinstance(data, dict):
        raise WorktreeError(f"{path}: must be a mapping with copy, link and setup lists")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise WorktreeError(f"{path}: unknown key(s) {', '.join(unknown)}; use {', '.join(CONFIG_KEYS)}")
    lists: dict[str, tuple[str, ...]] = {}
    for key in CONFIG_KEYS:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise WorktreeError(f"{path}: {key} must be a list of strings")
        lists[key] = tuple(v.strip() for v in value)
    return SetupPlan(
        copy=tuple(_rel(p, "copy", str(path)) for p in lists["copy"]),
        link=tuple(_rel(p, "link", str(path)) for p in lists["link"]),
        setup=lists["setup"],
        discard=lists["discard"],
        source=str(path),
    )


def setup_command(
    command: Sequence[str], *, root: Path, notes: Sequence[str], setup: Sequence[str]
) -> list[str]:
    """The agent's command, preceded in its own pane by the setup: ``notes`` are printed, each
    ``setup`` command runs once in the worktree's root with its output on screen (a failure is
    shown and the agent starts anyway), then the shell ``exec``s the agent."""
    lines = ["say() { printf '[cao] %s\\n' \"$1\"; }"]
    lines += [f"say {shlex.quote(n)}" for n in notes]
    for cmd in setup:
        q = shlex.quote(cmd)
        lines.append(
            f"say {shlex.quote('setup: ' + cmd)}; (cd {shlex.quote(str(root))} && sh -c {q}) "
            f'|| say "setup command failed (exit $?): "{q}'
        )
    if setup:
        lines.append("say 'setup done'")
    lines.append('exec "$@"')
    return ["sh", "-c", "\n".join(lines), "cao-setup", *command]


class Git:
    """The git CLI, run with an explicit cwd and a clean environment."""

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        *,
        name: str = "cao",
        email: str = "cao@localhost",
        timeout: float = GIT_TIMEOUT,
    ) -> None:
        source = os.environ if environ is None else environ
        self.env = {k: source[k] for k in ENV_KEEP if source.get(k)}
        self.env.update(LC_ALL="C", LANG="C", GIT_TERMINAL_PROMPT="0", GIT_EDITOR="true")
        self.identity = ("-c", f"user.name={name}", "-c", f"user.email={email}")
        self.timeout = timeout

    # -- plumbing ----------------------------------------------------------------------------------
    def run(
        self,
        cwd: Path,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        commit: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        argv = ["git", *(f for o in OVERRIDES for f in ("-c", o))]
        if commit:
            argv += self.identity
        argv += args
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env={**self.env, **(env or {})},
                input=input,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise WorktreeError(f"git is not installed or {cwd} is missing ({exc}); install git") from None
        except subprocess.TimeoutExpired:
            raise WorktreeError(f"`git {' '.join(args)}` took over {self.timeout:g} s in {cwd}") from None
        if check and done.returncode != 0:
            raise WorktreeError(
                f"`git {' '.join(args[:3])}` failed in {cwd}: {(done.stderr or done.stdout).strip()[:800]}"
            )
        return done

    def out(self, cwd: Path, *args: str, env: Mapping[str, str] | None = None, commit: bool = False) -> str:
        return self.run(cwd, *args, env=env, commit=commit).stdout.strip()

    # -- the source checkout ---------------------------------------------------------------------
    def inspect(self, directory: Path) -> Repo:
        """The repository ``directory`` is in, and its current HEAD; 422 when there is none."""
        probe = self.run(
            directory,
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-common-dir",
            check=False,
        )
        if probe.returncode != 0:
            raise WorktreeError(
                f"use_worktree: {directory} is not inside a git repository (or not in a checkout); "
                "start the worker in a git checkout, or leave use_worktree off"
            )
        toplevel, common = probe.stdout.split("\n")[:2]
        head = self.run(directory, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False)
        if head.returncode != 0:
            raise WorktreeError(
                f"use_worktree: the repository at {toplevel} has no commit yet; commit something first"
            )
        branch = self.run(directory, "symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()
        listing = self.run(directory, "worktree", "list", "--porcelain").stdout
        main = next((ln[9:] for ln in listing.splitlines() if ln.startswith("worktree ")), toplevel)
        top = Path(toplevel)
        rel = os.path.relpath(directory.resolve(), top.resolve())
        return Repo(
            toplevel=top,
            common_dir=Path(common),
            name=Path(main).name or "repo",
            head=head.stdout.strip(),
            branch=branch or None,
            subdir="" if rel == "." else rel,
        )

    def add(self, repo: Repo, path: Path, branch: str) -> None:
        """A new worktree at ``path`` on a new branch ``branch`` at the checkout's HEAD."""
        check = self.run(repo.toplevel, "check-ref-format", "--branch", branch, check=False)
        if check.returncode != 0:
            raise WorktreeError(
                f"use_worktree: {branch!r} is not a valid branch name; pick another profile name"
            )
        if (
            self.run(
                repo.toplevel, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False
            ).returncode
            == 0
        ):
            raise WorktreeError(f"use_worktree: branch {branch} already exists in {repo.toplevel}")
        if path.exists():
            raise WorktreeError(f"use_worktree: {path} already exists; remove it or set CAO_WORKTREES_DIR")
        path.parent.mkdir(parents=True, exist_ok=True)
        done = self.run(
            repo.toplevel, "worktree", "add", "--quiet", "-b", branch, str(path), repo.head, check=False
        )
        if done.returncode != 0:
            raise WorktreeError(
                f"use_worktree: git could not make a worktree at {path}: {done.stderr.strip()[:800]}"
            )

    def prepare(self, repo: Repo, path: Path, plan: SetupPlan) -> Prepared:
        """Copy and link the plan's files from the checkout into the new worktree."""
        paths: list[str] = []
        notes = [f"worktree {path} (branch {self.branch_of(path) or '?'}, from {repo.head[:10]})"]
        for rel, link in [(p, False) for p in plan.copy] + [(p, True) for p in plan.link]:
            src, dst = repo.toplevel / rel, path / rel
            if not src.exists():
                notes.append(f"not in the checkout, skipped: {rel}")
                continue
            # A committed symlink must not carry a copy or link out of its tree: the source must
            # resolve inside the checkout, and no parent of the destination may be a symlink (the
            # destination is removed before it is replaced).
            if not _inside(src.resolve(), repo.toplevel.resolve()):
                raise WorktreeError(f"setup: {rel} resolves outside the checkout (a symlink?); refusing it")
            if _through_symlink(path, rel):
                raise WorktreeError(f"setup: {rel} goes through a symlink in the worktree; refusing it")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.is_dir() and not dst.is_symlink():
                shutil.rmtree(dst)
            elif dst.exists() or dst.is_symlink():
                dst.unlink()
            if link:
                dst.symlink_to(src.resolve())
                notes.append(f"linked {rel}")
            elif src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
                notes.append(f"copied {rel}/")
            else:
                shutil.copy2(src, dst)
                notes.append(f"copied {rel}")
            paths.append(rel)
        return Prepared(tuple(paths), tuple(notes))

    def branch_of(self, path: Path) -> str | None:
        done = self.run(path, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        return done.stdout.strip() or None

    # -- state of a worker's tree ------------------------------------------------------------------
    def _skip(self, cwd: Path, paths: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """A pathspec for the whole tree minus the setup's files (git refuses to be handed
        ignored ones even to exclude them, and doesn't need to: it leaves those out itself)."""
        ignored: set[str] = set()
        if paths:
            done = self.run(cwd, "check-ignore", "--", *paths, env=env, check=False)
            ignored = set(done.stdout.splitlines())
        return ["--", ".", *(f":(exclude,top){p}" for p in paths if p not in ignored)]

    def dirty(self, path: Path, skip: Sequence[str] = ()) -> list[str]:
        """``git status --porcelain`` lines of uncommitted work (the setup's own files left out)."""
        out = self.run(path, "status", "--porcelain", "--untracked-files=all", *self._skip(path, skip)).stdout
        return [line for line in out.splitlines() if line.strip()]

    def contained_elsewhere(self, cwd: Path, branch: str, env: Mapping[str, str] | None = None) -> str | None:
        """A named ref other than the branch (branch, tag, remote branch) that contains its tip.
        ``refs/stash`` and other bookkeeping refs don't count: they are no place to keep work."""
        ref = f"refs/heads/{branch}"
        refs = self.run(cwd, "for-each-ref", "--format=%(refname)", "--contains", ref, *NAMED_REFS, env=env)
        return next((r for r in refs.stdout.splitlines() if r and r != ref), None)

    def registered(self, cwd: Path, env: Mapping[str, str] | None = None) -> dict[str, str | None]:
        """Worktrees git knows of: path → branch (None when detached)."""
        out: dict[str, str | None] = {}
        current: str | None = None
        for line in self.run(cwd, "worktree", "list", "--porcelain", env=env).stdout.splitlines():
            if line.startswith("worktree "):
                current = line[9:]
                out[current] = None
            elif line.startswith("branch refs/heads/") and current is not None:
                out[current] = line[len("branch refs/heads/") :]
        return out

    # -- retire: a worker is deleted -----------------------------------------------------------------
    def guard(self, cwd: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment that keeps a repository's own config from running code in cao's git calls:
        :data:`GUARD`, and every filter driver setting the repository's config (local or worktree
        scope, which a worker can write) makes is replaced by the operator's (system or global
        scope, e.g. git-lfs's) or, when the operator has none, emptied (the driver is off and
        the file is committed as it is)."""
        done = self.run(
            cwd, "config", "--show-scope", "--null", "--get-regexp", r"^filter\.", env=env, check=False
        )
        if done.returncode not in (0, 1):  # 1: no filter settings at all
            raise WorktreeError(
                f"could not read the repository's filter settings: {done.stderr.strip()[:300]}"
            )
        parts = done.stdout.split("\0")
        trusted: dict[str, str] = {}
        theirs: list[str] = []  # filter.<name>.<leaf> keys the repository sets
        for scope, entry in zip(parts[0::2], parts[1::2], strict=False):
            key, _, value = entry.partition("\n")
            if key.rpartition(".")[2] not in FILTER_KEYS:
                continue
            if scope in TRUSTED_SCOPES:
                trusted[key] = value
            elif key not in theirs:
                theirs.append(key)
        # Per key: an empty `process` would switch off the operator's `clean` too (git prefers a
        # defined process), so only what the repository sets is replaced.
        pairs = [*GUARD, *((k, trusted.get(k, "false" if k.endswith(".required") else "")) for k in theirs)]
        return config_env(pairs)

    def admin_of(self, common_dir: Path, path: Path) -> Path | None:
        """The worktree's entry in the repository (``<common>/worktrees/<name>``): the one whose
        ``gitdir`` file names ``<path>/.git``. None when git knows no worktree at ``path``."""
        want = (path / ".git").resolve()
        root = common_dir / "worktrees"
        for entry in sorted(root.iterdir()) if root.is_dir() else []:
            try:
                named = (entry / "gitdir").read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                continue
            if named and (entry / named).resolve() == want:
                return entry
        return None

    def identify(self, common_dir: Path, path: Path) -> Pinned:
        """The worktree cao made at ``path`` in the repository ``common_dir``, verified: git's
        entry for it exists, its ``.git`` file points at that entry, and git run there resolves to
        that entry, that repository and that directory. Raises :class:`WorktreeError` saying
        what is wrong otherwise (a worker rewrote ``.git``, made a repository of its own...)."""
        common = common_dir.resolve()
        admin = self.admin_of(common, path)
        if admin is None:
            raise WorktreeError(f"the repository {common} has no worktree entry pointing at {path} any more")
        link = path / ".git"
        if link.is_symlink() or not link.is_file():
            what = "a symlink" if link.is_symlink() else "a directory" if link.is_dir() else "missing"
            raise WorktreeError(
                f"its .git is {what} now, not the file git made: it belongs to another repository "
                f"than {common}"
            )
        text = link.read_text(encoding="utf-8", errors="replace").strip()
        target = text.removeprefix("gitdir:").strip()
        if not text.startswith("gitdir:") or (path / target).resolve() != admin.resolve():
            raise WorktreeError(
                f"its .git points at {target[:300]!r}, not at its entry {admin}: another repository"
            )
        probe = self.run(
            path,
            "rev-parse",
            "--path-format=absolute",
            "--git-dir",
            "--git-common-dir",
            "--show-toplevel",
            env=config_env(GUARD),
            check=False,
        )
        got = [Path(p).resolve() for p in probe.stdout.splitlines()]
        want = [admin.resolve(), common, path.resolve()]
        if probe.returncode != 0 or got != want:
            seen = ", ".join(map(str, got)) or (probe.stderr.strip()[:300] or "nothing")
            raise WorktreeError(
                f"git run there resolves to {seen} instead of {', '.join(map(str, want))}: another "
                "repository or work tree (core.worktree?)"
            )
        pinned = Pinned(path, admin, common, {})
        return Pinned(path, admin, common, self.guard(path, pinned.env()))

    def _lines(self, p: Pinned, *args: str, env: Mapping[str, str] | None = None) -> list[str]:
        """NUL-separated output of a git call on the pinned worktree."""
        out = self.run(p.where, *args, env=env or p.env()).stdout
        return [x for x in out.split("\0") if x]

    def holds(self, p: Pinned, skip: Sequence[str], discard: Sequence[str]) -> tuple[list[str], list[str]]:
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
        unmerged = sorted({e.split("\t", 1)[-1] for e in self._lines(p, "ls-files", "-u", "-z")})
        if unmerged:
            why.append(f"its index has unresolved conflicts ({_some(unmerged)})")
        untracked = self._lines(p, "ls-files", "-z", "--others", "--exclude-standard")
        ignored = self._lines(p, "ls-files", "-z", "--others", "--ignored", "--exclude-standard")
        mine = [x for x in ignored if not _under(x, skip)]
        nested = sorted(x.rstrip("/") for x in untracked + mine if x.endswith("/") and not _under(x, skip))
        why += [f"a git repository is nested at {n}/ (its commits and files live only there)" for n in nested]
        for entry in self._lines(p, "ls-files", "-s", "-z"):
            mode, _, rel = entry.partition("\t")
            here = p.path / rel
            if not mode.startswith("160000") or here.is_symlink() or not here.is_dir():
                continue
            if (here / ".git").exists():
                why += self._submodule_holds(p, rel)
            elif any(here.iterdir()):  # git doesn't look inside a submodule that is not checked out
                why.append(f"{rel}/ is a submodule's path with files in it but no .git: git can't see them")
        mine = [x for x in mine if not x.endswith("/")]
        notes = []
        if mine and discard:
            let_go = set(
                self._lines(
                    p, "ls-files", "-z", "--others", "--ignored", *(f"--exclude={d}" for d in discard)
                )
            )
            mine, gone = [x for x in mine if x not in let_go], len([x for x in mine if x in let_go])
            if gone:
                notes.append(f"discarded {gone} ignored file(s) matching .cao/worktree.yaml's discard: list")
        if mine:
            why.append(f"{len(mine)} ignored file(s) would be deleted with it: {_groups(mine)}")
        return why, notes

    def _submodule_holds(self, p: Pinned, rel: str) -> list[str]:
        """Why a checked-out submodule (or a committed nested repository) holds work: changes,
        untracked or ignored files, its own submodules, or — when its git directory goes with the
        worktree (a submodule checked out in a linked worktree keeps it in the worktree's entry)
        — a commit that none of its remote-tracking branches has."""
        assert p.path is not None
        sub = p.path / rel
        env = {**self.guard(sub), "GIT_OPTIONAL_LOCKS": "0"}
        probe = self.run(sub, "rev-parse", "--path-format=absolute", "--git-dir", env=env, check=False)
        if probe.returncode != 0:
            return [f"submodule {rel}: git can't read it ({probe.stderr.strip()[:200]})"]
        status = self.run(
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
        inner = self.run(sub, "ls-files", "-s", env=env).stdout
        if any(line.startswith("160000") for line in inner.splitlines()):
            return [f"submodule {rel} has submodules of its own"]
        gitdir = Path(probe.stdout.strip()).resolve()
        if _inside(gitdir, p.path.resolve()) or _inside(gitdir, p.admin.resolve()):
            only = self.run(sub, "rev-list", "-n1", "--all", "--not", "--remotes", env=env, check=False)
            if only.returncode != 0 or only.stdout.strip():
                return [
                    f"submodule {rel} has commits none of its remotes has "
                    f"({only.stdout.strip()[:10] or 'unreadable'}); they live only in this worktree"
                ]
        return []

    def snapshot(self, p: Pinned, skip: Sequence[str], tmp: Path) -> Snapshot:
        """The worktree's state as trees, through a scratch copy of the worker's index (a
        leftover ``index.lock`` doesn't block it, the worker's index is never written): what is
        staged, and everything in the tree (tracked and new files, not ignored, not the setup's;
        files hidden by assume-unchanged or skip-worktree that exist on disk included)."""
        assert p.path is not None
        index = tmp / "index"
        env = p.env(GIT_INDEX_FILE=str(index))
        head = self.run(p.where, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env, check=False)
        commit = head.stdout.strip() or None
        if (p.admin / "index").is_file():
            shutil.copyfile(p.admin / "index", index)
        elif commit:
            self.run(p.where, "read-tree", commit, env=env)
        staged = self.out(p.where, "write-tree", env=env)
        entries = [
            e for e in self._lines(p, "ls-files", "-v", "-z", env=env) if os.path.lexists(p.path / e[2:])
        ]
        # one flag per call: update-index applies only the first of --no-assume-unchanged and
        # --no-skip-worktree to a path
        for flag, hidden in (
            ("--no-assume-unchanged", str.islower),
            ("--no-skip-worktree", lambda t: t in "Ss"),
        ):
            paths = [e[2:] for e in entries if hidden(e[0])]
            if paths:
                self.run(
                    p.where, "update-index", flag, "-z", "--stdin", env=env, input="\0".join(paths) + "\0"
                )
        self.run(p.where, "add", "-A", *self._skip(p.where, skip, env), env=env)
        work = self.out(p.where, "write-tree", env=env)
        if commit:
            base = self.out(p.where, "rev-parse", f"{commit}^{{tree}}", env=env)
        else:  # an unborn branch: nothing committed yet
            base = self.run(p.where, "mktree", env=env, input="").stdout.strip()
        return Snapshot(commit, base, staged, work)

    def _commit(self, p: Pinned, tree: str, parent: str | None, message: str) -> str:
        parents = ["-p", parent] if parent else []
        return self.out(p.where, "commit-tree", tree, *parents, "-m", message, env=p.env(), commit=True)

    def _named(self, p: Pinned, commit: str) -> bool:
        """Is the commit on a branch, a tag or a remote branch?"""
        args = ("for-each-ref", "--count=1", "--contains", commit, *NAMED_REFS)
        return bool(self.run(p.where, *args, env=p.env()).stdout.strip())

    def _side(self, p: Pinned, prefix: str, commit: str) -> str:
        """A new branch ``<prefix>-<short sha>`` at ``commit`` (created only if it doesn't exist)."""
        for name in (f"{prefix}-{commit[:10]}", f"{prefix}-{commit}"):
            made = self.run(
                p.where,
                "update-ref",
                "-m",
                "cao: work saved at delete",
                f"refs/heads/{name}",
                commit,
                "",
                env=p.env(),
                check=False,
            )
            if made.returncode == 0:
                return name
        raise WorktreeError(f"could not make a branch {prefix}-{commit[:10]} for commit {commit[:10]}")

    def _stranded(self, p: Pinned) -> list[tuple[str, str, str]]:
        """Commits only the worktree's own things hold, which go with it, and no branch, tag or
        remote branch has: those the worker left behind on a detached HEAD (``checkout: moving
        from <sha> to ...`` in its HEAD reflog), newest first, and those only a per-worktree
        ref (``refs/worktree/*``) holds. Each as (commit, branch suffix, what it was)."""
        found: dict[str, tuple[str, str]] = {}
        try:
            lines = (p.admin / "logs" / "HEAD").read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in reversed(lines):
            old, _, rest = line.partition(" ")
            if rest.partition("\t")[2].startswith(f"checkout: moving from {old} "):
                found.setdefault(old, ("detached", "left behind on a detached HEAD"))
        refs = self.run(
            p.where,
            "for-each-ref",
            "--format=%(objecttype) %(objectname) %(refname)",
            "refs/worktree/",
            env=p.env(),
        )
        for kind, _, rest in (line.partition(" ") for line in refs.stdout.splitlines()):
            commit, _, ref = rest.partition(" ")
            if kind == "commit":
                found.setdefault(commit, ("saved", f"held only by {ref}, which goes with the worktree"))
        if not found:
            return []
        args = ("rev-list", "--ignore-missing", "--stdin", "--not", "--branches", "--tags", "--remotes")
        unnamed = set(self.run(p.where, *args, env=p.env(), input="\n".join(found) + "\n").stdout.split())
        return [(c, *found[c]) for c in found if c in unnamed]

    def save(self, p: Pinned, snap: Snapshot | None, *, branch: str, label: str) -> list[str]:
        """Put the worker's work where a named ref holds it (see :meth:`retire`); notes."""
        notes: list[str] = []
        env = p.env()
        head_ref = self.run(p.where, "symbolic-ref", "-q", "HEAD", env=env, check=False).stdout.strip()
        if snap is None:  # the folder is gone: only HEAD is left to save
            found = self.run(p.where, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env, check=False)
            head = found.stdout.strip() or None
        else:
            head = snap.head
        tip, made = head, None
        if snap and snap.staged not in (snap.base, snap.work):
            tip = self._commit(p, snap.staged, tip, f"wip: staged changes of {label}, saved by cao at delete")
            notes.append(f"staged changes committed as {tip[:10]}")
        if snap and snap.work != (snap.staged if tip != head else snap.base):
            tip = self._commit(p, snap.work, tip, f"wip: uncommitted work of {label}, saved by cao at delete")
        if tip != head:
            made = tip
        ours = f"refs/heads/{branch}"
        if head_ref == ours:
            if made:
                self.run(
                    p.where, "update-ref", "-m", "cao: work saved at delete", ours, made, head or "", env=env
                )
                notes.append(f"uncommitted work committed as {made[:10]} on {branch}")
        elif head_ref:
            name = head_ref.removeprefix("refs/heads/")
            if made:
                side = self._side(p, f"{branch}-wip", made)
                base = f"on top of {name}, which cao did not move" if head else f"{name} has no commit yet"
                notes.append(
                    f"the worker had switched to branch {name}: its uncommitted work committed as "
                    f"{made[:10]} on new branch {side} ({base})"
                )
            else:
                notes.append(f"the worker had switched to branch {name}; its commits are there")
        elif tip and not self._named(p, tip):
            side = self._side(p, f"{branch}-detached", tip)
            what = f"uncommitted work committed as {made[:10]} and" if made else "its commits"
            notes.append(f"HEAD was detached at {(head or '?')[:10]}: {what} saved as new branch {side}")
        elif tip:
            notes.append(f"HEAD was detached at {tip[:10]}, a commit a branch has already")
        for commit, suffix, what in self._stranded(p):
            if not self._named(p, commit):  # a branch made just now may have it by now
                side = self._side(p, f"{branch}-{suffix}", commit)
                notes.append(f"commit {commit[:10]}, {what}, saved as new branch {side}")
        return notes

    def retire(
        self,
        *,
        common_dir: Path,
        path: Path,
        branch: str,
        skip: Sequence[str],
        label: str,
        discard: Sequence[str] = (),
        since: float = 0.0,
    ) -> tuple[str, str]:
        """A worker is deleted: keep its work, drop what holds none. Returns (state, note).

        First the worktree's identity is checked (:meth:`identify`): if it is not the one cao
        made, nothing is touched and it is ``kept``. Then what would be lost with it
        (:meth:`holds`: an operation in progress, unresolved conflicts, a lock, ignored files,
        nested repositories, submodules with work of their own): any of those keeps it ``kept``
        exactly as it is, nothing committed. Else every commit is put on a named ref: the
        uncommitted work (staged, then the rest) as "wip" commits on the worker's branch, or on a
        new branch ``<branch>-wip-<sha>`` when HEAD is on another branch (which is not moved),
        or ``<branch>-detached-<sha>`` when HEAD is detached; commits left behind on a detached
        HEAD get such a branch too, and those only a ``refs/worktree/*`` ref holds get
        ``<branch>-saved-<sha>``. Then the worktree is removed, and cao's branch is deleted only
        when another branch, tag or remote branch contains its tip. All of it without the
        repository's hooks, fsmonitor or filters (:meth:`guard`), through the checked
        directories (``GIT_DIR``, ``GIT_WORK_TREE``).
        """
        if path.exists() and not path.is_dir():
            return "kept", f"worktree kept: {path} is not a directory any more; nothing was touched"
        if not path.is_dir():
            return self._retire_gone(common_dir, path, branch)
        try:
            p = self.identify(common_dir, path)
        except WorktreeError as exc:
            return "kept", f"worktree kept at {path}, not touched: {exc.message}"
        try:
            why, notes = self.holds(p, skip, discard)
            if why:
                return "kept", self._kept_note(p, why)
            if (p.admin / "index.lock").exists():
                notes.append(
                    "an index.lock was left in it (a git command crashed or was killed): the work was "
                    "saved without the worker's index"
                )
            with tempfile.TemporaryDirectory(prefix="cao-retire-") as tmp:
                (Path(tmp) / "a").mkdir()
                (Path(tmp) / "b").mkdir()
                snap = self.snapshot(p, skip, Path(tmp) / "a")
                if self.snapshot(p, skip, Path(tmp) / "b") != snap:  # something still writes there
                    return "kept", f"worktree kept at {path}: it changed while cao was saving it"
            notes = self.save(p, snap, branch=branch, label=label) + notes
        except WorktreeError as exc:
            return "kept", f"worktree kept at {path}: its work could not be committed ({exc.message})"
        notes += self._stashes(p, since)
        self.run(p.common, "worktree", "remove", "--force", str(path), env=config_env(GUARD))
        notes.append("worktree removed")
        notes.append(self._branch_fate(p.common, branch))
        return "removed", "; ".join(notes)

    def _retire_gone(self, common_dir: Path, path: Path, branch: str) -> tuple[str, str]:
        """The worktree's folder is gone: what its entry in the repository still holds (a
        detached HEAD, commits left behind) goes on named refs, then that entry is removed (only
        it: ``git worktree prune`` would drop other workers' entries too)."""
        common = common_dir.resolve()
        admin = self.admin_of(common, path)
        notes = []
        if admin is None:
            notes.append(f"its folder {path} was already gone and git knows no worktree there (moved?)")
        elif (admin / "locked").exists():
            return "kept", f"worktree {path} kept: its folder is gone but it is locked (`git worktree lock`)"
        else:
            p = Pinned(None, admin, common, {})
            probe = self.run(
                admin, "rev-parse", "--path-format=absolute", "--git-common-dir", env=p.env(), check=False
            )
            if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != common:
                seen = (probe.stdout or probe.stderr).strip()[:300]
                return "kept", (
                    f"worktree entry {admin} kept, not touched: its folder {path} is gone and the entry "
                    f"points at another repository ({seen})"
                )
            p = Pinned(None, admin, common, self.guard(admin, p.env()))
            try:
                notes += self.save(p, None, branch=branch, label="")
            except WorktreeError as exc:
                return "kept", f"worktree entry {admin} kept: its commits could not be saved ({exc.message})"
            self.run(common, "worktree", "remove", "--force", str(path), env=config_env(GUARD))
            notes.append("its folder was already gone; git's entry for it removed")
        notes.append(self._branch_fate(common, branch))
        return "removed", "; ".join(notes)

    def _kept_note(self, p: Pinned, why: Sequence[str]) -> str:
        """What a kept worktree holds, and why it was kept."""
        assert p.path is not None
        env = p.env()
        head = self.run(p.where, "rev-parse", "-q", "--verify", "HEAD", env=env, check=False).stdout.strip()
        on = self.run(p.where, "symbolic-ref", "-q", "--short", "HEAD", env=env, check=False).stdout.strip()
        changed = self.run(
            p.where,
            "status",
            "--porcelain",
            "--untracked-files=all",
            "--ignore-submodules=all",
            env=env,
            check=False,
        ).stdout.splitlines()
        where = f"it is on branch {on}" if on else f"its HEAD is detached at {head[:10]}"
        if head and not on and not self._named(p, head):
            where += f" (on no branch: `git branch <name> {head[:10]}` keeps it)"
        return (
            f"worktree kept at {p.path} as it was, nothing committed or removed: {'; '.join(why)}. "
            f"{where[0].upper()}{where[1:]}, with {len(changed)} uncommitted change(s). Keep what you "
            f"need, then `git worktree remove --force {p.path}`"
        )

    def _stashes(self, p: Pinned, since: float) -> list[str]:
        """Stashes live in the repository, shared by every worktree: they stay. Say so."""
        done = self.run(p.where, "log", "-g", "--format=%ct", "refs/stash", env=p.env(), check=False)
        n = sum(1 for t in done.stdout.split() if t.isdigit() and int(t) >= int(since))
        if not n:
            return []
        entries = "1 stash entry was" if n == 1 else f"{n} stash entries were"
        return [
            f"{entries} made in the repository while it worked; stashes are shared by all worktrees "
            "and stay (`git stash list`)"
        ]

    def _branch_fate(self, common: Path, branch: str) -> str:
        """cao's branch is deleted only when another branch, tag or remote branch has its tip (and
        no worktree has it checked out); never when only the stash has it."""
        env = config_env(GUARD)
        ref = f"refs/heads/{branch}"
        tip = self.run(common, "rev-parse", "-q", "--verify", ref, env=env, check=False).stdout.strip()
        if not tip:
            return f"branch {branch} no longer exists"
        where = next((w for w, b in self.registered(common, env).items() if b == branch), None)
        if where is not None:
            return f"branch {branch} kept: it is checked out at {where}"
        other = self.contained_elsewhere(common, branch, env)
        if other is None:
            return f"branch {branch} kept: it has commits not merged anywhere"
        self.run(common, "update-ref", "-m", "cao: worker deleted", "-d", ref, tip, env=env)
        short = other.removeprefix("refs/heads/")
        return f"branch {branch} deleted (merged: no commit of its own left, {short} has them)"

    # -- review ------------------------------------------------------------------------------------
    def fork_point(self, common_dir: Path, target: str, branch: str) -> str:
        done = self.run(common_dir, "merge-base", target, f"refs/heads/{branch}", check=False)
        if done.returncode != 0:
            raise WorktreeError(f"branch {branch} has no common history with {target}")
        return done.stdout.strip()

    def diff(
        self, *, common_dir: Path, path: Path | None, base: str, branch: str, skip: Sequence[str], stat: bool
    ) -> str:
        """Everything the worker changed since ``base``: its branch's commits and, while its
        worktree exists, what it has not committed yet (new files included, the setup's files
        left out); ``stat`` or the full patch."""
        fmt = ["--stat=120"] if stat else ["--patch", "--no-ext-diff", "--no-textconv"]
        if path is None or not path.is_dir():
            out = self.run(common_dir, "diff", "--no-color", *fmt, base, f"refs/heads/{branch}").stdout
            return out[:MAX_DIFF_BYTES]
        with tempfile.TemporaryDirectory(prefix="cao-diff-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}  # a scratch index: the worker's is untouched
            self.run(path, "read-tree", "HEAD", env=env)
            self.run(path, "add", "-A", *self._skip(path, skip), env=env)
            out = self.run(path, "diff", "--cached", "--no-color", *fmt, base, env=env).stdout
        return out[:MAX_DIFF_BYTES]

    def shortstat(self, path: Path, base: str) -> dict[str, int]:
        """Files, insertions, deletions of the worktree (committed + uncommitted tracked) vs base."""
        out = self.run(path, "diff", "--shortstat", base, check=False).stdout
        nums = {k: 0 for k in ("files", "insertions", "deletions")}
        for n, word in re.findall(r"(\d+) (file|insertion|deletion)", out):
            nums[{"file": "files", "insertion": "insertions", "deletion": "deletions"}[word]] = int(n)
        return nums

    # -- merge -------------------------------------------------------------------------------------
    def merge(self, *, common_dir: Path, branch: str, target: str, label: str) -> MergeResult:
        """Merge ``branch`` into the local branch ``target``; never leaves a half merge.

        ``git merge-tree --write-tree`` decides first, touching nothing: a conflict raises
        :class:`MergeConflict` with each conflicted file's text. A clean result is then applied:
        in the checkout that has ``target`` checked out (``git merge``; its tracked files must be
        clean, and a surprise conflict is aborted), or, when none has, as a merge commit that moves
        ``target`` only if it still points where it did (``update-ref <new> <old>``).
        """
        target_ref = f"refs/heads/{target}"
        old = self.run(common_dir, "rev-parse", "--verify", "-q", target_ref, check=False).stdout.strip()
        if not old:
            raise WorktreeError(f"merge: there is no local branch {target!r}; name an existing branch")
        tip = self.run(
            common_dir, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False
        ).stdout.strip()
        if not tip:
            raise WorktreeError(f"merge: the worker's branch {branch} no longer exists")
        if self.run(common_dir, "merge-base", "--is-ancestor", tip, old, check=False).returncode == 0:
            return MergeResult(True, old, target, branch, already=True)
        trial = self.run(common_dir, "merge-tree", "--write-tree", "--name-only", "-z", old, tip, check=False)
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
            conflicts = [{"path": f, "text": self._conflict_text(common_dir, tree, f)} for f in files]
            raise MergeConflict(
                f"merging {branch} into {target} would conflict in {', '.join(files) or 'some files'}; "
                f"nothing was changed. {info[:600]} Resolve it in the worker's worktree (merge {target} "
                "there and commit), then merge again",
                conflicts=conflicts,
                target=target,
                branch=branch,
            )
        message = f"Merge {branch} into {target} ({label})"
        checkout = next((p for p, b in self.registered(common_dir).items() if b == target), None)
        if checkout is None:
            done = self.run(common_dir, "commit-tree", tree, "-p", old, "-p", tip, "-m", message, commit=True)
            commit = done.stdout.strip()
            moved = self.run(common_dir, "update-ref", "-m", message, target_ref, commit, old, check=False)
            if moved.returncode != 0:
                raise NotMergeable(f"merge: {target} moved while merging; nothing was changed, merge again")
            return MergeResult(True, commit, target, branch)
        where = Path(checkout)
        changed = self.run(where, "status", "--porcelain", "--untracked-files=no").stdout.strip()
        if changed:
            raise NotMergeable(
                f"merge: {target} is checked out at {where} with uncommitted changes; commit or stash them "
                "there first (nothing was changed)"
            )
        done = self.run(
            where,
            "merge",
            "--no-ff",
            "--no-verify",
            "--no-edit",
            "-m",
            message,
            tip,
            check=False,
            commit=True,
        )
        if done.returncode != 0:
            aborted = self.run(where, "merge", "--abort", check=False)
            raise NotMergeable(
                f"merge: git merge stopped in {where}: {(done.stdout + done.stderr).strip()[:600]}; "
                + ("it was aborted, nothing was changed" if aborted.returncode == 0 else "check the checkout")
            )
        return MergeResult(True, self.out(where, "rev-parse", "HEAD"), target, branch, where=str(where))

    def _conflict_text(self, cwd: Path, tree: str, name: str) -> str:
        done = self.run(cwd, "cat-file", "-p", f"{tree}:{name}", check=False)
        text = done.stdout if done.returncode == 0 else ""
        if len(text) > MAX_CONFLICT_TEXT:
            start = max(0, text.find("<<<<<<<") - 200)
            text = text[start : start + MAX_CONFLICT_TEXT]
        return text


def dumps(paths: Sequence[str]) -> str:
    return json.dumps(list(paths))


def loads(text: str | None) -> list[str]:
    value: Any = json.loads(text) if text else []
    return [str(v) for v in value] if isinstance(value, list) else []
