"""A real cao-server process: launch, status, input/output, restart adoption, shutdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cao.tmux import Tmux
from tests.helpers import REPO, ServerProcess, pid_alive, server_env, wait_until


def _status(client, tid: str) -> str:
    return client.get(f"/terminals/{tid}").json()["status"]


@pytest.mark.sqlite_only("reads the rows from cao.db")
def test_server_end_to_end_and_restart_adoption(make_server, tmp_path: Path, tmux_socket: str):
    srv: ServerProcess = make_server()
    with srv.client() as c:
        a = c.post("/sessions", params={"session_name": "one", "working_directory": str(tmp_path)}).json()
        b = c.post("/sessions/one/terminals", json={"agent_profile": "reviewer"}).json()
        for t in (a, b):
            wait_until(lambda t=t: _status(c, t["id"]) == "idle", what="idle")
        c.post(f"/terminals/{a['id']}/input", json={"message": "hello server"})
        wait_until(
            lambda: c.get(f"/terminals/{a['id']}/output?mode=last").json()["output"] == "ok: hello server"
        )
    srv.kill()  # crash: no clean shutdown
    tmux = Tmux(tmux_socket)
    pane_b = next(p for p in tmux.list_panes() if p.pane_id != _pane(srv, a["id"]))
    tmux.kill_pane(pane_b.pane_id, pane_b.pane_pid)  # b dies while no server watches
    srv2: ServerProcess = make_server()
    with srv2.client() as c:
        assert _status(c, a["id"]) == "completed"  # re-adopted, same pane, live status
        assert _status(c, b["id"]) == "gone"  # kept, marked gone, not deleted
        assert {t["id"] for t in c.get("/terminals").json()} == {a["id"], b["id"]}
        c.post(f"/terminals/{a['id']}/input", json={"message": "after restart"})
        wait_until(
            lambda: c.get(f"/terminals/{a['id']}/output?mode=last").json()["output"] == "ok: after restart"
        )
        # the log pipe is still (or again) open after the restart
        log = srv2.home / "logs" / "terminal" / f"{a['id']}.log"
        wait_until(lambda: "after restart" in log.read_text(), what="log pipe still writing")
        pipes = Tmux(tmux_socket).run("list-panes", "-a", "-F", "#{pane_pipe}").split()
        assert pipes == ["1"]  # exactly one pipe, on the surviving pane


def _pane(srv: ServerProcess, tid: str) -> str:
    import sqlite3

    with sqlite3.connect(srv.home / "cao.db") as conn:
        return str(conn.execute("SELECT pane_id FROM terminal WHERE id = ?", (tid,)).fetchone()[0])


def test_second_server_on_same_home_is_refused(make_server, tmp_path: Path, tmux_socket: str):
    srv = make_server()
    env = server_env(srv.home, tmux_socket, srv.port + 1)
    proc = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert proc.returncode == 1
    assert "another cao-server" in proc.stderr and "CAO_HOME" in proc.stderr


def test_port_in_use_is_a_clear_error(make_server, tmp_path: Path, tmux_socket: str):
    srv = make_server()
    env = server_env(tmp_path / "other-home", tmux_socket, srv.port)
    proc = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert proc.returncode == 1 and "already in use" in proc.stderr


@pytest.mark.sqlite_only("reads the rows from cao.db")
def test_launch_headless_to_idle_and_shutdown_leaves_nothing(make_server, tmp_path: Path, tmux_socket: str):
    srv = make_server()
    env = {**server_env(srv.home, tmux_socket, srv.port), "CAO_SERVER_URL": srv.url}
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "cao", *args], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
    )
    launched = run("launch", "--headless", "--session-name", "cli", "--json")
    assert launched.returncode == 0, launched.stderr
    term = json.loads(launched.stdout)
    with srv.client() as c:
        wait_until(lambda: _status(c, term["id"]) == "idle", what="idle")
    assert run("send-input", term["id"], "from the cli").returncode == 0
    wait_until(lambda: run("output", term["id"], "--mode", "last").stdout.strip() == "ok: from the cli")
    status = json.loads(run("status", "--json").stdout)
    assert [t["id"] for t in status] == [term["id"]] and status[0]["status"] == "completed"
    pane_pid = _pane_pid(srv, term["id"])
    down = run("shutdown", "--all")
    assert down.returncode == 0 and "removed 1 terminal" in down.stdout
    assert json.loads(run("status", "--json").stdout) == []
    wait_until(lambda: not pid_alive(pane_pid), what="agent process gone")
    assert Tmux(tmux_socket).list_sessions() == []


def _pane_pid(srv: ServerProcess, tid: str) -> int:
    import sqlite3

    with sqlite3.connect(srv.home / "cao.db") as conn:
        return int(conn.execute("SELECT pane_pid FROM terminal WHERE id = ?", (tid,)).fetchone()[0])


def test_cli_without_server_says_how_to_start_it(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CAO_SERVER_URL": "http://127.0.0.1:9"}
    proc = subprocess.run(
        [sys.executable, "-m", "cao", "status"], env=env, capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert proc.returncode == 1
    assert "not reachable" in proc.stderr and "cao-server" in proc.stderr


@pytest.mark.integration  # the demo starts its own cao-server and tmux server
def test_demo_runs_end_to_end_and_cleans_up(tmp_path: Path):
    """The README's main job: three scripted agents coordinate through the inbox."""
    import os

    env = {k: v for k, v in server_env(tmp_path, "unused", 0).items() if not k.startswith("CAO_")}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cao", "demo", "--timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "5 messages, each delivered exactly once" in out
    assert "collected from" in out
    # piped (no terminal): a line per message change, then the table; every panel on lines of its own
    lines = out.splitlines()
    assert any(line.startswith("message #1 operator → supervisor") for line in lines), out
    assert all(line.lstrip().startswith(("╭", "┏")) for line in lines if "╭" in line or "┏" in line), out
    # its tmux server, server process and temp home are gone
    socket = Path(f"/tmp/tmux-{os.getuid()}/cao-demo-{proc.pid}")
    assert not Tmux(socket.name).is_alive()
    assert not socket.exists()
    assert list(tmp_path.glob("cao-demo-*")) == []


@pytest.mark.integration  # its own cao-server and tmux server, as the demo above
def test_the_coordination_demo_gets_a_result_and_a_blocked_notice_without_polling(tmp_path: Path):
    import os

    env = {k: v for k, v in server_env(tmp_path, "unused", 0).items() if not k.startswith("CAO_")}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "cao", "demo", "--coordination", "--timeout", "60"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    lines = out.splitlines()
    # the lead's own screen: the result as it arrived, the blocked notice, its finished notice
    assert any("collected the result of" in line and ": done" in line for line in lines), out
    assert any("needs a person: told the operator" in line for line in lines), out
    assert any(line.startswith("result #") and "→ lead" in line and "delivered" in line for line in lines), (
        out
    )
    assert any(line.startswith("notice #") and "→ lead" in line for line in lines), out
    assert "'branch': 'feat/parser'" in out
    assert list(tmp_path.glob("cao-demo-*")) == []  # its temp home is gone
    assert not [p for p in Path(f"/tmp/tmux-{os.getuid()}").glob("cao-demo-*") if Tmux(p.name).is_alive()]


def test_message_bodies_never_reach_the_logs(make_server, tmp_path: Path):
    srv: ServerProcess = make_server()  # runs at --log-level debug
    secret = "token-body-must-not-be-logged-7f3a"
    with srv.client() as c:
        tid = c.post("/sessions", json={"session_name": "logs"}).json()["id"]
        wait_until(lambda: _status(c, tid) == "idle")
        # JSON body and the reference query form (which would put the body in an access log)
        for kwargs in ({"json": {"message": secret}}, {"params": {"message": secret + "-q"}}):
            mid = c.post(f"/terminals/{tid}/inbox/messages", **kwargs).json()["message_id"]
            wait_until(lambda mid=mid: c.get(f"/messages/{mid}").json()["status"] == "delivered")
    logs = srv.log() + (srv.home / "logs" / "server.log").read_text()
    assert "messages delivered" in logs  # the log is there and has the delivery
    assert secret not in logs
