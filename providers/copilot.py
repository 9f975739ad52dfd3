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
servers. Hooks: user-level hook files are read from ``~/.copilot/hooks/*.json`` (the throwaway
home's, so nothing goes into your repository's ``.github/hooks``): ``cao.json`` runs cao's hook
program on ``sessionStart``, ``userPromptSubmitted``, ``agentStop`` and ``sessionEnd``. See
docs/providers.md.

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
import shlex
from pathlib import Path

from cao import knobs
from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, box_between_rules, bullet_blocks

BIN, MODEL, BYPASS = cli.cli_knobs(
    "COPILOT", "copilot", "Copilot CLI", "`--allow-all`", tools=True, fake_model=True
)
GITHUB_TOKEN = knobs.text(
    "CAO_COPILOT_GITHUB_TOKEN", "a GitHub token with Copilot access, passed as `COPILOT_GITHUB_TOKEN`"
)
PROVIDER_BASE_URL = knobs.text(
    "CAO_COPILOT_PROVIDER_BASE_URL",
    "an OpenAI-compatible endpoint for Copilot's own-key mode (no GitHub sign-in), with `CAO_OPENAI_API_KEY`",
    shown="`$CAO_MODEL_BASE_URL/v1`",
)
RULE_RE = rule("box_rule", r"^─{10,}$")
BOX_RE = rule("box", r"❯")
ECHO_RE = rule("echo", r"^ ❯ (?!\d+\. )")
BUSY_RE = rule("busy", r"^\s*\S\s+(?:Working|Thinking)\b|\besc to (?:cancel|interrupt)\b", re.I)
ASKING_RE = rule("asking", r"^[│ ]*❯ \d+\. |\benter to (?:select|confirm)\b", re.I)  # a menu, its key hint

HOOK_PHASES = {
    "sessionStart": HookPhase.SESSION_START,
    "userPromptSubmitted": HookPhase.TURN_START,
    "agentStop": HookPhase.TURN_END,  # the main agent's turn (a subagent's is subagentStop: not used)
    "sessionEnd": HookPhase.SESSION_END,
}


def hook_file(ctx: LaunchContext) -> str:
    """``~/.copilot/hooks/cao.json``: one command hook per event (``bash``: a command line)."""
    hooks = {
        event: [{"type": "command", "bash": shlex.join(ctx.hook_command("copilot", event)), "timeoutSec": 10}]
        for event in HOOK_PHASES
    }
    return json.dumps({"version": 1, "hooks": hooks}, indent=2)


class CopilotProvider(BoxedTUI):
    name = "copilot"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "GitHub Copilot CLI, `copilot`"
    idle_tail_pattern = rule("idle_tail", r"^(?!.*Working)")
    prompt_width = 1
    echo = ECHO_RE
    continuation = "   "
    asking = ASKING_RE
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, cli.OPENAI_API_KEY, GITHUB_TOKEN, PROVIDER_BASE_URL)
    hook_phases = HOOK_PHASES

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its session events' ``session.usage_record`` (providers/usage_files.py)."""
        return usage_files.copilot(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        allowed = cli.allowed_tools(ctx)
        bypass = ctx.knob(BYPASS, allowed is None)
        env = cli.pane_env(ctx, COPILOT_AUTO_UPDATE="false")
        local = ctx.knob(cli.MODEL_BASE_URL).rstrip("/")
        base_url = ctx.knob(PROVIDER_BASE_URL) or (f"{local}/v1" if local else "")
        if base_url:  # own-key mode: no GitHub sign-in
            env.update(
                COPILOT_PROVIDER_BASE_URL=base_url,
                COPILOT_PROVIDER_TYPE="openai",
                COPILOT_PROVIDER_API_KEY=ctx.knob(cli.OPENAI_API_KEY) or cli.LOCAL_KEY,
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
        if model := cli.model_name(ctx, MODEL, "fake-model" if local else ""):
            env["COPILOT_MODEL"] = model
        servers = cli.mcp_servers(ctx)
        for spec in servers.values():
            spec.setdefault("type", "http" if "url" in spec else "local")
            spec.setdefault("tools", ["*"])
        state = {"trustedFolders": [str(ctx.working_directory)], "appTipShown": True}
        files = {
            home / ".copilot" / "config.json": json.dumps(state, indent=2),
            home / "mcp.json": json.dumps({"mcpServers": servers}, indent=2),
        }
        if prompt := cli.system_prompt(ctx):  # the user-level instructions, read at every start
            files[home / ".copilot" / "copilot-instructions.md"] = prompt
        if ctx.hooks:
            files[home / ".copilot" / "hooks" / "cao.json"] = hook_file(ctx)
        command = [cli.find_cli(ctx, BIN, "@github/copilot")]
        command += ["--additional-mcp-config", f"@{home / 'mcp.json'}"]
        for tool in [*allowed, "cao"] if allowed is not None else ():
            command += ["--allow-tool", tool]
        if bypass:
            command.append("--allow-all")
        return LaunchSpec(command=command, env=env, files=files)

    def find_box(self, lines: list[str]) -> Box | None:
        return box_between_rules(lines, RULE_RE, BOX_RE)

    def blocks(self, lines: list[str]) -> list[str]:
        """The ``● …`` answers and ``✗ …`` failures in ``lines``, without marker or indent."""
        return bullet_blocks([line[1:] for line in lines], ("● ", "✗ "))

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        """Only what follows the last user turn: info lines (``● Tip``) use the answer bullet too."""
        turn = self.turn(lines[: box.top] if box else lines)
        blocks = self.blocks(turn if turn is not None else [])
        return blocks[-1] if blocks else ""

    def with_box(self, lines: list[str], box: Box) -> Reading:
        if any(BUSY_RE.search(line) for line in lines[box.end + 1 :]):
            return Reading(TerminalStatus.PROCESSING)
        turn = self.turn(lines[: box.top])
        if turn is None:
            return Reading(TerminalStatus.IDLE)
        marks = [line[1] for line in turn if line.startswith((" ● ", " ✗ "))]
        return Reading(TerminalStatus.ERROR if marks and marks[-1] == "✗" else TerminalStatus.COMPLETED)
