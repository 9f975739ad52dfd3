"""Agent profiles: who an agent is (its system prompt) and what it may use.

A profile is a markdown file with YAML front matter; the body is the system prompt::

    ---
    name: reviewer                       # required; the file is <name>.md
    description: Reviews diffs           # required; one line, shown by `cao profiles`
    provider: claude_code                # optional: pins the agent CLI when a request names none
    model: sonnet                        # optional: the CLI's model flag
    allowed_tools: [Read, Grep]          # optional: omitted = the CLI's defaults
    mcp_servers:                         # optional: extra MCP servers for the CLI
      cao: {command: cao-mcp-server}
    use_worktree: true                   # optional: its own git worktree by default (docs/worktrees.md)
    ---
    You are a careful code reviewer ...

Lookup order for ``load(name)``: the store (``$CAO_HOME/agent-store/<name>.md``, what
``cao install`` writes), then the built-ins shipped in ``cao/profiles/`` (``code_supervisor``,
``developer``, ``reviewer``), so a fresh install works with no store at all and an installed file
of the same name overrides a built-in.
"""

from __future__ import annotations

import builtins
import errno
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

import providers
from cao.errors import CaoError, InvalidInput, NotFound
from cao.settings import Settings

# The same rule as terminal and session names (cao.names.NAME_RE): a profile name is used in
# tmux window names and file names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
FIELDS = ("name", "description", "provider", "model", "allowed_tools", "mcp_servers", "use_worktree")
BUILTIN = "builtin"
FRONT_MATTER_RE = re.compile(
    r"\A---[ \t]*\r?\n(?P<yaml>.*?)^---[ \t]*(?:\r?\n|\Z)(?P<body>.*)\Z", re.S | re.M
)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    system_prompt: str
    provider: str | None = None
    model: str | None = None
    allowed_tools: tuple[str, ...] | None = None  # None: the CLI's own defaults
    mcp_servers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    use_worktree: bool = False  # workers with this profile get their own git worktree by default
    source: str = BUILTIN  # "builtin" or the file it was read from

    @property
    def builtin(self) -> bool:
        return self.source == BUILTIN

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "provider": self.provider,
            "model": self.model,
            "allowed_tools": builtins.list(self.allowed_tools) if self.allowed_tools is not None else None,
            "mcp_servers": {k: dict(v) for k, v in self.mcp_servers.items()},
            "use_worktree": self.use_worktree,
            "source": self.source,
            "system_prompt": self.system_prompt,
        }


def validate_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise InvalidInput(
            f"agent profile name {name!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


# -- parsing ---------------------------------------------------------------------------------------
def parse(text: str, source: str = BUILTIN) -> Profile:
    """Parse and validate one profile file's text; errors name the file, the field and the fix."""
    m = FRONT_MATTER_RE.match(text.lstrip("\ufeff"))
    if m is None:
        raise InvalidInput(
            f"{source}: no YAML front matter; start the file with a '---' line, then the fields "
            "(name, description, ...), then another '---' line, then the system prompt"
        )
    try:
        meta = yaml.safe_load(m["yaml"])
    except yaml.YAMLError as exc:
        problem = str(exc).replace("\n", " ")
        raise InvalidInput(f"{source}: the front matter is not valid YAML ({problem})") from None
    if not isinstance(meta, dict):
        raise InvalidInput(f"{source}: the front matter must be a mapping like 'name: developer'")
    unknown = sorted(str(k) for k in meta if k not in FIELDS)
    if unknown:
        raise InvalidInput(
            f"{source}: unknown field(s) {', '.join(unknown)}; profiles have: {', '.join(FIELDS)}"
        )
    name = _text(meta, "name", source, required=True)
    assert name is not None
    try:
        validate_name(name)
    except InvalidInput as exc:
        raise InvalidInput(f"{source}: {exc.message}") from None
    description = _text(meta, "description", source, required=True)
    assert description is not None
    provider = _text(meta, "provider", source)
    if provider is not None and provider not in providers.names():
        raise InvalidInput(
            f"{source}: provider {provider!r} is unknown; use one of {', '.join(providers.names())} "
            "or leave it out (the request or the default decides)"
        )
    return Profile(
        name=name,
        description=description,
        system_prompt=m["body"].strip(),
        provider=provider,
        model=_text(meta, "model", source),
        allowed_tools=_tools(meta.get("allowed_tools"), source),
        mcp_servers=_mcp_servers(meta.get("mcp_servers"), source),
        use_worktree=_flag(meta, "use_worktree", source),
        source=source,
    )


def _text(meta: Mapping[str, Any], key: str, source: str, *, required: bool = False) -> str | None:
    value = meta.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise InvalidInput(f"{source}: {key} is required (a non-empty string)")
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{source}: {key} must be a string, got {type(value).__name__}")
    return value.strip()


def _flag(meta: Mapping[str, Any], key: str, source: str) -> bool:
    value = meta.get(key, False)
    if not isinstance(value, bool):
        raise InvalidInput(f"{source}: {key} must be true or false, got {value!r}")
    return value


def _tools(value: object, source: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, builtins.list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise InvalidInput(f"{source}: allowed_tools must be a list of tool names, e.g. [Read, Edit]")
    return tuple(t.strip() for t in value)


def _mcp_servers(value: object, source: str) -> dict[str, dict[str, Any]]:
    if value is None:
        return {}
    example = "e.g. {cao: {command: cao-mcp-server}}"
    if not isinstance(value, dict):
        raise InvalidInput(f"{source}: mcp_servers must be a mapping of name to server, {example}")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in value.items():
        where = f"{source}: mcp_servers.{name}"
        if not isinstance(spec, dict):
            raise InvalidInput(f"{where} must be a mapping with a command (or a url), {example}")
        if not isinstance(spec.get("command"), str) and not isinstance(spec.get("url"), str):
            raise InvalidInput(f"{where} needs a command (stdio server) or a url (HTTP server), {example}")
        args = spec.get("args", [])
        if not isinstance(args, builtins.list) or not all(isinstance(a, str) for a in args):
            raise InvalidInput(f"{where}.args must be a list of strings")
        env = spec.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise InvalidInput(f"{where}.env must be a mapping of names to string values")
        out[str(name)] = dict(spec)
    return out


# -- the built-ins and the store --------------------------------------------------------------------
def _builtin_texts() -> dict[str, str]:
    folder = resources.files("cao").joinpath("profiles")
    return {
        entry.name.removesuffix(".md"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".md")
    }


def builtin_names() -> builtins.list[str]:
    return sorted(_builtin_texts())


def _store(store: Path | None) -> Path:
    return store if store is not None else Settings.from_env().profiles_dir


def names(store: Path | None = None) -> builtins.list[str]:
    """Every profile name (built-in or in the store) without parsing the files."""
    folder = _store(store)
    stored = {p.stem for p in folder.glob("*.md")} if folder.is_dir() else set()
    return sorted(stored | set(builtin_names()))


def _not_found(name: str, store: Path | None) -> NotFound:
    return NotFound(
        f"agent profile {name!r} not found; available: {', '.join(names(store))}. "
        "Install one with `cao install PATH.md` (see `cao profiles`)"
    )


def load(name: str, store: Path | None = None) -> Profile:
    """The profile called ``name``: the store's file if there is one, else the built-in."""
    validate_name(name)
    path = _store(store) / f"{name}.md"
    if path.is_file():
        profile = parse(path.read_text(encoding="utf-8"), str(path))
        if profile.name != name:
            raise InvalidInput(
                f"{path}: declares name {profile.name!r} but the file is {name}.md; "
                f"rename the file to {profile.name}.md or fix the name"
            )
        return profile
    text = _builtin_texts().get(name)
    if text is None:
        raise _not_found(name, store)
    return parse(text, BUILTIN)


def list(store: Path | None = None) -> builtins.list[Profile]:
    """All profiles, sorted by name; a store file shadows the built-in of the same name."""
    return [load(name, store) for name in names(store)]


def install(name_or_path: str, store: Path | None = None) -> tuple[Profile, Path]:
    """Copy a profile file (or a built-in, to edit it) into the store; returns it and where it went."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return install_text(path.read_text(encoding="utf-8"), store, source=str(path))
    if os.sep in name_or_path or name_or_path.endswith(".md"):
        raise NotFound(f"no profile file at {path}; pass an existing .md file or a built-in profile name")
    return install_builtin(name_or_path, store)


def install_builtin(name: str, store: Path | None = None) -> tuple[Profile, Path]:
    """A built-in's file copied into the store, to edit it there."""
    text = _builtin_texts().get(validate_name(name))
    if text is None:
        raise NotFound(
            f"{name!r} is neither a file nor a built-in profile "
            f"({', '.join(builtin_names())}); pass the path of a profile .md file"
        )
    return install_text(text, store, source=BUILTIN)


def install_text(
    text: str, store: Path | None = None, *, source: str = "the request"
) -> tuple[Profile, Path]:
    """A profile's text validated, then written as ``<store>/<name>.md`` in one rename (a reader
    sees the old file or the new one; an installed profile replaces one of the same name)."""
    profile = parse(text, source)
    folder = _store(store)
    dest = folder / f"{profile.name}.md"
    # a temporary file of its own per install (two at once must not share one), made like any
    # other file the user writes (mode 0666 less the umask: mkstemp's 0600 hid it from the group)
    tmp = folder / f".{dest.name}.{secrets.token_hex(8)}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the disk is full: 507
        raise CaoError(
            f"the agent store {folder} can't be written ({exc.strerror}); nothing was installed. "
            "Make it a directory cao-server may write"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return parse(text, str(dest)), dest
