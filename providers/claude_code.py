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
import sys
from typing import ClassVar

from cao.errors import ProviderError
from providers._cli import bullet_blocks, find_cli, flag, head, judge_submit
from providers.base import LaunchContext, LaunchSpec, Provider, TerminalStatus

FAKE_KEY = "sk-ant-api03-cao-local-model-server-key-0123456789abcdef"
RULE_RE = re.compile(r"^─{10,}$")
BOX = "❯\u00a0"
ECHO_RE = re.compile(r"^❯ (?!\d+\. )")  # a user turn; "❯ 1. Yes" is a menu option
MENU_RE = re.compile(r"^\s*❯ \d+\. ")
# The key hint under a prompt or dialog, for one whose cursor line isn't a numbered option.
HINT_RE = re.compile(r"^\s*(?:Enter to (?:confirm|select)|Esc to cancel) · ")
QUEUED_RE = re.compile(r"^  ❯ ")  # a message typed while busy, waiting for its turn
SPINNER_RE = re.compile(r"^[·✢✳✶✻✽*] \S.*…")
ERROR_RE = re.compile(r"^(API Error|Invalid API key|Credit balance is too low|OAuth token|Request timed out)")
PLACEHOLDERS = ("Press up to edit queued messages",)


def _lines(screen: str) -> list[str]:
    lines = [line.rstrip(" ") for line in screen.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _box(lines: list[str]) -> tuple[int, int] | None:
    """``(first, end)`` of the input box: between the last two full-width rules, opening with ❯+NBSP."""
    rules = [i for i, line in enumerate(lines) if RULE_RE.match(line)]
    if len(rules) >= 2 and rules[-1] - rules[-2] > 1 and lines[rules[-2] + 1].startswith(BOX):
        return rules[-2] + 1, rules[-1]
    return None


def _turn(transcript: list[str]) -> list[str] | None:
    """Lines after the last echoed user turn (its continuation lines skipped); None if none shows."""
    for i in range(len(transcript) - 1, -1, -1):
        if ECHO_RE.match(transcript[i]):
            j = i + 1
            while j < len(transcript) and transcript[j].startswith("  "):
                j += 1
            return transcript[j:]
    return None


def _marks(screen: str) -> tuple[str | None, int]:
    """What a submit adds: (the last echoed user turn's first line, how many inputs are queued)."""
    lines = _lines(screen)
    box = _box(lines)
    transcript = lines[: box[0] - 1] if box else lines
    echoes = [line for line in transcript if ECHO_RE.match(line)]
    return (echoes[-1] if echoes else None), sum(1 for line in transcript if QUEUED_RE.match(line))


def _blocks(lines: list[str]) -> list[str]:
    """The ``● …`` blocks (answers, tool calls, errors) in ``lines``, each without its bullet/indent."""
    return bullet_blocks(lines, ("● ",))


class ClaudeCodeProvider(Provider):
    name: ClassVar[str] = "claude_code"
    description: ClassVar[str] = "Claude Code (Anthropic), `claude`"
    accepts_input_while_processing: ClassVar[bool] = True
    waits_for_mcp: ClassVar[bool] = True
    paste_enter_delay: ClassVar[float] = 0.2
    submit_timeout: ClassVar[float] = 3.0
    exit_command: ClassVar[str] = "/exit"
    idle_tail_pattern: ClassVar[re.Pattern[str]] = re.compile(r"^(?!.*esc to interrupt)")

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        knobs, home, profile = ctx.settings_env, ctx.terminal_home, ctx.profile
        # A profile's tool allow-list means "ask before anything else", so it turns bypass off.
        allowed = (
            None if profile is None or profile.allowed_tools is None else [*profile.allowed_tools, "mcp__cao"]
        )
        bypass = flag(ctx, "CAO_CLAUDE_BYPASS", allowed is None)
        env = dict(ctx.base_env)
        env.setdefault("SHELL", "/bin/bash")
        env.update(
            HOME=str(home),
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL="1",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
        )
        key = knobs.get("CAO_ANTHROPIC_API_KEY", "")
        if knobs.get("CAO_MODEL_BASE_URL"):
            env["ANTHROPIC_BASE_URL"] = knobs["CAO_MODEL_BASE_URL"]
            key = key or FAKE_KEY
        if knobs.get("CAO_CLAUDE_CODE_OAUTH_TOKEN"):
            env["CLAUDE_CODE_OAUTH_TOKEN"] = knobs["CAO_CLAUDE_CODE_OAUTH_TOKEN"]
        elif not key:
            raise ProviderError(
                "claude_code has no credentials: set CAO_ANTHROPIC_API_KEY (or CAO_CLAUDE_CODE_OAUTH_TOKEN "
                "from `claude setup-token`, or CAO_MODEL_BASE_URL for a local model server) for cao-server"
            )
        if key:
            env["ANTHROPIC_API_KEY"] = key
        if bypass and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # root + --dangerously-skip-permissions needs exactly this
        state = {
            "hasCompletedOnboarding": True,
            "customApiKeyResponses": {"approved": [key[-20:]] if key else [], "rejected": []},
            "projects": {str(ctx.working_directory): {"hasTrustDialogAccepted": True}},
        }
        settings = {"skipDangerousModePermissionPrompt": True, "promptSuggestionEnabled": False}
        servers = {name: dict(spec) for name, spec in (profile.mcp_servers if profile else {}).items()}
        for spec in servers.values():
            if "url" in spec:
                spec.setdefault("type", "http")
        servers["cao"] = {
            "command": sys.executable,
            "args": ["-m", "cao.mcp"],
            "env": {
                "CAO_TERMINAL_ID": ctx.terminal_id,
                "CAO_SERVER_URL": ctx.server_url,
                "CAO_HOME": str(ctx.cao_home),  # where cao-server publishes its API token
            },
        }
        files = {
            home / ".claude.json": json.dumps(state, indent=2),
            home / ".claude" / "settings.json": json.dumps(settings, indent=2),
            home / "mcp.json": json.dumps({"mcpServers": servers}, indent=2),
        }
        command = [find_cli(ctx, "CAO_CLAUDE_BIN", "claude", "@anthropic-ai/claude-code")]
        command += ["--mcp-config", str(home / "mcp.json")]
        if model := knobs.get("CAO_CLAUDE_MODEL") or (profile and profile.model):
            command += ["--model", model]
        if profile and profile.system_prompt:
            files[home / "system-prompt.md"] = profile.system_prompt
            command += ["--append-system-prompt-file", str(home / "system-prompt.md")]
        if allowed is not None:
            command += ["--allowedTools", ",".join(allowed)]
        if bypass:
            command.append("--dangerously-skip-permissions")
        return LaunchSpec(command=command, env=env, files=files)

    def detect_status(self, screen: str) -> TerminalStatus:
        lines = _lines(screen)
        box = _box(lines)
        if box is None:  # a permission prompt, a question or a dialog replaces the box
            if any(MENU_RE.match(line) or HINT_RE.match(line) for line in lines):
                return TerminalStatus.WAITING_USER_ANSWER
            return TerminalStatus.PROCESSING  # starting up
        first, end = box
        if any("esc to interrupt" in line for line in lines[end + 1 :]):
            return TerminalStatus.PROCESSING
        transcript = lines[: first - 1]
        turn = _turn(transcript)
        if any(SPINNER_RE.match(line) for line in turn or ()):
            return TerminalStatus.PROCESSING
        blocks = _blocks(transcript if turn is None else turn)
        if not blocks:  # nothing answered yet (a long echo may have scrolled the start away)
            return TerminalStatus.IDLE if turn is None else TerminalStatus.COMPLETED
        return TerminalStatus.ERROR if ERROR_RE.match(blocks[-1]) else TerminalStatus.COMPLETED

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
        text = "\n".join(rows).strip()
        return "" if text in PLACEHOLDERS else text
