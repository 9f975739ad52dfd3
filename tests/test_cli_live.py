"""The CLI as a new user meets it: a real cao-server subprocess, the real `cao` command in another
process (environment from nothing but HOME/CAO_HOME/PATH), private tmux socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO, ServerProcess, wait_until, write_rules


def cao(
    srv: ServerProcess, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`cao ARGS` the way a person runs it: no CAO_SERVER_URL, no CAO_API_PORT, just CAO_HOME."""
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(srv.home.parent / "home"),
        "CAO_HOME": str(srv.home),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [sys.executable, "-m", "cao.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


def test_cao_finds_the_server_the_user_started_and_says_where_it_looked(make_server):
    srv: ServerProcess = make_server()  # on a random port, not 9889
    assert json.loads((srv.home / "server.json").read_text())["url"] == srv.url
    res = cao(srv, "status", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []
    srv.stop()
    assert not (srv.home / "server.json").exists()
    res = cao(srv, "status")
    assert res.returncode == 1
    assert "not reachable at http://127.0.0.1:9889" in res.stderr
    assert "no cao-server is running for" in res.stderr and "CAO_SERVER_URL" in res.stderr


def test_launch_without_a_terminal_says_how_to_attach_to_the_servers_tmux(make_server, tmp_path: Path):
    srv: ServerProcess = make_server()
    res = cao(
        srv, "launch", "-w", str(tmp_path), "--session-name", "nt", env={"CAO_TMUX_SOCKET": "not-the-servers"}
    )
    assert res.returncode == 0, res.stderr
    assert "not attaching" in res.stdout
    assert f"-L {srv.socket_name} attach-session -t =cao-nt" in res.stdout  # the server's socket
    with srv.client() as c:
        [t] = c.get("/terminals").json()
        wait_until(lambda: c.get(f"/terminals/{t['id']}").json()["status"] == "idle")  # still running


def test_a_starting_agent_reads_starting_not_processing(make_server):
    srv: ServerProcess = make_server()
    write_rules(srv.home, "sleepy", {"record": True, "startup_delay": 2.0})
    with srv.client() as c:
        t = c.post("/sessions", json={"agent_profile": "sleepy"}).json()
        assert t["status"] == "starting"
        wait_until(lambda: c.get(f"/terminals/{t['id']}").json()["status"] == "idle", timeout=15)
        c.post(f"/terminals/{t['id']}/input", json={"message": "hi"})
        wait_until(lambda: c.get(f"/terminals/{t['id']}").json()["status"] == "completed")


def test_unknown_session_is_404_and_full_output_has_no_trailing_blank_lines(make_server):
    srv: ServerProcess = make_server()
    with srv.client() as c:
        r = c.get("/sessions/nosuch/terminals")
        assert r.status_code == 404 and "not found" in r.json()["detail"]
        tid = c.post("/sessions", json={"session_name": "out"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle")
        out = c.get(f"/terminals/{tid}/output", params={"mode": "full"}).json()["output"]
        assert out.endswith("\n") and not out.endswith("\n\n") and "cao scripted agent" in out


def test_typed_exit_is_a_success_every_time(make_server):
    """The pane dies while the submit is being confirmed: the agent did take the input."""
    srv: ServerProcess = make_server()
    with srv.client() as c:
        ids = [c.post("/sessions", json={"session_name": f"x{i}"}).json()["id"] for i in range(6)]
        for tid in ids:
            wait_until(lambda t=tid: c.get(f"/terminals/{t}").json()["status"] == "idle")
        for tid in ids:
            r = c.post(f"/terminals/{tid}/input", json={"message": "/exit"})
            assert r.status_code == 200 and r.json()["confirmed"] is True, r.text
            wait_until(lambda t=tid: c.get(f"/terminals/{t}").json()["status"] == "gone")


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "piped"])
def test_cao_watch_follows_the_event_stream(make_server, as_json: bool):
    srv: ServerProcess = make_server()
    base = {"PATH": os.environ["PATH"], "HOME": str(srv.home.parent / "home"), "CAO_HOME": str(srv.home)}
    watch = subprocess.Popen(
        [sys.executable, "-m", "cao.cli", "watch", *(["--json"] if as_json else []), "--for", "8"],
        env=base,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        with srv.client() as c:
            wait_until(
                lambda: c.get("/info").json()["event_listeners"] >= 1, timeout=10, what="cao watch connected"
            )
            made = c.post("/sessions", json={"session_name": "w"})
            assert made.status_code == 201, made.text
            tid = made.json()["id"]
            wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle")
            mid = c.post(f"/terminals/{tid}/inbox/messages", json={"message": "token-watch"}).json()[
                "message_id"
            ]
            wait_until(lambda: c.get(f"/messages/{mid}").json()["status"] == "delivered")
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    if not as_json:  # no terminal: a plain line per event, then the tables once, each on its own lines
        lines = out.splitlines()
        assert any(line.endswith(f"terminal.created {tid}") for line in lines), out
        assert any(f"message.delivered #{mid} → {tid}" in line for line in lines), out
        assert all(line.lstrip().startswith("┏") for line in lines if "┏" in line), out
        assert "agents" in out and "latest messages" in out
        return
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    kinds = [(e["type"], e.get("terminal_id") or e.get("receiver_id")) for e in events]
    assert ("terminal.created", tid) in kinds and ("message.delivered", tid) in kinds, (kinds, err)
    delivered = [e for e in events if e["type"] == "message.delivered"]
    assert delivered[0]["message_ids"] == [mid] and delivered[0]["latency_ms"] >= 0


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "piped"])
def test_cao_watch_attention_shows_worker_events_only(make_server, as_json: bool):
    srv: ServerProcess = make_server()
    (srv.home / "scripted").mkdir(parents=True, exist_ok=True)
    (srv.home / "scripted" / "asker.json").write_text(
        json.dumps({"rules": [{"match": "^deploy$", "ask": "Allow tool deploy?", "reply": "deployed"}]})
    )
    base = {"PATH": os.environ["PATH"], "HOME": str(srv.home.parent / "home"), "CAO_HOME": str(srv.home)}
    args = ["watch", "--attention", *(["--json"] if as_json else []), "--for", "10"]
    watch = subprocess.Popen(
        [sys.executable, "-m", "cao.cli", *args], env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO,
    )  # fmt: skip
    try:
        with srv.client() as c:
            wait_until(lambda: c.get("/info").json()["event_listeners"] >= 1, timeout=10, what="connected")
            boss = c.post("/sessions", json={"session_name": "att"}).json()["id"]
            body = {"agent_profile": "asker", "supervisor_id": boss, "initial_message": "deploy"}
            worker = c.post("/sessions/att/terminals", json=body).json()["id"]
            wait_until(lambda: c.get("/notifications").json() != [], timeout=20, what="the blocked event")
        out, _ = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    if as_json:
        events = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert [(e["type"], e["event"], e["terminal_id"]) for e in events] == [
            ("notification", "blocked", worker)
        ]
        return
    lines = out.splitlines()
    assert any("notification" in line and worker in line for line in lines), out
    assert not any("message.delivered" in line for line in lines), out  # only what needs a person
    assert "needs a person now" in out and "latest worker events" in out


def test_cao_dashboard_prints_a_login_link_when_a_token_is_set(make_server):
    token = "d" * 32
    srv: ServerProcess = make_server(CAO_API_TOKEN=token)
    res = cao(srv, "dashboard")
    assert res.returncode == 0, res.stderr
    url = res.stdout.split("dashboard:")[1].strip()
    assert url.startswith(f"{srv.url}/login?code=") and token not in url  # the link is not the token
    r = httpx.get(url, follow_redirects=False)
    assert r.status_code == 303 and f"cao_token={token}" in r.headers["set-cookie"]
    again = httpx.get(url, follow_redirects=False)  # a link works once
    assert again.status_code == 401 and "cao dashboard" in again.json()["detail"]
    assert "set-cookie" not in again.headers
    # the token itself is no login link, and a code can't be had without the token
    assert httpx.get(f"{srv.url}/login?token={token}", follow_redirects=False).status_code == 401
    assert httpx.post(f"{srv.url}/login-codes").status_code == 401
    second = cao(srv, "dashboard").stdout.split("dashboard:")[1].strip()
    assert second != url and httpx.get(second, follow_redirects=False).status_code == 303
