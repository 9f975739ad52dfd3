"""The provider contract: what cao needs to know about one agent CLI.

A provider is a small class of data plus pure functions over captured screen text. It never
touches tmux, the database or the network; the terminal layer feeds it screens and runs what it
describes (:class:`LaunchSpec`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar, overload

from cao.errors import InvalidInput, ProviderError
from cao.knobs import Knob
from cao.states import HookPhase

if TYPE_CHECKING:
    from cao.profiles import Profile
    from providers.rules import Rule

T = TypeVar("T")
D = TypeVar("D")
_DECLARED = object()  # LaunchContext.knob without a launch-time default: the knob's declared one
ANSI_RE = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


class TerminalStatus(StrEnum):
    IDLE = "idle"
    PROCESSING = "processing"
    COMPLETED = "completed"
    WAITING_USER_ANSWER = "waiting_user_answer"
    ERROR = "error"
    # Nothing on screen matched what the provider knows (a CLI release it wasn't built for, a
    # screen it never saw, an exited CLI's last screen): cao waits and shows the reason instead of
    # guessing. See Provider.detect.
    UNKNOWN = "unknown"


class Reading(NamedTuple):
    """A status and what on screen decided it (the reason is shown when the status is unknown).

    ``final``: the screen is certain and no other signal may change it (the CLI has exited)."""

    status: TerminalStatus
    reason: str = ""
    final: bool = False


class UsageEntry(NamedTuple):
    """One model response as the CLI itself recorded it (its transcript, session file or hook
    payload): cao sums these per terminal and per task (cao/usage.py) and prices them."""

    at: float  # when the response was recorded (epoch seconds, from the CLI's own record)
    model: str  # the model the CLI named ("" when it named none)
    input_tokens: int  # prompt tokens, not counting cache reads/writes listed below
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    key: str = ""  # the CLI's own id for the response: a record written twice is counted once


@dataclass(frozen=True)
class LaunchContext:
    """Everything a provider may use to build its launch command."""

    terminal_id: str
    agent_profile: str
    working_directory: Path
    cao_home: Path
    server_url: str
    terminal_home: Path  # a throwaway directory owned by this terminal (config homes go here)
    base_env: Mapping[str, str]  # the allow-listed environment (PATH, LANG, TERM, CAO_* ids...)
    # cao-server's CAO_* variables; a provider reads its declared knobs from them with knob()
    settings_env: Mapping[str, str] = field(default_factory=dict)
    # The resolved agent profile (system prompt, model, allowed tools, extra MCP servers); None when
    # agent_profile names no profile (the scripted agent's rule-file names).
    profile: Profile | None = None
    hooks: bool = True  # wire the CLI's lifecycle hooks to cao-server (CAO_HOOKS)
    hook_key: str = ""  # this terminal's own key for its hook reports (cao/hookstate.py: hook_key)

    @overload
    def knob(self, knob: Knob[T]) -> T: ...

    @overload
    def knob(self, knob: Knob[T], default: D) -> T | D: ...

    def knob(self, knob: Knob[Any], default: object = _DECLARED) -> object:
        """The parsed value of one of the provider's knobs (declared in ``Provider.knobs``) from
        cao-server's environment; unset or blank: ``default`` if given (a default worked out at
        launch), else the declared one. A value the knob can't take fails the launch with a
        ``ProviderError`` naming the variable and the fix."""
        try:
            if default is _DECLARED:
                return knob.read(self.settings_env)
            return knob.read(self.settings_env, default)
        except InvalidInput as exc:
            raise ProviderError(f"{exc.message} (in cao-server's environment)") from exc

    def hook_command(self, source: str, event: str | None = None) -> list[str]:
        """The program a CLI runs on a lifecycle event: ``cao/hook.py``, which posts the event to
        cao-server for this terminal. ``source`` names the CLI; ``event``, when given, names the
        event even if the CLI's payload doesn't arrive (see cao/hook.py)."""
        return [
            sys.executable,
            "-P",  # not the working directory first on sys.path: a project's own cao/ must not run
            "-m",
            "cao.hook",
            "--terminal",
            self.terminal_id,
            "--server",
            self.server_url,
            "--home",
            str(self.cao_home),
            *(["--key", self.hook_key] if self.hook_key else []),
            source,
            *([event] if event else []),
        ]


@dataclass(frozen=True)
class LaunchSpec:
    command: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)  # written before launch
    # the turn-appending hook event this launch wired (Provider.turn_channel), or None
    turn_channel: str | None = None


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def last_line(text: str) -> str:
    """The last non-empty line of a raw log tail (handles CR redraws and ANSI)."""
    for line in reversed(re.split(r"[\r\n]", strip_ansi(text))):
        if line.strip():
            return line
    return ""


class Provider:
    """Base class. Subclasses set the class attributes and implement the screen functions; the real
    CLIs' providers derive from ``providers.tui.BoxedTUI``, which writes those over a few hooks."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # A message pasted mid-turn is queued as its own turn (never merged into the running one).
    accepts_input_while_processing: ClassVar[bool] = False
    # seconds a pane must be quiet after printing before its output wakes delivery (tmux %output,
    # cao/tmux/control.py): a CLI redraws a screen in bursts a few ms apart
    output_quiet: ClassVar[float] = 0.01
    # The CLI's own key that stops a running turn and brings its prompt back (an urgent message
    # with if_busy=interrupt: docs/attention.md), or None: it has none cao has proven on the real
    # program. ``interrupt_keeps_input``: the key keeps text typed into an input box the screen
    # hides while the CLI works (else cao sends it only while it can see the box is empty).
    interrupt_key: ClassVar[str | None] = None
    interrupt_keeps_input: ClassVar[bool] = False
    # The CLI's lifecycle hook event that can hand text to its running turn (a turn-appending
    # channel, proven on the real program: docs/attention.md), or None. cao's hook program prints
    # ``hand_output(text)`` for it; an urgent interrupting message goes this way instead of a key.
    turn_channel: ClassVar[str | None] = None
    # Seconds between the paste and Enter, and how many Enters submit.
    paste_enter_delay: ClassVar[float] = 0.0
    enter_count: ClassVar[int] = 1
    # How long to wait for proof that a submit took (the pane left idle / the box emptied).
    submit_timeout: ClassVar[float] = 2.0
    # The CLI starts cao's MCP server itself and may take input before it is connected (the turn
    # would then run without cao's tools): hold inbox deliveries and handoff tasks until the MCP
    # server reports in (POST /terminals/{id}/mcp-ready), or until CAO_MCP_READY_TIMEOUT passes.
    waits_for_mcp: ClassVar[bool] = False
    # Typed (then Enter) to leave the CLI politely.
    exit_command: ClassVar[str] = "/exit"
    # A name that is no agent profile is still a valid ``agent_profile`` when its rule file exists
    # (``$CAO_HOME/scripted/<name>.json``): the bundled scripted agent's way of being told what to do.
    takes_rule_files: ClassVar[bool] = False
    # Cheap check on the last line of the raw pane log: could the agent be idle now? It only saves
    # screen captures, so it must pass every ready screen (the contract test checks the saved
    # ones). None: no such check; delivery then looks at most every 250 ms while the log changes.
    idle_tail_pattern: ClassVar[Rule | None] = None
    # The CAO_* variables the launch reads (through ``ctx.knob``), each declared once: cao/knobs.py.
    # ``providers.all_knobs()`` lists every provider's; docs/providers.md's table is made from them.
    knobs: ClassVar[tuple[Knob[Any], ...]] = ()
    # What each of the CLI's lifecycle hook events means (see hook_phase).
    hook_phases: ClassVar[Mapping[str, HookPhase]] = {}

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        raise NotImplementedError

    def hand_output(self, text: str) -> str:
        """What the hook program prints on stdout to add ``text`` to the running turn: Claude
        Code's ``hookSpecificOutput.additionalContext`` (Codex, Qwen Code and Gemini CLI read the
        same shape)."""
        return json.dumps(
            {"hookSpecificOutput": {"hookEventName": self.turn_channel, "additionalContext": text}}
        )

    def hook_phase(self, event: str, payload: Mapping[str, object]) -> HookPhase | None:
        """What the CLI's lifecycle hook ``event`` (with its ``payload``, see cao/hook.py) says
        about its turn (cao/hookstate.py); None: nothing (an event cao doesn't use, or a provider
        whose launch wires no hooks). The launch wires them with ``ctx.hook_command(...)``. The
        default looks the event up in ``hook_phases``; providers whose events need their payload
        read override this."""
        return self.hook_phases.get(event)

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Every model response this terminal's CLI has recorded so far, read from its own files
        under ``home`` (the terminal's throwaway HOME, ``LaunchContext.terminal_home``), oldest
        first. ``None``: this CLI records nothing cao can read, so its usage is *unknown* (shown
        so, never as 0); ``[]``: it records usage and has made no request yet. Pure file reading:
        no tmux, no network, never raises on a half-written or foreign file (skip what can't be
        parsed)."""
        return None

    def detect_status(self, screen: str) -> TerminalStatus:
        raise NotImplementedError

    def detect(self, screen: str) -> Reading:
        """``detect_status`` with the evidence: for ``unknown``, why nothing matched (shown to the
        operator). Providers that can tell override this and derive ``detect_status`` from it."""
        return Reading(self.detect_status(screen))

    def can_read(self, screen: str) -> bool:
        """Does this screen match anything the provider knows? On one it can't read, the input box
        can't be found or told from the history, whatever the CLI's hooks say (cao/hookstate.py):
        no paste goes there, and neither "the box emptied" nor a header on it proves anything."""
        return self.detect(screen).status != TerminalStatus.UNKNOWN

    def extract_last_message(self, screen: str) -> str:
        raise NotImplementedError

    def input_text(self, screen: str) -> str | None:
        """Text in the input box, ``""`` when empty, ``None`` when no input box is showing."""
        raise NotImplementedError

    def transcript(self, screen: str) -> str:
        """The part of ``screen`` above the input box: what the agent has *shown* as its history.

        ``screen`` may be a whole-scrollback capture that ends with the visible screen. Text still
        sitting in the input box (and the box's footer) is not part of it, so delivery never takes
        a message that was pasted but not submitted for one the agent received. The default (no
        input box known) is the whole screen; providers with a box override it.
        """
        return screen

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        """Did a paste + Enter take? ``before`` is the screen before the paste, ``after`` a fresh one.

        True: submitted. False: the text still sits in the input box (delivery presses Enter once
        more). None: can't tell yet. The default: the input box is empty and the screen moved on.
        Providers whose busy screen keeps changing (spinners) should look for firmer evidence.
        """
        box = self.input_text(after)
        if box and box.strip():
            return False
        return True if after != before else None

    def tail_looks_idle(self, tail: str) -> bool:
        return self.idle_tail_pattern is None or bool(self.idle_tail_pattern.search(last_line(tail)))
