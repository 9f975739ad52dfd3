"""The reference orchestrator's CLI launching a real agent CLI through cao-server (issue 10).

``cli-agent-orchestrator``'s own ``cao launch --provider claude_code "task"`` runs inside the
loopback-only bed (it must reach cao-server's loopback port there), against a cao-server whose
agents are the real Claude Code talking to cao's fake model: the task arrives through the inbox,
the real CLI answers, and the reference client reads the answer back. ``claude_code`` is a provider
name both projects share, so no alias is involved.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from tests.realcli.bed import Bed
from tests.realcli.conftest import CaoServer
from tests.realcli.test_providers_e2e import token, turns_with
from tests.test_compat import install

pytestmark = pytest.mark.realcli


def test_the_reference_cli_launches_a_real_claude_code_with_a_task(
    bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    venv = install("2.5.4")
    server = make_server("claude_code")
    tok = token("ref")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(server.home.parent),
        "LANG": "C.UTF-8",
        "CAO_API_HOST": "127.0.0.1",
        "CAO_API_PORT": str(server.port),
    }
    argv = [
        str(venv / "bin" / "cao"),
        "launch",
        "--agents",
        "developer",
        "--provider",
        "claude_code",
        "--headless",
        "--auto-approve",
        "--session-name",
        "refreal",
        f"Say hello {tok} [[reply:Hello from the real CLI, via the reference client.]]",
    ]
    done = subprocess.run(
        bed.ns(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=server.work,
    )
    assert done.returncode == 0, (done.stdout, done.stderr, server.log()[-3000:])
    assert "Hello from the real CLI, via the reference client." in done.stdout
    assert len(turns_with(bed, tok)) == 1  # the task reached the model once
    [terminal] = server.call("GET", "/terminals")
    assert terminal["provider"] == "claude_code" and terminal["session_name"] == "cao-refreal"
