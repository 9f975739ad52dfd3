"""Agents working together, for real: real CLIs calling cao-mcp-server's tools inside the bed.

Every agent here is a real CLI (Claude Code, Codex, Gemini CLI) launched by a cao-server in the
loopback-only bed (see conftest.py); its model is the fake (cao/testing/fakemodel.py), scripted by
markers in the prompt. The fake takes markers from the *last user message* only, so a worker's
markers travel inside the task its supervisor hands out: they are written into the supervisor's tool
call arguments with their brackets JSON-escaped (``\\u005b``), which hides them from the supervisor's
own marker parser and gives them back, unescaped, in the worker's prompt.

- send_message: Claude → a Codex terminal; the message reaches the receiver's model in one turn.
- handoff: a Claude ``code_supervisor`` hands a task to a ``developer`` pinned to Codex; the answer
  comes back as the tool result and the worker is removed.
- assign (the demo recipe, docs/orchestration.md): a Claude supervisor assigns a Gemini worker, the
  worker reports back with ``send_message`` (no receiver_id) and the report reaches the supervisor's
  model once, under its ``[cao message #N from <worker>]`` header.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcli.bed import Bed
from tests.realcli.conftest import LOCK_WAIT, CaoServer, wait_for
from tests.realcli.test_providers_e2e import CLI, Agent, cmdline, descendants, token

# The first test also waits for the bed lock (another run may hold it), hence the longer timeout.
pytestmark = [pytest.mark.realcli, pytest.mark.timeout(LOCK_WAIT + 360)]

CLAUDE = CLI("claude_code", queues_while_busy=True, start_timeout=60)
CODEX = CLI("codex", queues_while_busy=False, start_timeout=60)
GEMINI = CLI("gemini_cli", queues_while_busy=True, start_timeout=90)
NewServer = Callable[[], CaoServer]
API = {"claude_code": "anthropic", "codex": "openai", "gemini_cli": "gemini"}  # the fake's log `api`


@pytest.fixture
def new_server(make_server: Callable[..., CaoServer]) -> Iterator[NewServer]:
    """A cao-server in the bed (its default provider: Claude); an error it logged is shown afterwards."""
    made: list[CaoServer] = []

    def make() -> CaoServer:
        made.append(make_server("claude_code"))
        return made[-1]

    yield make
    for server in made:
        if "Traceback" in (log := server.log()):
            print(f"cao-server logged an error:\n{log[log.index('Traceback') - 2000 :][:8000]}")


def mcp(tool: str, **args: Any) -> str:
    """An ``[[mcp:tool {...}]]`` marker. ``[`` and ``]`` inside the arguments are JSON-escaped, so
    markers meant for another agent (a worker's task, a message's text) don't end this one early or
    count as this agent's own; the tool receives them as plain ``[[…]]`` text."""
    encoded = json.dumps(args).replace("[", "\\u005b").replace("]", "\\u005d")
    return f"[[mcp:{tool} {encoded}]]"


def install_profile(server: CaoServer, name: str, provider: str) -> None:
    """``cao install <name>`` plus a ``provider:`` line: a store profile that pins the worker's CLI."""
    builtin = (Path(__file__).resolve().parents[2] / "cao" / "profiles" / f"{name}.md").read_text()
    head, body = builtin.split("---\n", 2)[1:]
    store = server.home / "agent-store"
    store.mkdir(parents=True, exist_ok=True)
    (store / f"{name}.md").write_text(f"---\n{head}provider: {provider}\n---\n{body}")


def start(server: CaoServer, bed: Bed, cli: CLI, profile: str = "developer") -> Agent:
    """A new session with one ``cli`` terminal (as ``cao launch``), once idle and its MCP server runs."""
    body = {"provider": cli.provider, "agent_profile": profile, "working_directory": str(server.work)}
    response = server.client.post("/sessions", json=body)
    assert response.status_code == 201, (
        f"POST /sessions {body} -> {response.status_code}: {response.text}\n"
        f"cao-server log tail:\n{server.log()[-4000:]}"
    )
    terminal = response.json()
    server.wait_status(terminal["id"], "idle", timeout=cli.start_timeout)
    agent = Agent(server, bed, cli, str(terminal["id"]), str(terminal["pane_id"]))
    wait_mcp(agent)
    return agent


def wait_mcp(agent: Agent) -> None:
    """Wait until the CLI's model is offered cao's tools.

    The cao MCP server process showing up is not enough: under load Claude's ``WaitForMcpServers``
    can give up ("Still connecting") and the turn then goes on without the tools, and Codex fails an
    early MCP call silently. So Claude gets short warm-up turns until one of its model requests
    offers ``mcp__cao__*`` tools; Codex gets a margin; Gemini queues prompts until MCP is up.
    """
    pane_pid = int(agent.bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_pid}").strip())
    wait_for(
        lambda: any("cao.mcp" in cmdline(p) for p in descendants(pane_pid)),
        30,
        f"{agent.cli.provider}'s cao MCP server",
    )
    if agent.cli.provider == "codex":
        time.sleep(3)
    if agent.cli.provider != "claude_code":
        return
    deadline = time.monotonic() + 60
    while True:
        tok = token("warmup")
        agent.type(f"Check your tools {tok} [[reply:Tools checked {tok}.]]", tok)
        agent.wait("completed", timeout=30)
        offered = [
            tool.get("name", "")
            for r in agent.bed.fake_requests(bodies=True)
            if r.get("kind") == "main" and tok in (r.get("prompt") or "")
            for tool in (r.get("body") or {}).get("tools") or []
        ]
        if any(name.startswith("mcp__cao__") for name in offered):
            return
        assert time.monotonic() < deadline, f"Claude's model was never offered cao's tools:\n{agent.screen()}"
        time.sleep(1)


def user_turns(bed: Bed, cli: CLI, text: str) -> list[dict[str, Any]]:
    """The main model requests of ``cli`` that start a turn (no tool results) with ``text`` in the prompt."""
    return [
        r
        for r in bed.fake_requests()
        if r.get("api") == API[cli.provider]
        and r.get("kind") == "main"
        and not r.get("tool_results")
        and text in (r.get("prompt") or "")
    ]


def tool_results_in_last_message(request: dict[str, Any]) -> list[str]:
    """The ``tool_result`` texts in the last user message of an Anthropic request body."""
    messages = (request.get("body") or {}).get("messages") or []
    users = [m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), list)]
    if not users:
        return []
    results = []
    for block in users[-1]["content"]:
        if block.get("type") != "tool_result":
            continue
        content = block.get("content")
        if isinstance(content, list):
            content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        results.append(str(content))
    return results


def until(pred: Any, timeout: float, what: str, server: CaoServer, *ids: str) -> Any:
    """``wait_for`` that, on timeout, shows the screens of the terminals ``ids`` as they are then."""
    try:
        return wait_for(pred, timeout, what)
    except AssertionError as exc:
        screens = "\n".join(f"--- {i} ({server.status(i)}):\n{server.screen(i)}" for i in ids)
        raise AssertionError(f"{exc}\n{screens}\n--- cao-server log tail:\n{server.log()[-3000:]}") from None


def terminals(server: CaoServer) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = server.call("GET", "/terminals")
    return result


# -- send_message between two real CLIs ----------------------------------------------------------
def test_send_message_reaches_another_real_cli_exactly_once(bed: Bed, new_server: NewServer) -> None:
    server = new_server()
    receiver = start(server, bed, CODEX)
    sender = start(server, bed, CLAUDE)

    tok = token("msg")
    text = f"Hello from Claude {tok} [[reply:Codex got {tok}.]]"
    sender.type(
        f"Greet the peer {tok} {mcp('send_message', receiver_id=receiver.id, message=text)}"
        "[[reply:Peer greeted.]]",
        tok,
    )
    sender.wait("completed", timeout=60)
    assert sender.last() == "Peer greeted."

    inbox = server.call("GET", f"/terminals/{receiver.id}/inbox/messages")
    calls = [(r["seq"], r.get("tool_results"), r.get("action")) for r in bed.fake_requests() if tok in str(r)]
    assert [(m["sender_id"], m["message"]) for m in inbox] == [(sender.id, text)], (
        f"inbox: {inbox}\nsender's model requests: {calls}\nsender screen:\n{sender.screen()}"
    )
    message_id = int(inbox[0]["id"])
    until(
        lambda: receiver.last() == f"Codex got {tok}." and receiver.status() == "completed",
        60,
        f"Codex's answer to message {message_id}",
        server,
        receiver.id,
    )
    header = f"[cao message #{message_id} from {sender.id}]"
    turns = user_turns(bed, CODEX, tok)
    assert len(turns) == 1, turns
    assert header in turns[0]["prompt"]
    assert server.message(message_id)["status"] == "delivered"
    time.sleep(2)  # nothing is pasted again later
    assert len(user_turns(bed, CODEX, tok)) == 1


# -- handoff: Claude supervisor, Codex worker ----------------------------------------------------
def test_handoff_returns_the_real_workers_answer_and_removes_it(bed: Bed, new_server: NewServer) -> None:
    server = new_server()
    install_profile(server, "developer", CODEX.provider)  # the worker's CLI: pinned by its profile
    supervisor = start(server, bed, CLAUDE, profile="code_supervisor")

    tok, work = token("handoff"), token("work")
    answer = f"Worker result {work}: 42 files checked."
    task = f"Count the files {work} [[reply:{answer}]]"
    supervisor.type(
        f"Delegate the count {tok} {mcp('handoff', agent_profile='developer', message=task, timeout=240)}"
        f"[[reply:Supervisor saw the result {tok}.]]",
        tok,
    )

    def worker() -> dict[str, Any] | None:
        return next((t for t in terminals(server) if t.get("supervisor_id") == supervisor.id), None)

    started = until(worker, 60, "the handoff's worker terminal", server, supervisor.id)
    assert (started["provider"], started["agent_profile"]) == (CODEX.provider, "developer")

    done = f"Supervisor saw the result {tok}."
    until(
        lambda: supervisor.last() == done and supervisor.status() == "completed",
        240,
        "the supervisor's final answer",
        server,
        supervisor.id,
        started["id"],
    )
    # The worker's model got the task once, as typed by handoff (markers unescaped).
    worker_turns = user_turns(bed, CODEX, work)
    assert len(worker_turns) == 1, worker_turns
    assert f"[[reply:{answer}]]" in worker_turns[0]["prompt"]
    # The supervisor's request after the tool call carries the worker's answer as the tool result.
    followups = [
        r
        for r in bed.fake_requests(bodies=True)
        if r.get("api") == "anthropic"
        and r.get("kind") == "main"
        and r.get("tool_results")
        and tok in (r.get("prompt") or "")
    ]
    assert followups, "no supervisor request carried the handoff's tool result"
    results = tool_results_in_last_message(followups[0])  # the request right after the tool call
    assert any(answer in result for result in results), results
    # ... and no worker terminal remains.
    wait_for(lambda: [t["id"] for t in terminals(server)] == [supervisor.id], 15, "only the supervisor left")


# -- assign + report back: the demo recipe, for real ---------------------------------------------
@pytest.mark.parametrize("worker_cli", [GEMINI, CODEX], ids=["gemini-worker", "codex-worker"])
def test_assigned_real_worker_reports_back_to_its_supervisor_once(
    bed: Bed, new_server: NewServer, worker_cli: CLI
) -> None:
    # Codex takes input before its MCP server is connected; cao holds the task until cao-mcp-server
    # reports in (POST /terminals/{id}/mcp-ready), else the report would be made without the tool.
    server = new_server()
    install_profile(server, "developer", worker_cli.provider)
    supervisor = start(server, bed, CLAUDE, profile="code_supervisor")

    tok, job = token("assign"), token("job")
    report = f"Report {job}: the parser is fixed and 12 tests pass."
    task = f"Fix the parser {job} {mcp('send_message', message=report)}[[reply:Reported {job}.]]"
    supervisor.type(
        f"Plan and delegate {tok} {mcp('assign', agent_profile='developer', message=task)}"
        f"[[reply:Assigned {tok}; waiting for the report.]]",
        tok,
    )
    until(
        lambda: supervisor.last() == f"Assigned {tok}; waiting for the report.",
        60,
        "the supervisor's turn to end after assign",
        server,
        supervisor.id,
    )
    worker = wait_for(
        lambda: next((t for t in terminals(server) if t.get("supervisor_id") == supervisor.id), None),
        10,
        "the assigned worker terminal",
    )
    assert (worker["provider"], worker["agent_profile"]) == (worker_cli.provider, "developer")
    wid = worker["id"]

    # The worker reports with send_message (no receiver_id): it lands in the supervisor's inbox.
    def reports() -> list[dict[str, Any]]:
        inbox: list[dict[str, Any]] = server.call("GET", f"/terminals/{supervisor.id}/inbox/messages")
        return [m for m in inbox if m["sender_id"] == wid]

    sent = until(reports, 150, "the worker's report", server, supervisor.id, wid)
    assert [m["message"] for m in sent] == [report]
    message_id = int(sent[0]["id"])
    header = f"[cao message #{message_id} from {wid}]"

    until(
        lambda: len(user_turns(bed, CLAUDE, header)) >= 1 and supervisor.status() == "completed",
        60,
        "the report to reach the supervisor's model",
        server,
        supervisor.id,
        wid,
    )
    time.sleep(2)  # nothing is pasted again later
    turns = user_turns(bed, CLAUDE, header)
    assert len(turns) == 1, turns
    assert report in turns[0]["prompt"]
    assert server.message(message_id)["status"] == "delivered"
    # The worker got its task once, with the note naming its supervisor, and finished its turn.
    task_turns = user_turns(bed, worker_cli, job)
    assert len(task_turns) == 1, task_turns
    assert f"terminal {supervisor.id} assigned you this task" in task_turns[0]["prompt"]
    reported = f"Reported {job}."
    until(lambda: server.screen(wid, "last") == reported, 30, "the worker's own answer", server, wid)
