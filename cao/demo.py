"""``cao demo``: a supervisor hands two tasks to two workers and collects their replies, all
through the inbox, with scripted agents (no API key). Runs its own cao-server on a private tmux
socket and a throwaway CAO_HOME, shows the messages live, then cleans up.

``--worktrees``: the supervisor works in a throwaway git repository and each worker gets its own
worktree on its own branch. Scripted agents don't edit files, so the demo writes each worker's
"work" into its worktree when it reports back; then the workers are removed (their uncommitted
work becomes a wip commit on their branch) and both branches are merged into the supervisor's."""

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from cao.states import MessageStatus, Status
from cao.timefmt import epoch
from cao.tmux import Tmux
from cao.worktrees import Git

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


WORK = {  # what each worker "writes" in its worktree (--worktrees)
    "worker-1": ("parser.py", "def parse(text):\n    return text.split()\n"),
    "worker-2": (
        "test_parser.py",
        "from parser import parse\n\n\ndef test_parse():\n    assert parse('a b') == ['a', 'b']\n",
    ),
}


def _make_repo(path: Path) -> None:
    """A throwaway repository on branch main with one commit (the supervisor's checkout)."""
    git = Git()
    path.mkdir(parents=True)
    git.run(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# demo project\n")
    git.run(path, "add", "-A")
    git.run(path, "commit", "-q", "--no-verify", "-m", "start", commit=True)


def _merge_workers(
    http: httpx.Client, console: Console, repo: Path, workers: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each worker's work into its worktree, the worker removed (wip commit), its branch merged."""
    results = []
    for label, worker in workers.items():
        name, text = WORK[label]
        (Path(worker["worktree"]["path"]) / name).write_text(text)
        stat = http.get(f"/terminals/{worker['id']}/diff").json()["diff"].strip()
        console.print(f"[bold]{label}[/] on {worker['worktree']['branch']}:\n{escape(stat)}")
        http.delete(f"/terminals/{worker['id']}").raise_for_status()
        merged = http.post(f"/terminals/{worker['id']}/merge", json={})
        if merged.status_code != 200:
            raise click.ClickException(f"merging {label} failed: {merged.json().get('detail')}")
        results.append(merged.json())
        console.print(f"merged {merged.json()['branch']} into [bold]{merged.json()['target']}[/]")
    log = Git().out(repo, "log", "--graph", "--oneline", "--format=%s", "main")
    files = sorted(p.name for p in repo.iterdir() if p.is_file())
    console.print(
        Panel(escape(log) + f"\n\nfiles on main: {', '.join(files)}", title="the supervisor's branch")
    )
    return results


@contextlib.contextmanager
def demo_server(rules: dict[str, Any], keep: bool) -> Iterator[tuple[httpx.Client, Path, str, int]]:
    """Its own cao-server on a private tmux socket and a throwaway CAO_HOME, with these scripted
    agents' rules; stopped and removed afterwards (unless ``keep``). Yields (http, home, socket
    name, server pid)."""
    home = Path(tempfile.mkdtemp(prefix="cao-demo-"))
    socket_name = f"cao-demo-{os.getpid()}"
    port = _free_port()
    (home / "scripted").mkdir(parents=True)
    for profile, body in rules.items():
        (home / "scripted" / f"{profile}.json").write_text(json.dumps(body))
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
        yield http, home, socket_name, server.pid
        if keep:
            Console().print(
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


def run(keep: bool, timeout: float, worktrees: bool = False) -> None:
    """The demo itself (``cao demo`` imports this module only when it runs)."""
    console = Console()
    rules = {"demo_supervisor": SUPERVISOR_RULES, "demo_worker": WORKER_RULES}
    with demo_server(rules, keep) as (http, home, socket_name, _pid):
        url = str(http.base_url).rstrip("/")
        _run(console, http, home, socket_name, url, timeout, worktrees)


def _run(
    console: Console,
    http: httpx.Client,
    home: Path,
    socket_name: str,
    url: str,
    timeout: float,
    worktrees: bool,
) -> None:
    ok = False
    console.print(f"[bold]cao demo[/] · server {url} · tmux socket {socket_name} · home {home}")
    repo = home / "project"
    where: dict[str, Any] = {}
    if worktrees:
        _make_repo(repo)
        where = {"working_directory": str(repo)}
    sup = http.post(
        "/sessions", json={"agent_profile": "demo_supervisor", "session_name": "demo", **where}
    ).json()
    # notify=false: this demo shows the inbox alone (`cao demo --coordination` shows notices)
    one = {"agent_profile": "demo_worker", "supervisor_id": sup["id"], "notify": False, **where}
    if worktrees:
        one["use_worktree"] = True
    w1 = http.post("/sessions/demo/terminals", json=one).json()
    w2 = http.post("/sessions/demo/terminals", json=one).json()
    if "id" not in w2:
        raise click.ClickException(f"could not start the workers: {w2.get('detail')}")
    names = {
        sup["id"]: f"supervisor {sup['id']}",
        w1["id"]: f"worker-1 {w1['id']}",
        w2["id"]: f"worker-2 {w2['id']}",
        "operator": "operator",
    }
    task = f"delegate {w1['id']} write the parser\ndelegate {w2['id']} write the tests"
    http.post(f"/terminals/{sup['id']}/inbox/messages", json={"sender_id": "operator", "message": task})
    start = time.monotonic()
    # On a terminal the table is redrawn in place; piped (a log, CI) a line per change instead.
    live = Live(console=console, refresh_per_second=8) if console.is_terminal else None
    seen: dict[int, str] = {}
    msgs: list[dict[str, Any]] = []
    with live or contextlib.nullcontext():
        while time.monotonic() - start < timeout:
            msgs = http.get("/messages", params={"limit": 100}).json()
            screen = http.get(f"/terminals/{sup['id']}/output", params={"mode": "last"}).json()["output"]
            if live is not None:
                answer = Panel(escape(screen or "…"), title="supervisor's last answer")
                live.update(Group(_table(msgs, names), answer))
            for m in sorted(msgs, key=lambda m: int(m["id"])) if live is None else ():
                if seen.get(m["id"]) != m["status"]:
                    seen[m["id"]] = m["status"]
                    who = f"{names.get(m['sender_id'], m['sender_id'])} → {names.get(m['receiver_id'])}"
                    console.print(f"message #{m['id']} {who}: {m['status']}", highlight=False)
            delivered = [m for m in msgs if m["status"] == MessageStatus.DELIVERED]
            if (
                len(delivered) >= 5
                and "collected" in screen
                and all(
                    http.get(f"/terminals/{t}").json()["status"] in (Status.IDLE, Status.COMPLETED)
                    for t in names
                    if t != "operator"
                )
            ):
                ok = True
                break
            time.sleep(0.15)
    if live is None:
        console.print(_table(msgs, names))
    full = http.get(f"/terminals/{sup['id']}/output").json()["output"]
    console.print(Panel(escape(full.strip()), title=f"supervisor pane ({sup['id']})"))
    if not ok:
        raise click.ClickException(f"the demo did not finish within {timeout:.0f}s")
    console.print("[green]done:[/] 5 messages, each delivered exactly once, in order.")
    if worktrees:
        _merge_workers(http, console, repo, {"worker-1": w1, "worker-2": w2})
        console.print("[green]done:[/] both workers' branches merged into the supervisor's (main).")
