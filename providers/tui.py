"""The template for a CLI drawn as a transcript over an input box (every real agent CLI cao runs),
and the screen helpers the providers share.

A screen is read as lines (each right-trimmed, trailing blank ones dropped; indices stay those of
the captured screen). A provider derived from :class:`BoxedTUI` says where its input box is
(``find_box``: a :class:`Box`) and what a screen with the box shows (``with_box``), and adjusts the
other hooks where its CLI differs: how the box's text reads (``box_text``, ``prompt_width``,
``placeholder``), where the last turn starts (``echo``, ``continues``, ``turn``), its answers
(``blocks``, ``last_answer``), what a submit leaves (``queued``, ``marks``), a screen without the
box (``asking``, ``starting``, ``no_box``) and an exit (``resume_hint``, ``quit_reason``). The
template writes the contract once over those:

    detect(screen)                    the CLI quit? → find the box → with_box / without_box
    transcript(screen)                everything above the box's top (the whole screen with no box)
    input_text(screen)                the box's text; "" for a placeholder; None with no box or after an exit
    extract_last_message(screen)      the last answer block of the last turn
    submit_confirmed(before, after)   judge_submit: a new echo, one more queued input, idle → busy
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, NamedTuple

from providers.base import Provider, Reading, TerminalStatus
from providers.rules import Rule, rule

BUSY = (TerminalStatus.PROCESSING, TerminalStatus.WAITING_USER_ANSWER)
# Each CLI's ``ignore`` rule: lines it matches are read as blank (a notice a CLI release draws
# where its provider doesn't expect one). Built in, it matches nothing and costs nothing; a user's
# override file (providers/rules.py) gives it a pattern.
IGNORE_NOTHING = r"(?!)"
IGNORE_DOC = (
    "lines read as blank (e.g. a notice drawn where none is expected); matches nothing unless overridden"
)

# What the CLIs print last when they quit: how to resume the session (Claude 2.1, Codex, Gemini,
# Qwen 0.12, Kimi; Hermes has its own check), always after the CLI's own lead-in, on the same line or the one
# above (so a resume command typed into an input box drawn near the bottom is no exit).
RESUME_RE = rule("resume", r"\b(?:claude --resume|codex resume|gemini --resume|qwen --resume|kimi -r) \S")
RESUME_LEAD_RE = rule(
    "resume_lead", r"Resume this session with:|To continue this session, run|To resume this session:"
)


PANE_DEAD_RE = rule("pane_dead", r"Pane is dead \(", doc="tmux's last line of a dead pane (remain-on-exit)")


def exited(lines: list[str]) -> bool:
    """The CLI has quit: tmux's own last line for a dead pane (windows with ``remain-on-exit``), or
    the CLI's parting "resume this session" hint at the very bottom (the box is gone or above it)."""
    for i in range(max(0, len(lines) - 3), len(lines)):
        line = lines[i]
        if PANE_DEAD_RE.match(line):
            return True
        hint = RESUME_RE.search(line)
        if hint is None:
            continue
        if RESUME_LEAD_RE.search(line[: hint.start()]) or (i and RESUME_LEAD_RE.search(lines[i - 1])):
            return True
    return False


def judge_submit(
    provider: Provider, before: str, after: str, marks: Callable[[str], tuple[str | None, int]]
) -> bool | None:
    """Firm evidence only (a spinner tick proves nothing): True on a new echoed turn, one more queued
    input, or idle → busy; False while the text still sits in the input box (delivery presses Enter
    again); None otherwise. ``marks(screen)`` gives (last echoed turn, queued inputs)."""
    box = provider.input_text(after)
    if box and box.strip():
        return False
    (echo, queued), (echo_now, queued_now) = marks(before), marks(after)
    if queued_now > queued or echo_now not in (None, echo):
        return True
    went_busy = provider.detect_status(before) not in BUSY and provider.detect_status(after) in BUSY
    return True if went_busy else None


def head(screen: str, end: int) -> str:
    """The first ``end`` lines of ``screen``, as captured (the providers' line lists keep its indices)."""
    return "\n".join(screen.split("\n")[:end])


def bullet_blocks(lines: list[str], marks: tuple[str, ...], *, stop: Rule | None = None) -> list[str]:
    """The blocks that start with one of ``marks`` (e.g. ``"● "``) and go on with indented or blank
    lines, each without its mark or indent; reading ends at the first line matching ``stop``."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if stop is not None and stop.match(line):
            break
        if line.startswith(marks):
            current = [line[2:]]
            blocks.append(current)
        elif current is not None and (line.startswith("  ") or not line.strip()):
            current.append(line[2:])
        else:
            current = None
    return ["\n".join(block).strip() for block in blocks]


class Box(NamedTuple):
    """Where the input box sits in a screen's lines: ``top`` is its first line (a rule, a band's
    edge, or the prompt row itself): the transcript is everything above it. Its text is in rows
    ``first`` up to ``end``."""

    top: int
    first: int
    end: int


def box_between_rules(lines: list[str], rule: Rule, opens: Rule) -> Box | None:
    """The rows between the last two ``rule`` lines when the first of them matches ``opens`` (the
    prompt): Claude Code's, Qwen Code's and Copilot CLI's box."""
    rules = [i for i, line in enumerate(lines) if rule.match(line)]
    # the bottom-most pair of rules with rows between them, the first row the prompt: rules drawn
    # right under one another (tmux reflowing full-width rules after a resize, a notice's own
    # rule) are skipped
    for top, bottom in zip(reversed(rules[:-1]), reversed(rules[1:]), strict=True):
        if bottom - top > 1:
            return Box(top, top + 1, bottom) if opens.match(lines[top + 1]) else None
    return None


class BoxedTUI(Provider):
    """A CLI that draws its transcript over an input box. Subclasses implement ``find_box`` and
    ``with_box`` and set the class data below; the rest are hooks with the common behaviour.

    The real CLIs start cao's MCP server themselves (so deliveries wait for it to report in), want
    a moment between a paste and its Enter, and may take a few seconds to show a submit took."""

    waits_for_mcp = True
    paste_enter_delay = 0.2
    submit_timeout = 4.0

    # Characters each line loses on its right (None: all whitespace). Claude keeps its NO-BREAK
    # SPACE: "❯\u00a0" is its empty box.
    trailing: ClassVar[str | None] = None
    # The box's prompt (``box_text`` cuts this many characters off its first row) and the indent
    # of the rows under it.
    prompt_width: ClassVar[int] = 2
    indent: ClassVar[int] = 2
    # What an empty box shows instead of nothing: a hint, an example prompt (fully matched).
    placeholder: ClassVar[Rule | None] = None
    # An echoed user turn's first line, and how its further lines start.
    echo: ClassVar[Rule] = rule("no_echo", r"(?!)", doc="a CLI that echoes no user turn")
    continuation: ClassVar[str] = "  "
    # With no box on screen: a line of a menu, a prompt or a dialog (its key hint), and what the
    # reading says then.
    asking: ClassVar[Rule | None] = None
    ignore: ClassVar[Rule | None] = None  # see IGNORE_NOTHING
    asking_reason: ClassVar[str] = ""
    # With no box, menu or dialog: the reading while the CLI starts (see ``starting``), and why
    # anything else drawn can't be read ("": it is all start-up drawing, so processing).
    starting_reason: ClassVar[str] = ""
    no_box: ClassVar[str] = ""
    # The CLI prints a parting resume hint (``exited``): that, or tmux's "Pane is dead", is an exit.
    resume_hint: ClassVar[bool] = False
    exit_reason: ClassVar[str] = "the CLI has exited (pane dead, or its resume hint)"

    # -- hooks ----------------------------------------------------------------------------------
    def lines(self, screen: str) -> list[str]:
        lines = [line.rstrip(self.trailing) for line in screen.split("\n")]
        if self.ignore is not None and self.ignore.regex is not self.ignore.default:  # overridden
            lines = ["" if self.ignore.search(line) else line for line in lines]
        while lines and not lines[-1].strip():
            lines.pop()
        return lines

    def find_box(self, lines: list[str]) -> Box | None:
        """The input box, wherever the screen shows one (even under an exit: see ``input_box``)."""
        raise NotImplementedError

    def quit_reason(self, lines: list[str]) -> str | None:
        """Why this is the screen of a CLI that quit, or None."""
        return self.exit_reason if self.resume_hint and exited(lines) else None

    def input_box(self, lines: list[str]) -> Box | None:
        """The box cao may read and type into: none when none shows, or once the CLI has quit."""
        box = self.find_box(lines)
        return None if box is None or self.quit_reason(lines) else box

    def box_text(self, lines: list[str], box: Box) -> str:
        """The text in the box: its first row after the prompt, the rows under it after the indent."""
        rows = lines[box.first : box.end]
        return "\n".join(row[self.indent if i else self.prompt_width :] for i, row in enumerate(rows)).strip()

    def continues(self, line: str) -> bool:
        """Is ``line`` more of the echoed user turn above it?"""
        return line.startswith(self.continuation)

    def is_echo(self, transcript: list[str], i: int) -> bool:
        """Is line ``i`` the first line of an echoed user turn?"""
        return bool(self.echo.match(transcript[i]))

    def turn(self, transcript: list[str]) -> list[str] | None:
        """The rows after the last echoed user turn (and its further lines); None when no turn shows."""
        for i in range(len(transcript) - 1, -1, -1):
            if self.is_echo(transcript, i):
                j = i + 1
                while j < len(transcript) and self.continues(transcript[j]):
                    j += 1
                return transcript[j:]
        return None

    def blocks(self, lines: list[str]) -> list[str]:
        """The answer blocks (and failures) in ``lines``, without their marks."""
        return []

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        """The last answer block of the last turn (of the whole transcript with no turn on screen)."""
        transcript = lines[: box.top] if box else lines
        turn = self.turn(transcript)
        blocks = self.blocks(transcript if turn is None else turn)
        return blocks[-1] if blocks else ""

    def queued(self, lines: list[str], box: Box | None, transcript: list[str]) -> int:
        """How many inputs wait for their turn (typed while the CLI was busy)."""
        return 0

    def marks(self, screen: str) -> tuple[str | None, int]:
        """What a submit adds: (the last echoed user turn's first line, how many inputs are queued)."""
        lines = self.lines(screen)
        box = self.find_box(lines)
        transcript = lines[: box.top] if box else lines
        echoes = [line for i, line in enumerate(transcript) if self.is_echo(transcript, i)]
        return (echoes[-1] if echoes else None), self.queued(lines, box, transcript)

    def asks(self, lines: list[str]) -> bool:
        """With no box: does a menu, a prompt or a dialog show?"""
        return self.asking is not None and any(self.asking.search(line) for line in lines)

    def starting(self, lines: list[str]) -> bool:
        """With no box, menu or dialog: is the CLI still starting (nothing drawn yet)?"""
        return not lines

    def without_box(self, lines: list[str]) -> Reading:
        """The screen shows no input box: a prompt or dialog has replaced it, or the CLI is starting."""
        if self.asks(lines):
            return Reading(TerminalStatus.WAITING_USER_ANSWER, self.asking_reason)
        if self.starting(lines) or not self.no_box:
            return Reading(TerminalStatus.PROCESSING, self.starting_reason)
        return Reading(TerminalStatus.UNKNOWN, self.no_box)

    def with_box(self, lines: list[str], box: Box) -> Reading:
        """The screen shows the input box: busy, or which way the last turn ended."""
        raise NotImplementedError

    # -- the contract ---------------------------------------------------------------------------
    def detect(self, screen: str) -> Reading:
        lines = self.lines(screen)
        if reason := self.quit_reason(lines):
            return Reading(TerminalStatus.UNKNOWN, reason, final=True)
        box = self.find_box(lines)
        return self.without_box(lines) if box is None else self.with_box(lines, box)

    def detect_status(self, screen: str) -> TerminalStatus:
        return self.detect(screen).status

    def transcript(self, screen: str) -> str:
        """Everything above the input box; the whole screen while a prompt or dialog shows, or once
        the CLI has quit."""
        box = self.input_box(self.lines(screen))
        return screen if box is None else head(screen, box.top)

    def input_text(self, screen: str) -> str | None:
        lines = self.lines(screen)
        box = self.input_box(lines)
        if box is None:
            return None
        text = self.box_text(lines, box)
        return "" if self.placeholder is not None and self.placeholder.fullmatch(text) else text

    def extract_last_message(self, screen: str) -> str:
        lines = self.lines(screen)
        return self.last_answer(lines, self.find_box(lines))

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        """See ``judge_submit``."""
        return judge_submit(self, before, after, self.marks)
