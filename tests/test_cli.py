"""The CLI through click's runner, against the real API in-process (real tmux, real SQLite)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import cao
from cao.api import create_app
from cao.cli import cli
from cao.client import Client
from cao.core import Cao
from tests.helpers import wait_until


@pytest.fixture
def run(core: Cao):
    with TestClient(create_app(core)) as http:
        client = Client("http://testserver", http=http)

        def invoke(*args: str):
            return CliRunner().invoke(cli, list(args), obj={"client": client})

        yield invoke


def test_help_version_and_examples():
    runner = CliRunner()
    assert runner.invoke(cli, ["--version"]).output.strip() == f"cao, version {cao.__version__}"
    top = runner.invoke(cli, ["-h"])
    assert top.exit_code == 0
    for name in cli.commands:
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, name
        assert "Example" in res.output, f"`cao {name} --help` has no example"
        assert name in top.output
    assert runner.invoke(cli, ["nosuch"]).exit_code == 2
    assert runner.invoke(cli, ["send"]).exit_code == 2


def test_status_json_is_stable_and_empty_list(run):
    res = run("status", "--json")
    assert res.exit_code == 0 and json.loads(res.output) == []
    assert run("inbox", "--json").output.strip() == "[]"


def test_launch_send_inbox_message_flow(run, core: Cao, tmp_path: Path):
    res = run("launch", "--headless", "--session-name", "c1", "-w", str(tmp_path), "--json")
    assert res.exit_code == 0, res.output
    term = json.loads(res.output)
    tid = term["id"]
    wait_until(lambda: json.loads(run("status", "--json").output)[0]["status"] == "idle")
    rows = json.loads(run("status", "--json").output)
    assert {"id", "name", "provider", "session_name", "agent_profile", "status", "last_active"} <= set(
        rows[0]
    )
    table = run("status").output  # the rich table, 80 columns wide here (no terminal)
    assert "c1" in table
    assert max(len(line) for line in table.splitlines()) <= 80
    assert re.search(r"│ \d+(ms|s|m|h) ago +│", table), table  # the last-active age, never cut
    receipt = json.loads(run("send", tid, "hello via inbox", "--from", "cli", "--key", "k1", "--json").output)
    assert receipt["duplicate"] is False
    again = run("send", tid, "hello via inbox", "--key", "k1")
    assert again.exit_code == 0 and "duplicate" in again.output
    wait_until(
        lambda: (
            json.loads(run("message", str(receipt["message_id"]), "--json").output)["status"] == "delivered"
        )
    )
    lifecycle = json.loads(run("message", str(receipt["message_id"]), "--json").output)
    shown = run("message", str(receipt["message_id"]))  # the table for people
    assert shown.exit_code == 0, shown.output
    assert re.search(r"delivered_at +│ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(", shown.output), shown.output
    assert lifecycle["attempts"] == 1 and lifecycle["delivered_at"] >= lifecycle["created_at"]
    inbox = json.loads(run("inbox", tid, "--json").output)
    assert [m["message"] for m in inbox] == ["hello via inbox"]
    assert "delivered" in run("inbox", tid).output
    wait_until(lambda: run("output", tid, "--mode", "last").output.strip() == "ok: hello via inbox")
    out = json.loads(run("output", tid, "--json").output)
    assert out["mode"] == "full" and "[cao message #" in out["output"]
    assert run("send-input", tid, "typed").exit_code == 0
    wait_until(lambda: run("output", tid, "--mode", "last").output.strip() == "ok: typed")
    info = json.loads(run("info", "--json").output)
    assert info["messages"]["delivered"] == 1 and info["tmux_socket"] == core.settings.tmux_socket
    down = json.loads(run("shutdown", "--session", "c1", "--json").output)
    assert down == {"c1": [tid]}
    assert json.loads(run("status", "--json").output) == []


def test_errors_exit_1_with_the_servers_words(run):
    res = run("send", "abcdef12", "hi")
    assert res.exit_code == 1 and "not found" in res.output and "HTTP 404" in res.output
    res = run("message", "nope")
    assert res.exit_code == 1 and "positive integers" in res.output
    res = run("shutdown")
    assert res.exit_code == 2 and "exactly one of" in res.output
    res = run("launch", "--headless", "--provider", "nope")
    assert res.exit_code == 1 and "choose one of" in res.output


def test_cancel_pending_message(run, core: Cao):
    from tests.helpers import write_rules

    write_rules(core.settings.home, "slow", {"rules": [{"match": "^work", "delay": 5, "reply": "w"}]})
    tid = json.loads(run("launch", "--headless", "--agents", "slow", "--json").output)["id"]
    wait_until(lambda: json.loads(run("status", "--json").output)[0]["status"] == "idle")
    run("send-input", tid, "work")
    wait_until(lambda: json.loads(run("status", "--json").output)[0]["status"] == "processing")
    mid = json.loads(run("send", tid, "never mind", "--json").output)["message_id"]
    res = run("cancel", str(mid))
    assert res.exit_code == 0 and "cancelled" in res.output
    assert run("cancel", str(mid)).exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["send", "1a2b3c4d", "hi", "--ttl", "nan"],
        ["send", "1a2b3c4d", "hi", "--ttl", "inf"],
        ["send", "1a2b3c4d", "hi", "--ttl", "-5"],
        ["inbox", "defer", "42", "--for", "nan"],
        ["inbox", "defer", "42", "--for", "-inf"],
        ["inbox", "defer", "42", "--for", "0"],
        ["inbox", "defer", "42"],
        ["inbox", "defer", "42", "--for", "10", "--until", "2026-12-02T09:00:00Z"],
    ],
)
def test_a_duration_that_is_no_number_of_seconds_is_a_usage_error_naming_the_option(args: list[str]):
    """NaN or infinity crashed the CLI with a traceback (the JSON encoder refused them); a defer
    without --for/--until was told about the API's `until`/`seconds`. Each is a usage error (exit 2)
    naming the option, before anything is sent."""
    res = CliRunner().invoke(cli, args, obj={"client": None})
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "--ttl" in res.output or "--for" in res.output
