"""cao-server on a PostgreSQL store, end to end: a real server process, a real tmux, scripted
agents, the test PostgreSQL server (cao/testing/pgserver.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO, ServerProcess, free_port, received_bodies, server_env, wait_until


def _with_password(url: str) -> str:
    # the test server trusts its unix socket, so any password is accepted: what matters is that it
    # never shows
    return url.replace("postgresql://cao@", "postgresql://cao:hunter2-secret@")


def test_a_server_on_postgresql_delivers_shows_no_password_and_holds_its_host_name(
    make_server, pg_url: str, tmp_path: Path, tmux_socket: str
):
    url = _with_password(pg_url)
    srv: ServerProcess = make_server(CAO_DATABASE_URL=url, CAO_SCRIPTED_RECORD="1")
    with srv.client() as c:
        t = c.post("/sessions", params={"session_name": "pg", "working_directory": str(tmp_path)}).json()
        wait_until(lambda: c.get(f"/terminals/{t['id']}").json()["status"] == "idle", what="idle")
        sent = c.post(
            f"/terminals/{t['id']}/inbox/messages", json={"sender_id": "cli", "message": "token-pg1"}
        )
        assert sent.status_code == 201
        wait_until(lambda: received_bodies(srv.home, t["id"]) == ["token-pg1"], what="delivered")
        info = c.get("/info").json()
        assert info["database"].startswith("postgresql://cao:***@") and "hunter2" not in str(info)
    assert not (srv.home / "cao.db").exists()  # the store is the server's database, not a file
    # a second cao-server on the same database under the same host name (another home, another
    # port) is refused, clearly: only another name makes it another host (tests/test_hosts.py)
    env = server_env(tmp_path / "other", tmux_socket, free_port(), CAO_DATABASE_URL=url)
    proc = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=30, cwd=REPO
    )
    assert proc.returncode == 1 and re.search(r"host name \S+ is held by a running cao-server", proc.stderr)
    assert "hunter2" not in proc.stderr
    # killed, the first one's lock goes with its connection: a new server takes over its terminals
    srv.kill()
    srv2: ServerProcess = make_server(CAO_DATABASE_URL=url, CAO_SCRIPTED_RECORD="1")
    with srv2.client() as c:
        assert [x["id"] for x in c.get("/terminals").json()] == [t["id"]]
        c.post(f"/terminals/{t['id']}/inbox/messages", json={"sender_id": "cli", "message": "token-pg2"})
        wait_until(lambda: received_bodies(srv.home, t["id"]) == ["token-pg1", "token-pg2"], what="delivered")
    assert "hunter2" not in srv.log()


def test_a_bad_database_url_is_refused_naming_the_fix(tmp_path: Path, tmux_socket: str):
    for url, says in (
        ("mysql://cao@db/cao", "must be a postgresql:// URL"),
        ("postgresql://cao:pw@db:5432", "names no database"),
    ):
        env = server_env(tmp_path / "h", tmux_socket, free_port(), CAO_DATABASE_URL=url)
        proc = subprocess.run(
            [sys.executable, "-m", "cao.server"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert proc.returncode == 1 and says in proc.stderr and "pw@" not in proc.stderr
