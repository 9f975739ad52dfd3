"""``cao demo``: a supervisor hands two tasks to two workers and collects their replies, all
through the inbox, with scripted agents (no API key). Runs its own cao-server on a private tmux
socket and a throwaway CAO_HOME, shows the messages live, then cleans up."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from cao.timefmt import epoch
from cao.tmux import Tmux

SUPERVISOR_RULES = {
    "rules": [
        {
            "match": r"^delegate (?P<to>[0-9a-f]{8}) (?P<task>.+)$",
            "reply": "handing out the work",
            "send": [{"to": "{to}", "message": "{task}"}],
        },
        {"match": r"^result: (?P<result>.+)$", "reply": "collected from {sender}: {result}"},
    ],
    "default": {"reply": "noted: {first_line}"},
}
WORKER_RULES = {
    "rules": [
        {
            "match": r"(?P<task>.+)",
            "delay": 1.2,
            "reply": "done with: {task}",
            "send": [{"to": "{sender}", "message": "result: {task} (by {terminal_id})"}],
        },
    ],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _table(messages: list[dict[str, Any]], names: dict[str, str]) -> Table:
    table = Table(title="inbox (live)")
    for col in ("#", "from", "to", "status", "latency", "message"):
        table.add_column(col, overflow="fold")
    for m in sorted(messages, key=lambda m: m["id"]):
        latency = "-"
        if m["delivered_at"]:
            latency = f"{((epoch(m['delivered_at']) or 0) - (epoch(m['created_at']) or 0)) * 1000:.0f} ms"
        style = {"delivered": "green", "pending": "yellow", "delivering": "blue", "failed": "red"}.get(
            m["status"], "white"
        )
        table.add_row(
            str(m["id"]),
            names.get(m["sender_id"], m["sender_id"]),
            names.get(m["receiver_id"], m["receiver_id"]),
            f"[{style}]{m['status']}[/]",
            latency,
            escape(m["message"].replace("\n", " ⏎ ")[:70]),
        )
    return table


def run(keep: bool, timeout: float) -> None:
    """The demo itself (``cao demo`` imports this module only when it runs)."""
    console = Console()
    home = Path(tempfile.mkdtemp(prefix="cao-demo-"))
    socket_name = f"cao-demo-{os.getpid()}"
    port = _free_port()
    (home / "scripted").mkdir(parents=True)
    (home / "scripted" / "demo_supervisor.json").write_text(json.dumps(SUPERVISOR_RULES))
    (home / "scripted" / "demo_worker.json").write_text(json.dumps(WORKER_RULES))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAO_", "TMUX"))}
    env.update(CAO_HOME=str(home), CAO_TMUX_SOCKET=socket_name, CAO_API_PORT=str(port))
    url = f"http://127.0.0.1:{port}"
    with (home / "server.stderr").open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "cao.server", "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    http = httpx.Client(base_url=url, timeout=30)
    ok = False
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                http.get("/health").raise_for_status()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException(
                        f"cao-server did not start; see {home / 'server.stderr'}"
                    ) from None
                time.sleep(0.05)
        console.print(f"[bold]cao demo[/] · server {url} · tmux socket {socket_name} · home {home}")
        sup = http.post("/sessions", json={"agent_profile": "demo_supervisor", "session_name": "demo"}).json()
        w1 = http.post("/sessions/demo/terminals", json={"agent_profile": "demo_worker"}).json()
        w2 = http.post("/sessions/demo/terminals", json={"agent_profile": "demo_worker"}).json()
        names = {
            sup["id"]: f"supervisor {sup['id']}",
            w1["id"]: f"worker-1 {w1['id']}",
            w2["id"]: f"worker-2 {w2['id']}",
            "operator": "operator",
        }
        task = f"delegate {w1['id']} write the parser\ndelegate {w2['id']} write the tests"
        http.post(f"/terminals/{sup['id']}/inbox/messages", json={"sender_id": "operator", "message": task})
        start = time.monotonic()
        with Live(console=console, refresh_per_second=8) as live:
            while time.monotonic() - start < timeout:
                msgs = http.get("/messages", params={"limit": 100}).json()
                screen = http.get(f"/terminals/{sup['id']}/output", params={"mode": "last"}).json()["output"]
                live.update(
                    Group(_table(msgs, names), Panel(escape(screen or "…"), title="supervisor's last answer"))
                )
                delivered = [m for m in msgs if m["status"] == "delivered"]
                if (
                    len(delivered) >= 5
                    and "collected" in screen
                    and all(
                        http.get(f"/terminals/{t}").json()["status"] in ("idle", "completed")
                        for t in names
                        if t != "operator"
                    )
                ):
                    ok = True
                    break
                time.sleep(0.15)
        full = http.get(f"/terminals/{sup['id']}/output").json()["output"]
        console.print(Panel(escape(full.strip()), title=f"supervisor pane ({sup['id']})"))
        if not ok:
            raise click.ClickException(f"the demo did not finish within {timeout:.0f}s")
        console.print("[green]done:[/] 5 messages, each delivered exactly once, in order.")
        if keep:
            console.print(
                f"agents are still running: tmux -L {socket_name} attach -t cao-demo\n"
                f"stop them with: CAO_SERVER_URL={url} cao shutdown --all; kill {server.pid}"
            )
    finally:
        if not keep:
            with contextlib.suppress(httpx.HTTPError):
                http.delete("/sessions/demo")
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
            Tmux(socket_name).kill_server()
            shutil.rmtree(home, ignore_errors=True)
        http.close()
