"""``cao-mcp-server`` driven by the official MCP client over stdio, against a real cao-server.

Every tool call below goes: MCP client -> cao-mcp-server (a subprocess, as an agent CLI would run
it) -> HTTP -> cao-server -> tmux -> scripted agents. What a worker received is read from its own
record; what a supervisor received is read from its inbox.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from cao.mcp import AgentTools
from cao.tmux import Tmux
from tests.helpers import REPO, ServerProcess, read_records, received_bodies, wait_until, write_rules

MCP_SERVER = Path(sys.executable).with_name("cao-mcp-server")
TOOLS = {
    "send_message",
    "check_inbox",
    "read_message",
    "ack",
    "report_result",
    "schedule_wakeup",
    "cancel_wakeup",
    "my_wakeups",
    "defer_message",
    "drop_message",
    "prioritize_message",
    "assign",
    "handoff",
    "worker_diff",
    "merge_worker",
    "my_inbox",
    "my_workers",
    "whoami",
    "board_get",
    "board_list",
    "board_set",
}
RULES: dict[str, dict[str, Any]] = {
    "boss": {"record": True},
    "coder": {
        "record": True,
        "rules": [{"match": r"^compute (?P<what>.+)$", "delay": 0.3, "reply": "42 ({what})"}],
    },
    "sleepy": {
        "record": True,
        "startup_delay": 1.5,
        "rules": [{"match": "^nap$", "delay": 2.0, "reply": "rested"}],
    },
    "broken": {"record": True, "rules": [{"match": ".", "error": "API Error: 500 overloaded"}]},
    "stuck": {"record": True, "rules": [{"match": ".", "delay": 60, "reply": "too late"}]},
    "helper": {
        "record": True,
        "rules": [
            {
                "match": r"^task (?P<task>.+)$",
                "reply": "on it",
                "send": [{"to": "{sender}", "message": "done: {task}"}],
            }
        ],
    },
}


class Team(NamedTuple):
    srv: ServerProcess
    http: httpx.Client
    boss: str  # the caller: a scripted agent in session cao-team
    boss_pane: str


@pytest.fixture
def team(make_server: Callable[..., ServerProcess], tmp_path: Path) -> Any:
    home = tmp_path / "cao"
    for name, rules in RULES.items():
        write_rules(home, name, rules)
    srv = make_server(home)
    with srv.client() as http:
        boss = http.post("/sessions", json={"agent_profile": "boss", "session_name": "team"}).json()
        wait_until(lambda: http.get(f"/terminals/{boss['id']}").json()["status"] == "idle", what="boss idle")
        yield Team(srv, http, boss["id"], boss["pane_id"])


@contextlib.asynccontextmanager
async def mcp_as(
    srv: ServerProcess, terminal_id: str | None, url: str | None = None
) -> AsyncIterator[ClientSession]:
    """An MCP client session with a fresh cao-mcp-server acting as ``terminal_id``."""
    env = {"CAO_SERVER_URL": url or srv.url}
    if terminal_id:
        env["CAO_TERMINAL_ID"] = terminal_id
    params = StdioServerParameters(command=str(MCP_SERVER), env=env, cwd=REPO)
    with (srv.home / "mcp.stderr").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def inbox(team: Team, terminal_id: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = team.http.get(f"/terminals/{terminal_id}/inbox/messages").json()
    return rows


def live_panes(team: Team) -> set[str]:
    return {p.pane_id for p in Tmux(team.srv.socket_name).list_panes() if not p.dead}


# -- listing and identity ----------------------------------------------------------------------
def test_tools_are_listed_and_whoami_knows_the_caller(team: Team):
    async def scenario() -> None:
        async with mcp_as(team.srv, team.boss) as mcp:
            listed = await mcp.list_tools()
            assert {t.name for t in listed.tools} == TOOLS
            assert all(t.description for t in listed.tools)
            me = data(await mcp.call_tool("whoami", {}))
            assert me["terminal_id"] == team.boss and me["session_name"] == "cao-team"
            assert me["agent_profile"] == "boss" and me["supervisor_id"] is None
            assert data(await mcp.call_tool("my_workers", {})) == {"supervisor_id": team.boss, "workers": []}
            assert data(await mcp.call_tool("my_inbox", {}))["messages"] == []

    anyio.run(scenario)


# -- handoff ---------------------------------------------------------------------------------------
def test_handoff_waits_for_a_slow_worker_returns_its_answer_and_removes_it(team: Team):
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async def scenario() -> CallToolResult:
        async with mcp_as(team.srv, team.boss) as mcp:
            return await mcp.call_tool(
                "handoff",
                {"agent_profile": "sleepy", "message": "nap", "timeout": 30},
                progress_callback=on_progress,
            )

    started = time.monotonic()
    result = anyio.run(scenario)
    assert not result.is_error, text(result)
    # its screen's answer, saying that it is one (the worker reported no result)
    answer, note = text(result).split("\n\n", 1)
    assert answer == "rested" and "reported no result (report_result)" in note
    assert time.monotonic() - started >= 3.5  # 1.5 s start-up + 2 s task: it really waited
    # progress notifications named the worker and followed it through start-up and work
    assert progress and all(total == 30 for _, total, _ in progress)
    messages = [m or "" for _, _, m in progress]
    assert any("processing" in m for m in messages)
    [worker] = set(re.findall(r"worker ([0-9a-f]{8})", "\n".join(messages)))
    assert received_bodies(team.srv.home, worker) == ["nap"]
    # no worker left behind: the row is deleted and its pane is gone
    assert team.http.get(f"/terminals/{worker}").status_code == 404
    assert [t["id"] for t in team.http.get("/terminals").json()] == [team.boss]
    assert live_panes(team) == {team.boss_pane}


class HandoffFailure(NamedTuple):
    profile: str
    timeout: float
    expect: tuple[str, ...]
    worker_started: bool = True


HANDOFF_FAILURES = {
    "worker-error": HandoffFailure(
        "broken", 30, ("stopped with an error", "API Error: 500 overloaded", "has been removed")
    ),
    "timeout": HandoffFailure(
        "stuck", 2, ("did not finish the task within 2 s", "last status: processing", "larger timeout")
    ),
    "unknown-profile": HandoffFailure(
        "nosuch", 30, ("agent profile 'nosuch' not found", "developer", "cao install"), worker_started=False
    ),
}


@pytest.mark.parametrize("case", HANDOFF_FAILURES.values(), ids=HANDOFF_FAILURES.keys())
def test_handoff_failures_are_clear_and_leave_no_worker(team: Team, case: HandoffFailure):
    async def scenario() -> CallToolResult:
        async with mcp_as(team.srv, team.boss) as mcp:
            return await mcp.call_tool(
                "handoff", {"agent_profile": case.profile, "message": "go", "timeout": case.timeout}
            )

    started = time.monotonic()
    result = anyio.run(scenario)
    assert result.is_error
    for fragment in case.expect:
        assert fragment in text(result), text(result)
    assert time.monotonic() - started < case.timeout + 15  # a clear failure, not a hang
    assert [t["id"] for t in team.http.get("/terminals").json()] == [team.boss]
    assert live_panes(team) == {team.boss_pane}
    workers = [
        p.stem for p in (team.srv.home / "scripted" / "received").glob("*.jsonl") if p.stem != team.boss
    ]
    assert len(workers) == case.worker_started
    assert all(received_bodies(team.srv.home, w) == ["go"] for w in workers)


def test_a_handoff_the_client_gives_up_on_still_removes_its_worker(team: Team):
    async def scenario() -> None:
        async with mcp_as(team.srv, team.boss) as mcp:
            with pytest.raises(MCPError, match="timed out"):  # the client's own timeout: it cancels the call
                await mcp.call_tool(
                    "handoff",
                    {"agent_profile": "stuck", "message": "go", "timeout": 60},
                    read_timeout_seconds=2,
                )
            wait_for = anyio.current_time() + 15
            while len(team.http.get("/terminals").json()) > 1:
                assert anyio.current_time() < wait_for, "the worker outlived the cancelled handoff"
                await anyio.sleep(0.1)
            assert not (await mcp.call_tool("whoami", {})).is_error  # the server carries on

    anyio.run(scenario)
    assert live_panes(team) == {team.boss_pane}


# -- assign + send_message -------------------------------------------------------------------------
def test_assign_then_the_worker_reports_back_to_its_supervisor(team: Team):
    async def assign() -> dict[str, Any]:
        async with mcp_as(team.srv, team.boss) as mcp:
            started = time.monotonic()
            assigned = data(
                await mcp.call_tool("assign", {"agent_profile": "helper", "message": "task build the parser"})
            )
            assert time.monotonic() - started < 10  # returns at once, doesn't wait for the work
            workers = data(await mcp.call_tool("my_workers", {}))["workers"]
            assert [w["id"] for w in workers] == [assigned["worker_id"]]
            assert workers[0]["status"] in ("starting", "processing", "idle", "completed")
            return assigned

    assigned = anyio.run(assign)
    worker = assigned["worker_id"]
    term = team.http.get(f"/terminals/{worker}").json()
    assert (term["supervisor_id"], term["session_name"], term["provider"]) == (
        team.boss,
        "cao-team",
        "scripted",
    )

    # the task arrives through the worker's inbox, with a note on how to report back
    wait_until(lambda: received_bodies(team.srv.home, worker), timeout=15, what="task delivered")
    [task] = received_bodies(team.srv.home, worker)
    assert task.startswith("task build the parser\n")
    assert team.boss in task and "send_message" in task and "receiver_id" in task
    assert read_records(team.srv.home, worker)[0]["messages"][0]["sender"] == team.boss

    # the scripted worker replies to its supervisor by itself ...
    def boss_got(body: str) -> bool:
        return any(m["message"] == body and m["sender_id"] == worker for m in inbox(team, team.boss))

    wait_until(lambda: boss_got("done: build the parser"), timeout=15, what="the worker's own report")

    # ... and send_message, acting as the worker, reaches the supervisor without a receiver_id
    async def report() -> tuple[dict[str, Any], dict[str, Any]]:
        async with mcp_as(team.srv, worker) as as_worker:
            sent = data(await as_worker.call_tool("send_message", {"message": "report: all tests pass"}))
        async with mcp_as(team.srv, team.boss) as as_boss:
            wait_for = anyio.current_time() + 15
            while not any(m["message"] == "report: all tests pass" for m in inbox(team, team.boss)):
                assert anyio.current_time() < wait_for
                await anyio.sleep(0.05)
            mine = data(await as_boss.call_tool("my_inbox", {}))
        return sent, mine

    sent, mine = anyio.run(report)
    assert sent["receiver_id"] == team.boss and sent["duplicate"] is False
    assert boss_got("report: all tests pass")
    assert {m["message"] for m in mine["messages"]} >= {"done: build the parser", "report: all tests pass"}
    assert {m["sender_id"] for m in mine["messages"]} == {worker}


def test_workers_use_the_callers_provider_unless_their_profile_pins_one(team: Team):
    (team.srv.home / "agent-store" / "pinned.md").write_text(
        "---\nname: pinned\ndescription: always the plain scripted agent\nprovider: scripted\n---\nHi.\n"
    )
    caller = team.http.post(
        "/sessions/team/terminals", json={"agent_profile": "boss", "provider": "scripted_eager"}
    )
    lead = caller.json()["id"]

    async def scenario() -> dict[str, str]:
        async with mcp_as(team.srv, lead) as mcp:
            same = data(await mcp.call_tool("assign", {"agent_profile": "helper", "message": "task a"}))
            pinned = data(await mcp.call_tool("assign", {"agent_profile": "pinned", "message": "task b"}))
            workers = data(await mcp.call_tool("my_workers", {}))["workers"]
        assert {w["id"] for w in workers} == {same["worker_id"], pinned["worker_id"]}
        return {same["provider"]: "helper", pinned["provider"]: "pinned"}

    assert anyio.run(scenario) == {"scripted_eager": "helper", "scripted": "pinned"}


def test_a_retried_send_message_is_sent_once(team: Team):
    peer = team.http.post("/sessions/team/terminals", json={"agent_profile": "boss"}).json()["id"]

    async def scenario() -> list[dict[str, Any]]:
        async with mcp_as(team.srv, team.boss) as mcp:
            args = {"message": "please rebase", "receiver_id": peer}
            first = data(await mcp.call_tool("send_message", args))
            retry = data(await mcp.call_tool("send_message", args))  # the same call again
            other = data(await mcp.call_tool("send_message", {**args, "message": "and run the tests"}))
            return [first, retry, other]

    first, retry, other = anyio.run(scenario)
    assert (first["duplicate"], retry["duplicate"], other["duplicate"]) == (False, True, False)
    assert retry["message_id"] == first["message_id"] != other["message_id"]
    assert "retry" in retry["note"] and "change the text" in retry["note"]
    wait_until(lambda: len(received_bodies(team.srv.home, peer)) == 2, timeout=15, what="both delivered")
    time.sleep(0.3)  # would a second copy follow? (none should)
    assert received_bodies(team.srv.home, peer) == ["please rebase", "and run the tests"]
    assert sorted(m["message"] for m in inbox(team, peer)) == ["and run the tests", "please rebase"]


class ToolFailure(NamedTuple):
    tool: str
    args: dict[str, Any]
    expect: tuple[str, ...]
    as_caller: bool = True
    server_down: bool = False


TOOL_FAILURES = {
    "unknown-receiver": ToolFailure(
        "send_message", {"message": "hi", "receiver_id": "deadbeef"}, ("deadbeef not found", "cao status")
    ),
    "malformed-receiver": ToolFailure(
        "send_message", {"message": "hi", "receiver_id": "bob"}, ("'bob' is malformed", "8 hex digits")
    ),
    "no-supervisor": ToolFailure("send_message", {"message": "hi"}, ("has no supervisor", "receiver_id")),
    "empty-message": ToolFailure("send_message", {"message": "  ", "receiver_id": "deadbeef"}, ("empty",)),
    "assign-unknown-profile": ToolFailure(
        "assign", {"agent_profile": "nosuch", "message": "x"}, ("'nosuch' not found", "available", "reviewer")
    ),
    "no-terminal-id": ToolFailure("whoami", {}, ("CAO_TERMINAL_ID is not set",), as_caller=False),
    "server-down": ToolFailure("my_inbox", {}, ("not reachable", "cao-server is running"), server_down=True),
}


def test_tool_errors_name_the_problem_and_the_fix(team: Team):
    # One cao-server (and one MCP server per identity) for the whole table: each case is a cheap
    # tool call; starting a cao-server per case is not.
    async def scenario() -> dict[str, CallToolResult]:
        results = {}
        async with contextlib.AsyncExitStack() as stack:
            sessions: dict[tuple[bool, bool], ClientSession] = {}
            for name, case in TOOL_FAILURES.items():
                who = (case.as_caller, case.server_down)
                if who not in sessions:
                    url = "http://127.0.0.1:9" if case.server_down else None
                    caller = team.boss if case.as_caller else None
                    sessions[who] = await stack.enter_async_context(mcp_as(team.srv, caller, url))
                results[name] = await sessions[who].call_tool(case.tool, case.args)
        return results

    for name, result in anyio.run(scenario).items():
        assert result.is_error, name
        for fragment in TOOL_FAILURES[name].expect:
            assert fragment in text(result), f"{name}: {text(result)}"
    assert inbox(team, team.boss) == []
    assert [t["id"] for t in team.http.get("/terminals").json()] == [team.boss]


# -- the board ---------------------------------------------------------------------------------------
def test_board_tools_write_the_callers_session_and_a_lost_race_returns_the_version_to_retry(team: Team):
    peer = team.http.post("/sessions/team/terminals", json={"agent_profile": "boss"}).json()["id"]
    outsider = team.http.post("/sessions", json={"agent_profile": "boss", "session_name": "else"}).json()[
        "id"
    ]

    async def scenario() -> None:
        async with mcp_as(team.srv, team.boss) as boss, mcp_as(team.srv, peer) as other:
            missing = data(await boss.call_tool("board_get", {"key": "owner/parser"}))
            assert (missing["exists"], missing["version"]) == (False, 0)
            assert "expected_version 0" in missing["note"]
            won = data(
                await boss.call_tool(
                    "board_set", {"key": "owner/parser", "value": team.boss, "expected_version": 0}
                )
            )
            assert (won["written"], won["version"], won["writer"]) == (True, 1, team.boss)
            assert "nobody was interrupted" in won["note"]
            args = {"key": "owner/parser", "value": team.boss, "expected_version": 0}
            again = data(await boss.call_tool("board_set", args))  # an MCP retry of the same call
            assert (again["written"], again["version"]) == (True, 1) and "a retry" in again["note"]
            lost = data(
                await other.call_tool(
                    "board_set", {"key": "owner/parser", "value": peer, "expected_version": 0}
                )
            )
            assert lost["written"] is False
            assert (lost["current_version"], lost["current_value"], lost["current_writer"]) == (
                1,
                team.boss,
                team.boss,
            )
            assert "board_set again with expected_version 1" in lost["note"]
            got = data(await other.call_tool("board_get", {"key": "owner/parser"}))
            assert (got["exists"], got["version"], got["value"]) == (True, 1, team.boss)
            data(
                await other.call_tool(
                    "board_set", {"key": "build", "value": {"green": True}, "expected_version": 0}
                )
            )
            listed = data(await boss.call_tool("board_list", {}))
            assert listed["session_name"] == "cao-team" and listed["count"] == 2
            assert [(f["key"], f["value"]) for f in listed["facts"]] == [
                ("build", {"green": True}),
                ("owner/parser", team.boss),
            ]
            assert [
                f["key"] for f in data(await boss.call_tool("board_list", {"prefix": "owner/"}))["facts"]
            ] == ["owner/parser"]
            bad = await boss.call_tool("board_set", {"key": "a b", "value": 1, "expected_version": 0})
            assert bad.is_error and "not a board key" in text(bad) and "build/status" in text(bad)
            null = await boss.call_tool("board_set", {"key": "k", "value": None, "expected_version": 0})
            assert null.is_error and "any JSON value but null" in text(null)
            negative = await boss.call_tool("board_set", {"key": "k", "value": 1, "expected_version": -1})
            assert negative.is_error
            async with mcp_as(team.srv, outsider) as elsewhere:  # its own session's board: empty
                assert data(await elsewhere.call_tool("board_list", {}))["facts"] == []

    anyio.run(scenario)
    # on the board, written by the agents themselves; nobody got a message about it
    assert team.http.get("/sessions/team/board/owner/parser").json()["writer"] == team.boss
    assert team.http.get("/messages").json() == []


# -- the idempotency key, without a server -----------------------------------------------------------
def test_identical_sends_share_a_key_within_a_sliding_window():
    now = [0.0]
    tools = AgentTools(httpx.AsyncClient(), "1a2b3c4d", retry_window=10.0, clock=lambda: now[0])
    first = tools.idempotency_key("9f8e7d6c", "hello")
    assert first.startswith("mcp-1a2b3c4d-")
    now[0] = 8.0
    assert tools.idempotency_key("9f8e7d6c", "hello") == first  # a retry
    assert tools.idempotency_key("9f8e7d6c", "hello!") != first  # other text
    assert tools.idempotency_key("0a0b0c0d", "hello") != first  # other receiver
    now[0] = 17.0
    assert tools.idempotency_key("9f8e7d6c", "hello") == first  # the window slid with the retry
    now[0] = 28.0
    assert tools.idempotency_key("9f8e7d6c", "hello") != first  # a new message, long after
    other_process = AgentTools(httpx.AsyncClient(), "1a2b3c4d", clock=lambda: now[0])
    assert other_process.idempotency_key("9f8e7d6c", "hello") != first
