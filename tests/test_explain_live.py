"""``GET /terminals/{id}/explain`` and ``cao explain`` on a real cao-server with a scripted agent in
a private tmux server: the explanation's status is the terminal's own, its evidence is lines of
that pane's screen, its bug report carries no home path, and a broken override file stops
cao-server at start naming the line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cao.tmux import Tmux
from tests.helpers import ServerProcess, wait_until


def test_explain_a_live_terminal(make_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    home = tmp_path / "cao"
    srv = make_server(home)
    with srv.client() as http:
        tid = http.post("/sessions", json={"session_name": "explained"}).json()["id"]
        wait_until(lambda: http.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        ex: dict[str, Any] = http.get(f"/terminals/{tid}/explain").json()
        assert ex["status"] == http.get(f"/terminals/{tid}").json()["status"] == "idle"
        assert ex["decided_by"] == "screen" and ex["terminal"]["id"] == tid
        assert ex["pane"]["pane_id"] == http.get(f"/terminals/{tid}").json()["pane_id"]
        screen = Tmux(srv.socket_name).capture(ex["pane"]["pane_id"]).split("\n")
        named = [ln for m in ex["screen"]["matched"] for ln in m["lines"] if ln["line"]]
        assert named, "an idle screen is read by some rule"
        for ln in named:
            assert screen[ln["line"] - 1].rstrip(" ") == ln["text"]
        assert ex["input_box"]["found"] and ex["input_box"]["text"] == ""
        report = http.get(f"/terminals/{tid}/explain", params={"report": "true"}).json()["bug_report"]
        assert "status: idle" in report and str(home) not in report
        assert http.get(f"/terminals/{tid}/explain", params={"report": "maybe"}).status_code == 422
        assert http.get("/terminals/00000000/explain").status_code == 404
        env = {**os.environ, "CAO_HOME": str(home), "CAO_SERVER_URL": srv.url}
        out = subprocess.run(
            [sys.executable, "-m", "cao", "explain", tid], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("status: idle  (decided by the screen)")


def test_a_broken_override_file_stops_the_server_at_start(tmp_path: Path, clean_env: dict[str, str]) -> None:
    home = tmp_path / "cao"
    (home / "providers").mkdir(parents=True)
    (home / "providers" / "claude_code.rules").write_text("# mine\nbusy_footer = (unclosed\n")
    env = {**clean_env, "CAO_HOME": str(home), "CAO_API_PORT": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert f"{home}/providers/claude_code.rules:2: the pattern for 'busy_footer'" in out.stderr
