"""Provider for GitHub Copilot CLI (``copilot``, npm ``@github/copilot``; tested with 1.0.102).

Launch: a throwaway HOME per terminal with ``~/.copilot/config.json`` seeded so the folder-trust
dialog doesn't show, cao's MCP server passed with ``--additional-mcp-config``, auto-update off.
Two ways to a model: the user's GitHub sign-in as a token (``CAO_COPILOT_GITHUB_TOKEN`` →
``COPILOT_GITHUB_TOKEN``), or Copilot's own-key mode against an OpenAI-compatible endpoint
(``CAO_MODEL_BASE_URL`` for a local server, or ``CAO_COPILOT_PROVIDER_BASE_URL`` with
``CAO_OPENAI_API_KEY``), which needs no GitHub sign-in and runs offline (``COPILOT_OFFLINE``).
Knobs: ``CAO_COPILOT_BIN``, ``CAO_COPILOT_MODEL``, ``CAO_COPILOT_BYPASS`` (default true,
``--allow-all``). The agent profile: its prompt as ``~/.copilot/copilot-instructions.md``, its
model, its ``allowed_tools`` as ``--allow-tool`` (bypass then defaults to off) and its extra MCP
servers. See docs/providers.md.

Screen (``capture-pane -p``, inline: the transcript stays in tmux's scrollback)::

     ❯ echoed user turn                                   04:24
     $ Shell Run a shell command 1 line…                  (tool calls; ✗ for a failed one)
     ● answer text
     /path/to/workdir
    ────────────────────
    ❯ text being typed                                    (the input box)
    ────────────────────
     ← open sidebar · Interactive · Allow All · …          (footer; "◉ Working …" while busy)

Traps: the box stays on screen while busy (the footer decides); info lines (``● Tip``, ``● MCP
Servers reloaded``) use the answer bullet, so only what follows the last user turn counts; a failed
request and a failed tool both show as ``✗ …`` (error = a turn whose last block is one); the footer
drops "Working" about a frame before the answer is drawn.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from cao import knobs
from cao.errors import ProviderError
from cao.knobs import Knob
from providers._cli import (
    LOCAL_KEY,
    MODEL_BASE_URL,
    OPENAI_API_KEY,
    REALCLI_CACHE,
    allowed_tools,
    bullet_blocks,
    cli_knobs,
    find_cli,
    head,
    judge_submit,
    mcp_servers,
    model_name,
    pane_env,
    system_prompt,
)
from providers.base import LaunchContext, LaunchSpec, Provider, TerminalStatus

BIN, MODEL, BYPASS = cli_knobs(
    "COPILOT",
    "copilot",
    cli="Copilot CLI",
    bypass="`--allow-all`",
    bypass_shown="true (false when the agent profile has `allowed_tools`)",
    model_shown="the profile's `model`, else the CLI's default (`fake-model` against `CAO_MODEL_BASE_URL`)",
)
GITHUB_TOKEN = knobs.text(
    "CAO_COPILOT_GITHUB_TOKEN", "a GitHub token with Copilot access, passed as `COPILOT_GITHUB_TOKEN`"
)
PROVIDER_BASE_URL = knobs.text(
    "CAO_COPILOT_PROVIDER_BASE_URL",
    "an OpenAI-compatible endpoint for Copilot's own-key mode (no GitHub sign-in), with `CAO_OPENAI_API_KEY`",
    shown="`$CAO_MODEL_BASE_URL/v1`",
)
RULE_RE = re.compile(r"^─{10,}$")
BOX = "❯"
ECHO_RE = re.compile(r"^ ❯ (?!\d+\. )")
BUSY_RE = re.compile(r"^\s*\S\s+(?:Working|Thinking)\b|\besc to (?:cancel|interrupt)\b", re.I)
MENU_RE = re.compile(r"^[│ ]*❯ \d+\. ")
HINT_RE = re.compile(r"\benter to (?:select|confirm)\b", re.I)
TIME_RE = re.compile(r"\s{2,}\d\d:\d\d$")


def _lines(screen: str) -> list[str]:
    lines = [line.rstrip() for line in screen.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _box(lines: list[str]) -> tuple[int, int] | None:
    """``(first, end)`` of the input box: between the last two full-width rules, opening with ❯."""
    rules = [i for i, line in enumerate(lines) if RULE_RE.match(line)]
    if len(rules) >= 2 and rules[-1] - rules[-2] > 1 and lines[rules[-2] + 1].startswith(BOX):
        return rules[-2] + 1, rules[-1]
    return None


def _transcript(lines: list[str], box: tuple[int, int] | None) -> list[str]:
    return lines[: box[0] - 1] if box else lines


def _turn(transcript: list[str]) -> list[str] | None:
    for i in range(len(transcript) - 1, -1, -1):
        if ECHO_RE.match(transcript[i]):
            j = i + 1
            while j < len(transcript) and transcript[j].startswith("   "):
                j += 1
            return transcript[j:]
    return None


def _marks(screen: str) -> tuple[str | None, int]:
    lines = _lines(screen)
    echoes = [line for line in _transcript(lines, _box(lines)) if ECHO_RE.match(line)]
    return (echoes[-1] if echoes else None), 0


def _blocks(lines: list[str]) -> list[str]:
    """The ``● …`` answers and ``✗ …`` failures in ``lines``, without marker or indent."""
    return bullet_blocks([line[1:] for line in lines], ("● ", "✗ "))


class CopilotProvider(Provider):
    name: ClassVar[str] = "copilot"
    description: ClassVar[str] = "GitHub Copilot CLI, `copilot`"
    accepts_input_while_processing: ClassVar[bool] = False
    waits_for_mcp: ClassVar[bool] = True
    paste_enter_delay: ClassVar[float] = 0.2
    submit_timeout: ClassVar[float] = 4.0
    exit_command: ClassVar[str] = "/exit"
    idle_tail_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^(?!.*Working)")
    knobs: ClassVar[tuple[Knob[Any], ...]] = (
        BIN,
        MODEL,
        BYPASS,
        MODEL_BASE_URL,
        REALCLI_CACHE,
        OPENAI_API_KEY,
        GITHUB_TOKEN,
        PROVIDER_BASE_URL,
    )

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        allowed = allowed_tools(ctx)
        bypass = ctx.knob(BYPASS, allowed is None)
        env = pane_env(ctx, COPILOT_AUTO_UPDATE="false")
        local = ctx.knob(MODEL_BASE_URL).rstrip("/")
        base_url = ctx.knob(PROVIDER_BASE_URL) or (f"{local}/v1" if local else "")
        if base_url:  # own-key mode: no GitHub sign-in
            env.update(
                COPILOT_PROVIDER_BASE_URL=base_url,
                COPILOT_PROVIDER_TYPE="openai",
                COPILOT_PROVIDER_API_KEY=ctx.knob(OPENAI_API_KEY) or LOCAL_KEY,
            )
            if local:  # and limits, else a "not in the built-in catalog" warning at every start
                env.update(
                    COPILOT_OFFLINE="true",
                    COPILOT_PROVIDER_MAX_PROMPT_TOKENS="128000",
                    COPILOT_PROVIDER_MAX_OUTPUT_TOKENS="16384",
                )
        elif token := ctx.knob(GITHUB_TOKEN):
            env["COPILOT_GITHUB_TOKEN"] = token
        else:
            raise ProviderError(
                "copilot has no credentials: set CAO_COPILOT_GITHUB_TOKEN (a token with Copilot access), "
                "or CAO_COPILOT_PROVIDER_BASE_URL with CAO_OPENAI_API_KEY (own-key mode), or "
                "CAO_MODEL_BASE_URL for a local model server, for cao-server"
            )
        if model := model_name(ctx, MODEL, "fake-model" if local else ""):
            env["COPILOT_MODEL"] = model
        servers = mcp_servers(ctx)
        for spec in servers.values():
            spec.setdefault("type", "http" if "url" in spec else "local")
            spec.setdefault("tools", ["*"])
        state = {"trustedFolders": [str(ctx.working_directory)], "appTipShown": True}
        files = {
            home / ".copilot" / "config.json": json.dumps(state, indent=2),
            home / "mcp.json": json.dumps({"mcpServers": servers}, indent=2),
        }
        if prompt := system_prompt(ctx):  # the user-level instructions, read at every start
            files[home / ".copilot" / "copilot-instructions.md"] = prompt
        command = [find_cli(ctx, BIN, "@github/copilot")]
        command += ["--additional-mcp-config", f"@{home / 'mcp.json'}"]
        for tool in [*allowed, "cao"] if allowed is not None else ():
            command += ["--allow-tool", tool]
        if bypass:
            command.append("--allow-all")
        return LaunchSpec(command=command, env=env, files=files)

    def detect_status(self, screen: str) -> TerminalStatus:
        lines = _lines(screen)
        box = _box(lines)
        if box is None:  # a permission prompt, a question or a start-up dialog replaces the box
            if any(MENU_RE.match(line) or HINT_RE.search(line) for line in lines):
                return TerminalStatus.WAITING_USER_ANSWER
            return TerminalStatus.PROCESSING  # starting up
        if any(BUSY_RE.search(line) for line in lines[box[1] + 1 :]):
            return TerminalStatus.PROCESSING
        turn = _turn(_transcript(lines, box))
        if turn is None:
            return TerminalStatus.IDLE
        marks = [line[1] for line in turn if line.startswith((" ● ", " ✗ "))]
        return TerminalStatus.ERROR if marks and marks[-1] == "✗" else TerminalStatus.COMPLETED

    def extract_last_message(self, screen: str) -> str:
        lines = _lines(screen)
        turn = _turn(_transcript(lines, _box(lines)))
        blocks = _blocks(turn if turn is not None else [])
        return blocks[-1] if blocks else ""

    def transcript(self, screen: str) -> str:
        box = _box(_lines(screen))
        return screen if box is None else head(screen, box[0] - 1)

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        return judge_submit(self, before, after, _marks)

    def input_text(self, screen: str) -> str | None:
        lines = _lines(screen)
        box = _box(lines)
        if box is None:
            return None
        first, end = box
        rows = [lines[first][len(BOX) :], *(line[2:] for line in lines[first + 1 : end])]
        return "\n".join(row.rstrip() for row in rows).strip()
