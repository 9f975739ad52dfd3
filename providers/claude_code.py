"""Provider for Claude Code (``claude``, npm ``@anthropic-ai/claude-code``; tested with 2.1.197).

Launch: a throwaway HOME per terminal seeded so no first-run dialog shows (onboarding, "use this
API key?", folder trust, bypass warning), the pane environment built from nothing, and the cao MCP
server passed with ``--mcp-config``. Knobs (read from the server's ``CAO_*`` environment):
``CAO_CLAUDE_BIN``, ``CAO_CLAUDE_MODEL``, ``CAO_CLAUDE_BYPASS`` (default true),
``CAO_MODEL_BASE_URL`` (a local model server, e.g. the test fake), ``CAO_ANTHROPIC_API_KEY``,
``CAO_CLAUDE_CODE_OAUTH_TOKEN``. The agent profile: its prompt via ``--append-system-prompt-file``,
its model, its ``allowed_tools`` as ``--allowedTools`` (bypass then defaults to off) and its extra
MCP servers. See docs/providers.md.

Screen (``capture-pane -p``)::

    ❯ echoed user turn                  (❯ + normal space)
    ● answer text                       (tool calls are ● blocks too: ● Bash(echo hi))
    ✻ Worked for 6s                     (turn closed; while busy: ✽ Honking…)
    ────────────────────
    ❯\u00a0text being typed              (the input box: ❯ + NO-BREAK SPACE)
    ────────────────────
      ⏵⏵ bypass permissions on · esc to interrupt      (footer; "esc to interrupt" = busy)

Traps: the box stays on screen while busy (the footer decides); menu lines (``❯ 1. Yes``) start
like echoes; a message pasted while busy is queued as its own turn and the box then reads
``Press up to edit queued messages`` (a placeholder, i.e. empty).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from cao import knobs
from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, box_between_rules, bullet_blocks, exited

BIN, MODEL, BYPASS = cli.cli_knobs(
    "CLAUDE", "claude", "Claude Code", "`--dangerously-skip-permissions`", tools=True
)
OAUTH_TOKEN = knobs.text(
    "CAO_CLAUDE_CODE_OAUTH_TOKEN",
    "a subscription token from `claude setup-token`, passed as `CLAUDE_CODE_OAUTH_TOKEN`",
)
FAKE_KEY = "sk-ant-api03-cao-local-model-server-key-0123456789abcdef"
RULE_RE = rule("box_rule", r"^─{10,}$")
BOX_RE = rule("box", r"^[❯>]\u00a0")  # the input box: ❯ (">" before 2.0) + NO-BREAK SPACE
ECHO_RE = rule("echo", r"^[❯>] (?!\d+\. )")  # a user turn; "❯ 1. Yes" is a menu option
# A menu's cursor line (framed, "│ ❯ 1. Yes │", before 2.0), or the key hint under a prompt or dialog
# whose cursor line isn't a numbered option.
ASKING_RE = rule("asking", r"^[│\s]*❯ \d+\. |^\s*(?:Enter to (?:confirm|select)|Esc to cancel) · ")
QUEUED_RE = rule("queued", r"^  ❯ ")  # a message typed while busy, waiting for its turn
BUSY_FOOTER_RE = rule("busy_footer", r"esc to interrupt")  # under the box while a turn runs
SPINNER_RE = rule("spinner", r"^[·✢✳✶✻✽*] \S.*…")
ERROR_RE = rule(
    "error", r"^(API Error|Invalid API key|Credit balance is too low|OAuth token|Request timed out)"
)
# The empty box: with a message queued, or 1.0.x's example prompt.
PLACEHOLDER_RE = rule("placeholder", r'Press up to edit queued messages|Try "[^"]*"')
# A ``projects`` entry of ~/.claude.json in the full shape 1.0.x needs (with only the trust flag it
# crashes at start: "allowedTools is not iterable"); later releases read it as well.
PROJECT = {
    "hasTrustDialogAccepted": True,
    "allowedTools": [],
    "mcpContextUris": [],
    "mcpServers": {},
    "enabledMcpjsonServers": [],
    "disabledMcpjsonServers": [],
    "hasCompletedProjectOnboarding": True,
}
# Lifecycle hooks (in ~/.claude/settings.json; every release since 1.0.85 has these five).
HOOK_EVENTS = (*cli.CLAUDE_HOOK_PHASES, "Notification", "PermissionRequest")  # the last one since 2.0

RESULT = "  ⎿"  # a tool's result; right under a user turn (before 2.1), the turn's API error


def _env(ctx: LaunchContext, bypass: bool) -> tuple[dict[str, str], str]:
    """The pane's environment and the API key in it ("" with only an OAuth token)."""
    env = cli.pane_env(
        ctx,
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    key = ctx.knob(cli.ANTHROPIC_API_KEY)
    if base_url := ctx.knob(cli.MODEL_BASE_URL):
        env["ANTHROPIC_BASE_URL"] = base_url
        key = key or FAKE_KEY
    if token := ctx.knob(OAUTH_TOKEN):
        env["CLAUDE_CODE_OAUTH_TOKEN"] = token
    elif not key:
        raise ProviderError(
            "claude_code has no credentials: set CAO_ANTHROPIC_API_KEY (or CAO_CLAUDE_CODE_OAUTH_TOKEN "
            "from `claude setup-token`, or CAO_MODEL_BASE_URL for a local model server) for cao-server"
        )
    if key:
        env["ANTHROPIC_API_KEY"] = key
    if bypass and os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # root + --dangerously-skip-permissions needs exactly this
    return env, key


class ClaudeCodeProvider(BoxedTUI):
    name = "claude_code"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "Claude Code (Anthropic), `claude`"
    accepts_input_while_processing = True
    submit_timeout = 3.0
    idle_tail_pattern = rule("idle_tail", r"^(?!.*esc to interrupt)")
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, cli.ANTHROPIC_API_KEY, OAUTH_TOKEN)
    hook_phases = cli.CLAUDE_HOOK_PHASES
    interrupt_key = "Escape"  # "esc to interrupt"; used only where the hook channel can't be
    turn_channel = "PostToolUse"  # additionalContext: in the model's next request of the turn (2.1.197)
    trailing = " "  # keeps the box's NO-BREAK SPACE
    placeholder = PLACEHOLDER_RE
    echo = ECHO_RE
    asking = ASKING_RE
    asking_reason = "a menu or a dialog's key hint"
    starting_reason = "starting: nothing drawn yet"
    no_box = (
        "no input box (❯ between two ──── rules), menu or dialog on screen: still starting, or a "
        "screen of a Claude Code release this provider does not know"
    )

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its transcripts' ``message.usage`` (providers/usage_files.py)."""
        return usage_files.claude(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        # A profile's tool allow-list means "ask before anything else", so it turns bypass off.
        allowed = cli.allowed_tools(ctx)
        bypass = ctx.knob(BYPASS, allowed is None)
        env, key = _env(ctx, bypass)
        binary = cli.find_cli(ctx, BIN, "@anthropic-ai/claude-code")
        version = cli.npm_version(binary, "@anthropic-ai/claude-code")
        state = {
            "hasCompletedOnboarding": True,
            "customApiKeyResponses": {"approved": [key[-20:]] if key else [], "rejected": []},
            "bypassPermissionsModeAccepted": True,  # before 2.1: the bypass warning's answer
            "projects": {str(ctx.working_directory): PROJECT},
        }
        settings: dict[str, object] = {
            "skipDangerousModePermissionPrompt": True,
            "promptSuggestionEnabled": False,
        }
        channel: str | None = None
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hookstate.py)
            events = HOOK_EVENTS if version is None or version >= (2, 0) else HOOK_EVENTS[:-1]
            if version is None or version >= (2, 1):  # PostToolUse additionalContext: proven on 2.1
                events = (*events, "PostToolUse")
                channel = self.turn_channel
            settings["hooks"] = cli.command_hooks(ctx, "claude", events, timeout=10)
        servers = cli.mcp_servers(ctx)
        for spec in servers.values():
            if "url" in spec:
                spec.setdefault("type", "http")
        files = {
            home / ".claude.json": json.dumps(state, indent=2),
            home / ".claude" / "settings.json": json.dumps(settings, indent=2),
            home / "mcp.json": json.dumps({"mcpServers": servers}, indent=2),
        }
        command = [binary, "--mcp-config", str(home / "mcp.json")]
        if model := cli.model_name(ctx, MODEL):
            command += ["--model", model]
        if prompt := cli.system_prompt(ctx):
            if version is not None and version < (2, 1):  # no --append-system-prompt-file yet
                command += ["--append-system-prompt", prompt]
            else:
                files[home / "system-prompt.md"] = prompt
                command += ["--append-system-prompt-file", str(home / "system-prompt.md")]
        if allowed is not None:
            command += ["--allowedTools", ",".join([*allowed, "mcp__cao"])]
        if bypass:
            command.append("--dangerously-skip-permissions")
        return LaunchSpec(command=command, env=env, files=files, turn_channel=channel)

    def hook_phase(self, event: str, payload: Mapping[str, object]) -> HookPhase | None:
        if event == "Notification":  # permission_prompt (after ~6 s), idle_prompt (after 60 s idle)
            kind = str(payload.get("notification_type") or "")
            text = str(payload.get("message") or "").lower()
            if kind in ("permission_prompt", "elicitation_dialog") or "permission" in text:
                return HookPhase.ASKING
            if kind == "idle_prompt" or "waiting for your input" in text:
                return HookPhase.TURN_END
            return None
        if event == "PermissionRequest":  # 2.0 and later, as the permission prompt opens
            return HookPhase.ASKING
        return super().hook_phase(event, payload)

    def find_box(self, lines: list[str]) -> Box | None:
        return box_between_rules(lines, RULE_RE, BOX_RE)

    def quit_reason(self, lines: list[str]) -> str | None:
        """The pane is dead or shows the resume hint (2.1), 1.0's cost summary under the box, or
        ``/exit`` as the last user turn (2.0 and 1.0 leave their box on screen)."""
        if exited(lines):
            return "the CLI has exited (pane dead, or its resume hint)"
        if any(line.startswith("Total cost:") for line in lines[-12:]):
            return "the CLI has exited (its cost summary is under the box)"
        echoes = [line[2:].strip() for line in lines if ECHO_RE.match(line)]
        if echoes and echoes[-1] in ("/exit", "/quit"):
            return f"the CLI was told to {echoes[-1]}"
        return None

    def continues(self, line: str) -> bool:
        return line.startswith("  ") and not line.startswith(RESULT)

    def blocks(self, lines: list[str]) -> list[str]:
        """The ``● …`` blocks (answers, tool calls, errors). Before 2.1 a failed turn shows no ``●``
        block but ``  ⎿  API Error: …`` right under the user's line: that opens the turn's lines
        here, and reads as a block too."""
        first = next((i for i, line in enumerate(lines) if line.strip()), None)
        if first is not None and lines[first].startswith(RESULT):
            lines = [*lines[:first], "● " + lines[first][len(RESULT) :].strip(" \u00a0"), *lines[first + 1 :]]
        return bullet_blocks(lines, ("● ",))

    def queued(self, lines: list[str], box: Box | None, transcript: list[str]) -> int:
        return sum(1 for line in transcript if QUEUED_RE.match(line))

    def with_box(self, lines: list[str], box: Box) -> Reading:
        if any(BUSY_FOOTER_RE.search(line) for line in lines[box.end + 1 :]):
            return Reading(TerminalStatus.PROCESSING, "footer: esc to interrupt")
        transcript = lines[: box.top]
        turn = self.turn(transcript)
        if any(SPINNER_RE.match(line) for line in turn or ()):
            return Reading(TerminalStatus.PROCESSING, "a spinner line after the last user turn")
        blocks = self.blocks(transcript if turn is None else turn)
        if not blocks:  # nothing answered yet (a long echo may have scrolled the start away)
            if turn is None:
                return Reading(TerminalStatus.IDLE, "the input box, no turn on screen")
            return Reading(TerminalStatus.COMPLETED, "the input box after a user turn")
        if ERROR_RE.match(blocks[-1]):
            return Reading(TerminalStatus.ERROR, "the last turn ends in an API error")
        return Reading(TerminalStatus.COMPLETED, "the input box after an answered turn")
