"""Git worktrees for workers: one worktree on its own branch per worker, review and merge.

The only module that runs ``git``. Every call goes through :meth:`Git.run`: the git CLI with an
explicit ``cwd``, a clean environment (no ``GIT_*`` variable of the host leaks in, prompts off,
``LC_ALL=C`` so messages read the same everywhere) and ``-c`` overrides for what a user's config
could change under us (colours, signing, the committer of cao's own commits). Hooks are skipped
for cao's commits and merges (``--no-verify``): they are the operator's, not cao's, to run.

    create    Repo.inspect(dir) → git worktree add -b cao/<profile>-<id> <worktrees>/<repo>/<…> HEAD
              then the setup: files copied/linked from the checkout, commands run in the pane
    retire    on delete: uncommitted work becomes a "wip" commit on the branch; the (now clean)
              worktree is removed; the branch is deleted only if another ref contains its tip
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
CONFIG_KEYS = ("copy", "link", "setup")
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
    source: str = ""  # the config file it came from ('' = none)


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

    def out(self, cwd: Path, *args: str) -> str:
        return self.run(cwd, *args).stdout.strip()

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
    def _skip(self, cwd: Path, paths: Sequence[str]) -> list[str]:
        """A pathspec for the whole tree minus the setup's files (git refuses to be handed
        ignored ones even to exclude them, and doesn't need to: it leaves those out itself)."""
        ignored: set[str] = set()
        if paths:
            done = self.run(cwd, "check-ignore", "--", *paths, check=False)
            ignored = set(done.stdout.splitlines())
        return ["--", ".", *(f":(exclude,top){p}" for p in paths if p not in ignored)]

    def dirty(self, path: Path, skip: Sequence[str] = ()) -> list[str]:
        """``git status --porcelain`` lines of uncommitted work (the setup's own files left out)."""
        out = self.run(path, "status", "--porcelain", "--untracked-files=all", *self._skip(path, skip)).stdout
        return [line for line in out.splitlines() if line.strip()]

    def commit_wip(self, path: Path, skip: Sequence[str], message: str) -> str | None:
        """Commit every uncommitted change (tracked and untracked, not ignored, not the setup's
        files) to the worktree's branch; the new commit, or None when there was nothing."""
        if not self.dirty(path, skip):
            return None
        self.run(path, "add", "-A", *self._skip(path, skip))
        self.run(path, "commit", "--no-verify", "-q", "-m", message, commit=True)
        return self.out(path, "rev-parse", "HEAD")

    def contained_elsewhere(self, cwd: Path, branch: str) -> bool:
        """Is the branch's tip reachable from some other ref (branch, tag, remote branch)?"""
        refs = self.out(cwd, "for-each-ref", "--format=%(refname)", "--contains", f"refs/heads/{branch}")
        return any(r and r != f"refs/heads/{branch}" for r in refs.splitlines())

    def registered(self, cwd: Path) -> dict[str, str | None]:
        """Worktrees git knows of: path → branch (None when detached)."""
        out: dict[str, str | None] = {}
        current: str | None = None
        for line in self.run(cwd, "worktree", "list", "--porcelain").stdout.splitlines():
            if line.startswith("worktree "):
                current = line[9:]
                out[current] = None
            elif line.startswith("branch refs/heads/") and current is not None:
                out[current] = line[len("branch refs/heads/") :]
        return out

    def retire(
        self, *, common_dir: Path, path: Path, branch: str, skip: Sequence[str], label: str
    ) -> tuple[str, str]:
        """A worker is deleted: keep its work, drop what holds none. Returns (state, note).

        Uncommitted work becomes a "wip" commit on the branch; the worktree, clean by then, is
        removed; the branch is deleted only when another ref contains its tip (nothing unmerged).
        When the commit fails the worktree is kept as it is (state ``kept``).
        """
        notes = []
        if path.is_dir():
            try:
                wip = self.commit_wip(path, skip, f"wip: uncommitted work of {label}, saved by cao at delete")
            except WorktreeError as exc:
                return (
                    "kept",
                    f"worktree kept at {path}: its uncommitted work could not be committed ({exc.message})",
                )
            if wip:
                notes.append(f"uncommitted work committed as {wip[:10]} on {branch}")
            if self.dirty(path, skip):  # something appeared meanwhile: never remove unsaved work
                return "kept", f"worktree kept at {path}: it still has uncommitted changes"
            self.run(common_dir, "worktree", "remove", "--force", str(path))
            notes.append("worktree removed")
        else:
            self.run(common_dir, "worktree", "prune", check=False)
        exists = self.run(common_dir, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False)
        if exists.returncode != 0:
            notes.append(f"branch {branch} no longer exists")
        elif self.contained_elsewhere(common_dir, branch):
            self.run(common_dir, "branch", "-D", branch)
            notes.append(f"branch {branch} deleted (merged: no commit of its own left)")
        else:
            notes.append(f"branch {branch} kept: it has commits not merged anywhere")
        return "removed", "; ".join(notes)

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
