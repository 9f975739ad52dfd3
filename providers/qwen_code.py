"""Provider for Qwen Code (``qwen``, npm ``@qwen-code/qwen-code``; tested with 0.15.10).

Launch: a throwaway HOME per terminal with ``~/.qwen/settings.json`` (OpenAI-compatible auth,
folder trust, usage statistics, telemetry, IDE integration and update checks off, tips hidden,
the cao MCP server under ``mcpServers.cao``) and the endpoint in ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` / ``OPENAI_MODEL``. Knobs (read from the server's ``CAO_*`` environment):
``CAO_QWEN_BIN``, ``CAO_QWEN_MODEL``, ``CAO_QWEN_BYPASS`` (default true, ``--yolo``),
``CAO_MODEL_BASE_URL`` (a local OpenAI-compatible server), ``CAO_QWEN_BASE_URL`` with
``CAO_OPENAI_API_KEY`` (any OpenAI-compatible endpoint, e.g. DashScope). The agent profile: its
prompt as ``~/.qwen/QWEN.md``, its model and its extra MCP servers. See docs/providers.md.

Screen (``capture-pane -p``, inline: the transcript stays in tmux's scrollback)::

      > echoed user turn
      ✦ answer text                      (✕ [API Error: …] for a failed turn)
      ⠸ Reticulating splines… (1s · esc to cancel)    (busy; the box stays visible)
    ────────────────────
    *   Type your message or @path/to/file            (the box; ">" without --yolo)
    ────────────────────
      YOLO mode (shift + tab to cycle)

Traps: the box shows while busy (the spinner decides); prompts typed before the MCP servers are
connected are queued (``Press ↑ to edit queued messages``) and run once they are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from cao import knobs
from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import literal, rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, box_between_rules, bullet_blocks

BIN, MODEL, BYPASS = cli.cli_knobs("QWEN", "qwen", "Qwen Code", "`--yolo`", fake_model=True)
BASE_URL = knobs.text(
    "CAO_QWEN_BASE_URL",
    "an OpenAI-compatible endpoint (e.g. DashScope's) for `CAO_OPENAI_API_KEY`, as `OPENAI_BASE_URL`",
    shown="`$CAO_MODEL_BASE_URL/v1`, else OpenAI's",
)
RULE_RE = rule("box_rule", r"^─{10,}$")
PROMPT_RE = rule("prompt", r"^[>*!] {1,3}")
# The spinner's timer: "(6s · esc to cancel)" (0.15), "(esc to cancel, 6s)" (0.12).
BUSY_RE = rule("busy", r"\((?:\d+[hms] ?)+ · esc to cancel\)|\(esc to cancel, [\dhms ]+\)|esc to cancel\)")
ECHO_RE = rule("echo", r"  > ")
MARKS = ("  ✦ ", "  ✕ ")
# A menu's cursor line, or a dialog's key hint.
ASKING_RE = rule(
    "asking", r"^[│ ]*[●❯›] \d+\. |\((?:Press|Use) Enter to (?:submit|select|confirm)\b|Enter to select", re.I
)
QUEUED = "Press ↑ to edit queued messages"
CURSOR = "\u200b"  # drawn after the typed text


# Lifecycle hooks (``hooks`` in ~/.qwen/settings.json: Claude Code's events and payloads).
HOOK_PHASES = {**cli.CLAUDE_HOOK_PHASES, "PermissionRequest": HookPhase.ASKING}
HOOK_EVENTS = (*HOOK_PHASES, "Notification", "PostToolUse")


class QwenCodeProvider(BoxedTUI):
    name = "qwen_code"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "Qwen Code, `qwen`"
    exit_command = "/quit"
    resume_hint = True  # 0.12 prints "To continue this session, run qwen --resume <id>" as it quits
    idle_tail_pattern = rule("idle_tail", r"^(?!.*esc to cancel)")
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, cli.OPENAI_API_KEY, BASE_URL)
    hook_phases = HOOK_PHASES
    interrupt_key = "Escape"
    turn_channel = "PostToolUse"  # additionalContext: appended to the tool's message (0.15.10)
    placeholder = literal("placeholder", "Type your message or @path/to/file")
    echo = ECHO_RE
    continuation = "    "
    asking = ASKING_RE

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its chat files' ``ui_telemetry`` API-response records (providers/usage_files.py)."""
        return usage_files.qwen(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        bypass = ctx.knob(BYPASS)
        env = cli.pane_env(ctx, COLORTERM="truecolor")
        local = ctx.knob(cli.MODEL_BASE_URL).rstrip("/")
        base_url = ctx.knob(BASE_URL) or (f"{local}/v1" if local else "")
        key = ctx.knob(cli.OPENAI_API_KEY) or (cli.LOCAL_KEY if local else "")
        if not key:
            raise ProviderError(
                "qwen_code has no credentials: set CAO_OPENAI_API_KEY (with CAO_QWEN_BASE_URL for a "
                "non-OpenAI endpoint), or CAO_MODEL_BASE_URL for a local model server, for cao-server"
            )
        env["OPENAI_API_KEY"] = key
        if base_url:
            env["OPENAI_BASE_URL"] = base_url
        model = cli.model_name(ctx, MODEL, "fake-model" if local else "")
        if model:
            env["OPENAI_MODEL"] = model
        settings = cli.gemini_settings(ctx, "openai", {"disableAutoUpdate": True, "disableUpdateNag": True})
        settings["$version"] = 4  # the current schema: else Qwen migrates (rewrites) the file at start
        if model:
            settings["model"] = {"name": model}
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hookstate.py); Claude Code's format
            settings["hooks"] = cli.command_hooks(ctx, "qwen", HOOK_EVENTS, timeout=10_000, matcher="")  # ms
        command = [cli.find_cli(ctx, BIN, "@qwen-code/qwen-code")]
        if bypass:
            command.append("--yolo")
        files = {home / ".qwen" / "settings.json": json.dumps(settings, indent=2)}
        if prompt := cli.system_prompt(ctx):  # the user-level context file, read at every start
            files[home / ".qwen" / "QWEN.md"] = prompt
        return LaunchSpec(
            command=command, env=env, files=files, turn_channel=self.turn_channel if ctx.hooks else None
        )

    def hook_phase(self, event: str, payload: Mapping[str, object]) -> HookPhase | None:
        if event == "Notification":
            kind = payload.get("notification_type")
            return {"permission_prompt": HookPhase.ASKING, "idle_prompt": HookPhase.TURN_END}.get(str(kind))
        return super().hook_phase(event, payload)

    def find_box(self, lines: list[str]) -> Box | None:
        return box_between_rules(lines, RULE_RE, PROMPT_RE)

    def box_text(self, lines: list[str], box: Box) -> str:
        rows = [PROMPT_RE.sub("", lines[box.first]), *(line[2:] for line in lines[box.first + 1 : box.end])]
        return "\n".join(row.replace(CURSOR, "").rstrip() for row in rows).strip()

    def blocks(self, lines: list[str]) -> list[str]:
        return bullet_blocks([line[2:] for line in lines], tuple(mark[2:] for mark in MARKS))

    def queued(self, lines: list[str], box: Box | None, transcript: list[str]) -> int:
        return sum(1 for line in transcript if line.strip() == QUEUED)

    def with_box(self, lines: list[str], box: Box) -> Reading:
        transcript = lines[: box.top]
        if any(BUSY_RE.search(line) for line in transcript[-4:]) or any(
            row.strip() == QUEUED for row in transcript
        ):
            return Reading(TerminalStatus.PROCESSING)
        turn = self.turn(transcript)
        marks = [line[2] for line in (transcript if turn is None else turn) if line.startswith(MARKS)]
        if not marks:
            return Reading(TerminalStatus.IDLE if turn is None else TerminalStatus.COMPLETED)
        return Reading(TerminalStatus.ERROR if marks[-1] == "✕" else TerminalStatus.COMPLETED)
