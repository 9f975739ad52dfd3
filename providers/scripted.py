"""Provider for the bundled scripted agent (``providers/scripted_agent.py``).

The default provider: it needs nothing installed and no API key, so cao runs (and its whole test
suite runs) on a fresh machine. ``scripted_eager`` is the same program declared as accepting input
while it is busy (it queues such input as its own turn, as Claude Code and Gemini CLI do).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cao import knobs
from cao.states import HookPhase
from providers import _cli as cli
from providers.base import LaunchContext, LaunchSpec, Provider, Reading, TerminalStatus, UsageEntry
from providers.rules import rule
from providers.usage_files import count, read_bounded, when

AGENT_PATH = Path(__file__).with_name("scripted_agent.py")
USAGE_FILE = "scripted-usage.jsonl"  # in the terminal's HOME folder: what its "usage" rules spent
RULES = knobs.path(
    "CAO_SCRIPTED_RULES",
    "the rules file of every scripted agent (docs/scripted-agent.md)",
    shown="`$CAO_HOME/scripted/<profile>.json`",
)
RECORD = knobs.flag(
    "CAO_SCRIPTED_RECORD",
    False,
    "scripted agents append every message they receive to `$CAO_HOME/scripted/received/<id>.jsonl`",
    shown="false (the rules file's `record`)",
)

# It speaks Claude Code's hook protocol when its rules say "hooks": true; a Notification is its question.
HOOK_PHASES = {**cli.CLAUDE_HOOK_PHASES, "Notification": HookPhase.ASKING}
SPINNER_RE = rule("spinner", r"^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] thinking… \(")
QUEUED_RE = rule("queued", r" · (\d+) queued")
QUESTION_RE = rule("question", r"^\? .* \(y/n\)")
PROMPT_RE = rule("prompt", r"^❯")  # the last line: its prompt
PROMPT = "❯ "
USER = "› "
REPLY = "● "
ERROR = "✗ "
DRAWING = ("cao scripted agent · ", "starting…", "  ")  # banner, start-up delay, continuation lines


def _lines(screen: str) -> list[str]:
    lines = screen.rstrip("\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _last_turn(lines: list[str]) -> list[str] | None:
    """Lines after the last user echo (its continuation lines skipped), or None if no echo shows."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith(USER):
            j = i + 1
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            return lines[j:]
    return None


def _rules_say_hooks(env: dict[str, str], profile: str) -> bool:
    """Do the rules the agent will load (providers/scripted_agent.py: the same order) turn its
    hooks on? Only then does a turn hand its tool steps' hook output to the running turn."""
    for cand in (env.get("CAO_SCRIPTED_RULES"), str(Path(env["CAO_SCRIPTED_DIR"]) / f"{profile}.json")):
        if cand and Path(cand).is_file():
            try:
                return bool(json.loads(Path(cand).read_text()).get("hooks"))
            except (OSError, ValueError, AttributeError):
                return False
    return False


class ScriptedProvider(Provider):
    name = "scripted"
    description = "bundled scripted agent (no API key; rules from a JSON file)"
    accepts_input_while_processing = False
    interrupt_key = "Escape"  # ends the running turn; text typed meanwhile stays in its input
    interrupt_keeps_input = True
    turn_channel = "PostToolUse"  # with "hooks": true, after each tool step of a turn (rules "steps")
    paste_enter_delay = 0.0
    submit_timeout = 2.0
    exit_command = "/exit"
    takes_rule_files = True
    idle_tail_pattern = rule("idle_tail", r"^❯")
    knobs = (RULES, RECORD)
    hook_phases = HOOK_PHASES

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        env = dict(ctx.base_env)
        env["CAO_SCRIPTED_DIR"] = str(ctx.cao_home / "scripted")
        if rules := ctx.knob(RULES):
            env[RULES.name] = str(rules)
        if (record := ctx.knob(RECORD, None)) is not None:  # set either way: it overrides the rules'
            env[RECORD.name] = "1" if record else "0"
        env["CAO_SCRIPTED_USAGE"] = str(ctx.terminal_home / USAGE_FILE)  # written by "usage" rules
        if ctx.hooks:  # used only when its rules say "hooks": true (it speaks Claude Code's protocol)
            env["CAO_SCRIPTED_HOOK"] = json.dumps(ctx.hook_command("claude"))
        command = [sys.executable, "-I", "-S", str(AGENT_PATH), "--terminal-id", ctx.terminal_id]
        channel = self.turn_channel if ctx.hooks and _rules_say_hooks(env, ctx.agent_profile) else None
        return LaunchSpec(command=command, env=env, turn_channel=channel)

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its ``"usage"`` rules' records (JSON lines); none written: its script spends nothing
        cao can count, so unknown."""
        data = read_bounded(home / USAGE_FILE)
        if data is None:
            return None
        text = data.decode("utf-8", errors="replace")
        out = []
        for line in text.splitlines():
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line being written
            at = when(r.get("at")) if isinstance(r, dict) else None
            if at is None:
                continue  # not one of its records
            out.append(
                UsageEntry(
                    at=at,
                    model=str(r.get("model", "")),
                    input_tokens=count(r.get("input_tokens")),
                    output_tokens=count(r.get("output_tokens")),
                    cache_read_tokens=count(r.get("cache_read_tokens")),
                    cache_write_tokens=count(r.get("cache_write_tokens")),
                    key=str(r.get("id", "")),
                )
            )
        return out

    def detect_status(self, screen: str) -> TerminalStatus:
        return self.detect(screen).status

    def detect(self, screen: str) -> Reading:
        lines = _lines(screen)
        if not lines:
            return Reading(TerminalStatus.PROCESSING, "starting: nothing drawn yet")
        last = lines[-1]
        if SPINNER_RE.match(last):
            return Reading(TerminalStatus.PROCESSING, "the spinner")
        if QUESTION_RE.match(last):
            return Reading(TerminalStatus.WAITING_USER_ANSWER, "a (y/n) question")
        if not PROMPT_RE.match(last):
            if last.startswith(DRAWING) or last[:2] in (USER, REPLY, ERROR):
                return Reading(TerminalStatus.PROCESSING, "starting up, or drawing a turn")
            return Reading(
                TerminalStatus.UNKNOWN, "the last line is no prompt (❯), spinner, question or turn line"
            )
        turn = _last_turn(lines[:-1])
        if turn is None:
            return Reading(TerminalStatus.IDLE, "the prompt, no turn on screen")
        marks = [line[:2] for line in turn if line[:2] in (REPLY, ERROR)]
        if marks and marks[-1] == ERROR:
            return Reading(TerminalStatus.ERROR, "the last turn ends in an error")
        return Reading(TerminalStatus.COMPLETED, "the prompt after a turn")

    def extract_last_message(self, screen: str) -> str:
        lines = _lines(screen)
        if lines and lines[-1].startswith("❯"):
            lines = lines[:-1]
        turn = _last_turn(lines)
        if turn is None:
            turn = lines
        out: list[str] = []
        collecting = False
        for line in turn:
            if line.startswith((REPLY, ERROR)):
                if not collecting:
                    out = []
                collecting = True
                out.append(line[2:])
            elif collecting and line.startswith("  "):
                out.append(line[2:])
            elif collecting and not line.strip():
                collecting = False
        return "\n".join(out).strip()

    def input_text(self, screen: str) -> str | None:
        lines = _lines(screen)
        if not lines or not lines[-1].startswith("❯"):
            return None
        return lines[-1][2:].rstrip()

    def transcript(self, screen: str) -> str:
        lines = _lines(screen)
        if lines and lines[-1].startswith("❯"):
            lines = lines[:-1]  # the input box: typed but not submitted
        return "\n".join(lines)

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        """Idle before: the generic check. Busy before (eager delivery): the spinner keeps changing
        the screen, so look for firmer evidence: one more queued input."""
        if self.detect_status(before) != TerminalStatus.PROCESSING:
            return super().submit_confirmed(before, after)
        # A new echo could be an earlier queued input starting its turn (another message's evidence),
        # so only one more queued input counts; anything else is judged later from the transcript.
        return True if _queued(after) > _queued(before) else None


def _queued(screen: str) -> int:
    lines = _lines(screen)
    found = QUEUED_RE.search(lines[-1]) if lines else None
    return int(found.group(1)) if found else 0


class EagerScriptedProvider(ScriptedProvider):
    name = "scripted_eager"
    description = "scripted agent that queues input while busy (eager delivery allowed)"
    accepts_input_while_processing = True
