"""The HTTP API in-process (TestClient) over a real core: real tmux, real SQLite, scripted agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from fastapi.testclient import TestClient

import providers
from cao import api, openapi
from cao.api import create_app
from cao.core import Cao
from cao.errors import InvalidInput
from cao.store import MESSAGE_STATUSES
from tests.helpers import pid_alive, received_bodies, wait_until, write_rules


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
        ("post", "/sessions", {"params": {"session_name": "a.b"}}, 422, "rewrites '.'"),
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
        ("get", "/terminals/abcdef12/inbox/messages?status=weird", {}, 400, "Invalid status"),
        ("get", "/terminals/abcdef12/inbox/messages?limit=101", {}, 422, "between 1 and 100"),
        ("get", "/messages?status=weird", {}, 422, "unknown"),
        ("get", "/messages?receiver_id=xyz", {}, 422, "8 hex digits"),
        ("post", "/terminals/abcdef12/key", {"params": {"key": "Home; ls"}}, 422, "not allowed"),
        ("post", "/terminals/abcdef12/key", {"params": {"key": "C-c"}}, 404, "not found"),
        ("post", "/sessions", {"params": {"provider": "kiro_cli"}}, 422, "CAO_PROVIDER_ALIASES"),
        ("post", "/sessions", {"params": {"use_worktree": "maybe"}}, 422, "true or false"),
        ("post", "/sessions", {"json": {"caller_id": "boss"}}, 422, "8 hex digits"),
        ("post", "/terminals/run-step", {"json": {"agent": "developer"}}, 422, "prompt is required"),
        (
            "post",
            "/terminals/run-step",
            {"json": {"agent": "x", "prompt": "p", "job_id": "1"}},
            422,
            "32-char",
        ),
        ("get", "/handoff-results/0123456789abcdef0123456789abcdef", {}, 404, "not found"),
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
    r = client.get(f"/terminals/{tid}/output", params={"format": "xml"})
    assert r.status_code == 422 and "not one of json, text" in r.json()["detail"]  # was JSON, silently


# -- what the reference orchestrator's clients use (docs/compatibility.md) -------------------------
def test_health_names_the_terminal_backend(client: TestClient):
    health = client.get("/health").json()
    assert health["terminal_backend"] == "tmux"
    assert (
        health["default_provider"] == "scripted" == providers.default_name()
    )  # the CLI and dashboard default


def test_caller_link_siblings_working_directory_and_session_shape(client: TestClient, tmp_path: Path):
    boss = client.post("/sessions", json={"session_name": "ref", "working_directory": str(tmp_path)}).json()
    assert boss["caller_id"] is None and boss["initial_delivery"] is None
    worker = client.post(
        "/sessions/ref/terminals", params={"caller_id": boss["id"], "working_directory": str(tmp_path)}
    ).json()
    # caller_id (the reference's name) and supervisor_id (ours) are one link, shown under both names
    assert worker["caller_id"] == worker["supervisor_id"] == boss["id"]
    assert client.get(f"/terminals/{worker['id']}").json()["caller_id"] == boss["id"]
    assert [t["id"] for t in client.get(f"/terminals/{boss['id']}/siblings").json()] == [worker["id"]]
    got = client.get(f"/terminals/{worker['id']}/siblings", params={"cross_session": "true"}).json()
    assert [t["id"] for t in got] == [boss["id"]]
    assert client.get(f"/terminals/{worker['id']}/working-directory").json() == {
        "working_directory": str(tmp_path)
    }
    view = client.get("/sessions/ref").json()
    assert view["session"] == {"id": "cao-ref", "name": "cao-ref", "status": "active"}
    assert view["name"] == "cao-ref"  # our own keys stay
    rows = {t["id"]: t for t in view["terminals"]}
    assert rows[worker["id"]]["tmux_session"] == "cao-ref"
    assert rows[worker["id"]]["tmux_window"] == worker["name"]
    assert rows[worker["id"]]["pending_inbox_count"] == 0
    mismatch = client.post(
        "/sessions/ref/terminals", json={"caller_id": boss["id"], "supervisor_id": "abcdef12"}
    )
    assert mismatch.status_code == 422 and "differ" in mismatch.json()["detail"]


def test_initial_message_is_the_first_task_and_its_delivery_is_tracked(client: TestClient, core: Cao):
    boss = client.post("/sessions", json={"session_name": "init"}).json()
    r = client.post(
        "/sessions/init/terminals",
        params={"caller_id": boss["id"], "defer_init": "true"},
        json={"initial_message": "build it\nthen test it", "description": None},
    )
    assert r.status_code == 201, r.text
    worker = r.json()
    assert worker["initial_delivery"]["state"] in ("pending", "delivered")
    wait_until(
        lambda: client.get(f"/terminals/{worker['id']}").json()["initial_delivery"]["state"] == "delivered",
        what="initial message delivered",
    )
    assert received_bodies(core.settings.home, worker["id"]) == ["build it\nthen test it"]
    [m] = client.get("/messages", params={"receiver_id": worker["id"]}).json()
    assert m["sender_id"] == boss["id"]  # the caller is the sender of its worker's task


def test_receipt_and_reference_inbox_list(client: TestClient):
    tid = client.post("/sessions", json={"session_name": "lst"}).json()["id"]
    receipts = [
        client.post(
            f"/terminals/{tid}/inbox/messages", params={"sender_id": "cli", "message": f"m{i}"}
        ).json()
        for i in range(12)
    ]
    first = receipts[0]
    assert first["success"] is True and first["duplicate"] is False
    assert first["created_at"].endswith("+00:00") and "T" in first["created_at"]  # ISO 8601
    listed = client.get(f"/terminals/{tid}/inbox/messages").json()
    assert [m["message"] for m in listed] == [f"m{i}" for i in range(10)]  # oldest first, 10 by default
    assert set(listed[0]) == {"id", "sender_id", "receiver_id", "message", "status", "created_at"}
    assert listed[0]["created_at"] == first["created_at"]
    ours = client.get("/messages", params={"receiver_id": tid}).json()
    assert [m["message"] for m in ours][:2] == ["m11", "m10"]  # our view: newest first, in full
    assert ours[-1]["created_at"] == first["created_at"] and "waiting_reason" in ours[0]  # ISO everywhere


def test_key_goes_through_the_checked_path(client: TestClient, core: Cao):
    tid = client.post("/sessions", json={"session_name": "keys"}).json()["id"]
    wait_until(lambda: _status(client, tid) == "idle")
    for key in ("h", "i"):
        assert client.post(f"/terminals/{tid}/key", params={"key": key}).json() == {"success": True}
    wait_until(lambda: "❯ hi" in core.output(tid), what="typed keys shown in the input box")
    client.post(f"/terminals/{tid}/key", json={"key": "C-c"})  # the scripted agent clears its box
    wait_until(lambda: "❯ hi" not in core.output(tid).splitlines()[-1], what="input box cleared")


def test_run_step_answers_and_removes_its_worker_and_keeps_the_result(client: TestClient, core: Cao):
    write_rules(
        core.settings.home, "stepper", {"rules": [{"match": "^sum", "delay": 0.3, "reply": "it is 42"}]}
    )
    boss = client.post("/sessions", json={"session_name": "step"}).json()
    job = "ab" * 16
    r = client.post(
        "/terminals/run-step",
        json={
            "provider": "scripted",
            "agent": "stepper",
            "prompt": "sum the numbers",
            "session_name": "cao-step",
            "caller_id": boss["id"],
            "timeout": 30,
            "job_id": job,
            "allowed_tools": None,
        },
    )
    assert r.status_code == 200, r.text
    step = r.json()
    assert step["last_message"] == "it is 42" and step["status"] == "completed"
    assert client.get(f"/terminals/{step['terminal_id']}").status_code == 404  # torn down
    kept = client.get(f"/handoff-results/{job}").json()
    assert (kept["state"], kept["terminal_id"], kept["last_message"]) == (
        "completed",
        step["terminal_id"],
        "it is 42",
    )


class StepCase(NamedTuple):
    rules: dict[str, Any]
    timeout: float
    status: int
    kind: str


@pytest.mark.parametrize(
    "case",
    [
        StepCase({"rules": [{"match": ".", "error": "API Error: 500 overloaded"}]}, 30, 502, "error"),
        StepCase({"rules": [{"match": ".", "delay": 60, "reply": "late"}]}, 1, 504, "timeout"),
    ],
    ids=["worker-errors", "worker-too-slow"],
)
def test_run_step_failures_name_kind_and_worker_and_leave_it(client: TestClient, core: Cao, case: StepCase):
    write_rules(core.settings.home, "failing", case.rules)
    job = "cd" * 16
    r = client.post(
        "/terminals/run-step",
        json={"agent": "failing", "prompt": "go", "timeout": case.timeout, "job_id": job},
    )
    assert r.status_code == case.status, r.text
    body = r.json()
    assert body["kind"] == case.kind and isinstance(body["detail"], str)
    assert body["terminal_id"] in body["detail"]
    assert client.get(f"/terminals/{body['terminal_id']}").status_code == 200  # left for inspection
    kept = client.get(f"/handoff-results/{job}").json()
    assert kept["state"] == "error" and kept["terminal_id"] == body["terminal_id"]


def test_run_step_with_remove_on_failure_removes_a_failed_worker(client: TestClient, core: Cao):
    """What the MCP handoff asks for: a worker that failed is not left behind (the failure still
    names it, and the kept result says what happened)."""
    write_rules(
        core.settings.home, "failing", {"rules": [{"match": ".", "error": "API Error: 500 overloaded"}]}
    )
    job = "ef" * 16
    r = client.post(
        "/terminals/run-step",
        json={"agent": "failing", "prompt": "go", "timeout": 30, "job_id": job, "remove_on_failure": True},
    )
    assert r.status_code == 502, r.text
    worker = r.json()["terminal_id"]
    assert client.get(f"/terminals/{worker}").status_code == 404
    assert client.get(f"/handoff-results/{job}").json()["state"] == "error"
    assert (
        client.post(
            "/terminals/run-step", json={"agent": "x", "prompt": "go", "remove_on_failure": "maybe"}
        ).status_code
        == 422
    )


def test_unknown_provider_names_ours_and_the_mapping(client: TestClient):
    detail = client.post("/sessions", params={"provider": "kiro_cli"}).json()["detail"]
    assert f"choose one of: {', '.join(providers.names())}." in detail
    assert "claude_code, codex, gemini_cli, kimi_cli, hermes are the same CLIs here" in detail
    assert "kiro_cli" in detail and "CAO_PROVIDER_ALIASES" in detail


def test_provider_aliases_run_one_of_ours(make_core: Any, settings: Any, tmp_path: Path):
    core = make_core(settings.with_(provider_aliases=(("kiro_cli", "scripted"),)))
    with TestClient(create_app(core)) as c:
        term = c.post("/sessions", params={"provider": "kiro_cli", "working_directory": str(tmp_path)}).json()
        assert term["provider"] == "scripted"
    for bad in ((("scripted", "codex"),), (("kiro_cli", "nope"),)):
        with pytest.raises(InvalidInput, match="CAO_PROVIDER_ALIASES"):
            make_core(settings.with_(provider_aliases=bad), start=False)


def test_a_parameter_given_in_both_the_query_and_the_body_is_refused_and_nothing_is_made(
    client: TestClient, core: Cao
):
    """The body used to win silently, so a query value was dropped unchecked (schemathesis found a
    `defer_init=-550` query beside a JSON body accepted with 201). Now it names the parameter."""
    r = client.post("/sessions", params={"defer_init": "-550"}, json={"defer_init": True})
    assert r.status_code == 422
    assert "defer_init" in r.json()["detail"] and "once" in r.json()["detail"]
    assert core.store.list_terminals() == []
    ok = client.post("/sessions", params={"session_name": "both-ways"}, json={"defer_init": True})
    assert ok.status_code == 201  # different parameters may come either way


# -- each route's parameters come from its one declaration (cao/params.py) -------------------------
DECLARED = {
    ("post", "/sessions"),
    ("post", "/sessions/{name}/terminals"),
    ("post", "/terminals/run-step"),
    ("get", "/terminals/{terminal_id}/siblings"),
    ("post", "/terminals/{terminal_id}/key"),
    ("post", "/terminals/{terminal_id}/input"),
    ("post", "/terminals/{terminal_id}/merge"),
    ("post", "/terminals/{receiver_id}/inbox/messages"),
    ("post", "/profiles"),
    ("post", "/messages/{message_id}/defer"),
    ("post", "/messages/{message_id}/drop"),
    ("post", "/messages/{message_id}/prioritize"),
    ("post", "/hosts/{name}/fail"),
    ("post", "/messages/{message_id}/read"),
    ("post", "/messages/{message_id}/cancel"),
    ("post", "/terminals/{terminal_id}/ack"),
    ("post", "/terminals/{terminal_id}/result"),
    ("post", "/terminals/{terminal_id}/schedules"),
    ("post", "/schedules/{schedule_id}/cancel"),
    ("put", "/sessions/{name}/board/{key}"),
    ("delete", "/sessions/{name}/board/{key}"),
}


def test_each_routes_schema_is_written_from_its_declaration(make_core: Any, settings: Any):
    app = create_app(make_core(settings, start=False))
    declared = openapi.declarations(app)
    assert set(declared) == DECLARED
    with TestClient(app) as c:
        schema = c.get("/openapi.json").json()
    for (method, path), params in declared.items():
        op = schema["paths"][path][method]
        names = [p.name for p in params.params]
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        assert list(body.get("properties", {})) == names, (method, path)
        assert body.get("properties", {}) == {p.name: p.schema() for p in params.params}, (method, path)
        assert [p["name"] for p in op.get("parameters", []) if p["in"] == "query"] == names, (method, path)
    # any other body a route reads is the hook report's, JSON only (openapi.JSON_BODIES)
    bodies = {(m, p) for p, ops in schema["paths"].items() for m, op in ops.items() if "requestBody" in op}
    assert bodies - DECLARED == set(openapi.JSON_BODIES)


def test_path_and_query_parameters_fastapi_reads_state_cores_checks(make_core: Any, settings: Any):
    """They come from the route's signature (cao.params.path/query): no table by name elsewhere."""
    with TestClient(create_app(make_core(settings, start=False))) as c:
        paths = c.get("/openapi.json").json()["paths"]

    def schema(path: str, name: str, method: str = "get") -> dict[str, Any]:
        [found] = [p["schema"] for p in paths[path][method]["parameters"] if p["name"] == name]
        return found

    inbox, messages = "/terminals/{terminal_id}/inbox/messages", "/messages"
    assert (schema(inbox, "limit")["maximum"], schema(inbox, "limit")["default"]) == (100, 10)
    assert (schema(messages, "limit")["maximum"], schema(messages, "limit")["default"]) == (10000, 50)
    assert schema(messages, "status") == {"type": "string", "enum": list(MESSAGE_STATUSES), "title": "Status"}
    assert (
        schema(messages, "receiver_id")["pattern"]
        == schema(inbox, "terminal_id")["pattern"]
        == "^[0-9a-f]{8}$"
    )
    assert schema("/messages/{message_id}", "message_id")["pattern"] == "^[0-9]{1,18}$"
    assert schema("/terminals/{terminal_id}/output", "mode")["enum"] == ["full", "last"]
    assert schema("/terminals/{terminal_id}/diff", "into")["maxLength"] == 4096
    assert schema("/handoff-results/{job_id}", "job_id")["pattern"] == "^[0-9a-f]{32}$"


def test_a_route_reads_only_the_parameters_it_declares():
    values = api.KEY.parse({"key": "C-c"}, b'{"description": "not ours"}')
    assert values["key"] == "C-c" and list(values.keys()) == ["key"]
    for undeclared in ("description", "message"):
        with pytest.raises(KeyError, match="declare it"):
            values[undeclared]
    assert not hasattr(values, "get")  # no silent None for a name the route forgot to declare
    # an ignored parameter is checked, then left out of what the route reads
    with pytest.raises(InvalidInput, match="defer_init must be true or false"):
        api.NEW_SESSION.parse({"defer_init": "maybe"}, b"")
    with pytest.raises(KeyError):
        api.NEW_SESSION.parse({"defer_init": "true"}, b"")["defer_init"]
    # undeclared text is checked all the same (by its name), then dropped
    with pytest.raises(InvalidInput, match="description contains a control character"):
        api.KEY.parse({"key": "C-c", "description": "a\x1b[2J"}, b"")
    step = api.RUN_STEP.parse(
        {"agent": "dev", "timeout": "30"}, b'{"prompt": "two\\nlines", "teardown": "no"}'
    )
    assert (step["prompt"], step["timeout"], step["teardown"], step["use_worktree"]) == (
        "two\nlines",
        30.0,
        False,
        None,
    )
