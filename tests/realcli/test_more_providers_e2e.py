"""OpenCode, Qwen Code, Copilot CLI, Kimi CLI and Hermes driven through cao-server, inside the
loopback-only bed.

Lean on purpose (``make test`` has a time budget): one cao-server and one terminal per CLI, and in
that one terminal a turn with its answer, an MCP ``send_message`` round trip to a scripted peer, and
an inbox message delivered exactly once (counted at the fake model). The helpers are the ones of
test_providers_e2e.py. Kimi CLI gets the fake model's markers as ``<<…>>``: it reads ``[word:word]``
in typed text as an attachment placeholder and splits the message there.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from cao.tmux import descendants
from tests.prepare import VENV_CLIS, missing_hint, venv_bin, venv_cli_blocker
from tests.realcli.bed import Bed
from tests.realcli.conftest import CACHE, COMMANDS, CaoServer, wait_for
from tests.realcli.test_providers_e2e import (
    CLI,
    SENDER,
    assert_delivered_at_first_or_second_try,
    cmdline,
    launch,
    token,
    turns_with,
)

pytestmark = pytest.mark.realcli

CLIS = [
    CLI("opencode", queues_while_busy=False, start_timeout=90, turn_end="session.idle"),
    # Qwen follows its Stop with an idle_prompt Notification at once (Claude waits 60 s)
    CLI("qwen_code", queues_while_busy=False, start_timeout=90, turn_end="Stop|Notification"),
    CLI("copilot", queues_while_busy=False, start_timeout=90, turn_end="agentStop"),
    CLI("kimi_cli", queues_while_busy=False, start_timeout=90, turn_end="Stop"),
    CLI("hermes", queues_while_busy=False, start_timeout=90, turn_end="on_session_end"),
]
ANGLE_MARKERS = ("kimi_cli",)


def marked(cli: CLI, text: str) -> str:
    """``text`` with the fake model's markers in the syntax ``cli`` passes on unchanged."""
    if cli.provider in ANGLE_MARKERS:
        return text.replace("[[", "<<").replace("]]", ">>")
    return text


def ensure_installed(cli: CLI) -> None:
    """A Python CLI (``VENV_CLIS``) is there (tests/prepare.py installed it), or the test skips saying why."""
    command = COMMANDS[cli.provider]
    if command in VENV_CLIS and not venv_bin(command, CACHE).exists():
        what = f"{command} ({VENV_CLIS[command][0]}, in {CACHE})"
        pytest.skip(missing_hint(what, "realcli", venv_cli_blocker()))


@pytest.mark.parametrize("cli", CLIS, ids=[c.provider for c in CLIS])
def test_turn_mcp_round_trip_and_inbox_once(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    ensure_installed(cli)
    server = make_server(cli.provider)
    agent = launch(server, bed, cli)
    assert agent.last() == ""

    tok = token()
    agent.type(
        marked(cli, f"Say hello slowly {tok} [[delay:3]][[reply:Hello from the model.\n\nSecond line.]]"), tok
    )
    agent.wait("processing", timeout=10)
    # "completed" can show a frame before the answer is fully drawn: wait for the answer itself
    wait_for(
        lambda: agent.last() == "Hello from the model.\n\nSecond line." and agent.status() == "completed",
        40,
        "the answer",
    )
    if cli.turn_end:
        agent.wait_hook(cli.turn_end, "turn_end")

    # The CLI's MCP server (python -m cao.mcp) speaks for the agent: the peer's inbox names it.
    peer = server.call(
        "POST", "/sessions", params={"provider": "scripted", "working_directory": str(server.work)}
    )
    pane_pid = int(bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_pid}").strip())
    wait_for(
        lambda: any("cao.mcp" in cmdline(p) for p in descendants(pane_pid)), 30, "the CLI's cao MCP server"
    )
    tok = token()
    call = json.dumps({"receiver_id": peer["id"], "message": f"hello from {tok}"})
    agent.type(marked(cli, f"Tell the peer {tok} [[mcp:send_message {call}]][[reply:Peer told.]]"), tok)
    wait_for(lambda: agent.last() == "Peer told." and agent.status() == "completed", 40, "the MCP turn")
    inbox = server.call("GET", f"/terminals/{peer['id']}/inbox/messages")
    assert [(m["sender_id"], m["message"]) for m in inbox] == [(agent.id, f"hello from {tok}")]

    tok = token()
    message_id = agent.send(marked(cli, f"Please acknowledge {tok} [[reply:Acknowledged {tok}.]]"))
    wait_for(lambda: agent.message(message_id)["status"] == "delivered", 30, "the message delivered")
    wait_for(
        lambda: agent.last() == f"Acknowledged {tok}." and agent.status() == "completed",
        40,
        f"the answer to message {message_id}",
    )
    assert_delivered_at_first_or_second_try(cli, agent.message(message_id))
    assert len(turns_with(bed, tok)) == 1
    assert f"[cao message #{message_id} from {SENDER}]" in agent.screen()

    if cli.provider == "hermes":
        # /new fires on_session_finalize, as quitting does (reason "session_boundary", not
        # "shutdown"): Hermes waits for input in a fresh session, and its mail goes in.
        server.call("POST", f"/terminals/{agent.id}/input", json={"message": "/new now"})
        agent.wait_hook("on_session_finalize", "session_start", timeout=20)
        agent.wait("idle", "completed", timeout=20)  # /new keeps the old turns on screen
        tok = token()
        message_id = agent.send(f"After the new session {tok} [[reply:Fresh {tok}.]]")
        wait_for(lambda: agent.message(message_id)["status"] == "delivered", 30, "mail after /new")
        wait_for(lambda: agent.last() == f"Fresh {tok}.", 40, "the answer after /new")
