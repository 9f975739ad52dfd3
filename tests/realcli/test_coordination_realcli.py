"""Coordination through real CLIs in the loopback-only bed (ATTENTION.md scenarios 12 and 13):
a Claude Code supervisor assigns two real workers; one reports its result with cao's
``report_result`` tool (twice: the retry is the first receipt), the other stops at a real
permission prompt. The supervisor's model gets the result once and the "blocked" notice once,
without polling; each is proven by its own message header in the model's request."""

from __future__ import annotations

from typing import Any

import pytest

from tests.realcli.bed import Bed
from tests.realcli.conftest import LOCK_WAIT, knob
from tests.realcli.test_orchestration import (
    CLAUDE,
    CODEX,
    GEMINI,
    NewServer,
    install_profile,
    mcp,
    start,
    terminals,
    until,
    user_turns,
)
from tests.realcli.test_providers_e2e import token

pytestmark = [pytest.mark.realcli, pytest.mark.timeout(LOCK_WAIT + 420)]


@pytest.fixture
def new_server(make_server: Any) -> Any:
    """A bed cao-server whose Codex asks before it runs a command (its permission prompt is real)."""

    def make() -> Any:
        return make_server("claude_code", **{knob("codex", "BYPASS"): "false"})

    return make


def test_a_real_supervisor_gets_a_workers_result_and_anothers_blocked_notice_once(
    bed: Bed, new_server: NewServer
) -> None:
    server = new_server()
    install_profile(server, "developer", GEMINI.provider)  # the reporter
    install_profile(server, "reviewer", CODEX.provider)  # the one that will be blocked
    supervisor = start(server, bed, CLAUDE, profile="code_supervisor")

    tok, job, probe = token("coord"), token("job"), token("probe")
    details = {"branch": "feat/parser", "files": ["src/parser.py"], "tests": "12 passed"}
    summary = f"Parser fixed {job}; 12 tests pass."
    report = mcp("report_result", status="done", summary=summary, details=details)
    task = f"Fix the parser {job} {report}{report}[[reply:Reported {job}.]]"  # the second: a retry
    blocked_task = f"Check the build {probe} [[permission]][[reply:Checked {probe}.]]"
    supervisor.type(
        f"Delegate {tok} {mcp('assign', agent_profile='developer', message=task)}"
        f"{mcp('assign', agent_profile='reviewer', message=blocked_task)}"
        f"[[reply:Assigned both {tok}; waiting.]]",
        tok,
    )
    until(
        lambda: supervisor.last() == f"Assigned both {tok}; waiting.",
        90,
        "the supervisor's turn to end after two assigns",
        server,
        supervisor.id,
    )
    workers = {
        t["agent_profile"]: t["id"] for t in terminals(server) if t.get("supervisor_id") == supervisor.id
    }
    reporter, blocked = workers["developer"], workers["reviewer"]

    def inbox(kind: str, sender: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = server.call("GET", "/messages", params={"receiver_id": supervisor.id})
        return [m for m in rows if m["kind"] == kind and m["sender_id"] == sender]

    # 12: one result, stored once (the retry answered the first receipt), delivered once
    results = until(
        lambda: inbox("result", reporter), 180, "the worker's result", server, supervisor.id, reporter
    )
    until(
        lambda: (
            len(server.call("GET", f"/terminals/{reporter}/results")) == 1
            and "Reported" in server.screen(reporter, "last")
        ),
        60,
        "the reporter's turn to end",
        server,
        reporter,
    )
    [stored] = server.call("GET", f"/terminals/{reporter}/results")
    assert (stored["status"], stored["summary"], stored["details"]) == ("done", summary, details)
    assert len(inbox("result", reporter)) == 1
    rid = int(results[0]["id"])
    # 13: the permission prompt is one "blocked" notice to the supervisor
    notices = until(
        lambda: [m for m in inbox("notice", blocked) if "waiting at a permission" in m["message"]],
        120,
        "the blocked notice",
        server,
        supervisor.id,
        blocked,
    )
    assert server.status(blocked) == "waiting_user_answer"
    nid = int(notices[0]["id"])
    for mid in (rid, nid):
        header = f"[cao message #{mid} from "
        until(
            lambda header=header: (
                len(user_turns(bed, CLAUDE, header)) >= 1 and supervisor.status() == "completed"
            ),
            90,
            f"message {mid} in the supervisor's model",
            server,
            supervisor.id,
        )
    # settled: the supervisor's turns ended and nothing waits for it (a second paste of either
    # message would need one of them pending again: delivered is final)
    until(
        lambda: (
            supervisor.status() == "completed"
            and not server.call(
                "GET", "/messages", params={"receiver_id": supervisor.id, "status": "pending"}
            )
        ),
        60,
        "the supervisor settled",
        server,
        supervisor.id,
    )
    for mid in (rid, nid):
        assert len(user_turns(bed, CLAUDE, f"[cao message #{mid} from ")) == 1
        assert server.message(mid)["status"] == "delivered"
    assert summary in user_turns(bed, CLAUDE, f"[cao message #{rid} from ")[0]["prompt"]
    events = [n["event"] for n in server.call("GET", "/notifications", params={"terminal_id": blocked})]
    assert events == ["blocked"]
    # the reporter reported: no "finished" notice for its task (the operator still sees the event)
    assert [m for m in inbox("notice", reporter) if "ended its turn" in m["message"]] == []
