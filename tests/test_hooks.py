"""Lifecycle hooks (cao/hooks.py, cao/hook.py): what the CLIs report about their turns, next to the
screen. Real cao-server, real tmux, the scripted agent running the real hook program."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cao.hook import report
from cao.hooks import Hooks, HookState, combine
from cao.states import HookPhase
from providers.base import Reading, TerminalStatus
from tests.conftest import REPO, ServerProcess, free_port, read_records, wait_until, write_rules

TOKEN = "hook-test-token-0123456789abcdef"
S = TerminalStatus


# -- combining the screen and the hooks (the table in cao/hooks.py) ----------------------------
def _state(phase: HookPhase, age: float, starts: bool = True, now: float = 1000.0) -> HookState:
    return HookState(phase=phase, event="Stop", at=now - age, sent_at=now - age, starts=starts)


@pytest.mark.parametrize(
    ("screen", "phase", "age", "starts", "want"),
    [
        # a screen nothing matched: the hook decides
        (S.UNKNOWN, HookPhase.TURN_END, 60, True, S.COMPLETED),
        (S.UNKNOWN, HookPhase.TURN_START, 60, True, S.PROCESSING),
        (S.UNKNOWN, HookPhase.ASKING, 1, True, S.WAITING_USER_ANSWER),
        (S.UNKNOWN, HookPhase.SESSION_START, 1, True, S.IDLE),
        # a menu on screen always wins
        (S.WAITING_USER_ANSWER, HookPhase.TURN_END, 60, True, S.WAITING_USER_ANSWER),
        # busy screen, ended turn: fine while fresh, a disagreement once stale (if starts are reported)
        (S.PROCESSING, HookPhase.TURN_END, 1, True, S.PROCESSING),
        (S.PROCESSING, HookPhase.TURN_END, 60, True, S.UNKNOWN),
        (S.PROCESSING, HookPhase.TURN_END, 60, False, S.PROCESSING),  # Codex: a queued turn may run
        # ready screen, started turn: busy while the screen catches up, the screen's after that
        (S.COMPLETED, HookPhase.TURN_START, 1, True, S.PROCESSING),
        (S.IDLE, HookPhase.TURN_START, 60, True, S.IDLE),
        (S.COMPLETED, HookPhase.TURN_END, 60, True, S.COMPLETED),
        (S.ERROR, HookPhase.ASKING, 60, True, S.ERROR),
        # the CLI said its session ended
        (S.IDLE, HookPhase.SESSION_END, 1, True, S.UNKNOWN),
    ],
)
def test_screen_and_hooks_combine_as_documented(
    screen: TerminalStatus, phase: HookPhase, age: float, starts: bool, want: TerminalStatus
):
    reading, by_hooks = combine(
        Reading(screen, "what the screen showed"),
        _state(phase, age, starts),
        1000.0,
        settle=5.0,
    )
    assert reading.status == want
    if want != screen:
        assert by_hooks and reading.reason  # the operator is told why
    if want == S.UNKNOWN:
        assert "hook" in reading.reason


def test_an_exited_cli_stays_exited_whatever_its_hooks_said():
    exited = Reading(S.UNKNOWN, "the CLI has exited", final=True)
    reading, by_hooks = combine(exited, _state(HookPhase.TURN_END, 1), 1000.0, settle=5)
    assert reading == exited and not by_hooks


def test_a_late_event_does_not_undo_a_newer_one_but_its_prompt_still_counts():
    hooks = Hooks(clock=lambda: 50.0)
    assert hooks.record("t1", HookPhase.TURN_START, "UserPromptSubmit", sent_at=20.0, prompts=["second"])
    assert not hooks.record(
        "t1", HookPhase.TURN_END, "Stop", sent_at=10.0, prompts=["[cao message #1 from a] (ref 9)"]
    )
    state = hooks.state("t1")
    assert state is not None and state.phase == HookPhase.TURN_START and state.count == 2
    assert hooks.saw("t1", "[cao message #1 from a] (ref 9)")
    assert not hooks.saw("t1", "[cao message #1 from a] (ref 8)")  # another message's nonce
    assert not hooks.saw("t2", "[cao message #1 from a] (ref 9)")  # another terminal


def test_a_header_quoted_mid_line_is_no_evidence():
    hooks = Hooks(clock=lambda: 1.0)
    hooks.record(
        "t1",
        HookPhase.TURN_START,
        "UserPromptSubmit",
        sent_at=1.0,
        prompts=["see [cao message #4 from a] (ref 77)"],
    )
    assert not hooks.saw("t1", "[cao message #4 from a] (ref 77)")


# -- the hook program ----------------------------------------------------------------------------
def test_the_hook_program_keeps_only_what_cao_uses_from_each_cli():
    claude = report("claude", None, {"hook_event_name": "UserPromptSubmit", "prompt": "hi", "cwd": "/x"})
    assert claude["event"] == "UserPromptSubmit" and claude["prompts"] == ["hi"] and "cwd" not in claude
    codex = report(
        "codex",
        None,
        {"type": "agent-turn-complete", "input-messages": ["a", "b"], "last-assistant-message": "done"},
    )
    assert codex["event"] == "agent-turn-complete" and codex["prompts"] == ["a", "b"]
    assert codex["last_message"] == "done"
    gemini = report("gemini", None, {"hook_event_name": "AfterAgent", "prompt_response": "answer"})
    assert gemini["last_message"] == "answer"


def _hook(
    server: str, terminal: str, home: Path, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cao.hook",
            "--terminal",
            terminal,
            "--server",
            server,
            "--home",
            str(home),
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=20,
    )


def test_the_hook_program_never_fails_the_clis_turn(tmp_path: Path):
    """Nothing listens: exit 0, nothing on stdout (Claude would add it to the prompt), one line why."""
    done = _hook(
        f"http://127.0.0.1:{free_port()}", "abcd1234", tmp_path, "claude", stdin='{"hook_event_name": "Stop"}'
    )
    assert done.returncode == 0 and done.stdout == ""
    assert "could not report" in done.stderr
    bad = _hook("http://127.0.0.1:9", "abcd1234", tmp_path, "nonsense")  # wrong usage: still 0
    assert bad.returncode == 0 and bad.stdout == ""


# -- through a real cao-server -----------------------------------------------------------------
def _server(make_server: Callable[..., ServerProcess], **env: str) -> tuple[ServerProcess, httpx.Client]:
    srv = make_server(CAO_API_TOKEN=TOKEN, **env)
    http = httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    _clients.append(http)
    return srv, http


_clients: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def _launch(http: httpx.Client, name: str, profile: str, cwd: Path) -> str:
    r = http.post(
        "/sessions",
        json={
            "provider": "scripted",
            "session_name": name,
            "agent_profile": profile,
            "working_directory": str(cwd),
        },
    )
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _term(http: httpx.Client, tid: str) -> dict[str, Any]:
    return dict(http.get(f"/terminals/{tid}").json())


def test_an_agent_whose_screen_cao_cannot_read_is_driven_by_its_hooks(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """A CLI release that redrew its prompt (``» `` instead of ``❯ ``): without hooks the status is
    unknown with the reason, and mail waits; with hooks cao goes by the CLI's own reports, delivers
    each message exactly once (the submit proven by the prompt hook carrying the message's own
    header, since the screen proves nothing) and shows where the status came from."""
    home = tmp_path / "cao"
    reply = {"reply": "ok: {first_line}", "delay": 0.3}
    write_rules(home, "hooked", {"hooks": True, "prompt_mark": "» ", "record": True, "default": reply})
    write_rules(home, "blind", {"prompt_mark": "» ", "record": True})
    _srv, http = _server(make_server)
    hooked = _launch(http, "hooked", "hooked", tmp_path)
    blind = _launch(http, "blind", "blind", tmp_path)

    wait_until(lambda: _term(http, blind)["status"] == "unknown", timeout=15, what="blind reads unknown")
    assert "no prompt" in _term(http, blind)["status_reason"]
    wait_until(
        lambda: _term(http, hooked)["status"] == "idle", timeout=15, what="hooked idle by SessionStart"
    )
    view = _term(http, hooked)
    assert view["hook"]["event"] == "SessionStart" and "screen not recognised" in view["status_reason"]

    ids = []
    for i in range(3):
        r = http.post(
            f"/terminals/{hooked}/inbox/messages", json={"sender_id": blind, "message": f"task {i}"}
        )
        assert r.status_code == 201, r.text
        ids.append(r.json()["message_id"])
    stuck = http.post(
        f"/terminals/{blind}/inbox/messages", json={"sender_id": hooked, "message": "never pasted"}
    )
    stuck_id = stuck.json()["message_id"]

    def delivered() -> bool:
        return all(http.get(f"/messages/{i}").json()["status"] == "delivered" for i in ids)

    try:
        wait_until(delivered, timeout=30, what="all three delivered")
    except AssertionError:
        print("VIEW", _term(http, hooked), http.get("/info").json())
        raise
    for i in ids:
        msg = http.get(f"/messages/{i}").json()
        assert msg["attempts"] == 1 and msg["last_error"] is None, msg  # confirmed first time: by the hook
    bodies = [m["body"] for rec in read_records(home, hooked) for m in rec["messages"]]
    assert sorted(bodies) == ["task 0", "task 1", "task 2"]  # each exactly once
    wait_until(
        lambda: _term(http, hooked)["hook"]["event"] == "Stop", timeout=15, what="the last turn's Stop"
    )
    wait_until(lambda: _term(http, hooked)["status"] == "completed", timeout=15, what="completed by Stop")

    msg = http.get(f"/messages/{stuck_id}").json()
    assert msg["status"] == "pending" and "unknown" in (msg["waiting_reason"] or ""), msg
    assert read_records(home, blind) == []


def test_a_screen_that_stays_busy_after_the_cli_said_done_reads_unknown_with_both_sides(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """The CLI's Stop hook says the turn ended, no turn started since, and the screen still shows
    the spinner past the settle time: the two disagree, and the operator sees both, not a guess."""
    home = tmp_path / "cao"
    write_rules(home, "slow", {"hooks": True, "default": {"reply": "done", "delay": 60}})
    _srv, http = _server(make_server, CAO_HOOK_SETTLE="0.5")
    tid = _launch(http, "slow", "slow", tmp_path)
    wait_until(lambda: _term(http, tid)["status"] == "idle", timeout=15, what="idle")
    assert http.post(f"/terminals/{tid}/input", json={"message": "think for a minute"}).status_code == 200
    wait_until(lambda: _term(http, tid)["status"] == "processing", timeout=10, what="busy")
    stop = {"event": "Stop", "sent_at": time.time()}
    assert http.post(f"/terminals/{tid}/hooks", json=stop).json() == {"success": True, "phase": "turn_end"}
    wait_until(lambda: _term(http, tid)["status"] == "unknown", timeout=10, what="disagreement")
    reason = _term(http, tid)["status_reason"]
    assert "processing" in reason and "Stop hook" in reason, reason


def test_the_hooks_route_checks_what_it_is_given(make_server: Callable[..., ServerProcess], tmp_path: Path):
    srv, http = _server(make_server)
    tid = _launch(http, "route", "developer", tmp_path)
    url = f"/terminals/{tid}/hooks"
    assert httpx.post(srv.url + url, json={"event": "Stop"}).status_code == 401  # no token
    page = http.post(url, json={"event": "Stop"}, headers={"Origin": "https://evil.example"})
    assert page.status_code == 403
    for body, words in [
        ({}, "event"),
        ({"event": ""}, "event"),
        ({"event": "Stop", "sent_at": "yesterday"}, "sent_at"),
        ({"event": "Stop", "prompts": "not a list"}, "prompts"),
        ({"event": "Stop", "prompts": ["x"] * 17}, "prompts"),
        ({"event": "Stop", "last_message": 7}, "last_message"),
        ({"event": "Stop", "prompts": ["a\x00b"]}, "NUL"),
    ]:
        r = http.post(url, json=body)
        assert r.status_code == 422 and words in r.json()["detail"], (body, r.text)
    assert http.post("/terminals/0badf00d/hooks", json={"event": "Stop"}).status_code == 404
    assert _term(http, tid)["hook"] is None  # nothing half-recorded
    ok = http.post(url, json={"event": "Unheard-of", "sent_at": time.time()})
    assert ok.json() == {"success": True, "phase": None}  # an event cao doesn't use: accepted, ignored


def test_the_hook_program_reports_through_the_token_file(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """The hook finds the server's token in CAO_HOME (the agents' environment carries no token)."""
    srv, http = _server(make_server)
    tid = _launch(http, "tok", "developer", tmp_path)
    payload = json.dumps(
        {
            "hook_event_name": "Notification",
            "notification_type": "permission_prompt",
            "message": "Claude needs your permission to use Bash",
        }
    )
    done = _hook(srv.url, tid, srv.home, "claude", stdin=payload)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
    hook = _term(http, tid)["hook"]
    assert hook["event"] == "Notification" and hook["phase"] == "asking"
    assert hook["detail"] == "Claude needs your permission to use Bash"
