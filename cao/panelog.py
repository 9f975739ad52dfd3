"""The pane logs: ``$CAO_HOME/logs/terminal/<id>.log``, one per terminal — the one owner of them.

tmux's ``pipe-pane`` appends every byte a pane prints to its terminal's log (cao/tmux/ opens
the pipe). The log is what the watchdog trigger polls (cao/engine.py), what the delivery's cheap
"could it be idle?" check reads the tail of (cao/delivery.py), what the dashboard's live terminal
view streams (cao/dashboard.py), and what housekeeping keeps under the cap and removes with its
terminal. Everything those do with the files goes through this class.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


class PaneLogs:
    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, terminal_id: str) -> Path:
        return self.dir / f"{terminal_id}.log"

    def exists(self, terminal_id: str) -> bool:
        return self.path(terminal_id).exists()

    def tail(self, terminal_id: str, size: int) -> str | None:
        """The last ``size`` bytes as text; None when the log can't be read."""
        try:
            with self.path(terminal_id).open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                end = fh.tell()
                fh.seek(max(0, end - size))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return None

    def remove(self, terminal_id: str) -> None:
        """Its terminal is deleted: nothing writes the log any more."""
        with contextlib.suppress(OSError):
            self.path(terminal_id).unlink()

    def cap(self, cap_bytes: int) -> list[str]:
        """Truncate the logs over ``cap_bytes`` (the pipe appends with O_APPEND, so it carries on);
        the terminals whose log was truncated."""
        capped: list[str] = []
        try:
            with os.scandir(self.dir) as listing:  # closed even if the listing fails half-way
                entries = list(listing)
        except FileNotFoundError:
            return capped
        for entry in entries:
            try:
                if entry.is_file() and entry.stat().st_size > cap_bytes:
                    os.truncate(entry.path, 0)
                    terminal_id = entry.name.removesuffix(".log")
                    capped.append(terminal_id)
                    extra = {"terminal_id": terminal_id, "cap_bytes": cap_bytes}
                    logger.info("pane log truncated at the cap", extra=extra)
            except OSError:
                continue
        return capped
