"""Where a running cao-server can be found: ``$CAO_HOME/server.json``.

cao-server writes it once it listens (its URL, pid and tmux socket) and removes it when it stops,
so ``cao`` talks to the server the user started — ``cao-server --port 9999`` then ``cao status``
just works — unless ``CAO_SERVER_URL`` (or ``CAO_API_HOST``/``CAO_API_PORT``) says otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

NAME = "server.json"


def write(home: Path, *, url: str, tmux_socket: str | None) -> Path:
    path = home / NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid(), "tmux_socket": tmux_socket}))
    tmp.replace(path)
    return path


def read(home: Path) -> dict[str, Any] | None:
    """The record of a server that is still running (its pid alive), else None."""
    try:
        data = json.loads((home / NAME).read_text())
        pid = int(data["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data if isinstance(data.get("url"), str) else None


def remove(home: Path) -> None:
    path = home / NAME
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
