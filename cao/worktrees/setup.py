"""The setup of a new worktree: ``.cao/worktree.yaml`` in the checkout, the files it copies and
links in, the commands it runs in the worker's pane — and the record of exactly what cao put
there, so cao can tell its own files from the worker's later::

    copy: [.env, config]              # copied from the checkout (missing ones are skipped)
    link: [node_modules]              # symlinked to the checkout's copy
    setup: ["npm ci", "make prepare"] # run once, in the worker's pane, before the agent starts
    discard: [__pycache__/, "*.pyc"]  # ignored files a delete may throw away

Only the exact files cao copied (each with its content's blob id) and the symlinks it made are
cao's, and only while they are what cao put there (:func:`classify`). Anything else — a new file
in a copied directory, a copy the worker changed — is the worker's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from cao.worktrees.git import Git, Repo, WorktreeError

CONFIG_FILE = Path(".cao") / "worktree.yaml"
CONFIG_KEYS = ("copy", "link", "setup", "discard")


@dataclass(frozen=True)
class SetupPlan:
    copy: tuple[str, ...] = ()
    link: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()  # gitignore patterns of ignored files a delete may remove
    source: str = ""  # the config file it came from ('' = none)


@dataclass(frozen=True)
class SetupFile:
    """One thing the setup put into the worktree, as it was put there: a copied file (its blob
    id, size and mtime), a symlink (its target), or — a setup cut short, or a row from before
    these records — just a path, everything under which counts as cao's."""

    path: str
    blob: str | None = None
    size: int = -1
    mtime_ns: int = -1
    link: str | None = None

    @property
    def prefix(self) -> bool:
        return self.blob is None and self.link is None

    def as_json(self) -> Any:
        if self.prefix:
            return self.path
        if self.link is not None:
            return {"path": self.path, "link": self.link}
        return {"path": self.path, "blob": self.blob, "size": self.size, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did: what it put into the worktree and lines to show in the pane."""

    files: tuple[SetupFile, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Classified:
    """The setup's files as they are now (:func:`classify`)."""

    unchanged: frozenset[str]  # still exactly what cao put there: cao's
    prefixes: tuple[str, ...]  # paths everything under which is cao's (older records)
    changed: tuple[str, ...]  # copies the worker changed (or replaced): the worker's now

    def cao_owns(self, path: str) -> bool:
        path = path.rstrip("/")
        return path in self.unchanged or under(path, self.prefixes)


NOTHING = Classified(frozenset(), (), ())


def dumps(files: Iterable[SetupFile]) -> str:
    return json.dumps([f.as_json() for f in files])


def loads(text: str | None) -> list[SetupFile]:
    value: Any = json.loads(text) if text else []
    out: list[SetupFile] = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, str):
            out.append(SetupFile(item))
        elif isinstance(item, dict) and isinstance(item.get("path"), str):
            link, blob = item.get("link"), item.get("blob")
            out.append(
                SetupFile(
                    item["path"],
                    blob=str(blob) if blob is not None else None,
                    size=int(item.get("size", -1)),
                    mtime_ns=int(item.get("mtime_ns", -1)),
                    link=str(link) if link is not None else None,
                )
            )
    return out


def under(path: str, roots: Sequence[str]) -> bool:
    """Is ``path`` (relative, '/'-separated) one of ``roots`` or inside one?"""
    return any(path.rstrip("/") == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def through_symlink(root: Path, rel: str) -> bool:
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


def blob_id(path: Path, object_format: str = "sha1") -> str:
    """git's blob id of the file's bytes as they are (``git hash-object --no-filters``)."""
    h = hashlib.new(object_format)
    h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _record(root: Path, rel: str, object_format: str) -> list[SetupFile]:
    """What is at ``root/rel`` now, file by file (a directory's files and symlinks, recursively)."""
    top = root / rel
    if top.is_symlink():
        return [SetupFile(rel, link=os.readlink(top))]
    if not top.is_dir():
        st = top.stat()
        return [SetupFile(rel, blob=blob_id(top, object_format), size=st.st_size, mtime_ns=st.st_mtime_ns)]
    out: list[SetupFile] = []
    for here, dirs, names in os.walk(top):
        for name in sorted(names) + sorted(d for d in dirs if os.path.islink(os.path.join(here, d))):
            out += _record(root, Path(here, name).relative_to(root).as_posix(), object_format)
    return out


def prepare(git: Git, repo: Repo, path: Path, plan: SetupPlan) -> Prepared:
    """Copy and link the plan's files from the checkout into the new worktree, and record
    exactly what was put there."""
    files: list[SetupFile] = []
    notes = [f"worktree {path} (branch {git.branch_of(path) or '?'}, from {repo.head[:10]})"]
    object_format = git.out(path, "rev-parse", "--show-object-format") or "sha1"
    for rel, link in [(p, False) for p in plan.copy] + [(p, True) for p in plan.link]:
        src, dst = repo.toplevel / rel, path / rel
        if not src.exists():
            notes.append(f"not in the checkout, skipped: {rel}")
            continue
        # A committed symlink must not carry a copy or link out of its tree: the source must
        # resolve inside the checkout, and no parent of the destination may be a symlink (the
        # destination is removed before it is replaced).
        if not inside(src.resolve(), repo.toplevel.resolve()):
            raise WorktreeError(f"setup: {rel} resolves outside the checkout (a symlink?); refusing it")
        if through_symlink(path, rel):
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
        files += _record(path, rel, object_format)
    return Prepared(tuple(files), tuple(notes))


def classify(root: Path, files: Sequence[SetupFile], *, object_format: str, strict: bool) -> Classified:
    """Which of the setup's files are still exactly what cao put there. A copy whose size and
    mtime are unchanged is taken as unchanged unless ``strict`` (at delete: every copy is read
    again). A copy that is gone is neither: nothing of the worker's is in it."""
    unchanged: set[str] = set()
    changed: list[str] = []
    for f in files:
        if f.prefix:
            continue
        here = root / f.path
        try:
            st = os.lstat(here)
        except OSError:
            continue
        if f.link is not None:
            same = stat.S_ISLNK(st.st_mode) and os.readlink(here) == f.link
        elif not stat.S_ISREG(st.st_mode):
            same = False
        elif not strict and st.st_size == f.size and st.st_mtime_ns == f.mtime_ns:
            same = True
        else:
            same = st.st_size == f.size and blob_id(here, object_format) == f.blob
        if same:
            unchanged.add(f.path)
        else:
            changed.append(f.path)
    return Classified(frozenset(unchanged), tuple(f.path for f in files if f.prefix), tuple(changed))
