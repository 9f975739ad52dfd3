"""Helpers shared by the real agent CLI providers (Claude Code, Codex, Gemini CLI)."""

from __future__ import annotations

import shutil
from pathlib import Path

from cao.errors import ProviderError
from providers.base import LaunchContext


def flag(ctx: LaunchContext, name: str, default: bool) -> bool:
    raw = ctx.settings_env.get(name, "").strip().lower()
    return default if not raw else raw in ("1", "true", "yes", "on")


def find_cli(ctx: LaunchContext, knob: str, command: str, package: str) -> str:
    """``$knob`` (a path or a name), else ``command`` on the pane's PATH, else the real-CLI cache."""
    home = Path(ctx.base_env.get("HOME") or "~").expanduser()
    cache = Path(ctx.settings_env.get("CAO_REALCLI_CACHE") or home / ".cache" / "cao" / "realcli")
    wanted = ctx.settings_env.get(knob) or command
    for path in (ctx.base_env.get("PATH", ""), str(cache.expanduser() / "node_modules" / ".bin")):
        if found := shutil.which(wanted, path=path):
            return found
    raise ProviderError(
        f"{wanted} not found (on PATH or in {cache}/node_modules/.bin); install it with "
        f"`npm install -g {package}` or set {knob}=/path/to/{command} for cao-server"
    )
