"""Provider for Gemini CLI (``gemini``, npm ``@google/gemini-cli``; tested with 0.61.0).

Launch: a throwaway HOME per terminal with ``~/.gemini/settings.json`` (API-key auth, folder
trust off, usage statistics, telemetry, IDE integration and auto-update off, tips hidden) and the
cao MCP server under ``mcpServers.cao``. Knobs (read from the server's ``CAO_*`` environment):
``CAO_GEMINI_BIN``, ``CAO_GEMINI_MODEL``, ``CAO_GEMINI_BYPASS`` (default true, ``--yolo``),
``CAO_MODEL_BASE_URL``, ``CAO_GEMINI_API_KEY``. The agent profile: its prompt as
``~/.gemini/GEMINI.md``, its model and its extra MCP servers. See docs/providers.md.

Screen (``capture-pane -p``)::

    ▄▄▄▄▄▄▄▄
     > echoed user turn                 (each echo sits in a ▄/▀ band like the box)
    ▀▀▀▀▀▀▀▀
    ✦ answer text                       (✕ [API Error: …] for a failed turn)
     ⠧ Thinking... (esc to cancel, 1s)  (busy; the box stays visible)
    ▄▄▄▄▄▄▄▄
     *   Type your message or @path/to/file      (the box; prompt ">" without --yolo)
    ▀▀▀▀▀▀▀▀

Traps: the box shows while busy (the spinner decides); 5xx errors are retried silently under
the spinner; an Enter that arrives < 50 ms after a paste is dropped (paste_enter_delay 0.2 s, and
delivery presses Enter again if the text is still in the box); Gemini ignores SIGHUP, so teardown
must kill the pane's process group (cao's tmux layer does).
"""

from __future__ import annotations

import json
from itertools import takewhile
from pathlib import Path

from cao import knobs
from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import literal, rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, bullet_blocks

BIN, MODEL, BYPASS = cli.cli_knobs("GEMINI", "gemini", "Gemini CLI", "`--yolo`")
API_KEY = knobs.text("CAO_GEMINI_API_KEY", "a Gemini API key, passed as `GEMINI_API_KEY`")
# Lifecycle hooks (in ~/.gemini/settings.json; 0.24 and later). Notification: a tool permission.
HOOK_PHASES = {
    "SessionStart": HookPhase.SESSION_START,
    "BeforeAgent": HookPhase.TURN_START,
    "AfterAgent": HookPhase.TURN_END,
    "Notification": HookPhase.ASKING,
    "SessionEnd": HookPhase.SESSION_END,
}
TOP_RE = rule("top", r"^▄{10,}$")
BOTTOM_RE = rule("bottom", r"^▀{10,}$")
RULE_RE = rule("box_rule", r"^─{10,}$")
BUSY_RE = rule("busy", r"\(esc to cancel, \d+[ms]")
PROMPT_RE = rule("prompt", r"^ [>*!] ")  # " > " (" * " under --yolo, " ! " in shell mode)
# A menu's cursor line, or a framed dialog's key hint (with a menu, or without: the API-key entry box).
ASKING_RE = rule("asking", r"^[│ ]*● \d+\. |^[│ ]*\((?:Press|Use) Enter to (?:submit|select)\b")
FRAME_TOP_RE = rule("frame_top", r"^╭─{10,}╮$")  # before 0.30: the box is a rounded frame
FRAME_BOTTOM_RE = rule("frame_bottom", r"^╰─{10,}╯$")
FRAMED_PROMPT_RE = rule("framed_prompt", r"^│ [>*!] ")
ECHO_LINE_RE = rule("echo_line", r"^> \S")  # before 0.30: an echoed user turn is a plain "> text" line
QUEUED = "Queued (press ↑ to edit):"  # then one line per input typed while busy, indented 4


def _bands(lines: list[str]) -> list[tuple[int, int]]:
    """``(first, end)`` content rows of every ▄/▀ band (echoed turns and the input box)."""
    bands: list[tuple[int, int]] = []
    top: int | None = None
    for i, line in enumerate(lines):
        if TOP_RE.match(line):
            top = i
        elif BOTTOM_RE.match(line) and (top is not None or not bands):
            bands.append((0 if top is None else top + 1, i))  # a band cut by the top of the screen
            top = None
    return bands


def _framed_box(lines: list[str]) -> tuple[int, int] | None:
    """Before 0.30: the last ╭…╰ frame whose first row is the prompt (``│ > …`` / ``│ * …``)."""
    for end in range(len(lines) - 1, -1, -1):
        if FRAME_BOTTOM_RE.match(lines[end]):
            for top in range(end - 1, -1, -1):
                if FRAME_TOP_RE.match(lines[top]):
                    return (
                        (top + 1, end) if top + 1 < end and FRAMED_PROMPT_RE.match(lines[top + 1]) else None
                    )
            return None
    return None


def _box(lines: list[str]) -> Box | None:
    """The input box: the last band, right under the composer's rule (and its mode line); before
    0.30 a rounded frame. Its top is that rule (the ▄ or ╭ row without one).

    Typed text reads " > text" exactly like an echoed turn, so only the position tells them apart.
    """
    bands = _bands(lines)
    found = bands[-1] if bands else None
    if found is None or not any(RULE_RE.match(line) for line in lines[max(0, found[0] - 4) : found[0] - 1]):
        found = _framed_box(lines)
    if found is None:
        return None
    first, end = found
    edge = first - 1  # the ▄ row (╭ before 0.30)
    rules = [i for i in range(max(0, edge - 3), edge) if RULE_RE.match(lines[i])]
    return Box(rules[-1] if rules else edge, first, end)


def _row(line: str) -> str:
    """A box row without a frame's side borders (a band's rows have none)."""
    return line[1:].rstrip().removesuffix("│").rstrip() if line.startswith("│") else line


def _echoes(lines: list[str], box: Box | None) -> list[tuple[int, int]]:
    """``(first, last)`` rows of each echoed user turn above the box: its band (first row to the
    ▀ row), or before 0.30 a ``> text`` line and its indented continuation."""
    top = box.first - 1 if box else len(lines)
    rows = (box.first, box.end) if box else None
    bands = [band for band in _bands(lines) if band != rows and band[1] < top]
    if bands:
        return bands
    echoes = []
    for i in range(top):
        if ECHO_LINE_RE.match(lines[i]):
            j = i
            while j + 1 < top and lines[j + 1].startswith("  ") and lines[j + 1].strip():
                j += 1
            echoes.append((i, j))
    return echoes


def _turn(lines: list[str], box: Box | None) -> list[str] | None:
    """Lines between the last echoed user turn and the composer (spinner line, rule, status line,
    box); None if no turn shows."""
    end = box.first - 1 if box else len(lines)
    rules = [i for i in range(end) if RULE_RE.match(lines[i])]
    if box and rules:
        end = rules[-1] - 1  # the spinner / "? for shortcuts" line sits right above the rule
    echoes = [echo for echo in _echoes(lines, box) if echo[1] <= end]
    if not echoes:
        return None
    return lines[echoes[-1][1] + 1 : end]


class GeminiCliProvider(BoxedTUI):
    name = "gemini_cli"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "Gemini CLI (Google), `gemini`"
    accepts_input_while_processing = True
    paste_enter_delay = 0.2  # < 50 ms and Gemini drops the Enter
    exit_command = "/quit"
    idle_tail_pattern = rule("idle_tail", r"^(?!.*esc to cancel)")
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, API_KEY)
    hook_phases = HOOK_PHASES
    interrupt_key = "Escape"
    turn_channel = "AfterTool"  # additionalContext: <hook_context> in the tool's response (0.61.0)
    placeholder = literal("placeholder", "Type your message or @path/to/file")
    asking = ASKING_RE  # a permission prompt, a question or a dialog
    asking_reason = "a menu or a dialog's key hint"
    starting_reason = "starting: nothing drawn yet"
    no_box = (
        "no input box (a ▄/▀ band under a ──── rule, or a ╭╰ frame), menu or dialog on screen: still "
        "starting, or a screen of a Gemini CLI release this provider does not know"
    )
    resume_hint = True

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its chat files' per-message ``tokens`` (providers/usage_files.py)."""
        return usage_files.gemini(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        home = ctx.terminal_home
        bypass = ctx.knob(BYPASS)
        env = cli.pane_env(ctx, GEMINI_TELEMETRY_ENABLED="false", COLORTERM="truecolor")
        key = ctx.knob(API_KEY)
        if base_url := ctx.knob(cli.MODEL_BASE_URL):
            env["GOOGLE_GEMINI_BASE_URL"] = base_url
            key = key or cli.LOCAL_KEY
        if not key:
            raise ProviderError(
                "gemini_cli has no credentials: set CAO_GEMINI_API_KEY (or CAO_MODEL_BASE_URL for a "
                "local model server) for cao-server"
            )
        env["GEMINI_API_KEY"] = key
        general = {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
        settings = cli.gemini_settings(ctx, "gemini-api-key", general)
        binary = cli.find_cli(ctx, BIN, "@google/gemini-cli")
        command = [binary]
        channel: str | None = None
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hookstate.py); no on-screen notes
            # (Gemini's hook timeout is in ms.)
            version = cli.npm_version(binary, "@google/gemini-cli")
            events: tuple[str, ...] = tuple(HOOK_PHASES)
            if version is None or version >= (0, 61):  # AfterTool additionalContext: proven on 0.61
                events = (*events, "AfterTool")
                channel = self.turn_channel
            hooks = cli.command_hooks(ctx, "gemini", events, timeout=10_000, matcher="*", name="cao")
            if version is not None and version < (0, 45):  # 0.24: off unless hooks.enabled
                hooks.update(enabled=True, notifications=False)
            else:  # on by default since; the switches moved to hooksConfig
                settings["hooksConfig"] = {"enabled": True, "notifications": False}
            settings["hooks"] = hooks
        if model := cli.model_name(ctx, MODEL):
            command += ["--model", model]
        if bypass:
            command.append("--yolo")
        files = {home / ".gemini" / "settings.json": json.dumps(settings, indent=2)}
        if prompt := cli.system_prompt(ctx):  # the user-level context file, read at every start
            files[home / ".gemini" / "GEMINI.md"] = prompt
        return LaunchSpec(command=command, env=env, files=files, turn_channel=channel)

    def find_box(self, lines: list[str]) -> Box | None:
        return _box(lines)

    def box_text(self, lines: list[str], box: Box) -> str:
        rest = (_row(line)[3:] for line in lines[box.first + 1 : box.end])
        return "\n".join([PROMPT_RE.sub("", _row(lines[box.first])), *rest]).strip()

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        """The last ``✦ …`` answer (or ``✕ …`` error) of the last turn, without its marker."""
        turn = _turn(lines, box)
        blocks = bullet_blocks(turn if turn is not None else lines, ("✦ ", "✕ "))
        return blocks[-1] if blocks else ""

    def marks(self, screen: str) -> tuple[str | None, int]:
        """The last echoed turn's first line, and the inputs listed under ``Queued``."""
        lines = self.lines(screen)
        echoes = _echoes(lines, _box(lines))
        queued = 0
        for i, line in enumerate(lines):
            if line.strip() == QUEUED:
                queued = len(list(takewhile(lambda row: row.startswith("    "), lines[i + 1 :])))
        return (lines[echoes[-1][0]] if echoes else None), queued

    def with_box(self, lines: list[str], box: Box) -> Reading:
        if any(BUSY_RE.search(line) for line in lines[: box.first]):
            return Reading(TerminalStatus.PROCESSING, "a spinner line (esc to cancel, Ns)")
        turn = _turn(lines, box)
        marks = [
            line[0] for line in (lines[: box.first] if turn is None else turn) if line[:2] in ("✦ ", "✕ ")
        ]
        if not marks:  # nothing answered yet (a long echo may have scrolled the start away)
            if turn is None:
                return Reading(TerminalStatus.IDLE, "the input box, no turn on screen")
            return Reading(TerminalStatus.COMPLETED, "the input box after a user turn")
        if marks[-1] == "✕":
            return Reading(TerminalStatus.ERROR, "the last turn ends in ✕ (an error)")
        return Reading(TerminalStatus.COMPLETED, "the input box after an answered turn")
