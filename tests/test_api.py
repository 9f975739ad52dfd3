"""The HTTP API in-process (TestClient) over a real core: real tmux, real SQLite, scripted agents."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from tests.conftest import pid_alive, wait_until


@pytest.fixture
def client(core: Cao):
    with TestClient(create_app(core)) as c:
        yield c


def _status(client: TestClient, tid: str) -> str:
    return client.get(f"/terminals/{tid}").json()["status"]


def test_health_and_info(client: TestClient):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/info").json()
    assert info["tmux_socket"].startswith("cao-test-")
    assert info["messages"]["pending"] == 0


def test_session_lifecycle_query_form(client: TestClient, tmp_path: Path):
    r = client.post(
        "/sessions",
        params={"provider": "scripted", "session_name": "alpha", "working_directory": str(tmp_path)},
    )
    assert r.status_code == 201, r.text
    term = r.json()
    assert {"id", "name", "provider", "session_name", "agent_profile", "status", "last_active"} <= set(term)
    assert term["session_name"] == "cao-alpha" and term["agent_profile"] == "developer"
    assert len(term["id"]) == 8
    wait_until(lambda: _status(client, term["id"]) == "idle", what="idle")
    sessions = client.get("/sessions").json()
    assert [s["name"] for s in sessions] == ["cao-alpha"]
    # add a terminal with a JSON body
    r2 = client.post("/sessions/alpha/terminals", json={"agent_profile": "reviewer"})
    assert r2.status_code == 201, r2.text
    assert r2.json()["agent_profile"] == "reviewer"
    assert len(client.get("/sessions/cao-alpha").json()["terminals"]) == 2
    assert len(client.get("/sessions/alpha/terminals").json()) == 2
    r3 = client.delete("/sessions/alpha")
    assert sorted(r3.json()["deleted_terminals"]) == sorted([term["id"], r2.json()["id"]])
    assert client.get("/sessions").json() == []
    assert client.get(f"/terminals/{term['id']}").status_code == 404


def test_input_output_exit_delete(client: TestClient, core: Cao):
    term = client.post("/sessions", json={"session_name": "io"}).json()
    tid = term["id"]
    wait_until(lambda: _status(client, tid) == "idle")
    assert client.post(f"/terminals/{tid}/input", params={"message": "first question"}).json() == {
        "success": True,
        "confirmed": True,
    }
    wait_until(lambda: _status(client, tid) == "completed")
    assert client.get(f"/terminals/{tid}/output", params={"mode": "last"}).json() == {
        "output": "ok: first question",
        "mode": "last",
    }
    client.post(f"/terminals/{tid}/input", json={"message": "second\nquestion"})
    wait_until(lambda: client.get(f"/terminals/{tid}/output?mode=last").json()["output"] == "ok: second")
    full = client.get(f"/terminals/{tid}/output").json()["output"]
    assert "› first question" in full and "  question" in full
    assert (
        client.get(f"/terminals/{tid}/output", params={"mode": "last", "format": "text"}).text == "ok: second"
    )
    pid = core.store.get_terminal(tid).pane_pid
    assert client.post(f"/terminals/{tid}/exit").json() == {"success": True, "confirmed": True}
    wait_until(lambda: _status(client, tid) == "gone", what="agent exited")
    assert client.delete(f"/terminals/{tid}").json()["success"]
    assert pid is not None
    wait_until(lambda: not pid_alive(pid), what="agent process gone")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "code", "words"),
    [
        ("get", "/terminals/xyz", {}, 422, "8 hex digits"),
        ("get", "/terminals/abcdef12", {}, 404, "not found"),
        ("post", "/sessions", {"params": {"provider": "nope"}}, 422, "choose one of"),
        ("post", "/sessions", {"params": {"session_name": "bad name!"}}, 422, "not allowed"),
        ("post", "/sessions", {"params": {"working_directory": "/does/not/exist"}}, 422, "not a directory"),
        (
            "post",
            "/sessions",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
            "not valid JSON",
        ),
        ("post", "/sessions", {"json": [1, 2]}, 422, "JSON object"),
        ("get", "/terminals/abcdef12/output?mode=weird", {}, 404, "not found"),
        ("post", "/sessions/nosuch/terminals", {}, 404, "create it first"),
        ("delete", "/sessions/nosuch", {}, 404, "not found"),
        ("get", "/messages/abc", {}, 422, "positive integers"),
        ("get", "/messages/12345", {}, 404, "not found"),
        ("post", "/terminals/abcdef12/inbox/messages", {"json": {"message": "x"}}, 404, "not found"),
        ("post", "/terminals/abcdef12/inbox/messages", {"json": {}}, 422, "message is required"),
        ("get", "/terminals/abcdef12/inbox/messages?status=weird", {}, 422, "unknown"),
    ],
)
def test_errors_are_json_and_name_the_problem(client: TestClient, method, path, kwargs, code, words):
    r = getattr(client, method)(path, **kwargs)
    assert r.status_code == code, r.text
    body = r.json()
    assert words in body["detail"], body
    assert body["error"]


def test_output_mode_validated(client: TestClient):
    tid = client.post("/sessions", json={"session_name": "m"}).json()["id"]
    r = client.get(f"/terminals/{tid}/output", params={"mode": "weird"})
    assert r.status_code == 422 and "use full or last" in r.json()["detail"]
