"""ATTENTION.md scenario 15 on a real cao-server: two scripted agents in one session, each in its
own pane of a private tmux server, write the same key with the same expected version at once:
through their MCP tools (a cao-mcp-server each, as their CLIs would run it), then through the HTTP
API from two threads. One wins, the other is told the current version; nobody's pane changes, no
message is made and no delivery is woken."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from cao.tmux import Tmux
from tests.helpers import ServerProcess, read_records, wait_until, write_rules
from tests.test_mcp import data, mcp_as


def test_two_agents_race_for_one_key_one_wins_the_other_gets_the_version_and_no_pane_changes(
    make_server: Callable[..., ServerProcess], tmp_path: Any
):
    home = tmp_path / "cao"
    write_rules(home, "developer", {"record": True})  # each agent records every turn it is given
    srv = make_server(home)
    with srv.client() as http:
        a = http.post("/sessions", json={"session_name": "team"}).json()["id"]
        b = http.post("/sessions/team/terminals", json={}).json()["id"]
        for tid in (a, b):
            wait_until(lambda t=tid: http.get(f"/terminals/{t}").json()["status"] == "idle", what="idle")
        tmux = Tmux(srv.socket_name)
        panes = {tid: http.get(f"/terminals/{tid}").json()["pane_id"] for tid in (a, b)}

        def seen() -> dict[str, Any]:
            """Everything a write could have disturbed: each pane's whole screen and scrollback, what
            each agent was handed, the messages, and how often delivery was woken."""
            return {
                "screens": {tid: tmux.capture(pane, scrollback=True) for tid, pane in panes.items()},
                "records": {tid: read_records(home, tid) for tid in (a, b)},
                "messages": http.get("/messages").json(),
                "kicks": http.get("/info").json()["engine"]["kicks"],
            }

        # 1. both agents' board_set at once, each through its own MCP server, over "must not exist"
        async def race() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
            results: dict[str, dict[str, Any]] = {}
            async with mcp_as(srv, a) as as_a, mcp_as(srv, b) as as_b:
                # (an MCP server reporting in wakes delivery to its agent: that is before, not the board)
                before = seen()

                async def claim(who: str, session: Any) -> None:
                    args = {"key": "owner/release", "value": {"owner": who}, "expected_version": 0}
                    results[who] = data(await session.call_tool("board_set", args))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(claim, a, as_a)
                    tg.start_soon(claim, b, as_b)
            return before, results

        before, results = anyio.run(race)
        assert before["messages"] == [] and all("cao scripted agent" in s for s in before["screens"].values())
        [winner] = [who for who, r in results.items() if r["written"]]
        [loser] = [who for who in (a, b) if who != winner]
        assert results[winner]["version"] == 1
        lost = results[loser]
        assert (lost["current_version"], lost["current_value"], lost["current_writer"]) == (
            1,
            {"owner": winner},
            winner,
        )

        # 2. the same through the HTTP API: two threads, both over version 1
        start = threading.Barrier(2)
        answers: dict[str, httpx.Response] = {}

        def put(who: str) -> None:
            with srv.client() as own:
                start.wait()
                answers[who] = own.put(
                    "/sessions/team/board/owner/release",
                    json={"value": {"owner": who, "round": 2}, "expected_version": 1, "by": who},
                )

        threads = [threading.Thread(target=put, args=(who,)) for who in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(r.status_code for r in answers.values()) == [200, 409]
        [(second, ok)] = [(who, r) for who, r in answers.items() if r.status_code == 200]
        [conflict] = [r.json() for r in answers.values() if r.status_code == 409]
        assert ok.json()["version"] == 2
        assert (conflict["current_version"], conflict["current_writer"]) == (2, second)
        assert conflict["current_value"] == {"owner": second, "round": 2}
        assert "retry with expected_version 2" in conflict["detail"]

        history = http.get("/sessions/team/board/owner/release", params={"history": "true"}).json()
        assert [(h["version"], h["writer"]) for h in history] == [(2, second), (1, winner)]
        # nobody's pane changed, nobody was handed anything, no message, no delivery woken
        assert seen() == before
