"""Run one cao action in a separate process that dies (``os._exit(1)``) at a named fault point.

    python -m tests.crash_helper HOME SOCKET FAULT_POINT send RECEIVER BODY [KEY]
    python -m tests.crash_helper HOME SOCKET FAULT_POINT deliver RECEIVER
    python -m tests.crash_helper HOME SOCKET FAULT_POINT create PROFILE
    python -m tests.crash_helper HOME SOCKET FAULT_POINT delete TERMINAL

Exit status 1 = the fault point was reached; 0 = the action finished without reaching it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cao.core import Cao
from cao.settings import Settings


def main(argv: list[str]) -> int:
    home, socket_name, fault, action, target, *rest = argv
    settings = Settings(
        home=Path(home),
        tmux_socket=socket_name,
        fault_point=fault,
        scripted_record=True,
        inline_limit=int(os.environ.get("CAO_INBOX_INLINE_LIMIT", "4096")),
        database_url=os.environ.get("CAO_DATABASE_URL") or None,
    )
    core = Cao(settings)  # not started: no triggers of its own, only the action below
    if action == "send":
        core.send_message(
            target, rest[0], sender_id="crasher", idempotency_key=rest[1] if len(rest) > 1 else None
        )
    elif action == "deliver":
        core.delivery.deliver(target, trigger="crash-test")
    elif action == "create":
        print(core.lifecycle.create(provider="scripted", agent_profile=target).id)
    elif action == "delete":
        core.lifecycle.delete(core.terminal_row(target))
    else:
        raise SystemExit(f"unknown action {action}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
