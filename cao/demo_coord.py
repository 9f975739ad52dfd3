"""``cao demo --coordination``: a lead agent assigns two tasks and hears back without polling:
one worker reports a structured result (report_result), the other stops at a permission prompt
and the lead gets a ``notice`` saying so; the operator (this demo) answers the prompt, and the
lead hears that worker finished. Scripted agents, no API key; its own cao-server, tmux socket and
CAO_HOME (cao/demo.py ``demo_server``), removed afterwards."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from cao.demo import demo_server
from cao.states import Kind, MessageStatus, ResultStatus

RESULT_RE = r"^Result from worker (?P<w>[0-9a-f]{8}) \(.*\): (?P<st>\w+)"
LEAD_RULES = {
    "rules": [
        {"match": RESULT_RE, "reply": "collected the result of {w}: {st}"},
        {
            "match": r"^Worker (?P<w>[0-9a-f]{8}) .*waiting at a permission",
            "reply": "worker {w} needs a person: told the operator",
        },
        {"match": r"^Worker (?P<w>[0-9a-f]{8}) .*ended its turn", "reply": "worker {w} finished"},
    ],
    "default": {"reply": "noted: {first_line}"},
}
BUILDER_RULES = {
    "rules": [
        {
            "match": r"^build (?P<what>.+)$",
            "delay": 1.0,
            "reply": "built {what}",
            "result": {
                "status": ResultStatus.DONE.value,
                "summary": "built {what}; 12 tests pass",
                "details": {"branch": "feat/parser", "files": ["src/parser.py", "tests/test_parser.py"]},
            },
        }
    ]
}
DEPLOYER_RULES = {
    "rules": [
        {
            "match": r"^deploy (?P<what>.+)$",
            "ask": "Allow tool deploy?",
            "delay": 0.5,
            "reply": "deployed {what}",
        }
    ]
}


def _table(messages: list[dict[str, Any]], names: dict[str, str]) -> Table:
    table = Table(title="the lead's inbox and the tasks (live)")
    for col in ("#", "kind", "from", "to", "status", "message"):
        table.add_column(col, overflow="fold")
    for m in sorted(messages, key=lambda m: m["id"]):
        style = {"delivered": "green", "pending": "yellow", "delivering": "blue"}.get(m["status"], "white")
        table.add_row(
            str(m["id"]),
            m["kind"],
            names.get(m["sender_id"], m["sender_id"]),
            names.get(m["receiver_id"], m["receiver_id"]),
            f"[{style}]{m['status']}[/]",
            escape(m["message"].replace("\n", " ⏎ ")[:80]),
        )
    return table


def _got(msgs: list[dict[str, Any]], to: str, kind: Kind, words: str) -> bool:
    return any(
        m["receiver_id"] == to
        and m["kind"] == kind
        and m["status"] == MessageStatus.DELIVERED
        and words in m["message"]
        for m in msgs
    )


def run(keep: bool, timeout: float) -> None:
    console = Console()
    rules = {"demo_lead": LEAD_RULES, "demo_builder": BUILDER_RULES, "demo_deployer": DEPLOYER_RULES}
    with demo_server(rules, keep) as (http, home, socket_name, _pid):
        console.print(f"[bold]cao demo --coordination[/] · tmux socket {socket_name} · home {home}")
        _run(console, http, timeout)


def _run(console: Console, http: httpx.Client, timeout: float) -> None:
    lead = http.post("/sessions", json={"agent_profile": "demo_lead", "session_name": "demo"}).json()
    if "id" not in lead:
        raise click.ClickException(f"could not start the lead: {lead.get('detail')}")
    sup = lead["id"]

    def worker(profile: str, task: str) -> str:
        w = http.post(
            "/sessions/demo/terminals",
            json={"agent_profile": profile, "supervisor_id": sup, "initial_message": task},
        ).json()
        if "id" not in w:
            raise click.ClickException(f"could not start a worker: {w.get('detail')}")
        return str(w["id"])

    builder = worker("demo_builder", "build the parser")
    deployer = worker("demo_deployer", "deploy the docs site")
    names = {sup: f"lead {sup}", builder: f"builder {builder}", deployer: f"deployer {deployer}"}
    console.print(
        f"lead {sup} assigned two tasks: builder {builder} (reports a result), deployer {deployer} "
        "(will stop at a permission prompt). The lead never polls."
    )
    answered = ok = False
    msgs: list[dict[str, Any]] = []
    start = time.monotonic()
    live = Live(console=console, refresh_per_second=8) if console.is_terminal else None
    seen: dict[int, str] = {}
    with live or contextlib.nullcontext():
        while time.monotonic() - start < timeout:
            msgs = http.get("/messages", params={"limit": 100}).json()
            screen = http.get(f"/terminals/{sup}/output", params={"mode": "last"}).json()["output"]
            if live is not None:
                live.update(
                    Group(_table(msgs, names), Panel(escape(screen or "…"), title="the lead's last answer"))
                )
            else:
                for m in sorted(msgs, key=lambda m: int(m["id"])):
                    if seen.get(m["id"]) != m["status"]:
                        seen[m["id"]] = m["status"]
                        who = f"{names.get(m['sender_id'], m['sender_id'])} → {names.get(m['receiver_id'])}"
                        console.print(f"{m['kind']} #{m['id']} {who}: {m['status']}", highlight=False)
            blocked = _got(msgs, sup, Kind.NOTICE, "waiting at a permission")
            if blocked and not answered:  # the operator answers the deployer's prompt
                if live is None:
                    console.print(f"the operator answers deployer {deployer}'s prompt: y")
                http.post(f"/terminals/{deployer}/input", json={"message": "y"}).raise_for_status()
                answered = True
            if (
                _got(msgs, sup, Kind.RESULT, f"Result from worker {builder}")
                and blocked
                and _got(msgs, sup, Kind.NOTICE, f"Worker {deployer} (demo_deployer) ended its turn")
                and "finished" in http.get(f"/terminals/{sup}/output").json()["output"]
            ):
                ok = True
                break
            time.sleep(0.15)
    if live is None:
        console.print(_table(msgs, names))
    console.print(
        Panel(
            escape(http.get(f"/terminals/{sup}/output").json()["output"].strip()),
            title=f"the lead's pane ({sup})",
        )
    )
    reported = http.get(f"/terminals/{builder}/results").json()
    if reported:
        result = reported[0]
        data = escape(str(result["details"]))
        console.print(Panel(data, title=f"builder's result as data: {result['status']}"))
    if not ok:
        raise click.ClickException(f"the demo did not finish within {timeout:.0f}s")
    console.print(
        "[green]done:[/] the lead got the builder's result as data and the deployer's 'blocked' and "
        "'finished' notices, without polling."
    )
