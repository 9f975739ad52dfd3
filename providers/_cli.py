"""Helpers shared by the real agent CLI providers (Claude Code, Codex, Gemini CLI, ...)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from cao import knobs
from cao.errors import ProviderError
from cao.knobs import Knob
from cao.states import HookPhase
from providers.base import LaunchContext

LOCAL_KEY = "cao-local-model-server-key"  # the API key a CLI gets for the local model server

# Knobs more than one provider reads.
MODEL_BASE_URL = knobs.text(
    "CAO_MODEL_BASE_URL",
    "a local model server speaking the CLIs' own APIs (the tests' `cao.testing.fakemodel`); a "
    "placeholder API key is used unless a real one is set",
)
REALCLI_CACHE = knobs.path(
    "CAO_REALCLI_CACHE",
    "where the test bed installs the CLIs; the last place a provider looks for its CLI",
    shown="`~/.cache/cao/realcli`",
)
ANTHROPIC_API_KEY = knobs.text(
    "CAO_ANTHROPIC_API_KEY",
    "an Anthropic API key, passed as `ANTHROPIC_API_KEY` (Claude Code: pre-approved, so no "
    '"use this API key?" dialog)',
)
OPENAI_API_KEY = knobs.text(
    "CAO_OPENAI_API_KEY",
    "an OpenAI (or OpenAI-compatible) API key: Codex's model provider's, OpenCode's and Qwen Code's "
    "`OPENAI_API_KEY`, Copilot CLI's own-key mode's",
)

EVERY_CLI = (MODEL_BASE_URL, REALCLI_CACHE)  # every real CLI's launch reads these


def cli_knobs(
    prefix: str,
    command: str,
    cli: str,
    bypass: str,
    *,
    tools: bool = False,
    fake_model: bool = False,
    model_form: str = "",
    vendor_key: str = "",
    venv: str = "",
) -> tuple[Knob[str], Knob[str], Knob[bool]]:
    """``CAO_<prefix>_BIN``, ``_MODEL`` and ``_BYPASS`` of the CLI ``cli``: which ``command`` runs (a
    path or a name, found on the pane's PATH, then in the real-CLI cache: its npm ``.bin``, or the
    virtualenv of the PyPI package ``venv``), its model (``model_form``: how it is named; with
    ``fake_model``, ``fake-model`` against a local server; required with ``vendor_key``), and
    whether its permission prompts are skipped (``bypass`` says how; ``tools``: an agent profile's
    ``allowed_tools`` turn it off)."""
    where = f"venvs/{venv}/bin" if venv else "node_modules/.bin"
    model = f"the model{f' as {model_form}' if model_form else ''}; overrides the agent profile's"
    shown = "the profile's `model`" + ("" if vendor_key else ", else the CLI's default")
    return (
        knobs.text(
            f"CAO_{prefix}_BIN",
            f"the `{command}` to run: a path, or a command looked up on `PATH`, then in "
            f"`$CAO_REALCLI_CACHE/{where}`",
            default=command,
        ),
        knobs.text(
            f"CAO_{prefix}_MODEL",
            model + (f" (one of them is required with `{vendor_key}`)" if vendor_key else ""),
            shown=shown + (" (`fake-model` against `CAO_MODEL_BASE_URL`)" if fake_model else ""),
        ),
        knobs.flag(
            f"CAO_{prefix}_BYPASS",
            True,
            f"skip {cli}'s permission prompts ({bypass}); false makes tool use ask (the terminal shows "
            "`waiting_user_answer`)",
            shown="true (false when the agent profile has `allowed_tools`)" if tools else "",
        ),
    )


def vendor_knobs(prefix: str, key: str, url: str) -> tuple[Knob[str], Knob[str]]:
    """``CAO_<prefix>_API_KEY`` (``key`` says whose) and ``CAO_<prefix>_BASE_URL`` (else ``url``), for
    :func:`vendor_or_local`."""
    return (
        knobs.text(f"CAO_{prefix}_API_KEY", f"{key}; needs a model (`CAO_{prefix}_MODEL` or the profile's)"),
        knobs.text(f"CAO_{prefix}_BASE_URL", f"the endpoint for `CAO_{prefix}_API_KEY`", shown=f"`{url}`"),
    )


def pane_env(ctx: LaunchContext, **extra: str) -> dict[str, str]:
    """The pane's environment, built from nothing: cao's allow-listed base, ``SHELL`` (the CLIs'
    shell tools need one: ``/bin/bash`` unless the base has it), ``HOME`` = the terminal's throwaway
    home, and ``extra`` (the CLI's own variables)."""
    env = dict(ctx.base_env)
    env.setdefault("SHELL", "/bin/bash")
    env.update(HOME=str(ctx.terminal_home), **extra)
    return env


def cao_mcp_server(ctx: LaunchContext) -> dict[str, Any]:
    """cao's own MCP server for this terminal (stdio: ``command``, ``args``, ``env``): its tools act
    as this terminal."""
    return {
        "command": sys.executable,
        "args": ["-P", "-m", "cao.mcp"],  # -P: a project's own cao/ package must not run instead
        "env": {
            "CAO_TERMINAL_ID": ctx.terminal_id,
            "CAO_SERVER_URL": ctx.server_url,
            "CAO_HOME": str(ctx.cao_home),  # where cao-server publishes its API token
        },
    }


def mcp_servers(ctx: LaunchContext, *, url_key: str = "url") -> dict[str, dict[str, Any]]:
    """The agent profile's MCP servers (copies: the provider may reshape them for its CLI) and cao's
    (:func:`cao_mcp_server`), which always wins the name ``cao``. ``url_key``: the CLI's name for a
    streamable-HTTP server's address (Gemini CLI's and Qwen Code's ``httpUrl``)."""
    servers = {name: dict(spec) for name, spec in (ctx.profile.mcp_servers if ctx.profile else {}).items()}
    for spec in servers.values():
        if "url" in spec and url_key != "url":
            spec[url_key] = spec.pop("url")
    servers["cao"] = cao_mcp_server(ctx)
    return servers


def model_name(ctx: LaunchContext, knob: Knob[str], fallback: str = "") -> str:
    """The model: ``$knob``, else the agent profile's, else ``fallback`` ("" for the CLI's own)."""
    return ctx.knob(knob) or (ctx.profile.model if ctx.profile else None) or fallback


def system_prompt(ctx: LaunchContext) -> str:
    """The agent profile's system prompt ("" without one)."""
    return ctx.profile.system_prompt if ctx.profile and ctx.profile.system_prompt else ""


def allowed_tools(ctx: LaunchContext) -> list[str] | None:
    """The agent profile's tool allow-list; None: the CLI's own defaults (and bypass stays on)."""
    tools = ctx.profile.allowed_tools if ctx.profile else None
    return None if tools is None else list(tools)


class Endpoint(NamedTuple):
    base_url: str
    key: str
    model: str
    local: bool  # the local model server (CAO_MODEL_BASE_URL), not the vendor's API


def vendor_or_local(
    ctx: LaunchContext,
    key: Knob[str],
    url: Knob[str],
    vendor_url: str,
    model: Knob[str],
    *,
    needs_model: str,
    no_credentials: str,
) -> Endpoint:
    """Where a CLI with one API of its own (Kimi CLI: Moonshot's, Hermes: OpenRouter) talks to:
    ``$key`` at ``$url`` (else ``vendor_url``) with a model that must be named (``$model`` or the
    profile's; ``needs_model`` says so), else the local model server (``fake-model`` unless one is
    named), else nowhere: ``no_credentials`` says what to set."""
    chosen = model_name(ctx, model)
    if api_key := ctx.knob(key):
        if not chosen:
            raise ProviderError(needs_model)
        return Endpoint(ctx.knob(url) or vendor_url, api_key, chosen, local=False)
    if local := ctx.knob(MODEL_BASE_URL).rstrip("/"):
        return Endpoint(f"{local}/v1", LOCAL_KEY, chosen or "fake-model", local=True)
    raise ProviderError(no_credentials)


def gemini_settings(ctx: LaunchContext, auth: str, general: dict[str, bool]) -> dict[str, Any]:
    """The ``settings.json`` of Gemini CLI and of Qwen Code (its fork, same schema): ``auth`` as the
    selected auth type, folder trust, usage statistics, telemetry and the IDE integration off, tips
    hidden, ``general`` (the update switches, named differently in each) and the MCP servers."""
    return {
        "security": {"auth": {"selectedType": auth}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": general,
        "telemetry": {"enabled": False},
        "ide": {"enabled": False},
        "ui": {"hideTips": True},
        "mcpServers": mcp_servers(ctx, url_key="httpUrl"),  # their name for a streamable-HTTP address
    }


# Claude Code's lifecycle hooks and what they mean (Codex 0.171, Qwen Code and Kimi CLI run hooks
# in Claude's format, with Claude's event names and payloads; each adds or drops a few).
CLAUDE_HOOK_PHASES = {
    "SessionStart": HookPhase.SESSION_START,
    "UserPromptSubmit": HookPhase.TURN_START,
    "Stop": HookPhase.TURN_END,
    "SessionEnd": HookPhase.SESSION_END,
}


def command_hooks(
    ctx: LaunchContext,
    source: str,
    events: Iterable[str],
    *,
    timeout: int,
    matcher: str | None = None,
    name: str | None = None,
) -> dict[str, object]:
    """Claude Code's ``hooks`` shape (also Codex's hooks.json, Qwen Code's and Gemini CLI's
    settings): for each event one command hook running cao's hook program for this terminal
    (cao/hook.py). ``timeout`` is in the CLI's unit; ``matcher``/``name`` where the CLI has them."""
    hooks: dict[str, object] = {}
    for event in events:
        hook: dict[str, object] = {"type": "command", "command": shlex.join(ctx.hook_command(source, event))}
        if name is not None:
            hook = {"name": name, **hook}
        hook["timeout"] = timeout
        entry: dict[str, object] = (
            {"hooks": [hook]} if matcher is None else {"matcher": matcher, "hooks": [hook]}
        )
        hooks[event] = [entry]
    return hooks


def _cache(ctx: LaunchContext) -> Path:
    home = Path(ctx.base_env.get("HOME") or "~").expanduser()
    return ctx.knob(REALCLI_CACHE) or home / ".cache" / "cao" / "realcli"


def _which(ctx: LaunchContext, knob: Knob[str], last: Path) -> str | None:
    """``$knob`` (a path or a name; its default is the command), on the pane's PATH, else in ``last``."""
    for path in (ctx.base_env.get("PATH", ""), str(last)):
        if found := shutil.which(ctx.knob(knob), path=path):
            return found
    return None


def find_cli(ctx: LaunchContext, knob: Knob[str], package: str) -> str:
    """The npm CLI ``$knob`` names (a path or a name): on the pane's PATH, else in the real-CLI cache."""
    bin_dir = _cache(ctx) / "node_modules" / ".bin"
    if found := _which(ctx, knob, bin_dir):
        return found
    raise ProviderError(
        f"{ctx.knob(knob)} not found (on PATH or in {bin_dir}); install it with `npm install -g {package}`"
        f" or set {knob.name}=/path/to/{knob.default} for cao-server"
    )


def find_venv_cli(
    ctx: LaunchContext, knob: Knob[str], package: str, release: str, extra: str = "", note: str = ""
) -> str:
    """The Python CLI ``$knob`` names: on the pane's PATH, else in the real-CLI cache's virtualenv for
    it (``<cache>/venvs/<package>/bin``, tests/realcli/bed.py). ``extra``: the package's extra the CLI
    needs, ``note``: a word on the release; both go in the install hint."""
    venv = _cache(ctx) / "venvs" / package / "bin"
    if found := _which(ctx, knob, venv):
        return found
    raise ProviderError(
        f"{ctx.knob(knob)} not found (on PATH or in {venv}); install it with "
        f"`pip install '{package}{f'[{extra}]' if extra else ''}=={release}'`{f' ({note})' if note else ''} "
        f"or set {knob.name}=/path/to/{knob.default} for cao-server"
    )


def npm_version(binary: str, package: str) -> tuple[int, ...] | None:
    """The release of ``package`` when ``binary`` is its npm-installed command (read from the
    ``package.json`` above the resolved script), so a launch can leave out a flag an older release
    would reject; None when it can't tell (another install, a wrapper, no manifest)."""
    path = Path(binary).resolve()
    for parent in list(path.parents)[:3]:
        if (manifest := parent / "package.json").is_file():
            try:
                data = json.loads(manifest.read_text())
            except (OSError, ValueError):
                return None
            found = re.match(r"(\d+)\.(\d+)\.(\d+)", str(data.get("version", "")))
            return (
                tuple(int(part) for part in found.groups()) if found and data.get("name") == package else None
            )
    return None
