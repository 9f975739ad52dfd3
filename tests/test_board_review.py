"""What a hostile review of the coordination board found, each kept as the test that failed on the
code it was written against (ATTENTION.md guarantee 12, docs/orchestration.md "The board"): a
forgotten deleted key letting a stale compare-and-swap through, an uppercased terminal id around
the 403, an encoded '/' in a session name reaching another key, the MCP retry check taking 1 for
true or missing a rewrite over a tombstone, the depth limit off by one."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from cao.errors import VersionConflict
from cao.mcp.tools import AgentTools
from cao.store import Store
from cao.store import board as rules
from tests.test_board import Team, put, team  # noqa: F401  (the fixture)
from tests.test_store import _terminal

pytestmark = pytest.mark.fast


def test_a_forgotten_deleted_key_does_not_let_a_stale_cas_through(tmp_path: Path, monkeypatch):
    """Versions restart from 0 once a deleted key is forgotten, so a reader's stale version matches
    again (ABA): a writer that read "owner=A" at v1 overwrites "owner=C" that was written since."""
    monkeypatch.setattr(rules, "MAX_DELETED_KEYS", 2)
    s = Store(tmp_path / "cao.db", busy_timeout=5)
    _terminal(s)
    stale = s.board_set("cao-x", "owner/parser", "A", expected_version=0, writer="cli").version  # 1
    s.board_delete("cao-x", "owner/parser", expected_version=1, writer="cli")
    for i in range(3):  # other keys deleted since: owner/parser is forgotten whole
        v = s.board_set("cao-x", f"tmp/{i}", i, expected_version=0, writer="cli").version
        s.board_delete("cao-x", f"tmp/{i}", expected_version=v, writer="cli")
    s.board_set("cao-x", "owner/parser", "C", expected_version=0, writer="cli")  # C claims it
    with pytest.raises(VersionConflict):  # main: succeeds, overwriting C's claim
        s.board_set("cao-x", "owner/parser", "B", expected_version=stale, writer="cli")


def test_an_uppercased_terminal_id_is_not_a_way_around_the_403(team: Team):  # noqa: F811
    r = put(team, "x", 1, 0, by=team.carol.upper())  # carol is in cao-other
    assert r.status_code in (403, 422), r.text  # main: 200, writer "C…" shown as if an agent


def test_an_encoded_slash_in_the_session_name_does_not_reach_another_key(team: Team):  # noqa: F811
    # what `cao board set team/board x v` sends (cao.names.board_path quotes the session with safe='')
    r = team.api.put("/sessions/team%2Fboard/board/x", json={"value": "v", "expected_version": 0})
    assert r.status_code in (404, 422), r.text  # main: 200, key 'board/x' of cao-team written
    assert team.api.get("/sessions/team/board/board/x").status_code == 404


def _tools(t: Team, tid: str) -> AgentTools:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=t.api.app), base_url="http://testserver")
    return AgentTools(http, tid)


def test_mcp_retry_detection_does_not_claim_a_different_value_was_written(team: Team):  # noqa: F811
    tools = _tools(team, team.alice)

    async def go():
        first = await tools.board_set("flag", 1, 0)
        second = await tools.board_set("flag", True, 0)  # another call (parallel tool call), not a retry
        return first, second

    first, second = anyio.run(go)
    assert first["written"] is True
    board = team.api.get("/sessions/team/board/flag").json()
    assert board["value"] == 1 and board["value"] is not True
    # main: written True, value True (Python: 1 == True), though the board holds 1
    assert not (second["written"] and second["value"] is True), second


def test_mcp_retry_of_a_write_over_a_deleted_key_answers_written(team: Team):  # noqa: F811
    """docs: an MCP retry of a write that got through answers written: true; and after a delete the
    docs say to write the key again with expected_version 0."""
    put(team, "k", "old", 0)
    team.api.request("DELETE", "/sessions/team/board/k", json={"expected_version": 1})
    tools = _tools(team, team.alice)

    async def go():
        first = await tools.board_set("k", "mine", 0)
        retry = await tools.board_set("k", "mine", 0)  # the same call again (its answer was lost)
        return first, retry

    first, retry = anyio.run(go)
    assert first["written"] is True and first["version"] == 3
    assert retry["written"] is True, retry  # main: written False, "already exists at version 3"


def test_the_depth_limit_is_the_documented_64_levels(team: Team):  # noqa: F811
    deep = []
    for _ in range(64):
        deep = [deep]  # 65 levels of lists
    r = put(team, "deep", deep, 0)
    assert r.status_code == 422, r.text  # docs: "at most 64 levels deep"; main: 200
