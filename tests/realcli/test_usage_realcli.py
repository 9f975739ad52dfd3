"""Token usage as the real CLIs record it, in the loopback-only bed.

The fake model reports distinct token counts for every reply (cao/testing/fakemodel/wire.py
``usage_of``) and logs them with the reply's id; what cao counts for the terminal
(``GET /terminals/{id}/usage``, read from the CLI's own transcript or session files) must be
exactly what the fake reported for the replies that terminal's turns got — in total and per task
attempt (two tasks sent to its inbox). The CLIs' own side requests (titles, routing) are in no
record they keep, so they aren't counted (docs/usage.md).

Qwen Code, Copilot CLI, Kimi CLI and OpenCode are checked in total: Qwen records (and bills) its
own background agents (a memory extractor after a turn, whose prompt carries no task's token and
can run into the next task's window), so for these four what cao counts must equal what the fake
reported for every tool-carrying reply since the agent was ready."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.realcli.bed import Bed
from tests.realcli.conftest import CaoServer
from tests.realcli.test_more_providers_e2e import CLIS as MORE_CLIS
from tests.realcli.test_providers_e2e import CLI, CLIS, launch, token, wait_for

pytestmark = pytest.mark.realcli

KINDS = ("input", "output", "cache_read", "cache_write")


@pytest.fixture(params=CLIS, ids=[c.provider for c in CLIS])
def cli(request: pytest.FixtureRequest) -> CLI:
    result: CLI = request.param
    return result


def reported(requests: list[dict[str, Any]], tok: str) -> dict[str, int]:
    """What the fake reported for the model turns whose prompt carries ``tok``."""
    mine = [
        r for r in requests if r.get("kind") == "main" and r.get("usage") and tok in (r.get("prompt") or "")
    ]
    assert mine, f"no model turn carried {tok}"
    return {k: sum(r["usage"][k] for r in mine) for k in KINDS}


def counted(u: dict[str, Any]) -> dict[str, int]:
    return {k: u[f"{k}_tokens"] for k in KINDS}


def test_tokens_per_agent_and_per_task_match_what_the_model_reported(
    cli: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    server = make_server(cli.provider)
    agent = launch(server, bed, cli)
    bed.fake_clear()  # from here on, every request is this agent's
    tasks: dict[str, str] = {}
    for n in (1, 2):
        tok = token(f"task{n}")
        receipt = server.call(
            "POST",
            f"/terminals/{agent.id}/inbox/messages",
            json={
                "message": f"Do task {n} {tok} [[reply:Task {n} done.]]",
                "sender_id": "operator",
                "kind": "task",
            },
        )
        tasks[f"m{receipt['message_id']}"] = tok
        wait_for(
            lambda n=n: agent.last() == f"Task {n} done." and agent.status() == "completed",
            60,
            f"task {n}'s answer",
        )
    requests = bed.fake_requests()

    def matches() -> bool:
        u = server.call("GET", f"/terminals/{agent.id}/usage")
        return bool(u.get("known")) and u["responses"] >= 2

    wait_for(matches, 15, "its CLI recorded both responses")
    u = server.call("GET", f"/terminals/{agent.id}/usage")
    total = {k: sum(reported(requests, tok)[k] for tok in tasks.values()) for k in KINDS}
    assert counted(u) == total, (u, requests)
    by_task = {t["task_id"]: counted(t) for t in u["by_task"]}
    assert by_task == {task: reported(requests, tok) for task, tok in tasks.items()}
    assert u["tokens"] == sum(total.values())
    listed = {t["id"]: t["usage"] for t in server.call("GET", "/terminals")}
    assert listed[agent.id]["tokens"] == u["tokens"]  # what `cao status` shows


RECORDING = [c for c in MORE_CLIS if c.provider in ("qwen_code", "copilot", "kimi_cli", "opencode")]


@pytest.mark.parametrize("more", RECORDING, ids=[c.provider for c in RECORDING])
def test_tokens_of_the_other_cli_records_match_what_the_model_reported(
    more: CLI, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    server = make_server(more.provider)
    agent = launch(server, bed, more)
    bed.fake_clear()  # from here on, every request is this agent's
    sent = []
    for n in (1, 2):
        receipt = server.call(
            "POST",
            f"/terminals/{agent.id}/inbox/messages",
            json={
                "message": f"Do task {n} {token(f'task{n}')} [[reply:Task {n} done.]]",
                "sender_id": "operator",
                "kind": "task",
            },
        )
        sent.append(f"m{receipt['message_id']}")
        wait_for(
            lambda n=n: agent.last() == f"Task {n} done." and agent.status() == "completed", 90, f"task {n}"
        )

    def replies() -> list[dict[str, Any]]:  # the model turns (with tools), as the fake reported them
        return [r for r in bed.fake_requests() if r.get("kind") == "main" and r.get("usage")]

    seen: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []

    def settled() -> bool:  # one snapshot of both sides: the CLI may ask the model again after its turn
        u = server.call("GET", f"/terminals/{agent.id}/usage")
        r = replies()
        seen[:] = [(u, r)]
        return bool(u.get("known")) and u["responses"] == len(r) >= 2

    wait_for(settled, 30, "its CLI recorded every reply")
    u, answered = seen[0]
    total = {k: sum(r["usage"][k] for r in answered) for k in KINDS}
    assert counted(u) == total, (u, answered)
    by_task = {t["task_id"]: t for t in u["by_task"]}
    assert all(by_task.get(task, {}).get("responses", 0) >= 1 for task in sent), u["by_task"]
    assert u["by_model"][0]["model"] == "fake-model" and len(u["by_model"]) == 1  # the model named
