"""Tokens, cost and budgets on a real cao-server with scripted agents in a private tmux server:
the counts are what the agent recorded for each response, per task; a budget reached holds the
next task with the reason (a chat sent after it still arrives, so the hold is attributable), the
agent keeps running; `cao status` and `cao usage` show it; a broken budgets file stops cao-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import ServerProcess, read_records, wait_until, write_rules

SPEND = {"model": "claude-haiku-4-5", "input_tokens": 2000, "output_tokens": 500, "cache_write_tokens": 100}
PER = 2000 + 500 + 100


def recorded(home: Path, tid: str) -> list[dict[str, Any]]:
    """The agent's own usage records (the JSON lines its "usage" rule wrote)."""
    path = home / "terminals" / tid / "scripted-usage.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_usage_per_task_and_a_budget_that_holds_the_next_task(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    home = tmp_path / "cao"
    write_rules(
        home, "spender", {"record": True, "rules": [{"match": "^task", "reply": "done", "usage": SPEND}]}
    )
    (home / "budgets.toml").write_text("[profile.spender]\ntokens = 5000\n")
    srv = make_server(home)
    env = {**os.environ, "CAO_HOME": str(home), "CAO_SERVER_URL": srv.url}

    def cao(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "cao", *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    with srv.client() as http:
        tid = http.post("/sessions", json={"session_name": "spend", "agent_profile": "spender"}).json()["id"]
        wait_until(lambda: http.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        assert http.get(f"/terminals/{tid}/usage").json()["known"] is False  # nothing spent yet
        ids = []
        for n in (1, 2):
            r = http.post(
                f"/terminals/{tid}/inbox/messages",
                json={"message": f"task {n}", "sender_id": "operator", "kind": "task"},
            )
            ids.append(r.json()["message_id"])
            wait_until(lambda n=n: len(recorded(home, tid)) == n, timeout=20, what=f"response {n}")
            # its CLI may answer before the paste is confirmed; the task's window (from its claim)
            # is written with the confirmation, so a read between the two counts it to the task before
            wait_until(
                lambda i=ids[-1]: http.get(f"/messages/{i}").json()["status"] == "delivered",
                timeout=20,
                what=f"task {n} delivered",
            )
        u = http.get(f"/terminals/{tid}/usage").json()
        mine = recorded(home, tid)
        assert u["known"] and u["responses"] == 2 == len(mine)
        assert u["input_tokens"] == sum(r["input_tokens"] for r in mine) == 4000
        assert u["tokens"] == 2 * PER
        assert {t["task_id"]: t["tokens"] for t in u["by_task"]} == {f"m{ids[0]}": PER, f"m{ids[1]}": PER}
        assert u["cost_usd"] == round(2 * (2000 * 1.0 + 500 * 5.0 + 100 * 1.25) / 1e6, 6)
        # 5,200 of 5,000 tokens: the next task waits, with the reason; other mail goes
        held = http.post(
            f"/terminals/{tid}/inbox/messages",
            json={"message": "task 3", "sender_id": "operator", "kind": "task"},
        ).json()["message_id"]
        chat = http.post(
            f"/terminals/{tid}/inbox/messages", json={"message": "a note after it", "sender_id": "operator"}
        ).json()["message_id"]
        wait_until(
            lambda: http.get(f"/messages/{chat}").json()["status"] == "delivered", timeout=20, what="chat"
        )
        bodies = [m["body"] for r in read_records(home, tid) for m in r["messages"]]
        assert "a note after it" in bodies and "task 3" not in bodies
        m = http.get(f"/messages/{held}").json()
        assert m["status"] == "pending"
        assert (
            "profile spender budget" in m["waiting_reason"] and "5,200 of 5,000 tokens" in m["waiting_reason"]
        )
        assert http.get(f"/terminals/{tid}").json()["usage"]["budget_hold"] == m["waiting_reason"]
        assert http.get(f"/terminals/{tid}").json()["state"] == "live"  # never killed
        status = cao("status")
        assert "5,200 · $0.01" in status and "budget reached" in status
        overview = cao("usage")
        assert "total: 5,200 tokens" in overview and "reached" in overview
        assert "per task" in cao("usage", tid)
        # raised: read again on the next look, the task goes
        (home / "budgets.toml").write_text("[profile.spender]\ntokens = 50000\n")
        http.get(f"/terminals/{tid}/usage")
        wait_until(
            lambda: http.get(f"/messages/{held}").json()["status"] == "delivered", timeout=20, what="held"
        )


def test_a_broken_budgets_file_stops_the_server_at_start(tmp_path: Path, clean_env: dict[str, str]) -> None:
    home = tmp_path / "cao"
    home.mkdir()
    (home / "budgets.toml").write_text("[profile.dev]\nusd = 'five'\n")
    env = {**clean_env, "CAO_HOME": str(home), "CAO_API_PORT": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert f"{home}/budgets.toml: profile.dev.usd must be a number" in out.stderr
