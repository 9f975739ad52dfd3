"""What names a pane instance and what cao reads back from tmux about it: the identity tuple
(``PaneRef``), the formats every checked action uses, what keeps input out of a pane a person is
using (a mode, input off, synchronized panes), and the errors that say so."""

from __future__ import annotations

from dataclasses import dataclass

from cao.errors import PaneInMode, PaneMismatch
from cao.states import Blocked

SESSION_PREFIX = "cao-"
_PLACEHOLDER = "__cao_init"
_SERVER_DOWN_WORDS = ("no server running", "error connecting to", "server exited unexpectedly")


_ID_FMT = "#{pid}/#{pane_pid}/#{pane_dead}"
# What keeps cao's input out of a pane a person is using, read in the same call as each action:
# the tmux modes stacked on it and their name ("0:" or "1:copy-mode"), input turned off
# (select-pane -d), and synchronize-panes (cao's keys would reach a person's other panes too).
_MODE_FMT = "#{pane_in_mode}:#{pane_mode}:#{pane_input_off}:#{pane_synchronized}"
_REFUSED = "cao-refused"
_NOT_IN_MODE = "#{&&:#{==:#{pane_in_mode},0},#{&&:#{==:#{pane_input_off},0},#{==:#{pane_synchronized},0}}}"
INPUT_OFF = "input-off"
SYNCHRONIZED = "synchronize-panes"


def _blocker(fields: str) -> str:
    """``""`` when cao may type into the pane, else what stops it: a mode's name, ``input-off`` or
    ``synchronize-panes`` (from the ``_MODE_FMT`` fields)."""
    in_mode, name, input_off, synced = ([*fields.split(":"), "", "", "", ""])[:4]
    if in_mode not in ("", "0"):  # the number of modes stacked on the pane
        return name or "unknown"
    if input_off == "1":
        return INPUT_OFF
    if synced == "1":
        return SYNCHRONIZED
    return ""


def blocked_reason(mode: str) -> Blocked:
    """Why nothing is typed into a pane (``mode`` from :func:`_blocker`), as a person reads it."""
    return {
        "copy-mode": Blocked.COPY_MODE,
        "view-mode": Blocked.VIEW_MODE,
        "tree-mode": Blocked.TREE_MODE,
        "clock-mode": Blocked.CLOCK_MODE,
        INPUT_OFF: Blocked.INPUT_OFF,
        SYNCHRONIZED: Blocked.SYNCHRONIZED,
    }.get(mode, Blocked.OTHER_MODE)


def in_mode_error(mode: str, *, typed: bool = False) -> PaneInMode:
    way_out = {
        INPUT_OFF: "until input is turned back on (select-pane -e)",
        SYNCHRONIZED: "until synchronize-panes is off",
    }.get(mode, "until the mode ends (q or Escape leaves it)")
    what = blocked_reason(mode) + (f" ({mode})" if blocked_reason(mode) == Blocked.OTHER_MODE else "")
    return PaneInMode(f"{what}: nothing is typed into it {way_out}", mode=mode, typed=typed)


@dataclass(frozen=True)
class PaneRef:
    """A pane instance: tmux server pid, pane id and the pane's process. A new tmux server hands
    out ``%0``, ``%1``… again, and ``respawn-pane`` keeps the id with a new process, so only the
    triple names one pane. Every read, paste and kill below checks it in the same tmux call."""

    server_pid: int
    pane_id: str
    pane_pid: int
    # the pane's @cao_home tag (which CAO_HOME created it), checked too when given: a copy of one
    # home's database run by another server on the same tmux server must not reach its panes
    home: str = ""

    @property
    def fmt(self) -> str:
        """The tmux format that reads this identity back."""
        return f"{_ID_FMT}/#{{@cao_home}}" if self.home else _ID_FMT

    @property
    def expected(self) -> str:
        return f"{self.server_pid}/{self.pane_pid}/0" + (f"/{self.home}" if self.home else "")

    @property
    def refused(self) -> str:
        """What a refused conditional action prints instead (parsed by ``Tmux._raise_refused``)."""
        return f"{_REFUSED} {self.fmt} #{{@cao_fence}} {_MODE_FMT}"

    def condition(
        self, fence: int | None = None, *, fence_op: str = "<", alive: bool = True, typing: bool = False
    ) -> str:
        """A tmux format that is 1 only for this pane, alive (and, with ``fence``, only while the
        pane's ``@cao_fence`` compares ``fence_op`` to it). ``alive=False``: dead or alive.
        ``typing``: also only while the pane is in no tmux mode (in copy mode tmux would send a
        paste without its bracket markers, every newline an Enter, and keys would drive the mode)."""
        if alive:
            ident = f"#{{==:{self.fmt},{self.expected}}}"
        else:
            home = "/#{@cao_home}" if self.home else ""
            want = f"{self.server_pid}/{self.pane_pid}" + (f"/{self.home}" if self.home else "")
            ident = f"#{{==:#{{pid}}/#{{pane_pid}}{home},{want}}}"
        # the pane's own id too: a control client resolves an if-shell target that is gone to its
        # own current pane (a forked client to none), and that must never read as this pane
        ident = f"#{{&&:#{{==:#{{pane_id}},{self.pane_id}}},{ident}}}"
        if typing:
            ident = f"#{{&&:{ident},{_NOT_IN_MODE}}}"
        if fence is None:
            return ident
        op = "<" if fence_op == "<" else "=="
        return f"#{{&&:{ident},#{{e|{op}:#{{@cao_fence}},{fence}}}}}"


@dataclass(frozen=True)
class PaneInfo:
    pane_id: str
    pane_pid: int
    session_name: str
    window_name: str
    server_pid: int = 0

    @property
    def ref(self) -> PaneRef:
        return PaneRef(self.server_pid, self.pane_id, self.pane_pid)


@dataclass(frozen=True)
class TaggedPane:
    """A pane as ``list-panes`` sees it, with the tags cao set when it created it."""

    server_pid: int
    pane_id: str
    pane_pid: int
    dead: bool
    terminal_id: str
    home_tag: str
    piped: bool = True  # its output goes to a pipe (cao's pane log)
    session_name: str = ""

    @property
    def ref(self) -> PaneRef:
        return PaneRef(self.server_pid, self.pane_id, self.pane_pid, self.home_tag)


def _mismatch(ref: PaneRef, seen: str) -> PaneMismatch:
    server, _, rest = seen.partition("/")
    pid, _, rest = rest.partition("/")
    dead, _, home = rest.partition("/")
    if not pid:
        why = f"tmux pane {ref.pane_id} no longer exists"
    elif server != str(ref.server_pid):
        why = f"a new tmux server (pid {server}, was {ref.server_pid}) reuses pane id {ref.pane_id}"
    elif pid != str(ref.pane_pid):
        why = f"pane {ref.pane_id} runs another process (pid {pid}, was {ref.pane_pid})"
    elif dead == "1":
        why = f"the program in pane {ref.pane_id} exited"
    elif ref.home and home != ref.home:
        owner = home or "untagged"
        why = f"pane {ref.pane_id} belongs to another cao home ({owner}): another cao-server's agent"
    else:
        why = f"pane {ref.pane_id} is not the terminal's ({seen})"
    return PaneMismatch(why)


def session_name_for(name: str) -> str:
    return name if name.startswith(SESSION_PREFIX) else SESSION_PREFIX + name
