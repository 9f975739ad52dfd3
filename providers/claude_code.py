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
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from cao import knobs
from cao.errors import ProviderError
from cao.knobs import Knob
from cao.states import HookPhase
from providers._cli import (
    ANTHROPIC_API_KEY,
    CLAUDE_HOOK_PHASES,
    MODEL_BASE_URL,
    REALCLI_CACHE,
    allowed_tools,
    bullet_blocks,
    cli_knobs,
    command_hooks,
    exited,
    find_cli,
    head,
    judge_submit,
    mcp_servers,
    model_name,
    npm_version,
    pane_env,
    system_prompt,
)
from providers.base import LaunchContext, LaunchSpec, Provider, Reading, TerminalStatus

BIN, MODEL, BYPASS = cli_knobs(
    "CLAUDE",
    "claude",
    cli="Claude Code",
    bypass="`--dangerously-skip-permissions`",
    bypass_shown="true (false when the agent profile has `allowed_tools`)",
)
OAUTH_TOKEN = knobs.text(
    "CAO_CLAUDE_CODE_OAUTH_TOKEN",
    "a subscription token from `claude setup-token`, passed as `CLAUDE_CODE_OAUTH_TOKEN`",
)
FAKE_KEY = "sk-ant-api03-cao-local-model-server-key-0123456789abcdef"
RULE_RE = re.compile(r"^─{10,}$")
BOX_RE = re.compile(r"^[❯>]\u00a0")  # the input box: ❯ (">" before 2.0) + NO-BREAK SPACE
ECHO_RE = re.compile(r"^[❯>] (?!\d+\. )")  # a user turn; "❯ 1. Yes" is a menu option
MENU_RE = re.compile(r"^[│\s]*❯ \d+\. ")  # framed (│ ❯ 1. Yes │) before 2.0
# The key hint under a prompt or dialog, for one whose cursor line isn't a numbered option.
HINT_RE = re.compile(r"^\s*(?:Enter to (?:confirm|select)|Esc to cancel) · ")
QUEUED_RE = re.compile(r"^  ❯ ")  # a message typed while busy, waiting for its turn
SPINNER_RE = re.compile(r"^[·✢✳✶✻✽*] \S.*…")
ERROR_RE = re.compile(r"^(API Error|Invalid API key|Credit balance is too low|OAuth token|Request timed out)")
PLACEHOLDERS = ("Press up to edit queued messages",)
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
HINT_IN_BOX_RE = re.compile(r'^Try "[^"]*"$')  # 1.0.x's example prompt in the empty box
# Lifecycle hooks (in ~/.claude/settings.json; every release since 1.0.85 has these five).
HOOK_EVENTS = (*CLAUDE_HOOK_PHASES, "Notification", "PermissionRequest")  # the last one since 2.0

RESULT = "  ⎿"  # a tool's result; right under a user turn (before 2.1), the turn's API error


def _lines(screen: str) -> list[str]:
    lines = [line.rstrip(" ") for line in screen.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _box(lines: list[str]) -> tuple[int, int] | None:
    """``(first, end)`` of the input box: between the last two full-width rules, opening with ❯+NBSP."""
    rules = [i for i, line in enumerate(lines) if RULE_RE.match(line)]
    if len(rules) >= 2 and rules[-1] - rules[-2] > 1 and BOX_RE.match(lines[rules[-2] + 1]):
        return rules[-2] + 1, rules[-1]
    return None


def _turn(transcript: list[str]) -> list[str] | None:
    """Lines after the last echoed user turn (its continuation lines skipped); None if none shows."""
    for i in range(len(transcript) - 1, -1, -1):
        if ECHO_RE.match(transcript[i]):
            j = i + 1
            while (
                j < len(transcript)
                and transcript[j].startswith("  ")
                and not transcript[j].startswith(RESULT)
            ):
                j += 1
            return transcript[j:]
    return None


def _quit(lines: list[str]) -> str | None:
    """Why the screen is a Claude that quit, or None: the pane is dead or shows the resume hint
    (2.1), 1.0's cost summary under the box, or ``/exit`` as the last user turn (2.0 and 1.0 leave
    their box on screen)."""
    if exited(lines):
        return "the CLI has exited (pane dead, or its resume hint)"
    if any(line.startswith("Total cost:") for line in lines[-12:]):
        return "the CLI has exited (its cost summary is under the box)"
    echoes = [line[2:].strip() for line in lines if ECHO_RE.match(line)]
    if echoes and echoes[-1] in ("/exit", "/quit"):
        return f"the CLI was told to {echoes[-1]}"
    return None


def _marks(screen: str) -> tuple[str | None, int]:
    """What a submit adds: (the last echoed user turn's first line, how many inputs are queued)."""
    lines = _lines(screen)
    box = _box(lines)
    transcript = lines[: box[0] - 1] if box else lines
    echoes = [line for line in transcript if ECHO_RE.match(line)]
    return (echoes[-1] if echoes else None), sum(1 for line in transcript if QUEUED_RE.match(line))


def _blocks(lines: list[str]) -> list[str]:
    """The ``● …`` blocks (answers, tool calls, errors) in ``lines``, each without its bullet/indent.

    Before 2.1 a failed turn shows no ``●`` block but ``  ⎿  API Error: …`` right under the user's
    line: that opens the turn's lines here, and reads as a block too."""
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is not None and lines[first].startswith(RESULT):
        lines = [*lines[:first], "● " + lines[first][len(RESULT) :].strip(" \u00a0"), *lines[first + 1 :]]
    return bullet_blocks(lines, ("● ",))


def _env(ctx: LaunchContext, bypass: bool) -> tuple[dict[str, str], str]:
    """The pane's environment and the API key in it ("" with only an OAuth token)."""
    env = pane_env(
        ctx,
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
    )
    key = ctx.knob(ANTHROPIC_API_KEY)
    if base_url := ctx.knob(MODEL_BASE_URL):
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


class ClaudeCodeProvider(Provider):
    name: ClassVar[str] = "claude_code"
    description: ClassVar[str] = "Claude Code (Anthropic), `claude`"
    accepts_input_while_processing: ClassVar[bool] = True
    waits_for_mcp: ClassVar[bool] = True
    paste_enter_delay: ClassVar[float] = 0.2
    submit_timeout: ClassVar[float] = 3.0
    exit_command: ClassVar[str] = "/exit"
    idle_tail_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^(?!.*esc to interrupt)")
    knobs: ClassVar[tuple[Knob[Any], ...]] = (
        BIN,
        MODEL,
        BYPASS,
        MODEL_BASE_URL,
        REALCLI_CACHE,
        ANTHROPIC_API_KEY,
        OAUTH_TOKEN,
    )
    hook_phases: ClassVar[Mapping[str, HookPhase]] = CLAUDE_HOOK_PHASES

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        # A profile's tool allow-list means "ask before anything else", so it turns bypass off.
        allowed = allowed_tools(ctx)
        bypass = ctx.knob(BYPASS, allowed is None)
        env, key = _env(ctx, bypass)
        binary = find_cli(ctx, BIN, "@anthropic-ai/claude-code")
        version = npm_version(binary, "@anthropic-ai/claude-code")
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
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hooks.py)
            events = HOOK_EVENTS if version is None or version >= (2, 0) else HOOK_EVENTS[:-1]
            settings["hooks"] = command_hooks(ctx, "claude", events, timeout=10)
        servers = mcp_servers(ctx)
        for spec in servers.values():
            if "url" in spec:
                spec.setdefault("type", "http")
        files = {
            home / ".claude.json": json.dumps(state, indent=2),
            home / ".claude" / "settings.json": json.dumps(settings, indent=2),
            home / "mcp.json": json.dumps({"mcpServers": servers}, indent=2),
        }
        command = [binary, "--mcp-config", str(home / "mcp.json")]
        if model := model_name(ctx, MODEL):
            command += ["--model", model]
        if prompt := system_prompt(ctx):
            if version is not None and version < (2, 1):  # no --append-system-prompt-file yet
                command += ["--append-system-prompt", prompt]
            else:
                files[home / "system-prompt.md"] = prompt
                command += ["--append-system-prompt-file", str(home / "system-prompt.md")]
        if allowed is not None:
            command += ["--allowedTools", ",".join([*allowed, "mcp__cao"])]
        if bypass:
            command.append("--dangerously-skip-permissions")
        return LaunchSpec(command=command, env=env, files=files)

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

    def detect_status(self, screen: str) -> TerminalStatus:
        return self.detect(screen).status

    def detect(self, screen: str) -> Reading:
        lines = _lines(screen)
        if quit_ := _quit(lines):
            return Reading(TerminalStatus.UNKNOWN, quit_, final=True)
        box = _box(lines)
        if box is None:  # a permission prompt, a question or a dialog replaces the box
            if any(MENU_RE.match(line) or HINT_RE.match(line) for line in lines):
                return Reading(TerminalStatus.WAITING_USER_ANSWER, "a menu or a dialog's key hint")
            if not lines:
                return Reading(TerminalStatus.PROCESSING, "starting: nothing drawn yet")
            return Reading(
                TerminalStatus.UNKNOWN,
                "no input box (❯ between two ──── rules), menu or dialog on screen: still starting, "
                "or a screen of a Claude Code release this provider does not know",
            )
        first, end = box
        if any("esc to interrupt" in line for line in lines[end + 1 :]):
            return Reading(TerminalStatus.PROCESSING, "footer: esc to interrupt")
        transcript = lines[: first - 1]
        turn = _turn(transcript)
        if any(SPINNER_RE.match(line) for line in turn or ()):
            return Reading(TerminalStatus.PROCESSING, "a spinner line after the last user turn")
        blocks = _blocks(transcript if turn is None else turn)
        if not blocks:  # nothing answered yet (a long echo may have scrolled the start away)
            if turn is None:
                return Reading(TerminalStatus.IDLE, "the input box, no turn on screen")
            return Reading(TerminalStatus.COMPLETED, "the input box after a user turn")
        if ERROR_RE.match(blocks[-1]):
            return Reading(TerminalStatus.ERROR, "the last turn ends in an API error")
        return Reading(TerminalStatus.COMPLETED, "the input box after an answered turn")

    def extract_last_message(self, screen: str) -> str:
        lines = _lines(screen)
        box = _box(lines)
        transcript = lines[: box[0] - 1] if box else lines
        turn = _turn(transcript)
        blocks = _blocks(transcript if turn is None else turn)
        return blocks[-1] if blocks else ""

    def transcript(self, screen: str) -> str:
        """Everything above the rule that opens the input box (queued inputs included: they were
        submitted and will run as their own turns); the whole screen while a prompt or dialog shows."""
        lines = _lines(screen)
        box = _box(lines)
        return screen if box is None or _quit(lines) else head(screen, box[0] - 1)

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        return judge_submit(self, before, after, _marks)

    def input_text(self, screen: str) -> str | None:
        lines = _lines(screen)
        box = _box(lines)
        if box is None or _quit(lines):
            return None
        first, end = box
        rows = [lines[first][2:], *(line[2:] for line in lines[first + 1 : end])]
        text = "\n".join(rows).strip()
        return "" if text in PLACEHOLDERS or HINT_IN_BOX_RE.match(text) else text
