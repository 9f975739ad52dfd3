"""The real Claude Code, Codex and Gemini CLIs driven through cao-server, inside the loopback-only bed.

Each test starts its own cao-server in the bed (see conftest.py), launches one terminal with
``POST /sessions?provider=…``, drives it through the HTTP API (the bed's tmux is used only to read
pane pids and to re-press an Enter that ``/input`` lost, see ``Agent.type``), and deletes it. The fake
model (cao/testing/fakemodel.py) answers by the markers in the prompt; its request log tells how
many model turns carried a message, so "delivered exactly once" is counted where the CLI acts on it.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import providers
from cao.tmux import descendants, pid_alive
from tests.prepare import OLDER_CLIS, missing_hint, version_bin
from tests.realcli.bed import Bed
from tests.realcli.conftest import CACHE, COMMANDS, CaoServer, knob, wait_for

pytestmark = pytest.mark.realcli

SENDER = "e2e-tester"


class CLI(NamedTuple):
    provider: str
    queues_while_busy: bool  # a message pasted mid-turn is queued and runs as its own turn
    start_timeout: float
    turn_end: str = ""  # its lifecycle hook event for a finished turn (cao/hookstate.py); "": none
    asking: str = ""  # ... and for a permission prompt


CLIS = [
    CLI("claude_code", queues_while_busy=True, start_timeout=60, turn_end="Stop", asking="PermissionRequest"),
    # a mid-turn paste cancels the turn
    CLI("codex", queues_while_busy=False, start_timeout=60, turn_end="Stop", asking="PermissionRequest"),
    CLI("gemini_cli", queues_while_busy=True, start_timeout=90, turn_end="AfterAgent", asking="Notification"),
]


@pytest.fixture(params=CLIS, ids=[c.provider for c in CLIS])
def cli(request: pytest.FixtureRequest) -> CLI:
    result: CLI = request.param
    return result


class Agent(NamedTuple):
    """One terminal, seen through the API (and the bed's tmux, only to re-press a swallowed Enter)."""

    server: CaoServer
    bed: Bed
    cli: CLI
    id: str
    pane: str

    def status(self) -> str:
        return self.server.status(self.id)

    def wait(self, *statuses: str, timeout: float = 30) -> str:
        return self.server.wait_status(self.id, *statuses, timeout=timeout)

    def last(self) -> str:
        return self.server.screen(self.id, "last")

    def screen(self) -> str:
        return self.server.screen(self.id)

    def type(self, text: str, token: str) -> None:
        """``POST /input`` and wait until the model got ``token``.

        ``/input`` pastes and presses Enter once, unconfirmed. A CLI starved of CPU (or still
        starting) can read the paste and the Enter in one chunk and keep the Enter as a newline;
        inbox delivery presses Enter again in that case (``Delivery._confirm``), and so does this.
        """
        self.server.call("POST", f"/terminals/{self.id}/input", json={"message": text})
        provider = providers.get(self.cli.provider)
        since: float | None = None
        deadline = time.monotonic() + 20
        while not turns_with(self.bed, token):
            box = provider.input_text(self.bed.capture(self.pane)) or ""
            now = time.monotonic()
            since = (since or now) if token in box else None
            if since is not None and now - since > 1.5:
                print(f"{self.cli.provider} kept the Enter of {token!r} as a newline; pressed Enter again")
                self.bed.send_keys(self.pane, "Enter")
                since = None
            assert now < deadline, f"the model never got {token!r}; screen:\n{self.screen()}"
            time.sleep(0.05)

    def send(self, text: str) -> int:
        """An inbox message from ``SENDER``; returns its id."""
        receipt = self.server.call(
            "POST", f"/terminals/{self.id}/inbox/messages", json={"message": text, "sender_id": SENDER}
        )
        return int(receipt["message_id"])

    def message(self, message_id: int) -> dict[str, Any]:
        return self.server.message(message_id)

    def hook(self) -> dict[str, Any]:
        """The CLI's latest lifecycle hook event as cao-server got it (cao/hookstate.py), or {}."""
        return dict(self.server.call("GET", f"/terminals/{self.id}")["hook"] or {})

    def wait_hook(self, event: str, phase: str, timeout: float = 15) -> None:
        """Until the latest hook event is ``event`` (or one of ``A|B``) with ``phase``."""

        def seen() -> bool:
            hook = self.hook()
            return hook.get("event") in event.split("|") and hook.get("phase") == phase

        wait_for(seen, timeout, f"the {event} hook ({phase}) reported to cao-server; latest: {self.hook()}")


def launch(server: CaoServer, bed: Bed, cli: CLI) -> Agent:
    """A new terminal of ``cli`` through the API, once it shows its idle prompt."""
    terminal = server.call(
        "POST", "/sessions", params={"provider": cli.provider, "working_directory": str(server.work)}
    )
    server.wait_status(terminal["id"], "idle", timeout=cli.start_timeout)
    return Agent(server, bed, cli, str(terminal["id"]), str(terminal["pane_id"]))


def turns_with(bed: Bed, token: str) -> list[int]:
    """Sequence numbers of the model turns whose prompt carries ``token`` (not tool-loop follow-ups)."""
    return [
        r["seq"]
        for r in bed.fake_requests()
        if r.get("kind") == "main" and not r.get("tool_results") and token in (r.get("prompt") or "")
    ]


def token(name: str = "tok") -> str:
    return f"{name}-{secrets.token_hex(4)}"


def answered(agent: Agent, reply: str) -> bool:
    """Whether ``reply`` shows as an answer, besides in the echoed prompt's ``[[reply:…]]`` marker."""
    return agent.screen().count(reply) > 1


def assert_delivered_at_first_or_second_try(cli: CLI, message: dict[str, Any]) -> None:
    """One attempt is the rule. A CLI starved of CPU can drop a paste outright; delivery then sees
    no proof of a submit, releases the message and pastes it again (exactly once is still checked
    at the model)."""
    assert message["status"] == "delivered"
    if message["attempts"] > 1:
        print(f"{cli.provider}: delivered at attempt {message['attempts']} ({message['last_error']})")
    assert message["attempts"] <= 2, message


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# -- launch, a turn, its answer ------------------------------------------------------------------
def test_launch_idle_then_a_turn_completes_with_its_answer(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    agent = launch(make_server(cli.provider), bed, cli)
    assert agent.last() == ""

    tok = token()
    agent.type(f"Say hello slowly {tok} [[delay:3]][[reply:Hello from the model.\n\nSecond line.]]", tok)
    agent.wait("processing", timeout=10)
    agent.wait("completed", timeout=30)
    assert agent.last() == "Hello from the model.\n\nSecond line."
    agent.wait_hook(cli.turn_end, "turn_end")  # the CLI reported the turn's end itself
    assert agent.hook()["events"] >= 2  # its start too (and its session's)


def test_api_error_shows_as_error(cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]) -> None:
    agent = launch(make_server(cli.provider), bed, cli)
    tok = token()
    agent.type(f"Please fail {tok} [[error:400]]", tok)
    agent.wait("error", timeout=30)
    assert "400" in agent.last()


def test_permission_prompt_waits_for_the_user_and_holds_the_inbox(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    agent = launch(make_server(cli.provider, **{knob(cli.provider, "BYPASS"): "false"}), bed, cli)
    tok = token()
    agent.type(f"Make a probe file {tok} [[permission]][[reply:Probe made.]]", tok)
    agent.wait("waiting_user_answer", timeout=30)
    agent.wait_hook(cli.asking, "asking")

    message_id = agent.send("Not while a prompt is open [[reply:Too early.]]")
    # the send's own attempt found the prompt open and said so (not merely "not yet tried")
    wait_for(
        lambda: agent.message(message_id)["waiting_reason"] == "receiver waiting for a user answer",
        10,
        "the message held at the open prompt",
    )
    message = agent.message(message_id)
    assert (message["status"], message["waiting_reason"]) == ("pending", "receiver waiting for a user answer")
    assert agent.status() == "waiting_user_answer"


def test_exit_command_ends_the_cli(cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]) -> None:
    agent = launch(make_server(cli.provider), bed, cli)
    for attempt in range(3):  # /exit types the exit command once, unconfirmed (see Agent.type)
        if attempt:
            print(f"{cli.provider} did not take its exit command; sending it again")
        response = agent.server.client.post(f"/terminals/{agent.id}/exit")
        assert response.status_code in (200, 410), response.text  # 410: gone meanwhile
        with contextlib.suppress(AssertionError):
            agent.wait("gone", timeout=10)
            return
    agent.wait("gone", timeout=1)


def test_delete_leaves_no_process_behind(cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]) -> None:
    server = make_server(cli.provider)
    infrastructure = set(bed.namespace_pids())  # tmux, the fake model, cao-server and its relay
    agent = launch(server, bed, cli)
    pane_pid = int(bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_pid}").strip())
    tok = token()
    agent.type(f"Run a long command {tok} [[shell:sleep 321]][[reply:Slept.]]", tok)

    def under_pane(what: str) -> bool:
        return any(what in cmdline(p) for p in descendants(pane_pid))

    wait_for(lambda: under_pane("sleep 321"), 30, "the shell tool's `sleep 321` under the pane")
    wait_for(lambda: under_pane("cao.mcp"), 30, "the CLI's cao MCP server under the pane")
    tree = {pid: cmdline(pid) for pid in {pane_pid, *descendants(pane_pid)}}

    server.call("DELETE", f"/terminals/{agent.id}")
    wait_for(lambda: not [p for p in tree if pid_alive(p)], 10, "the pane's process tree to end")
    assert {p: tree[p] for p in tree if pid_alive(p)} == {}

    def strays() -> dict[int, str]:
        return {p: cmdline(p) for p in set(bed.namespace_pids()) - infrastructure if pid_alive(p)}

    wait_for(lambda: not strays(), 10, "nothing of the terminal left in the namespace")


def test_agent_reaches_cao_through_its_mcp_server(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    """The CLI's MCP server (``python -m cao.mcp``) speaks for the agent: its message to another
    terminal arrives with the agent's terminal id as the sender."""
    server = make_server(cli.provider)
    agent = launch(server, bed, cli)
    peer = server.call(
        "POST", "/sessions", params={"provider": "scripted", "working_directory": str(server.work)}
    )
    pane_pid = int(bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_pid}").strip())
    wait_for(
        lambda: any("cao.mcp" in cmdline(p) for p in descendants(pane_pid)), 30, "the CLI's cao MCP server"
    )
    time.sleep(2)  # Codex offers MCP tools only once the server's handshake is done (no wait tool)
    tok = token()
    call = json.dumps({"receiver_id": peer["id"], "message": f"hello from {tok}"})
    agent.type(f"Tell the peer {tok} [[mcp:send_message {call}]][[reply:Peer told.]]", tok)
    agent.wait("completed", timeout=30)
    inbox = server.call("GET", f"/terminals/{peer['id']}/inbox/messages")
    assert [(m["sender_id"], m["message"]) for m in inbox] == [(agent.id, f"hello from {tok}")]
    assert agent.last() == "Peer told."


# -- the inbox -----------------------------------------------------------------------------------
def test_inbox_message_is_delivered_once_to_an_idle_agent(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    agent = launch(make_server(cli.provider), bed, cli)
    tok = token()
    message_id = agent.send(f"Please acknowledge {tok} [[reply:Acknowledged {tok}.]]")

    wait_for(lambda: agent.message(message_id)["status"] == "delivered", 30, "the message delivered")
    wait_for(
        lambda: agent.last() == f"Acknowledged {tok}." and agent.status() == "completed",
        30,
        f"the answer to message {message_id}",
    )
    message = agent.message(message_id)
    assert_delivered_at_first_or_second_try(cli, message)
    assert len(turns_with(bed, tok)) == 1
    assert f"[cao message #{message_id} from {SENDER}]" in agent.screen()


def test_inbox_message_sent_while_busy(cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]) -> None:
    """Claude and Gemini take it mid-turn (eager delivery) and run it as a turn of its own; Codex,
    where a mid-turn paste would cancel the running turn, gets it only once it is idle again."""
    agent = launch(make_server(cli.provider, CAO_EAGER_INBOX_DELIVERY="true"), bed, cli)
    first, tok = token("first"), token()
    agent.type(f"Long task {first} [[delay:12]][[reply:First task finished.]]", first)
    agent.wait("processing", timeout=10)
    message_id = agent.send(f"Meanwhile {tok} [[reply:Inbox {tok} handled.]]")

    if cli.queues_while_busy:
        wait_for(lambda: agent.message(message_id)["status"] == "delivered", 8, "delivery mid-turn")
        assert agent.status() == "processing"
        assert not answered(agent, "First task finished.")
    else:
        for _ in range(10):
            message = agent.message(message_id)
            assert message["status"] == "pending", f"delivered to a busy {cli.provider}: {message}"
            time.sleep(0.2)
        assert message["waiting_reason"] == "receiver busy"
        wait_for(lambda: agent.message(message_id)["status"] == "delivered", 30, "delivery once idle")

    wait_for(
        lambda: agent.last() == f"Inbox {tok} handled." and agent.status() == "completed",
        40,
        "the inbox message's own turn to finish",
    )
    assert answered(agent, "First task finished."), "the running turn was cut short"
    assert len(turns_with(bed, first)) == 1
    assert len(turns_with(bed, tok)) == 1
    assert turns_with(bed, first)[0] < turns_with(bed, tok)[0]
    assert_delivered_at_first_or_second_try(cli, agent.message(message_id))


def test_copy_mode_holds_the_inbox_and_the_message_arrives_whole_after(
    bed: Bed, make_server: Callable[..., CaoServer], tmp_path: Path
) -> None:
    """DELIVERY.md scenario 33 on the real Claude Code: a person scrolls its pane (copy mode) while
    a message with an ``/exit`` line and a ``!`` shell line waits. tmux would paste it without the
    bracket markers there (each line an Enter: ``/exit`` would end Claude, ``!`` would run a shell
    command); cao holds it with the reason, and once the person stops scrolling it arrives as one
    message — one model turn carrying both lines as text."""
    cli = next(c for c in CLIS if c.provider == "claude_code")
    agent = launch(make_server(cli.provider), bed, cli)
    pwned = tmp_path / "pwned"
    tok = token()
    bed.tmux("copy-mode", "-t", agent.pane)
    message_id = agent.send(
        f"Please acknowledge {tok} [[reply:Acknowledged {tok}.]]\n/exit\n!touch {pwned}\nend"
    )
    wait_for(
        lambda: (agent.message(message_id)["waiting_reason"] or "").startswith("a person is scrolling"),
        10,
        "the reason shown",
    )
    time.sleep(1.5)  # a few retries' worth
    assert agent.message(message_id)["status"] == "pending"
    assert not turns_with(bed, tok) and not pwned.exists()
    assert bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_mode}").strip() == "copy-mode"
    bed.tmux("send-keys", "-t", agent.pane, "-X", "cancel")  # the person stops scrolling
    wait_for(lambda: agent.message(message_id)["status"] == "delivered", 20, "delivery after the mode")
    wait_for(lambda: agent.last() == f"Acknowledged {tok}.", 30, "the answer")
    [seq] = turns_with(bed, tok)
    prompt = next(r["prompt"] for r in bed.fake_requests() if r["seq"] == seq)
    assert "/exit" in prompt and f"!touch {pwned}" in prompt  # text in one message, not keystrokes
    agent.wait("completed", "idle")  # Claude is still there: "/exit" was text, not a command
    assert not pwned.exists()


# -- older releases ------------------------------------------------------------------------------
# The oldest release of each CLI that the providers support (docs/providers.md), through the same
# cao-server path: the provider's own launch with CAO_<CLI>_BIN pointing at the older release.
OLDER = [(p, v) for c, v in OLDER_CLIS for p, command in COMMANDS.items() if command == c]
OLDER_TURN_END = {"claude_code": "Stop", "codex": "agent-turn-complete", "gemini_cli": "AfterAgent"}


def older_release(provider: str, version: str) -> str:
    """The release's binary (tests/prepare.py installed it beside the current ones), or a skip."""
    binary = version_bin(COMMANDS[provider], version, CACHE)
    if not binary.exists():
        pytest.skip(missing_hint(f"{provider} {version} (in {CACHE}/versions)", "realcli"))
    return str(binary)


@pytest.mark.parametrize(("provider", "version"), OLDER, ids=[f"{p}-{v}" for p, v in OLDER])
def test_older_release_answers_and_takes_an_inbox_message_once(
    provider: str, version: str, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    binary = older_release(provider, version)
    cli = next(c for c in CLIS if c.provider == provider)
    agent = launch(make_server(provider, **{knob(provider, "BIN"): binary}), bed, cli)
    assert agent.last() == ""

    tok = token()
    agent.type(f"Say hello slowly {tok} [[delay:3]][[reply:Hello from {version}.]]", tok)
    agent.wait("processing", timeout=10)
    agent.wait("completed", timeout=30)
    assert agent.last() == f"Hello from {version}."
    agent.wait_hook(OLDER_TURN_END[provider], "turn_end")  # its hooks (Codex 0.77: notify) report too

    tok = token()
    message_id = agent.send(f"Please acknowledge {tok} [[reply:Acknowledged {tok}.]]")
    wait_for(lambda: agent.message(message_id)["status"] == "delivered", 30, "the message delivered")
    wait_for(
        lambda: agent.last() == f"Acknowledged {tok}." and agent.status() == "completed",
        30,
        f"the answer to message {message_id}",
    )
    assert_delivered_at_first_or_second_try(cli, agent.message(message_id))
    assert len(turns_with(bed, tok)) == 1
