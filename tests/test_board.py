"""The coordination board through the library and the HTTP API (cao/board.py, cao/api.py) on
memory panes: who may write which board, what each route refuses and how, the event a write
publishes, and that a write types nothing and wakes no delivery. The two-agent race on real tmux
is ATTENTION.md scenario 15 in tests/test_board_live.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.errors import Forbidden, InvalidInput
from cao.store.board import KEY_PATTERN, MAX_KEY_CHARS, check_key
from cao.watch import event_line
from tests.test_fast_delivery import World

pytestmark = pytest.mark.fast


class Team(NamedTuple):
    world: World
    api: TestClient
    alice: str  # both in session cao-team
    bob: str
    carol: str  # in session cao-other


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    w = World(tmp_path, allowed_hosts=("testserver",))
    make = w.core.lifecycle.create
    alice = make(provider="scripted", agent_profile="developer", session_name="team").id
    bob = make(provider="scripted", agent_profile="developer", session_name="team", new_session=False).id
    carol = make(provider="scripted", agent_profile="developer", session_name="other").id
    with TestClient(create_app(w.core)) as api:
        yield Team(w, api, alice, bob, carol)
    w.core.stop()


def put(t: Team, key: str, value: Any, expected: Any, by: str | None = None, session: str = "team") -> Any:
    body = {"value": value, "expected_version": expected, **({"by": by} if by else {})}
    return t.api.put(f"/sessions/{session}/board/{key}", json=body)


def test_a_fact_is_written_read_listed_and_deleted_through_the_api(team: Team):
    t = team
    r = put(t, "build/status", {"green": False, "failing": ["test_x"]}, 0, by=t.alice)
    assert r.status_code == 200, r.text
    fact = r.json()
    assert fact["session_name"] == "cao-team" and fact["key"] == "build/status"
    assert (fact["version"], fact["writer"], fact["deleted"]) == (1, t.alice, False)
    assert fact["at"].endswith("+00:00")
    assert put(t, "build/status", {"green": True}, 1, by=t.bob).json()["version"] == 2
    put(t, "owner:parser", "bob", 0, by=t.bob)
    got = t.api.get("/sessions/cao-team/board/build/status").json()  # with or without the prefix
    assert (got["version"], got["value"], got["writer"]) == (2, {"green": True}, t.bob)
    assert [f["key"] for f in t.api.get("/sessions/team/board").json()] == ["build/status", "owner:parser"]
    assert [f["key"] for f in t.api.get("/sessions/team/board", params={"prefix": "owner:"}).json()] == [
        "owner:parser"
    ]
    history = t.api.get("/sessions/team/board/build/status", params={"history": "true"}).json()
    assert [(h["version"], h["writer"]) for h in history] == [(2, t.bob), (1, t.alice)]
    one = t.api.get("/sessions/team/board/build/status", params={"history": "true", "limit": 1}).json()
    assert [h["version"] for h in one] == [2]
    # delete: a tombstone version; the key is gone from reads, its history stays
    gone = t.api.request("DELETE", "/sessions/team/board/owner:parser", params={"expected_version": 1})
    assert gone.status_code == 200 and gone.json()["deleted"] is True and gone.json()["version"] == 2
    missing = t.api.get("/sessions/team/board/owner:parser")
    assert missing.status_code == 404 and missing.json()["current_version"] == 2
    assert "write it again with expected_version 0" in missing.json()["detail"]
    assert [f["key"] for f in t.api.get("/sessions/team/board").json()] == ["build/status"]
    assert [h["deleted"] for h in t.api.get("/sessions/team/board/owner:parser?history=true").json()] == [
        True,
        False,
    ]
    # the query form, as every route takes: a value given there is its text
    q = t.api.put("/sessions/team/board/note", params={"value": "plain text", "expected_version": "0"})
    assert q.status_code == 200 and q.json()["value"] == "plain text" and q.json()["writer"] == "operator"


def test_a_stale_write_is_a_409_carrying_the_current_fact_and_nothing_changes(team: Team):
    t = team
    put(t, "plan", "v1", 0, by=t.alice)
    put(t, "plan", "v2", 1, by=t.bob)
    r = put(t, "plan", "alice's", 1, by=t.alice)
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "VersionConflict"
    assert (body["current_version"], body["current_value"], body["current_writer"]) == (2, "v2", t.bob)
    assert "retry with expected_version 2" in body["detail"]
    assert t.api.get("/sessions/team/board/plan").json()["value"] == "v2"
    taken = put(t, "plan", "new", 0, by=t.alice)
    assert taken.status_code == 409 and "must not exist yet" in taken.json()["detail"]
    r = t.api.request("DELETE", "/sessions/team/board/plan", params={"expected_version": 1})
    assert r.status_code == 409 and r.json()["current_version"] == 2
    r = t.api.request("DELETE", "/sessions/team/board/never", params={"expected_version": 0})
    assert r.status_code == 404 and "nothing to delete" in r.json()["detail"]


def test_an_agent_writes_its_own_sessions_board_only_and_reads_any(team: Team):
    t = team
    put(t, "k", "mine", 0, by=t.alice)
    r = put(t, "k", "theirs", 1, by=t.carol)
    assert r.status_code == 403
    assert f"terminal {t.carol} is in session cao-other, not cao-team" in r.json()["detail"]
    r = t.api.request("DELETE", "/sessions/team/board/k", params={"expected_version": 1, "by": t.carol})
    assert r.status_code == 403
    assert t.api.get("/sessions/team/board/k").json()["version"] == 1  # nothing written
    assert put(t, "k", "x", 0, by=t.carol, session="other").status_code == 200  # its own: fine
    # an operator (any name that isn't a terminal's id) may write any board
    assert put(t, "k", "ops", 1, by="ana").json()["writer"] == "ana"
    with pytest.raises(Forbidden):
        t.world.core.board_set("team", "k", "lib", expected_version=2, by=t.carol)


class Bad(NamedTuple):
    path: str
    body: Any  # JSON (dict) or raw bytes
    code: int
    words: str


BAD = [
    Bad("/sessions/team/board/has%20space", {"value": 1, "expected_version": 0}, 422, "not a board key"),
    Bad("/sessions/team/board/a/%2E%2E/b", {"value": 1, "expected_version": 0}, 422, "'.' or '..'"),
    Bad("/sessions/team/board/a//b", {"value": 1, "expected_version": 0}, 422, "none may be empty"),
    Bad("/sessions/team/board/" + "k" * 201, {"value": 1, "expected_version": 0}, 422, "1-200 characters"),
    Bad("/sessions/team/board/k", {"value": 1}, 422, "expected_version is required: 0 for a key"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": "one"}, 422, "must be a whole number"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": 1.5}, 422, "must be a whole number"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": True}, 422, "must be a whole number"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": -1}, 422, "out of range"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": 2**60}, 422, "out of range"),
    Bad("/sessions/team/board/k", {"expected_version": 0}, 422, "value is required"),
    Bad("/sessions/team/board/k", {"value": None, "expected_version": 0}, 422, "DELETE it"),
    Bad("/sessions/team/board/k", {"value": {"a": ["x\x00"]}, "expected_version": 0}, 422, "NUL"),
    Bad("/sessions/team/board/k", {"value": {"a\x00": 1}, "expected_version": 0}, 422, "NUL"),
    Bad("/sessions/team/board/k", b'{"value": ["\\ud800"], "expected_version": 0}', 422, "lone UTF-16"),
    Bad("/sessions/team/board/k", b'{"value": [NaN], "expected_version": 0}', 422, "NaN or Infinity"),
    Bad("/sessions/team/board/k", {"value": [[[[[[[[1]]]]]]]] * 1, "expected_version": 0}, 200, ""),
    Bad(
        "/sessions/team/board/k",
        b'{"value": ' + b"[" * 70 + b"]" * 70 + b', "expected_version": 0}',
        422,
        "64 levels",
    ),
    Bad("/sessions/team/board/k", {"value": "x" * 70_000, "expected_version": 0}, 413, "64 KiB"),
    Bad("/sessions/team/board/k", {"value": 1, "expected_version": 0, "by": "not a name!"}, 422, "by 'not"),
    Bad(
        "/sessions/team/board/k",
        {"value": 1, "expected_version": 0, "by": "abcdef12"},
        422,
        "names no terminal",
    ),
    Bad("/sessions/nope/board/k", {"value": 1, "expected_version": 0}, 404, "session cao-nope not found"),
    Bad("/sessions/bad%3Bname/board/k", {"value": 1, "expected_version": 0}, 422, "not a session name"),
]


@pytest.mark.parametrize("case", BAD, ids=[f"{c.code}-{i}" for i, c in enumerate(BAD)])
def test_bad_writes_are_refused_by_name_and_nothing_is_written(team: Team, case: Bad):
    t = team
    kwargs: dict[str, Any] = (
        {"content": case.body, "headers": {"content-type": "application/json"}}
        if isinstance(case.body, bytes)
        else {"json": case.body}
    )
    r = t.api.put(case.path, **kwargs)
    assert r.status_code == case.code, r.text
    if case.code == 200:  # nested within the limit: taken as it is
        assert r.json()["value"] == [[[[[[[[1]]]]]]]]
        return
    assert case.words in r.json()["detail"], r.json()
    assert t.world.core.store.board_list("cao-team") == []
    assert not [e for e in t.world.core.events.since(None) or [] if e["type"] == "board.set"]


def test_bad_reads_name_the_problem(team: Team):
    t = team
    cases = [
        ("/sessions/team/board/nope", 404, "never written"),
        ("/sessions/team/board/nope?history=true", 404, "never written"),
        ("/sessions/team/board/k?history=maybe", 422, "history"),
        ("/sessions/team/board/k?history=true&limit=101", 422, "limit"),
        ("/sessions/team/board?prefix=a%20b", 422, "prefix 'a b' can't begin a board key"),
        ("/sessions/nope/board", 404, "session cao-nope not found"),
    ]
    for path, code, words in cases:
        r = t.api.get(path)
        assert r.status_code == code, (path, r.text)
        assert words in r.json()["detail"], (path, r.json())


def test_a_write_is_one_board_set_event_and_types_nothing_wakes_nothing(team: Team):
    t = team
    w = t.world

    def panes() -> dict[str, tuple[str, list[str]]]:  # each pane's screen and everything it was sent
        return {
            tid: (w.io.pane(w.pane(tid)).screen.capture(50, True), list(w.io.pane(w.pane(tid)).received))
            for tid in (t.alice, t.bob)
        }

    screens = panes()
    before = w.core.store.counts_by_status()
    put(t, "k", {"big": "x" * 1000}, 0, by=t.alice)
    t.api.request("DELETE", "/sessions/team/board/k", params={"expected_version": 1, "by": t.bob})
    events = [e for e in w.core.events.since(None) or [] if e["type"].startswith("board")]
    assert [
        {k: e[k] for k in ("type", "session_name", "key", "version", "writer", "deleted")} for e in events
    ] == [
        {
            "type": "board.set",
            "session_name": "cao-team",
            "key": "k",
            "version": 1,
            "writer": t.alice,
            "deleted": False,
        },
        {
            "type": "board.set",
            "session_name": "cao-team",
            "key": "k",
            "version": 2,
            "writer": t.bob,
            "deleted": True,
        },
    ]
    assert all("value" not in e for e in events)  # up to 64 KiB: read it from the board
    assert event_line(events[1]).endswith(f"board.set cao-team k v2 (deleted) by {t.bob}")  # cao watch
    assert w.core.store.counts_by_status() == before  # no message
    assert panes() == screens
    assert w.core.engine.stats["kicks"] == 0  # no delivery woken


KEYS = [
    "a",
    "build/status",
    "task:42.owner",
    "x-y_z",
    "...",
    ".hidden",
    "..a",
    "a/.b/..c",
    "k" * MAX_KEY_CHARS,
    "",
    ".",
    "..",
    "a/./b",
    "a/../b",
    "/a",
    "a/",
    "a//b",
    "k" * (MAX_KEY_CHARS + 1),
    "a b",
    "é",
    "a?b",
    "a%2Fb",
]


@pytest.mark.parametrize("key", KEYS)
def test_the_schemas_key_pattern_agrees_with_the_check(key: str):
    """The OpenAPI schema's pattern (what clients and the fuzzer read) says what check_key does."""
    by_schema = bool(re.fullmatch(KEY_PATTERN, key)) and len(key) <= MAX_KEY_CHARS
    try:
        check_key(key)
        by_check = True
    except InvalidInput:
        by_check = False
    assert by_schema == by_check


def test_the_cli_reads_writes_and_shows_a_conflict_with_the_current_version(team: Team):
    from click.testing import CliRunner

    from cao.cli import board, cli
    from cao.client import Client

    client = Client("http://testserver", http=team.api)

    def cao(*args: str) -> Any:
        return CliRunner().invoke(cli, ["board", *args], obj={"client": client})

    for name in board.commands:
        res = CliRunner().invoke(cli, ["board", name, "--help"])
        assert res.exit_code == 0 and "Example" in res.output, name
    assert cao("list", "team", "--json").output.strip() == "[]"
    assert "no facts" in cao("list", "team").output
    res = cao("set", "team", "build/status", "green", "--expected-version", "0")
    assert res.exit_code == 0, res.output
    assert "build/status is at version 1 on cao-team's board" in res.output
    again = cao("set", "team", "build/status", "red", "--expected-version", "0")
    assert again.exit_code == 1
    assert "already exists at version 1" in again.output and 'current: version 1: "green"' in again.output
    res = cao("set", "team", "plan", '{"step": 2, "owner": "bob"}', "--json-value", "--expected-version", "0")
    assert res.exit_code == 0, res.output
    got = json.loads(cao("get", "team", "plan", "--json").output)
    assert (got["value"], got["writer"], got["version"]) == ({"step": 2, "owner": "bob"}, "cli", 1)
    shown = cao("get", "team", "plan").output
    assert '"step": 2' in shown and "version" in shown and "cli" in shown
    listed = cao("list", "team").output
    assert "build/status" in listed and '"green"' in listed and "plan" in listed
    assert [f["key"] for f in json.loads(cao("list", "team", "--prefix", "build/", "--json").output)] == [
        "build/status"
    ]
    bad = cao("set", "team", "plan", "{not json", "--json-value", "--expected-version", "1")
    assert bad.exit_code == 2 and "not JSON" in bad.output
    assert cao("set", "team", "plan", "x", "--expected-version", "-1").exit_code == 2
    stale = cao("rm", "team", "plan", "--expected-version", "2")
    assert stale.exit_code == 1 and "is at version 1" in stale.output
    res = cao("rm", "team", "plan", "--expected-version", "1", "--by", "ana")
    assert res.exit_code == 0 and "plan deleted (version 2)" in res.output
    missing = cao("get", "team", "plan")
    assert missing.exit_code == 1 and "deleted at version 2 by ana" in missing.output
    history = json.loads(cao("get", "team", "plan", "--history", "--json").output)
    assert [(h["version"], h["deleted"]) for h in history] == [(2, True), (1, False)]
    assert "(deleted)" in cao("get", "team", "plan", "--history").output
    dots = cao("set", "team", "a/../b", "x", "--expected-version", "0")  # reaches the server as typed
    assert dots.exit_code == 1 and "'.' or '..'" in dots.output
    assert cao("get", "nope", "k").exit_code == 1
