"""Lifecycle hooks (cao/hookstate.py, cao/hook.py): what the CLIs report about their turns, next to the
screen. Real cao-server, real tmux, the scripted agent running the real hook program."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cao.hook import report
from cao.hookstate import HOOK_KEY_HEADER, Hooks, HookState, combine, hook_key, load_secret
from cao.paste import header
from cao.states import HookPhase
from providers.base import Reading, TerminalStatus
from tests.helpers import REPO, ServerProcess, free_port, read_records, wait_until, write_rules

TOKEN = "hook-test-token-0123456789abcdef"
S = TerminalStatus


# -- combining the screen and the hooks (the table in cao/hookstate.py) ----------------------------
def _state(phase: HookPhase, age: float, starts: bool = True, now: float = 1000.0) -> HookState:
    return HookState(phase=phase, event="Stop", at=now - age, starts=starts)


@pytest.mark.parametrize(
    ("screen", "phase", "age", "starts", "want"),
    [
        # a screen nothing matched: the hook decides
        (S.UNKNOWN, HookPhase.TURN_END, 60, True, S.COMPLETED),
        (S.UNKNOWN, HookPhase.TURN_END, 1, False, S.COMPLETED),  # notify only: a fresh turn end
        (S.UNKNOWN, HookPhase.TURN_END, 60, False, S.UNKNOWN),  # ... but not an old one
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
        (S.PROCESSING, HookPhase.SESSION_END, 60, True, S.UNKNOWN),
        # ... but its box is still up long after: a /clear whose session-start report got lost
        (S.IDLE, HookPhase.SESSION_END, 60, True, S.IDLE),
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


def test_evidence_is_a_messages_own_marker_from_any_event_of_that_terminal():
    hooks = Hooks(clock=lambda: 50.0)
    hooks.record("t1", HookPhase.TURN_START, "UserPromptSubmit", prompts=["second"])
    hooks.record("t1", None, "agent-turn-complete", prompts=["[cao message #1 from a] (ref 9)"])
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
    history = [{"role": "user", "content": "hi"}]  # Hermes sends the whole conversation: not kept
    hermes = report(
        "hermes",
        None,
        {
            "hook_event_name": "post_llm_call",
            "extra": {"user_message": "hi", "assistant_response": "hello", "conversation_history": history},
        },
    )
    assert hermes == {
        "source": "hermes",
        "event": "post_llm_call",
        "prompts": ["hi"],
        "last_message": "hello",
    }


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


def _key(srv: ServerProcess, tid: str) -> dict[str, str]:
    """The header only that terminal's hook program carries (cao passes the key at launch)."""
    return {HOOK_KEY_HEADER: hook_key(load_secret(srv.home), tid)}


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


SWEEPING = {"CAO_INBOX_RECONCILE_INTERVAL": "0.2", "CAO_INBOX_RECONCILE_GRACE_SECONDS": "0"}


def _after_two_sweeps(http: httpx.Client) -> None:
    """Every trigger has had its turn: the immediate attempt, the watchdog, and two sweeps since
    now (servers started with ``SWEEPING``), each of which kicks every receiver with mail waiting."""
    start = http.get("/info").json()["engine"]["sweeps"]
    wait_until(lambda: http.get("/info").json()["engine"]["sweeps"] >= start + 2, timeout=10, what="2 sweeps")


def _term(http: httpx.Client, tid: str) -> dict[str, Any]:
    return dict(http.get(f"/terminals/{tid}").json())


def test_a_screen_cao_cannot_read_gets_its_status_from_the_hooks_but_no_paste(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """A CLI release that redrew its prompt (``» `` instead of ``❯ ``): without hooks the status is
    unknown with the reason; with hooks it is the CLI's own (idle at its SessionStart, completed at
    its Stop). Mail still waits, saying why: the box can't be found, so a person's half-typed text
    in it could not be told apart and would be submitted with the message."""
    home = tmp_path / "cao"
    reply = {"reply": "ok: {first_line}", "delay": 0.3}
    write_rules(home, "hooked", {"hooks": True, "prompt_mark": "» ", "record": True, "default": reply})
    write_rules(home, "blind", {"prompt_mark": "» ", "record": True})
    _srv, http = _server(make_server, CAO_INPUT_WAIT_TIMEOUT="0.5", **SWEEPING)
    hooked = _launch(http, "hooked", "hooked", tmp_path)
    blind = _launch(http, "blind", "blind", tmp_path)

    wait_until(lambda: _term(http, blind)["status"] == "unknown", timeout=15, what="blind reads unknown")
    assert "no prompt" in _term(http, blind)["status_reason"]
    wait_until(lambda: _term(http, hooked)["status"] == "idle", timeout=15, what="idle by SessionStart")
    view = _term(http, hooked)
    assert view["hook"]["event"] == "SessionStart" and "screen not recognised" in view["status_reason"]

    tmux = ["tmux", "-L", _srv.socket_name]
    subprocess.run([*tmux, "send-keys", "-t", view["pane_id"], "-l", "rm -rf build"], check=True)
    sent = http.post(f"/terminals/{hooked}/inbox/messages", json={"sender_id": blind, "message": "task"})
    stuck = http.post(f"/terminals/{blind}/inbox/messages", json={"sender_id": hooked, "message": "too"})
    for r, words in ((sent, "input box not found"), (stuck, "status unknown")):
        mid = r.json()["message_id"]
        wait_until(
            lambda mid=mid, words=words: (
                words in (http.get(f"/messages/{mid}").json()["waiting_reason"] or "")
            ),
            timeout=10,
            what=f"message {mid} waiting: {words}",
        )
    _after_two_sweeps(http)  # still nothing pasted
    assert http.get(f"/messages/{sent.json()['message_id']}").json()["status"] == "pending"
    assert read_records(home, hooked) == [] and read_records(home, blind) == []

    # typed input is held to the same rule: the box can't be proven empty, so nothing is typed
    # (it used to be appended to the person's text and both submitted as one turn)
    typed = http.post(f"/terminals/{hooked}/input", json={"message": " now"})
    assert typed.status_code == 409 and "can't be proven empty" in typed.json()["detail"], typed.text
    assert read_records(home, hooked) == []
    # the person submits their own text: the CLI's Stop hook ends the turn
    subprocess.run([*tmux, "send-keys", "-t", view["pane_id"], "Enter"], check=True)
    wait_until(lambda: _term(http, hooked)["hook"]["event"] == "Stop", timeout=15, what="the turn's Stop")
    wait_until(lambda: _term(http, hooked)["status"] == "completed", timeout=15, what="completed by Stop")
    assert [r["text"] for r in read_records(home, hooked)] == ["rm -rf build"]


def test_a_busy_line_cao_cannot_read_is_busy_by_the_hooks_and_mail_waits_for_the_turn(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """A release with a new busy line: mid-turn the screen matches nothing. With hooks the turn's
    start says busy (the reason names the hook), the message waits and is delivered exactly once
    after the turn; without hooks the same screen reads unknown."""
    home = tmp_path / "cao"
    slow = {"reply": "ok: {first_line}", "delay": 3}
    write_rules(home, "hooked", {"hooks": True, "busy_text": "◐ working", "record": True, "default": slow})
    write_rules(home, "blind", {"busy_text": "◐ working", "default": slow})
    _srv, http = _server(make_server)
    hooked = _launch(http, "hooked", "hooked", tmp_path)
    blind = _launch(http, "blind", "blind", tmp_path)
    for tid in (hooked, blind):
        wait_until(lambda tid=tid: _term(http, tid)["status"] == "idle", timeout=15, what="idle")
        assert http.post(f"/terminals/{tid}/input", json={"message": "long task"}).status_code == 200

    wait_until(lambda: _term(http, blind)["status"] == "unknown", timeout=10, what="blind mid-turn: unknown")
    busy = _term(http, hooked)
    assert busy["status"] == "processing" and "UserPromptSubmit" in busy["status_reason"], busy
    r = http.post(f"/terminals/{hooked}/inbox/messages", json={"sender_id": blind, "message": "after it"})
    mid = r.json()["message_id"]
    assert http.get(f"/messages/{mid}").json()["status"] == "pending"
    wait_until(
        lambda: http.get(f"/messages/{mid}").json()["status"] == "delivered", timeout=20, what="delivered"
    )
    assert [m["body"] for rec in read_records(home, hooked) for m in rec["messages"]] == [
        "long task",
        "after it",
    ]
    assert not any(rec["arrived_busy"] for rec in read_records(home, hooked))  # never pasted mid-turn


def test_the_clis_latest_report_survives_a_server_restart(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """An idle CLI reports nothing more: after a restart cao must still know its turn ended."""
    home = tmp_path / "cao"
    write_rules(home, "hooked", {"hooks": True})
    srv, http = _server(make_server)
    tid = _launch(http, "keep", "hooked", tmp_path)
    assert http.post(f"/terminals/{tid}/input", json={"message": "one turn"}).status_code == 200
    wait_until(lambda: (_term(http, tid)["hook"] or {}).get("event") == "Stop", timeout=15, what="Stop")
    before = _term(http, tid)["hook"]
    srv.stop()
    _srv2, http2 = _server(make_server)
    after = _term(http2, tid)
    assert after["state"] == "live"
    assert {k: after["hook"][k] for k in ("event", "phase", "at")} == {
        k: before[k] for k in ("event", "phase", "at")
    }


def test_a_screen_that_stays_busy_after_the_cli_said_done_reads_unknown_with_both_sides(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """The CLI's Stop hook says the turn ended, no turn started since, and the screen still shows
    the spinner past the settle time: the two disagree, and the operator sees both, not a guess."""
    home = tmp_path / "cao"
    write_rules(home, "slow", {"hooks": True, "default": {"reply": "done", "delay": 60}})
    srv, http = _server(make_server, CAO_HOOK_SETTLE="0.5")
    tid = _launch(http, "slow", "slow", tmp_path)
    wait_until(lambda: _term(http, tid)["status"] == "idle", timeout=15, what="idle")
    assert http.post(f"/terminals/{tid}/input", json={"message": "think for a minute"}).status_code == 200
    wait_until(lambda: _term(http, tid)["status"] == "processing", timeout=10, what="busy")
    stop = {"event": "Stop"}
    posted = http.post(f"/terminals/{tid}/hooks", json=stop, headers=_key(srv, tid))
    assert posted.json() == {"success": True, "phase": "turn_end"}
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
        ({"event": "Stop", "prompts": "not a list"}, "prompts"),
        ({"event": "Stop", "prompts": ["x"] * 17}, "prompts"),
        ({"event": "Stop", "last_message": 7}, "last_message"),
        ({"event": "Stop", "prompts": ["a\x00b"]}, "NUL"),
        (b'{"event": "Stop", "last_message": "lone \\ud800 surrogate"}', "surrogate"),
        ({"event": "Stop", "last_message": "x" * 65_537}, "at most 65536"),
    ]:
        if isinstance(body, bytes):  # JSON that only decodes to a lone surrogate (httpx can't encode one)
            r = http.post(url, content=body, headers={"Content-Type": "application/json"})
        else:
            r = http.post(url, json=body)
        assert r.status_code == 422 and words in r.json()["detail"], (body, r.text)
    assert http.post("/terminals/0badf00d/hooks", json={"event": "Stop"}).status_code == 404
    assert _term(http, tid)["hook"] is None  # nothing half-recorded
    ok = http.post(
        url, json={"event": "Unheard-of", "sent_at": 10**400, "extra": [1]}, headers=_key(srv, tid)
    )
    assert ok.json() == {"success": True, "phase": None}  # an event cao doesn't use: accepted, ignored


def test_a_holder_of_the_token_cannot_report_hooks_for_another_terminal(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """Each terminal's hook program has its own key: a forged turn start every few seconds used to
    hold an idle agent at processing for good (and showed a reason nobody gave)."""
    srv, http = _server(make_server)
    tid = _launch(http, "forge", "developer", tmp_path)
    other = _launch(http, "forge2", "developer", tmp_path)
    wait_until(lambda: _term(http, tid)["status"] == "idle", timeout=15, what="idle")
    url = f"/terminals/{tid}/hooks"
    start = {"event": "UserPromptSubmit", "prompts": ["pretend"]}
    for headers in ({}, _key(srv, other), {HOOK_KEY_HEADER: "0" * 32}, {HOOK_KEY_HEADER: b"\xe9" * 10}):
        r = http.post(url, json=start, headers=headers)
        assert r.status_code == 403 and "own hook key" in r.json()["detail"], (headers, r.text)
    assert _term(http, tid)["hook"] is None and _term(http, tid)["status"] == "idle"
    assert http.post(url, json=start, headers=_key(srv, tid)).json()["phase"] == "turn_start"


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
    done = _hook(srv.url, tid, srv.home, "--key", *_key(srv, tid).values(), "claude", stdin=payload)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
    hook = _term(http, tid)["hook"]
    assert hook["event"] == "Notification" and hook["phase"] == "asking"
    assert hook["detail"] == "Claude needs your permission to use Bash"


def test_only_the_message_markers_of_a_prompt_are_kept_and_forgotten_with_the_terminal():
    """Evidence is the header/trailer lines, nothing else of what the agent was told; bounded."""
    hooks = Hooks(clock=lambda: 1.0)
    big = "x" * 1_000_000 + "\n[cao message #3 from a] (ref 0f)\nbody\n[end of cao message #3] (ref 0f)"
    for n in range(2000):
        hooks.record(
            "t1",
            HookPhase.TURN_START,
            "UserPromptSubmit",
            prompts=[f"[cao message #{n} from a] (ref 1)"],
        )
    hooks.record("t1", HookPhase.TURN_START, "UserPromptSubmit", prompts=[big])
    assert hooks.saw("t1", "[cao message #3 from a] (ref 0f)")
    assert hooks.saw("t1", "[end of cao message #3] (ref 0f)")
    assert not hooks.saw("t1", "[cao message #0 from a] (ref 1)")  # the oldest fell out
    assert hooks.saw("t1", "[cao message #1999 from a] (ref 1)")
    assert len(hooks._states["t1"].markers) <= 1024
    hooks.forget("t1")
    assert hooks.state("t1") is None and not hooks.saw("t1", "[cao message #1999 from a] (ref 1)")


def test_a_cli_that_never_closes_the_hooks_stdin_is_not_held_up(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """The event's name comes with the command line, so it is reported even without the payload."""
    srv, http = _server(make_server)
    tid = _launch(http, "open", "developer", tmp_path)
    where = [
        "--terminal",
        tid,
        "--server",
        srv.url,
        "--home",
        str(srv.home),
        "--key",
        *_key(srv, tid).values(),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cao.hook", *where, "claude", "Stop"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        proc.wait(timeout=15)  # its stdin stays open all along
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the hook program waited for a stdin that never closed") from None
    finally:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            assert pipe is not None
        out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            pipe.close()  # type: ignore[union-attr]
    assert proc.returncode == 0 and out == b"", err
    assert _term(http, tid)["hook"]["event"] == "Stop"


def test_eager_delivery_never_pastes_into_a_screen_it_cannot_read_on_a_turn_start(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    """An agent that queues mid-turn input, eager delivery on, a question drawn in a form its
    provider doesn't know, and the CLI's turn-start report: 'processing' by the hook must not open
    the eager gate: Enter would answer the question."""
    home = tmp_path / "cao"
    ask = {"match": "deploy", "ask": "Allow deploy?\r\nEnter to confirm"}  # the last line: no "(y/n)"
    write_rules(home, "asker", {"record": True, "rules": [ask]})
    _srv, http = _server(make_server, CAO_EAGER_INBOX_DELIVERY="true", **SWEEPING)
    r = http.post(
        "/sessions", json={"provider": "scripted_eager", "session_name": "ask", "agent_profile": "asker"}
    )
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    wait_until(lambda: _term(http, tid)["status"] == "idle", timeout=15, what="idle")
    assert http.post(f"/terminals/{tid}/input", json={"message": "deploy now"}).status_code == 200
    wait_until(lambda: _term(http, tid)["status"] == "unknown", timeout=10, what="an unknown question")
    report = http.post(
        f"/terminals/{tid}/hooks",
        json={"event": "UserPromptSubmit", "prompts": ["deploy now"]},
        headers=_key(_srv, tid),
    )
    assert report.json()["phase"] == "turn_start" and _term(http, tid)["status"] == "processing"
    mid = http.post(
        f"/terminals/{tid}/inbox/messages", json={"sender_id": "boss", "message": "hello"}
    ).json()["message_id"]
    wait_until(
        lambda: "input box not found" in (http.get(f"/messages/{mid}").json()["waiting_reason"] or ""),
        timeout=10,
        what="the message waiting for a box it can see",
    )
    _after_two_sweeps(http)
    assert http.get(f"/messages/{mid}").json()["status"] == "pending"
    assert [rec["text"] for rec in read_records(home, tid)] == ["deploy now"]  # nothing typed since


def test_an_unsubmitted_paste_in_a_box_cao_cannot_read_is_no_evidence(core, settings, tmp_path: Path):
    """Recovery and re-checks look for a message's own header in the pane's history. On a screen
    its provider can't read, the box can't be told from the history: cao's own paste still sitting
    in it must not count as arrived; the CLI's hook report of the submitted prompt does."""
    write_rules(settings.home, "blind", {"prompt_mark": "» "})
    term = core.create_terminal(agent_profile="blind", working_directory=str(tmp_path))
    tid = str(term["id"])
    message = core.send_message(tid, "hello", sender_id="boss").message
    pane = core.terminal_row(tid)
    wait_until(lambda: "»" in core.panes.screen(pane), what="the redrawn prompt")
    subprocess.run(
        ["tmux", "-L", settings.tmux_socket, "send-keys", "-t", str(pane.pane_id), "-l", header(message)],
        check=True,
    )
    wait_until(lambda: header(message) in core.panes.screen(pane), what="the header in the box")
    provider = core.panes.provider(pane)
    assert core.delivery._seen(pane, provider, [message]) == []
    core.status.hooks.record(
        tid, HookPhase.TURN_START, "UserPromptSubmit", prompts=[header(message) + "\nhello"]
    )
    assert core.delivery._seen(pane, provider, [message]) == [message]


@pytest.mark.parametrize("answer", ["garbage", "trickle"])
def test_the_hook_program_survives_a_server_that_answers_badly(answer: str, tmp_path: Path):
    """Something else on the port (garbage instead of HTTP), or a server that trickles bytes: the
    hook still exits 0, prints nothing on stdout, and gives up within its time limit."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if answer == "garbage":
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            while not stop.wait(0.5):  # a byte now and then: no single read ever times out
                with contextlib.suppress(OSError):
                    conn.sendall(b"x")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        done = _hook(url, "abcd1234", tmp_path, "claude", "Stop", stdin="{}")
    finally:
        stop.set()
        listener.close()
    assert done.returncode == 0 and done.stdout == "", done
    assert "cao hook:" in done.stderr


def test_the_last_answer_comes_from_the_hook_when_the_screen_shows_none(core, tmp_path: Path):
    """docs/providers.md: ``output?mode=last`` falls back to the answer the CLI's turn-end report
    carried when the screen gives none; a turn start clears it (it belonged to the turn before)."""
    term = core.create_terminal(working_directory=str(tmp_path))
    tid = str(term["id"])
    pane = core.terminal_row(tid)
    wait_until(lambda: core.status.status(pane) == "idle", what="idle, no answer on screen")
    assert core.status.output(pane, "last") == ""
    core.status.hooks.record(tid, HookPhase.TURN_END, "Stop", last_message="the answer, as reported")
    assert core.status.output(pane, "last") == "the answer, as reported"
    core.status.hooks.record(tid, HookPhase.TURN_START, "UserPromptSubmit")
    assert core.status.output(pane, "last") == ""
