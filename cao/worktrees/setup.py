"""The setup of a new worktree: ``.cao/worktree.yaml`` in the checkout, the files it copies and
links in, the commands it runs in the worker's pane::

    copy: [.env, config/local.toml]   # copied into the worktree (missing ones are skipped)
    link: [node_modules]              # symlinked to the checkout's copy
    setup: ["npm ci", "make prepare"] # run once, in the worker's pane, before the agent starts
    discard: [__pycache__/, "*.pyc"]  # ignored files a delete may throw away

The paths the setup put there are cao's, not the worker's: never committed by cao, never
shown as changes (:func:`exclude`).
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Mapping, Sequence
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
class Prepared:
    """What :func:`prepare` did: the paths it put into the worktree (never committed by cao)
    and lines to show in the pane."""

    paths: tuple[str, ...]
    notes: tuple[str, ...]


def dumps(paths: Sequence[str]) -> str:
    return json.dumps(list(paths))


def loads(text: str | None) -> list[str]:
    value: Any = json.loads(text) if text else []
    return [str(v) for v in value] if isinstance(value, list) else []


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


def prepare(git: Git, repo: Repo, path: Path, plan: SetupPlan) -> Prepared:
    """Copy and link the plan's files from the checkout into the new worktree."""
    paths: list[str] = []
    notes = [f"worktree {path} (branch {git.branch_of(path) or '?'}, from {repo.head[:10]})"]
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
        paths.append(rel)
    return Prepared(tuple(paths), tuple(notes))


def exclude(git: Git, cwd: Path, paths: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """A pathspec for the whole tree minus the setup's files (git refuses to be handed
    ignored ones even to exclude them, and doesn't need to: it leaves those out itself)."""
    ignored: set[str] = set()
    if paths:
        done = git.run(cwd, "check-ignore", "--", *paths, env=env, check=False)
        ignored = set(done.stdout.splitlines())
    return ["--", ".", *(f":(exclude,top){p}" for p in paths if p not in ignored)]
