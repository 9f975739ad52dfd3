"""The git runner: every git call cao makes goes through :meth:`Git.run`, and the guard.

``run`` is the git CLI with an explicit ``cwd``, a clean environment (no ``GIT_*`` variable of
the host, prompts off, ``LC_ALL=C``), ``-c`` overrides for what a user's config could change under
cao (colours, signing, the committer of cao's own commits) and, on every call but the one
``git worktree add``, the **guard**: a repository's own config is something a worker can write
(its local and worktree config live in the repository the worker commits to), so nothing in it
runs in cao's git calls — no hooks, no fsmonitor, no lazy fetch (:data:`GUARD`), and, where a
call reads or writes files (:meth:`Git.guard`), no filter or merge driver the repository set.
Paths are never patterns: ``GIT_LITERAL_PATHSPECS=1``.

It also checks a worktree's identity (:meth:`Git.identify` → :class:`Pinned`): every git call on
a worker's tree names its checked directories (``GIT_DIR``, ``GIT_WORK_TREE``).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cao.errors import InvalidInput

GIT_TIMEOUT = 300.0
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
# What a repository's own config could run, or change, in any of cao's git calls: hooks
# (reference-transaction, post-index-change, post-merge...), the fsmonitor, lazy fetches of a
# partial clone, signature checks (gpg.program). Filter and merge drivers: :meth:`Git.guard`.
GUARD = (
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.splitIndex", "false"),
    ("core.untrackedCache", "false"),
    ("submodule.recurse", "false"),
    ("gc.auto", "0"),
    ("log.showSignature", "false"),
    ("merge.verifySignatures", "false"),
    ("protocol.allow", "never"),
    *((f"protocol.{name}.allow", "never") for name in ("file", "git", "ssh", "http", "https", "ext")),
)
TRUSTED_SCOPES = ("system", "global")  # the operator's config; local and worktree are the repository's
FILTER_KEYS = ("clean", "smudge", "process", "required")
# What an operator's own filter reads from the repository's config and runs: git-lfs (whose
# `git lfs install` puts its filter in the global config) runs each `lfs.extension.<name>` command
# on clean and smudge, a `lfs.customtransfer.<name>` program as a standalone transfer agent, and,
# when its server asks for credentials, the credential helpers and `core.askPass`; for an ssh://
# endpoint `core.sshCommand`. Each set by the repository is replaced by the operator's setting
# of the same key, or switched off (value here).
PROGRAM_KEYS = re.compile(
    r"^(?:lfs\.(?:extension\..+\.(?:clean|smudge)|customtransfer\..+\.(?:path|args)|standalonetransferagent)"
    r"|core\.(?:askpass|sshcommand)|credential\.(?:.+\.)?helper)$"
)
PROGRAM_OFF = {"core.sshcommand": "ssh"}  # else "": no extension, no agent, no askpass, no helper
# A merge driver the repository's config defines, without one of the operator's of that name:
# git's own text merge, as the driver (an empty one would "merge" by keeping our side).
TEXT_MERGE = "git merge-file -L ours -L base -L theirs --marker-size=%L %A %O %B"
NAMED_REFS = ("refs/heads", "refs/tags", "refs/remotes")  # where work is kept (not refs/stash)


class WorktreeError(InvalidInput):
    """422: no worktree can be made here (not a git repository, no commit yet, git failed...)."""


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
class Pinned:
    """A worktree whose identity :meth:`Git.identify` checked. Every git call on it names its
    directories (``GIT_DIR``, ``GIT_WORK_TREE``), so a ``.git`` file rewritten since can't
    redirect them, and carries ``config`` (:meth:`Git.guard`). ``path`` is None when the
    worktree's folder is gone and only its entry in the repository is left."""

    path: Path | None
    admin: Path  # its entry in the repository, <common>/worktrees/<name>
    common: Path
    config: Mapping[str, str]
    object_format: str = "sha1"

    @property
    def where(self) -> Path:
        return self.path or self.admin

    def env(self, **more: str) -> dict[str, str]:
        env = {**self.config, "GIT_DIR": str(self.admin), "GIT_OPTIONAL_LOCKS": "0", **more}
        if self.path is not None:
            env["GIT_WORK_TREE"] = str(self.path)
        return env


BRANCH_RE = re.compile(r"^(?!-)(?!.*\.\.)(?!.*//)[A-Za-z0-9._/-]{1,200}(?<![./])$")


def validate_branch(name: str, what: str = "into") -> str:
    """A local branch name that can't be read as an option or a revision expression."""
    if not BRANCH_RE.match(name or "") or name.endswith(".lock"):
        raise InvalidInput(
            f"{what} {name[:80]!r} is not a branch name; use letters, digits, '.', '_', '-' and '/', "
            "e.g. main or feature/parser"
        )
    return name


def config_env(pairs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``-c key=value`` for each pair, as environment (no quoting or '=' in a key can break it,
    git passes it on to the git processes it starts, and no config file can override it)."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return env


def shown(text: str) -> str:
    """Text with file names read byte for byte (:meth:`Git.run` ``paths``) made printable: a
    non-UTF-8 byte becomes U+FFFD (a note or an answer must be valid UTF-8)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def dotgit_like(name: str) -> bool:
    """A name git refuses as a path part (``.git`` in any case, ``.git.``, NTFS's ``git~1``...)."""
    n = name.casefold().split(":", 1)[0].rstrip(" .")
    return n in (".git", "git~1")


def not_the_folder(path: Path) -> str | None:
    """Why ``path`` is not (any more) the real directory cao made there, or None. Never follows
    a symlink: ``path`` itself must be a directory (``lstat``) that resolves to itself."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path} can't be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink now (to {os.readlink(path)[:300]}), not the folder cao made"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory any more"
    real = os.path.realpath(path)
    if real != os.path.abspath(path):
        return f"{path} resolves to {real} now (a symlink on the way?), not to itself"
    return None


class Git:
    """The git CLI, run with an explicit cwd, a clean environment and the guard."""

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

    def run(
        self,
        cwd: Path,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        commit: bool = False,
        input: str | None = None,
        guarded: bool = True,
        paths: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """One git call. ``guarded`` (all but ``git worktree add``): :data:`GUARD` and literal
        pathspecs; an ``env`` from :meth:`guard` or :meth:`Pinned.env` replaces the former.
        ``paths``: the output (and ``input``) are file names, which may be any bytes but NUL and
        must come back to the same file: non-UTF-8 bytes are kept as surrogates (``os.fsencode``
        gives them back), not replaced (a file named ``caf\xe9.txt`` was never committed, then
        deleted with its worktree); :func:`shown` makes such text printable."""
        argv = ["git", *(f for o in OVERRIDES for f in ("-c", o))]
        if commit:
            argv += self.identity
        argv += args
        full = dict(self.env)
        if guarded:
            full.update(config_env(GUARD), GIT_LITERAL_PATHSPECS="1")
        full.update(env or {})
        try:
            done = subprocess.run(
                argv,
                cwd=cwd,
                env=full,
                input=input,
                capture_output=True,
                text=True,
                errors="surrogateescape" if paths else "replace",
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

    def lines(self, cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> list[str]:
        """NUL-separated output of a git call (``-z``): file names, byte for byte (``paths``)."""
        return [x for x in self.run(cwd, *args, env=env, paths=True).stdout.split("\0") if x]

    def guard(self, cwd: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment that keeps a repository's own config from running code in a git call
        that reads or writes files: :data:`GUARD`, and each filter driver (``clean``,
        ``smudge``, ``process``) and merge driver the repository's config (local or worktree
        scope, which a worker can write) sets is replaced by the operator's (system or global
        scope, e.g. git-lfs's) or, when the operator has none, switched off: a filter is
        emptied (the file is read and written as it is), a merge driver becomes git's own text
        merge (:data:`TEXT_MERGE`)."""
        done = self.run(
            cwd,
            "config",
            "--show-scope",
            "--null",
            "--get-regexp",
            r"^(filter|merge|lfs|credential)\.|^core\.(askpass|sshcommand)$",
            env=env,
            check=False,
        )
        if done.returncode not in (0, 1):  # 1: no such settings at all
            raise WorktreeError(
                f"could not read the repository's filter and merge drivers: {done.stderr.strip()[:300]}"
            )
        parts = done.stdout.split("\0")
        trusted: dict[str, list[str]] = {}
        theirs: list[str] = []  # the keys above the repository sets
        for scope, entry in zip(parts[0::2], parts[1::2], strict=False):
            key, _, value = entry.partition("\n")
            section, _, leaf = key.rpartition(".")
            driver = key.startswith("merge.") and leaf == "driver" and section != "merge"
            program = PROGRAM_KEYS.match(key) is not None
            if not driver and not program and not (key.startswith("filter.") and leaf in FILTER_KEYS):
                continue
            if scope in TRUSTED_SCOPES:
                trusted.setdefault(key, []).append(value)
            elif scope != "command" and key not in theirs:
                theirs.append(key)

        def off(key: str) -> str:
            if key.startswith("merge."):
                return TEXT_MERGE
            if key in PROGRAM_OFF:
                return PROGRAM_OFF[key]
            return "false" if key.endswith(".required") else ""

        # Per key: an empty `process` would switch off the operator's `clean` too (git prefers a
        # defined process), so only what the repository sets is replaced. A credential helper is a
        # list: an empty value empties it, then the operator's own are listed again.
        pairs: list[tuple[str, str]] = []
        for key in theirs:
            if key.startswith("credential."):
                pairs += [(key, ""), *((key, v) for v in trusted.get(key, []) if v)]
            else:
                pairs.append((key, trusted.get(key, [off(key)])[-1]))
        return config_env([*GUARD, *pairs])

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
        ref = f"refs/heads/{branch}"
        if self.run(repo.toplevel, "rev-parse", "--verify", "-q", ref, check=False).returncode == 0:
            raise WorktreeError(f"use_worktree: branch {branch} already exists in {repo.toplevel}")
        if path.exists():
            raise WorktreeError(f"use_worktree: {path} already exists; remove it or set CAO_WORKTREES_DIR")
        path.parent.mkdir(parents=True, exist_ok=True)
        done = self.run(  # the operator's checkout, at the operator's request: its post-checkout hook runs
            repo.toplevel,
            "worktree",
            "add",
            "--quiet",
            "-b",
            branch,
            str(path),
            repo.head,
            check=False,
            guarded=False,
        )
        if done.returncode != 0:
            raise WorktreeError(
                f"use_worktree: git could not make a worktree at {path}: {done.stderr.strip()[:800]}"
            )

    def branch_of(self, path: Path) -> str | None:
        done = self.run(path, "symbolic-ref", "-q", "--short", "HEAD", check=False)
        return done.stdout.strip() or None

    # -- the repository's refs ---------------------------------------------------------------------
    def contained_elsewhere(self, cwd: Path, branch: str, env: Mapping[str, str] | None = None) -> str | None:
        """A named ref other than the branch (branch, tag, remote branch) that contains its tip.
        ``refs/stash`` and other bookkeeping refs don't count: they are no place to keep work."""
        ref = f"refs/heads/{branch}"
        refs = self.run(cwd, "for-each-ref", "--format=%(refname)", "--contains", ref, *NAMED_REFS, env=env)
        return next((r for r in refs.stdout.splitlines() if r and r != ref), None)

    def named(self, cwd: Path, commit: str, env: Mapping[str, str] | None = None) -> bool:
        """Is the commit on a branch, a tag or a remote branch?"""
        args = ("for-each-ref", "--count=1", "--contains", commit, *NAMED_REFS)
        return bool(self.run(cwd, *args, env=env).stdout.strip())

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

    # -- a worker's worktree: is it still the one cao made? -------------------------------------------
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
        """The worktree cao made at ``path`` in the repository ``common_dir``, verified: ``path``
        is a real directory (no symlink, :func:`not_the_folder`), git's entry for it exists, its
        ``.git`` file points at that entry, and git run there resolves to that entry, that
        repository and that directory. Raises :class:`WorktreeError` saying what is wrong
        otherwise (a worker rewrote ``.git``, made a repository of its own...)."""
        problem = not_the_folder(path)
        if problem:
            raise WorktreeError(problem)
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
            "--show-object-format",
            check=False,
        )
        found = probe.stdout.splitlines()
        got = [Path(p).resolve() for p in found[:3]]
        want = [admin.resolve(), common, path.resolve()]
        if probe.returncode != 0 or got != want:
            seen = ", ".join(map(str, got)) or (probe.stderr.strip()[:300] or "nothing")
            raise WorktreeError(
                f"git run there resolves to {seen} instead of {', '.join(map(str, want))}: another "
                "repository or work tree (core.worktree?)"
            )
        pinned = Pinned(path, admin, common, {})
        fmt = found[3] if len(found) > 3 else "sha1"
        return Pinned(path, admin, common, self.guard(path, pinned.env()), fmt)
