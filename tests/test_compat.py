"""The reference orchestrator's own clients against a real cao-server (docs/compatibility.md).

``cli-agent-orchestrator`` (PyPI) is the orchestrator cao's routes follow; its ``cao`` CLI and its
``cao-mcp-server`` find the API at ``http://$CAO_API_HOST:$CAO_API_PORT``, so they reach ours
unchanged. ``make test`` installs each covered version first (``python -m tests.prepare``) into a
throwaway venv under ``~/.cache/cao/refclients/<version>`` (never into this project's .venv: its
entry points are named like ours); where one is missing these tests skip and say how to install it.

Every step below is the reference's own code talking to a private cao-server (private tmux
socket, temp CAO_HOME) whose agents are scripted. The reference's CLI insists on its own provider
names (``kiro_cli`` by default), so the server runs with ``CAO_PROVIDER_ALIASES=kiro_cli=scripted``;
its MCP server asks for whatever provider its own terminal has (``scripted``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent

from tests.helpers import ServerProcess, received_bodies, wait_until, write_rules
from tests.prepare import REF_PACKAGE, REF_VERSIONS, missing_hint, refclient_venv, refclients_cache

VERSIONS = tuple(REF_VERSIONS)
CACHE = refclients_cache()  # read at import, before conftest points HOME at a temp dir
RULES: dict[str, dict[str, Any]] = {
    "boss": {"record": True},
    "worker": {
        "record": True,
        "rules": [{"match": r"^compute (?P<what>.+)$", "delay": 0.3, "reply": "result of {what}"}],
    },
    "asker": {
        "record": True,
        "rules": [{"match": "^deploy", "ask": "Allow tool deploy?", "reply": "deployed"}],
    },
}


# -- the reference clients (tests/prepare.py installs them before pytest starts) -------------------
def install(version: str) -> Path:
    """The venv holding ``cli-agent-orchestrator==version``, or a skip naming how to install it."""
    venv = refclient_venv(version, CACHE)
    if not (venv / ".cao-installed").exists() or not (venv / "bin" / "cao").exists():
        pytest.skip(missing_hint(f"{REF_PACKAGE}=={version} (in {venv})", "integration"))
    return venv


class Ref(NamedTuple):
    """One reference version's clients, pointed at one cao-server."""

    version: str
    venv: Path
    srv: ServerProcess
    home: Path  # HOME of the reference clients (they keep files under ~/.aws)

    def env(self, terminal_id: str | None = None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "CAO_API_HOST": "127.0.0.1",
            "CAO_API_PORT": str(self.srv.port),
        }
        if terminal_id:
            env["CAO_TERMINAL_ID"] = terminal_id
        return env

    def cli(
        self, *args: str, as_terminal: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "cao"), *args],
            env=self.env(as_terminal),
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def ok(self, *args: str, as_terminal: str | None = None, timeout: float = 120) -> str:
        done = self.cli(*args, as_terminal=as_terminal, timeout=timeout)
        assert done.returncode == 0, (
            f"cao {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
        return done.stdout

    def ok_json(self, *args: str, as_terminal: str | None = None, timeout: float = 120) -> Any:
        return json.loads(self.ok(*args, as_terminal=as_terminal, timeout=timeout))

    @contextlib.asynccontextmanager
    async def mcp(self, terminal_id: str) -> AsyncIterator[ClientSession]:
        """The reference's ``cao-mcp-server``, driven by the official MCP client, acting as an agent."""
        params = StdioServerParameters(
            command=str(self.venv / "bin" / "cao-mcp-server"), env=self.env(terminal_id), cwd=self.home
        )
        with (self.srv.home / f"ref-mcp-{self.version}.stderr").open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                yield session


def tool(result: CallToolResult) -> dict[str, Any]:
    """A tool's result as a dict (structured content, else its JSON text)."""
    assert not result.is_error, [c.text for c in result.content if isinstance(c, TextContent)]
    data = result.structured_content
    if isinstance(data, dict):
        inner = data.get("result")
        return inner if set(data) == {"result"} and isinstance(inner, dict) else data
    text = "".join(c.text for c in result.content if isinstance(c, TextContent))
    parsed: dict[str, Any] = json.loads(text)
    return parsed


@pytest.fixture(params=VERSIONS)
def ref(
    request: pytest.FixtureRequest, make_server: Callable[..., ServerProcess], tmp_path: Path
) -> Iterator[Ref]:
    venv = install(request.param)
    home = tmp_path / "cao"
    for name, rules in RULES.items():
        write_rules(home, name, rules)
    srv = make_server(home, CAO_PROVIDER_ALIASES="kiro_cli=scripted")
    ref_home = tmp_path / "refhome"
    ref_home.mkdir()
    yield Ref(request.param, venv, srv, ref_home)


# -- helpers over our own API (to set up and to look) ---------------------------------------------------
def api(ref: Ref) -> httpx.Client:
    return ref.srv.client()


def status(ref: Ref, tid: str) -> str:
    with api(ref) as http:
        return str(http.get(f"/terminals/{tid}").json()["status"])


def terminal(ref: Ref, tid: str) -> dict[str, Any]:
    with api(ref) as http:
        r = http.get(f"/terminals/{tid}")
        return r.json() if r.status_code == 200 else {"status_code": r.status_code}


def start_boss(ref: Ref, session: str) -> str:
    with api(ref) as http:
        boss = http.post(
            "/sessions",
            json={"agent_profile": "boss", "session_name": session, "working_directory": str(ref.home)},
        ).json()
    wait_until(lambda: status(ref, boss["id"]) == "idle", what="boss idle")
    return str(boss["id"])


def inbox(ref: Ref, tid: str) -> list[str]:
    with api(ref) as http:
        return [m["message"] for m in http.get("/messages", params={"receiver_id": tid, "limit": 100}).json()]


def got(ref: Ref, tid: str) -> list[str]:
    """What the scripted agent itself received, in order."""
    return received_bodies(ref.srv.home, tid)


# -- the CLI ------------------------------------------------------------------------------------------
def test_cli_launch_session_and_shutdown(ref: Ref):
    """`cao launch --headless` with and without a task, `session list/status/send`, `shutdown`."""
    out = ref.ok(
        "launch", "--agents", "boss", "--headless", "--auto-approve", "--session-name", "first", "hi boss"
    )
    assert "ok: hi boss" in out  # the task arrived, was answered, and the answer was read back
    ref.ok("launch", "--agents", "boss", "--headless", "--auto-approve", "--session-name", "plain")
    listed = ref.ok_json("session", "list", "--json")
    assert sorted(s["session"] for s in listed) == ["cao-first", "cao-plain"]
    assert all(s["conductor"]["provider"] == "scripted" for s in listed)
    plain = next(s["conductor"]["id"] for s in listed if s["session"] == "cao-plain")
    wait_until(lambda: status(ref, plain) == "idle", what="plain idle")
    shown = ref.ok_json("session", "status", "cao-first", "--json")
    assert shown["conductor"]["last_output"] == "ok: hi boss"
    assert "ok: again" in ref.ok("session", "send", "cao-plain", "again", "--timeout", "60")
    ref.ok("shutdown", "--all")
    with api(ref) as http:
        assert http.get("/sessions").json() == []


def test_cli_agent_commands(ref: Ref):
    """`cao agent assign/send-message/status/result/cancel/handoff` (2.5 only: 2.1 has no `agent`)."""
    if ref.version.startswith("2.1"):
        pytest.skip("cli-agent-orchestrator 2.1 has no `cao agent` commands")
    boss = start_boss(ref, "crew")
    assigned = ref.ok_json("agent", "assign", "worker", "compute the plan", "--json", as_terminal=boss)
    worker = assigned["terminal_id"]
    assert assigned["success"] is True
    wait_until(
        lambda: got(ref, worker)[:1] and got(ref, worker)[0].startswith("compute the plan"), what="task"
    )
    assert terminal(ref, worker)["caller_id"] == boss
    assert terminal(ref, worker)["working_directory"] == str(ref.home)  # the supervisor's directory
    # a worker replies without naming the receiver: its recorded caller gets it
    sent = ref.ok_json("agent", "send-message", "report: plan done", "--json", as_terminal=worker)
    assert sent["success"] is True and sent["receiver_id"] == boss
    wait_until(lambda: any(m.startswith("report: plan done") for m in inbox(ref, boss)), what="report")
    # the supervisor messages its worker by id (the client checks the caller link first)
    assert ref.ok_json("agent", "send-message", "and test it", "--to", worker, "--json", as_terminal=boss)[
        "success"
    ]
    wait_until(lambda: any(b.startswith("and test it") for b in got(ref, worker)), what="second message")
    wait_until(lambda: status(ref, worker) in ("idle", "completed"), what="worker ready")
    assert ref.ok_json("agent", "status", worker, "--json")["status"] in ("idle", "completed")
    assert ref.ok_json("agent", "result", worker, "--json")["output"].startswith("ok: and test it")
    # cancel presses C-c: the scripted agent clears what is typed in its box
    with api(ref) as http:
        for key in ("z", "q"):
            http.post(f"/terminals/{worker}/key", params={"key": key})
        wait_until(lambda: http.get(f"/terminals/{worker}/output").json()["output"].rstrip().endswith("❯ zq"))
        assert ref.ok_json("agent", "cancel", worker, "--json", as_terminal=boss)["success"] is True
        wait_until(
            lambda: not http.get(f"/terminals/{worker}/output").json()["output"].rstrip().endswith("zq")
        )
    # handoff --no-wait: the worker exists, its task arrives once it is ready
    quick = ref.cli("agent", "handoff", "worker", "compute 2+2", "--no-wait", "--json", as_terminal=boss)
    assert quick.returncode == 0, quick.stdout + quick.stderr
    later = json.loads(quick.stdout)["terminal_id"]
    wait_until(lambda: got(ref, later) == ["compute 2+2"], what="--no-wait task delivered")
    # handoff and wait: created first (its id on stderr), run through run-step, removed after
    waited = ref.ok_json("agent", "handoff", "worker", "compute 6x7", "--json", as_terminal=boss)
    assert waited["success"] is True and waited["output"] == "result of 6x7"
    assert terminal(ref, waited["terminal_id"])["status_code"] == 404
    assert ref.ok_json("agent", "cancel", worker, "--delete", "--json", as_terminal=boss)["success"] is True
    assert terminal(ref, worker)["status_code"] == 404


# -- the MCP server ------------------------------------------------------------------------------------
def test_mcp_handoff_assign_and_messages(ref: Ref):
    boss = start_boss(ref, "team")
    new = not ref.version.startswith("2.1")

    async def scenario() -> None:
        async with ref.mcp(boss) as mcp:
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"handoff", "assign", "send_message"} <= names
            done = tool(await mcp.call_tool("handoff", {"agent_profile": "worker", "message": "compute 3*3"}))
            assert done["success"] is True, done
            assert done["output"] == "result of 3*3"
            assigned = tool(
                await mcp.call_tool("assign", {"agent_profile": "worker", "message": "compute a plan"})
            )
            assert assigned["success"] is True, assigned
            worker = assigned["terminal_id"]
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: got(ref, worker)[:1] and got(ref, worker)[0].startswith("compute a plan")
                )
            )
            sent = tool(await mcp.call_tool("send_message", {"receiver_id": worker, "message": "also this"}))
            assert sent["success"] is True and "message_id" in sent, sent
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: any(b.startswith("also this") for b in got(ref, worker)))
            )
            if not new:
                return
            assert terminal(ref, worker)["caller_id"] == boss
            # a peer in the same session that boss did not start: reachable through siblings
            with api(ref) as http:
                peer = http.post("/sessions/team/terminals", json={"agent_profile": "worker"}).json()["id"]
            peer_sent = tool(
                await mcp.call_tool("send_message", {"receiver_id": peer, "message": "hello peer"})
            )
            assert peer_sent["success"] is True, peer_sent
            # a worker that asks: its supervisor answers the prompt
            asked = tool(await mcp.call_tool("assign", {"agent_profile": "asker", "message": "deploy now"}))
            asker = asked["terminal_id"]
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: status(ref, asker) == "waiting_user_answer", what="asking")
            )
            answered = tool(await mcp.call_tool("answer_user_prompt", {"terminal_id": asker, "answer": "y"}))
            assert answered["success"] is True, answered
            await anyio.to_thread.run_sync(
                lambda: wait_until(lambda: terminal(ref, asker).get("status") == "completed", what="answered")
            )
            deleted = tool(await mcp.call_tool("delete_terminal", {"terminal_id": asker}))
            assert deleted["success"] is True, deleted
            assert terminal(ref, asker)["status_code"] == 404
        if new:
            # the worker replies without a receiver: its recorded caller (boss) gets it
            async with ref.mcp(worker) as as_worker:
                reply = tool(await as_worker.call_tool("send_message", {"message": "plan ready"}))
                assert reply["success"] is True, reply
            await anyio.to_thread.run_sync(
                lambda: wait_until(
                    lambda: any(m.startswith("plan ready") for m in inbox(ref, boss)), what="reply"
                )
            )
            with api(ref) as http:
                assert (
                    http.get(f"/terminals/{peer}/inbox/messages")
                    .json()[0]["message"]
                    .startswith("hello peer")
                )

    anyio.run(scenario)


def test_health_and_session_shape_as_the_reference_reads_them(ref: Ref):
    """`sync_backend_from_server` (2.5) picks the tmux backend from /health; `cao info` (2.1) and
    `terminal restore` read `GET /sessions/{name}`."""
    boss = start_boss(ref, "shape")
    python = str(ref.venv / "bin" / "python")
    if ref.version.startswith("2.1"):
        probe = (
            "import requests; from cli_agent_orchestrator.constants import API_BASE_URL as u;"
            "d = requests.get(u + '/sessions/cao-shape').json(); print(len(d['terminals']))"
        )
        want = "1"
    else:
        probe = (
            "from cli_agent_orchestrator.utils.terminal import sync_backend_from_server as s;"
            "from cli_agent_orchestrator.backends.registry import get_backend as g;"
            "import requests; from cli_agent_orchestrator.constants import API_BASE_URL as u; s();"
            "d = requests.get(u + '/sessions/cao-shape').json();"
            "print(type(g()).__name__, d['session']['name'], d['terminals'][0]['tmux_window'],"
            " d['terminals'][0]['pending_inbox_count'])"
        )
        with api(ref) as http:
            window = http.get(f"/terminals/{boss}").json()["name"]
        want = f"TmuxBackend cao-shape {window} 0"
    done = subprocess.run(
        [python, "-c", probe], env=ref.env(), cwd=ref.home, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == want
