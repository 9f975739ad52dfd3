"""The only module that talks to tmux.

libtmux gives us the server handle (socket name, binary, liveness); the hot path (capture, paste)
runs the tmux binary directly so one process can carry several chained commands (``;``) and the
paste text can go through stdin (no argv length limit, nothing on a command line).

Naming: sessions ``cao-<name>``, one window per terminal, panes addressed by their unique
``%N`` id, sessions by exact name (``=name``) so tmux never prefix-matches another session.
"""

from __future__ import annotations

from cao.tmux.client import Tmux
from cao.tmux.procs import descendants, pid_alive
from cao.tmux.refs import (
    INPUT_OFF,
    SESSION_PREFIX,
    SYNCHRONIZED,
    PaneInfo,
    PaneRef,
    TaggedPane,
    blocked_reason,
    in_mode_error,
    session_name_for,
)

__all__ = [
    "INPUT_OFF",
    "SESSION_PREFIX",
    "SYNCHRONIZED",
    "PaneInfo",
    "PaneRef",
    "TaggedPane",
    "Tmux",
    "blocked_reason",
    "descendants",
    "in_mode_error",
    "pid_alive",
    "session_name_for",
]
