"""What the server keeps of the agent CLIs' lifecycle hooks: what they report about their turns,
next to the screen. (The program the CLIs run to report is ``cao/hook.py``.)

Claude Code runs hook commands on ``UserPromptSubmit`` / ``Stop`` / ``Notification``, Codex runs
its ``notify`` program when a turn completes, Gemini CLI runs ``BeforeAgent`` / ``AfterAgent``
hooks. cao's launch points them at ``python -m cao.hook`` (``cao/hook.py``), which posts each
event to ``POST /terminals/{id}/hooks``; the provider maps the CLI's event to a **phase**
(:class:`Phase`) and :class:`Hooks` keeps the latest per terminal.

The screen stays the judge of what only the screen shows (a permission menu, a start-up dialog,
the text in the input box); a hook is used where the screen can't tell or a CLI release drew
something its provider never saw (:func:`combine`):

=================================  ==============================================================
screen reads                       with the CLI's latest hook
=================================  ==============================================================
``waiting_user_answer``            kept (the menu is on screen)
an exited CLI (``final``)          kept
``unknown`` (nothing matched)      turn ended → ``completed`` (from a CLI that reports only turn
                                   ends, e.g. Codex's ``notify``: only within ``settle`` seconds);
                                   turn started → ``processing``;
                                   asking → ``waiting_user_answer``; session started → ``idle``;
                                   none yet → ``unknown``
``processing``                     kept, unless the CLI said its turn ended more than ``settle``
                                   seconds ago and no turn began since (a CLI that has reported
                                   a turn start reports them all; Codex's ``notify`` reports only
                                   ends): the two disagree → ``unknown`` with both sides named
idle / completed / error           a turn start less than ``settle`` seconds old → ``processing``
                                   (the screen hasn't caught up yet); an older one is reported in
                                   the reason only (an interrupted turn never reports its end)
any but an exited CLI              the session ended → ``unknown`` (exited), unless the screen
                                   reads ready more than ``settle`` seconds later (a /clear whose
                                   new session's report was lost: a real exit ends the pane)
=================================  ==============================================================

A hook's prompt text is also evidence a delivery can attribute: a ``UserPromptSubmit`` (or a
Codex turn's ``input-messages``) that carries a message's own ``[cao message #N …] (ref NONCE)``
header as a whole line proves that message was submitted (:meth:`Hooks.saw`); only those marker
lines are kept, a bounded number per terminal, forgotten with the terminal.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cao.errors import InvalidInput
from cao.states import HookPhase as Phase
from providers.base import Reading, TerminalStatus

MARKERS_KEPT = 1024  # message headers/trailers seen in reported prompts, per terminal
TEXT_LIMIT = 65_536  # characters of an answer kept from one event
# A whole line that is a cao header or trailer (cao/paste.py): the only part of a prompt kept.
MARKER_RE = re.compile(
    r"^(?:\[cao message #\d{1,19} from [^\]\s]{1,64}\]|\[end of cao message #\d{1,19}\])"
    r" \(ref [0-9a-f]{1,32}\)$",
    re.M,
)

logger = logging.getLogger(__name__)


@dataclass
class HookState:
    """The latest turn-relevant event of one terminal, and the message markers its prompts held."""

    phase: Phase | None = None
    event: str = ""  # the CLI's own name for it (Stop, agent-turn-complete, AfterAgent…)
    at: float = 0.0  # when cao-server received it
    detail: str = ""  # e.g. a Notification's message
    last_message: str = ""  # the answer the CLI reported with its turn end, if any
    count: int = 0  # events received
    starts: bool = False  # it has reported a turn start (so it reports every one: Claude, Gemini)
    transcript: str | None = None  # the CLI's transcript file, as its hooks name it (Claude Code)
    markers: deque[str] = field(default_factory=lambda: deque(maxlen=MARKERS_KEPT))

    def as_dict(self, iso: Callable[[float], str | None]) -> dict[str, object]:
        return {
            "event": self.event,
            "phase": self.phase.value if self.phase else None,
            "at": iso(self.at),
            "detail": self.detail or None,
            "events": self.count,
        }


class Hooks:
    """Per-terminal hook state (thread-safe; in memory)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._states: dict[str, HookState] = {}
        self._lock = threading.Lock()

    def record(
        self,
        terminal_id: str,
        phase: Phase | None,
        event: str,
        *,
        prompts: list[str] | None = None,
        detail: str = "",
        last_message: str = "",
        transcript: str | None = None,
    ) -> None:
        """Note one event, in the order cao-server receives them (the CLIs wait for each hook to
        finish before their turn goes on, so that is the order they happened in). The message
        markers in its prompts count as evidence whatever its phase."""
        with self._lock:
            state = self._states.setdefault(terminal_id, HookState())
            state.count += 1
            if transcript:
                state.transcript = transcript
            for prompt in prompts or ():
                state.markers.extend(m for m in MARKER_RE.findall(prompt) if m not in state.markers)
            if phase is None:
                return
            state.phase, state.event = phase, event
            state.at = self.clock()
            state.detail = detail[:1000]
            if phase == Phase.TURN_END and last_message:
                state.last_message = last_message[:TEXT_LIMIT]
            elif phase == Phase.TURN_START:
                state.last_message = ""
                state.starts = True

    def restore(self, terminal_id: str, phase: Phase, event: str, at: float, starts: bool) -> None:
        """The latest report as stored before a cao-server restart (no evidence: that is in the
        panes' history, where delivery's recovery looks)."""
        with self._lock:
            if terminal_id not in self._states:
                self._states[terminal_id] = HookState(phase=phase, event=event, at=at, starts=starts)

    def state(self, terminal_id: str) -> HookState | None:
        with self._lock:
            state = self._states.get(terminal_id)
            if state is None:
                return None
            return HookState(**{**state.__dict__, "markers": deque()})  # without the evidence (saw)

    def ready(self, terminal_id: str) -> bool:
        """Did the CLI's latest report say it waits for input (a turn ended, its session began)?
        Such a report often comes before the screen settles, so the next screen change is worth
        a full look even when the pane log's last line doesn't look idle."""
        with self._lock:
            state = self._states.get(terminal_id)
            return state is not None and state.phase in (Phase.TURN_END, Phase.SESSION_START)

    def transcript(self, terminal_id: str) -> str | None:
        """The CLI's transcript file its hooks last named (not checked here: the reader checks it)."""
        with self._lock:
            state = self._states.get(terminal_id)
            return state.transcript if state is not None else None

    def saw(self, terminal_id: str, marker: str) -> bool:
        """Did the CLI report a submitted prompt holding ``marker`` (a message's header or trailer,
        with its nonce) as a whole line?"""
        with self._lock:
            state = self._states.get(terminal_id)
            return state is not None and marker in state.markers

    def forget(self, terminal_id: str) -> None:
        with self._lock:
            self._states.pop(terminal_id, None)


def combine(
    reading: Reading,
    state: HookState | None,
    now: float,
    *,
    settle: float,
) -> tuple[Reading, bool]:
    """The status from the screen's ``reading`` and the CLI's latest hook ``state`` (see the table
    in this module's docstring). Returns the reading and whether the hook changed or annotated it
    (then its reason is shown to the operator)."""
    if state is None or state.phase is None or reading.final:
        return reading, False
    status, phase = reading.status, state.phase
    age = max(0.0, now - state.at)
    said = f"the CLI's {state.event} hook {age:.0f} s ago"
    if phase == Phase.SESSION_END:
        ready = status in (TerminalStatus.IDLE, TerminalStatus.COMPLETED, TerminalStatus.ERROR)
        if not ready or age <= settle:
            return Reading(TerminalStatus.UNKNOWN, f"the CLI has exited ({said})", final=True), True
        # still drawing its box long after: a session boundary (/clear, /new) whose "session start"
        # never arrived. An exit would have ended the pane by now (tmux says so): the screen's.
        return (
            Reading(status, f"{said} the session ended, yet its input box is still up: going by the screen"),
            True,
        )
    if status == TerminalStatus.WAITING_USER_ANSWER:
        return reading, False
    if status == TerminalStatus.UNKNOWN:
        why = f"screen not recognised ({reading.reason}); going by {said}"
        if phase == Phase.TURN_END:
            if state.starts or age <= settle:
                return Reading(TerminalStatus.COMPLETED, why), True
            # a CLI that reports only turn ends (Codex's notify) would not report a later turn,
            # a question or a dialog either: an old turn end says nothing about now
            return Reading(TerminalStatus.UNKNOWN, f"{why}, which is too old to go by"), True
        if phase == Phase.TURN_START:
            return Reading(TerminalStatus.PROCESSING, why), True
        if phase == Phase.SESSION_START:
            return Reading(TerminalStatus.IDLE, why), True
        if phase == Phase.ASKING:
            return Reading(TerminalStatus.WAITING_USER_ANSWER, f"{why}: {state.detail}".rstrip(": ")), True
        return reading, False
    if status == TerminalStatus.PROCESSING:
        if phase == Phase.TURN_END and state.starts and age > settle:
            return (
                Reading(
                    TerminalStatus.UNKNOWN,
                    f"the screen reads processing ({reading.reason or 'busy'}) but {said} said the turn "
                    "ended and no turn started since",
                ),
                True,
            )
        return reading, False
    # idle, completed, error
    if phase == Phase.TURN_START:
        if age <= settle:
            return (
                Reading(TerminalStatus.PROCESSING, f"{said} started a turn; the screen has not caught up"),
                True,
            )
        return (
            Reading(status, f"{said} started a turn and none ended since; the screen reads {status.value}"),
            True,
        )
    return reading, False


# -- who may report for a terminal -------------------------------------------------------------------
HOOK_KEY_HEADER = "X-Cao-Hook-Key"
SECRET_FILE = "hook-secret"


def load_secret(home: Path) -> bytes:
    """This home's secret for hook keys (``$CAO_HOME/hook-secret``, 0600), made on first use and
    made anew when the file is too short to be one (an empty or truncated file would make every
    key guessable)."""
    path = home / SECRET_FILE
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        secret = b""
    except IsADirectoryError:
        raise InvalidInput(f"{path} is a directory; remove it (cao-server makes the file itself)") from None
    if len(secret) >= 32:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # readable by others: not a secret
        return secret
    home.mkdir(parents=True, exist_ok=True)
    fresh = secrets.token_hex(32).encode()
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(fresh)
    if secret:  # too short: replace it
        os.replace(tmp, path)
        return fresh
    try:
        os.link(tmp, path)  # first writer wins; a second reads the winner's
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    found = path.read_bytes().strip()
    if len(found) < 32:  # an empty file was there: ours replaces it
        path.write_bytes(fresh)
        path.chmod(0o600)
        return fresh
    return found


def keep_secret(home: Path, secret: bytes) -> bool:
    """Write this server's secret again if ``$CAO_HOME/hook-secret`` was deleted or changed under it
    (the running agents' hook keys are derived from it, so a restart would make a new one and
    refuse them all). Returns whether it had to."""
    path = home / SECRET_FILE
    try:
        if path.read_bytes().strip() == secret:
            return False
    except (FileNotFoundError, IsADirectoryError):
        pass
    if path.is_dir():
        return False  # an operator's directory there: the next start says so
    tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secret)
    os.replace(tmp, path)
    logger.warning("hook-secret was deleted or changed under the running server; written again")
    return True


def hook_key(secret: bytes, terminal_id: str) -> str:
    """The key a terminal's hook program sends (cao passes it to the CLI at launch): one agent's
    key can't be used to report for another, even by a holder of the API token."""
    return hmac.new(secret, terminal_id.encode(), hashlib.sha256).hexdigest()[:32]
