"""``cao``: the command line (thin: call the HTTP API, format with rich).

Exit codes: 0 success, 1 a handled failure (the message says what to do), 2 usage error.
Every read command takes ``--json`` (stable keys; ``[]`` when empty).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import cao
from cao import apitoken
from cao import client as server
from cao.names import board_path
from cao.states import MessageStatus
from cao.timefmt import epoch

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
console = Console()
err_console = Console(stderr=True)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _age(value: str | float | None) -> str:
    ts = epoch(value)
    if ts is None:
        return "-"
    secs = max(0.0, time.time() - ts)
    if secs < 1:
        return f"{secs * 1000:.0f}ms"
    if secs < 120:
        return f"{secs:.0f}s"
    if secs < 7200:
        return f"{secs / 60:.0f}m"
    return f"{secs / 3600:.0f}h"


STATUS_STYLE = {
    "idle": "green",
    "completed": "cyan",
    "processing": "yellow",
    "waiting_user_answer": "magenta",
    "error": "red",
    "unknown": "bold red",
    "gone": "dim",
    "pending": "yellow",
    "delivering": "blue",
    "delivered": "green",
    "failed": "red",
    "cancelled": "dim",
}


def usage_cell(usage: dict[str, Any] | None) -> str:
    """``12,345 · $0.04``; ``unknown`` where the CLI records no usage (never 0); a budget hold."""
    if not usage or usage.get("tokens") is None:
        cell = "[dim]unknown[/dim]"
    else:
        cost = usage.get("cost_usd")
        cell = f"{usage['tokens']:,} · " + (f"${cost:.2f}" if cost is not None else "$ unknown")
    if usage and usage.get("budget_hold"):
        cell += "\n[yellow]budget reached: new tasks wait[/yellow]"
    return cell


def _styled(value: str) -> str:
    style = STATUS_STYLE.get(value)
    return f"[{style}]{value}[/{style}]" if style else value


@click.group(context_settings=CONTEXT, epilog="Example:\n\n\b\n  cao launch --headless && cao status")
@click.version_option(cao.__version__, "--version", prog_name="cao")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Run CLI coding agents side by side in tmux and let them message each other.

    Commands talk to a running cao-server (CAO_SERVER_URL, default http://127.0.0.1:9889) and
    send its API token if it has one (CAO_API_TOKEN, else $CAO_HOME/api-token).
    """
    ctx.ensure_object(dict)


# -- terminals -----------------------------------------------------------------------------------
@cli.command(
    epilog="\b\nExamples:\n  cao launch --headless\n  cao launch --agents reviewer --session-name review\n"
    "  cao launch --headless --host build-2"
)
@click.option("--provider", default=None, help="Agent CLI provider (default: scripted).")
@click.option("--agents", "agent_profile", default="developer", show_default=True, help="Agent profile name.")
@click.option("--session-name", default=None, help="Session name (tmux session cao-NAME); random if omitted.")
@click.option(
    "--working-directory", "-w", default=None, help="Directory the agent starts in (default: here)."
)
@click.option("--headless", is_flag=True, help="Don't attach to the tmux session.")
@click.option(
    "--worktree/--no-worktree",
    "use_worktree",
    default=None,
    help="Run the agent in its own git worktree on a new branch (default: the profile's setting).",
)
@click.option(
    "--host",
    default=None,
    help="Run it on this host (`cao hosts`; several cao-servers sharing a store). Default: this one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the new terminal as JSON.")
@click.pass_context
def launch(
    ctx: click.Context,
    provider: str | None,
    agent_profile: str,
    session_name: str | None,
    working_directory: str | None,
    headless: bool,
    use_worktree: bool | None,
    host: str | None,
    as_json: bool,
) -> None:
    """Create a session with one agent and attach to it (unless --headless)."""
    client = server.for_context(ctx)
    body = {
        "host": host,
        "provider": provider,
        "agent_profile": agent_profile,
        "session_name": session_name,
        "working_directory": os.path.abspath(working_directory or os.getcwd()),
        "use_worktree": use_worktree,
    }
    term = client.post("/sessions", json={k: v for k, v in body.items() if v is not None})
    if as_json:
        _print_json(term)
    else:
        console.print(
            f"terminal [bold]{term['id']}[/] ({term['provider']}, {term['agent_profile']}) "
            f"in session [bold]{term['session_name']}[/]: {_styled(term['status'])}"
        )
        if term.get("worktree"):
            wt = term["worktree"]
            console.print(f"worktree {escape(wt['path'])} on branch [bold]{escape(wt['branch'])}[/]")
    if not headless and term.get("host") not in (None, client.get("/info").get("host")):
        console.print(f"not attaching: it runs on host {escape(str(term['host']))}; attach there")
        return
    if not headless:
        from cao.tmux import Tmux

        socket = client.get("/info").get("tmux_socket")  # the server's tmux, not this shell's setting
        argv = Tmux(socket).attach_argv(term["session_name"], inside_tmux="TMUX" in os.environ)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            console.print(
                "not attaching (no terminal here); the agent keeps running. Watch it with:\n  "
                + " ".join(argv)
            )
            return
        os.execvp(argv[0], argv)


@cli.command(epilog="\b\nExamples:\n  cao status\n  cao status --json | jq '.[].status'")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of terminals.")
@click.option("--session", default=None, callback=server.checked_session_name, help="Only this session.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, session: str | None) -> None:
    """Show sessions, their terminals and each agent's live status."""
    client = server.for_context(ctx)
    path = f"/sessions/{session}/terminals" if session else "/terminals"
    terms = client.get(path)
    if as_json:
        _print_json(terms)
        return
    info = client.get("/info")
    if info.get("store", "ok") != "ok":
        console.print(f"[red]the server's database is lost:[/] {escape(str(info['store']))}")
    for orphan in info.get("orphan_panes") or []:
        console.print(
            f"[yellow]note:[/] pane {orphan['pane_id']} (session {orphan['session_name']}) runs terminal "
            f"{orphan['terminal_id']} of this home, which the database doesn't know (it was replaced or "
            f"deleted); kept, never killed: `tmux attach -t {orphan['session_name']}` to look, "
            f"`tmux kill-pane -t {orphan['pane_id']}` to end it"
        )
    if not terms:
        console.print("no terminals; start one with `cao launch --headless`")
        return
    table = Table(title="cao terminals")
    for col in ("session", "terminal", "profile", "provider", "status"):
        table.add_column(col, no_wrap=col == "terminal")
    table.add_column("last active", no_wrap=True)  # an age ("12s ago"); the time itself is in --json
    table.add_column("tokens · cost", no_wrap=True)  # `cao usage` has the detail
    for t in terms:
        why = f"\n[dim]{escape(t['status_reason'])}[/dim]" if t.get("status_reason") else ""
        table.add_row(
            t["session_name"],
            t["id"],
            t["agent_profile"],
            t["provider"],
            _styled(t["status"]) + why,
            f"{_age(t['last_active'])} ago" if t.get("last_active") else "-",
            usage_cell(t.get("usage")),
        )
    console.print(table)


@cli.command("send-input", epilog="Example:\n\n\b\n  cao send-input 1a2b3c4d 'summarise the README'")
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.argument("text")
@click.pass_context
def send_input(ctx: click.Context, terminal_id: str, text: str) -> None:
    """Type TEXT into a terminal now (bracketed paste + Enter), whatever its status."""
    server.for_context(ctx).post(f"/terminals/{terminal_id}/input", json={"message": text})
    console.print(f"sent to {terminal_id}")


@cli.command(epilog="\b\nExamples:\n  cao output 1a2b3c4d --mode last\n  cao output 1a2b3c4d --json")
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.option(
    "--mode",
    type=click.Choice(["full", "last"]),
    default="full",
    show_default=True,
    help="full = the whole scrollback; last = the agent's last answer.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {output, mode} as JSON.")
@click.pass_context
def output(ctx: click.Context, terminal_id: str, mode: str, as_json: bool) -> None:
    """Print a terminal's output."""
    data = server.for_context(ctx).get(f"/terminals/{terminal_id}/output", params={"mode": mode})
    if as_json:
        _print_json(data)
    else:
        click.echo(data["output"])


@cli.command(epilog="\b\nExamples:\n  cao shutdown --session demo\n  cao shutdown --all")
@click.option("--all", "all_", is_flag=True, help="Every cao session.")
@click.option(
    "--session",
    default=None,
    callback=server.checked_session_name,
    help="One session (name with or without the cao- prefix).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
@click.pass_context
def shutdown(ctx: click.Context, all_: bool, session: str | None, as_json: bool) -> None:
    """Stop agents: kill their panes and processes, keep their history in the database."""
    if all_ == bool(session):
        raise click.UsageError("give exactly one of --all or --session NAME")
    client = server.for_context(ctx)
    names = [s["name"] for s in client.get("/sessions")] if all_ else [session]
    removed: dict[str, list[str]] = {}
    for name in names:
        removed[str(name)] = client.delete(f"/sessions/{name}")["deleted_terminals"]
    if as_json:
        _print_json(removed)
        return
    if not removed:
        console.print("nothing to shut down")
    for name, ids in removed.items():
        console.print(f"session {name}: removed {len(ids)} terminal(s)")


@cli.command(epilog="\b\nExamples:\n  cao info\n  cao info --json")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
def info(ctx: click.Context, as_json: bool) -> None:
    """Show where cao keeps its data, which tmux server it drives, and inbox counters."""
    data = server.for_context(ctx).get("/info")
    data["server_url"] = server.for_context(ctx).base_url
    if as_json:
        _print_json(data)
        return
    table = Table(show_header=False, title="cao info")
    for key, value in data.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    console.print(table)


# -- worktrees: review and merge -----------------------------------------------------------------
@cli.command(epilog="\b\nExamples:\n  cao diff 1a2b3c4d\n  cao diff 1a2b3c4d --full | less -R")
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.option("--full", is_flag=True, help="The whole patch instead of the stat.")
@click.option("--into", default=None, help="Compare with this branch (default: the one it was made from).")
@click.option("--json", "as_json", is_flag=True, help="Print {branch, base, diff, ...} as JSON.")
@click.pass_context
def diff(ctx: click.Context, terminal_id: str, full: bool, into: str | None, as_json: bool) -> None:
    """Show what a worker changed in its worktree: its branch's commits and what it has not
    committed yet (new files included)."""
    params: dict[str, Any] = {"full": "true" if full else "false"}
    if into:
        params["into"] = into
    data = server.for_context(ctx).get(f"/terminals/{terminal_id}/diff", params=params)
    if as_json:
        _print_json(data)
        return
    extra = " + uncommitted" if data["includes_uncommitted"] else ""
    err_console.print(f"branch {data['branch']} against {data['against']} ({data['base'][:10]}{extra})")
    click.echo(data["diff"].rstrip("\n") if data["diff"].strip() else "(no changes)")


@cli.command(epilog="\b\nExamples:\n  cao merge 1a2b3c4d\n  cao merge 1a2b3c4d --into integration")
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.option("--into", default=None, help="Target branch (default: the branch it was made from).")
@click.option("--json", "as_json", is_flag=True, help="Print the result (or the conflicts) as JSON.")
@click.pass_context
def merge(ctx: click.Context, terminal_id: str, into: str | None, as_json: bool) -> None:
    """Merge a worker's branch. A conflict stops before anything changes and is shown."""
    client = server.for_context(ctx)
    resp = client.response("POST", f"/terminals/{terminal_id}/merge", json={"into": into} if into else {})
    if resp.status_code == 409 and resp.json().get("conflicts") is not None:
        data = resp.json()
        if as_json:
            _print_json(data)
        else:
            err_console.print(f"[red]conflict:[/] {escape(data['detail'])}")
            for c in data["conflicts"]:
                click.echo(f"--- {c['path']}\n{c['text'].rstrip()}")
        raise SystemExit(1)
    data = client.answer(resp)
    if as_json:
        _print_json(data)
    elif data["already_merged"]:
        console.print(f"{data['branch']} is already merged into {data['target']}")
    else:
        where = f" (checkout {escape(data['updated_checkout'])})" if data["updated_checkout"] else ""
        console.print(f"merged {data['branch']} into [bold]{data['target']}[/]{where}: {data['commit'][:10]}")


@cli.command(epilog="\b\nExamples:\n  cao worktrees\n  cao worktrees --json | jq '.[] | select(.orphan)'")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def worktrees(ctx: click.Context, as_json: bool) -> None:
    """List workers' worktrees: branch, state, changes, and orphans found at server start."""
    rows = server.for_context(ctx).get("/worktrees")
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("no worktrees; start a worker with `cao launch --worktree`")
        return
    table = Table(title="worktrees")
    for col in ("terminal", "branch", "state", "changes", "path", "note"):
        table.add_column(col, overflow="fold")
    for w in rows:
        stat = w.get("diffstat")
        changes = f"{stat['files']} files +{stat['insertions']} -{stat['deletions']}" if stat else "-"
        state = "[red]orphan[/]" if w.get("orphan") else str(w.get("state") or "-")
        note = w.get("reason") or w.get("note") or ""
        table.add_row(
            w.get("terminal_id") or "-",
            escape(str(w.get("branch"))),
            state,
            changes,
            escape(w["path"]),
            escape(note),
        )
    console.print(table)


# -- inbox ---------------------------------------------------------------------------------------
class _Seconds(click.ParamType):  # type: ignore[type-arg]
    """A number of seconds above 0 (not NaN, not infinite: JSON can't carry them, and no deadline
    or deferral is that long)."""

    name = "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds; give one like 600", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a number of seconds above 0; give one like 600", param, ctx)
        return seconds


SECONDS = _Seconds()


@cli.command(
    epilog="\b\nExamples:\n  cao send 1a2b3c4d 'please review PR 12'\n"
    "  cao send 1a2b3c4d 'deploy' --from 9f8e7d6c --key deploy-1"
)
@click.argument("receiver_id", callback=server.checked_terminal_id)
@click.argument("message")
@click.option("--from", "sender", default="cli", show_default=True, help="Sender id shown to the receiver.")
@click.option("--key", default=None, help="Idempotency key: a retry with the same key sends nothing new.")
@click.option(
    "--priority",
    type=click.Choice(["urgent", "high", "normal", "low"]),
    default=None,
    help="Served by priority, then order (default: the kind's; a person's chat is high).",
)
@click.option(
    "--if-busy",
    type=click.Choice(["wait", "refuse", "interrupt"]),
    default=None,
    help="If the agent is working: wait (default), refuse (store nothing, exit 1), interrupt "
    "(--priority urgent).",
)
@click.option(
    "--ttl", type=SECONDS, default=None, help="Seconds; still undelivered then: expired, never pasted."
)
@click.option("--kind", default=None, help="chat (default from a name), message, task, notice.")
@click.option("--topic", default=None, help="Notices on one topic from one sender replace each other.")
@click.option("--at", "deliver_at", default=None, help="Not before this time (ISO 8601 with a zone).")
@click.option("--json", "as_json", is_flag=True, help="Print the receipt as JSON.")
@click.pass_context
def send(
    ctx: click.Context,
    /,
    receiver_id: str,
    message: str,
    sender: str,
    key: str | None,
    as_json: bool,
    **attention: Any,
) -> None:
    """Put MESSAGE in a terminal's inbox; it is pasted as soon as the agent is ready (by priority)."""
    body: dict[str, Any] = {"sender_id": sender, "message": message}
    if key:
        body["idempotency_key"] = key
    names = {"ttl": "ttl_seconds"}
    body.update({names.get(k, k): v for k, v in attention.items() if v is not None})
    receipt = server.for_context(ctx).post(f"/terminals/{receiver_id}/inbox/messages", json=body)
    if as_json:
        _print_json(receipt)
    else:
        dup = " (duplicate: already sent with this key)" if receipt["duplicate"] else ""
        console.print(f"message #{receipt['message_id']} queued for {receiver_id}{dup}")


class _InboxGroup(click.Group):
    """``cao inbox [TERMINAL_ID] [options]`` lists (as it always did); ``cao inbox defer|drop|…`` acts."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@cli.group(
    cls=_InboxGroup,
    epilog="\b\nExamples:\n  cao inbox\n  cao inbox 1a2b3c4d --status pending --json\n"
    "  cao inbox show 1a2b3c4d\n  cao inbox defer 42 --for 600 --reason 'after the deploy'\n"
    "  cao inbox drop 42 --reason 'already done'\n  cao inbox prioritize 42 urgent\n  cao inbox read 42",
)
def inbox() -> None:
    """Messages: list them, see an agent's queue and timeline, defer, drop, re-prioritise, read."""


@inbox.command("list", epilog="\b\nExamples:\n  cao inbox\n  cao inbox 1a2b3c4d --status pending --json")
@click.argument("terminal_id", required=False, callback=server.checked_terminal_id)
@click.option("--status", default=None, type=click.Choice(list(MessageStatus)))
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10000))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def inbox_list(
    ctx: click.Context, terminal_id: str | None, status: str | None, limit: int, as_json: bool
) -> None:
    """List messages (of one terminal, or all) with status, age, attempts and why still pending;
    for one terminal also what it attends to and its latest timeline events."""
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    if terminal_id:
        params["receiver_id"] = terminal_id
    client = server.for_context(ctx)
    rows = client.get("/messages", params=params)
    if as_json:
        _print_json(rows)
        return
    view = client.get(f"/terminals/{terminal_id}/attention", params={"limit": 10}) if terminal_id else None
    if not rows:
        console.print("no messages")
        return
    table = Table(title=f"inbox {terminal_id}" if terminal_id else "all messages")
    cols = ["id", "from", *([] if terminal_id else ["to"]), "status", "priority", "age", "read · acked"]
    for col in cols:
        table.add_column(col, no_wrap=col in ("status", "id"))
    for col in ("why / last error", "message"):
        table.add_column(col, overflow="fold")
    for m in rows:
        why = m.get("waiting_reason") or m.get("closed_reason") or m.get("last_error") or ""
        preview = m["message"].replace("\n", " ")
        table.add_row(
            str(m["id"]),
            m["sender_id"],
            *([] if terminal_id else [m["receiver_id"]]),
            _styled(m["status"]),
            str(m.get("priority", "normal")),
            _age(m["created_at"]),
            _facts(m),
            escape(why),
            escape(preview[:60] + ("…" if len(preview) > 60 else "")),
        )
    if view is not None:  # what it attends to, then its messages, then its latest events
        _print_attention(view, instead_of_queue=table)
    else:
        console.print(table)


@inbox.command("show", epilog="\b\nExamples:\n  cao inbox show 1a2b3c4d\n  cao inbox show 1a2b3c4d --json")
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.option(
    "--limit", default=30, show_default=True, type=click.IntRange(1, 10000), help="Timeline events."
)
@click.option("--json", "as_json", is_flag=True, help="Print the attention view as JSON.")
@click.pass_context
def inbox_show(ctx: click.Context, terminal_id: str, limit: int, as_json: bool) -> None:
    """One agent's attention: what it is doing, its queue in serving order, its timeline."""
    view = server.for_context(ctx).get(f"/terminals/{terminal_id}/attention", params={"limit": limit})
    if as_json:
        _print_json(view)
        return
    _print_attention(view)


def _facts(m: dict[str, Any]) -> str:
    """Read and acked, each a separate fact with its own age ("-": not yet)."""
    if m.get("status") != MessageStatus.DELIVERED:
        return ""
    return f"{_age(m.get('read_at'))} · {_age(m.get('acked_at'))}"


def _print_attention(view: dict[str, Any], *, instead_of_queue: Table | None = None) -> None:
    """An agent's attention state, its queue in serving order (or another table) and its timeline,
    for people."""
    terminal_id = view["terminal_id"]
    state = view["attention"]
    on = view.get("working_on")
    if on:
        state += f" on message #{on['message_id']} from {on['sender_id']} since {_age(on['since'])} ago"
    console.print(f"[bold]{terminal_id}[/bold] ({escape(view['name'])}): {escape(state)}")
    table = Table(title="queue (served in this order)")
    for col in ("id", "from", "priority", "kind", "status", "deadline", "why waiting", "message"):
        table.add_column(col, overflow="fold")
    for m in view["queue"]:
        preview = " ".join(m["message"].split())
        table.add_row(
            str(m["id"]),
            m["sender_id"],
            m["priority"],
            m["kind"],
            _styled(m["status"]),
            m.get("expires_at") or "",
            escape(m.get("waiting_reason") or ""),
            escape(preview[:50] + ("…" if len(preview) > 50 else "")),
        )
    if instead_of_queue is not None:
        console.print(instead_of_queue)
    else:
        console.print(table if view["queue"] else "queue: empty")
    if view.get("unacked"):
        unacked = Table(title=f"delivered, not acknowledged (cursor at {view.get('ack_cursor', 0)})")
        for col in ("id", "from", "kind", "delivered", "read", "message"):
            unacked.add_column(col, overflow="fold")
        for m in view["unacked"]:
            preview = " ".join(m["message"].split())
            unacked.add_row(
                str(m["id"]),
                m["sender_id"],
                m["kind"],
                f"{_age(m['delivered_at'])} ago",
                _age(m.get("read_at")),
                escape(preview[:50] + ("…" if len(preview) > 50 else "")),
            )
        console.print(unacked)
    timeline = Table(title="timeline")
    for col in ("at", "event", "message", "by", "reason"):
        timeline.add_column(col, overflow="fold")
    for e in view["timeline"]:
        timeline.add_row(
            e["at"][11:19],
            e["event"],
            f"#{e['message_id']}" if e["message_id"] else "",
            escape(e.get("actor") or ""),
            escape(e.get("reason") or ""),
        )
    console.print(timeline)


def _changed(ctx: click.Context, message_id: int, action: str, body: dict[str, Any], as_json: bool) -> None:
    m = server.for_context(ctx).post(f"/messages/{message_id}/{action}", json=body)
    if as_json:
        _print_json(m)
        return
    when = f" until {m['deliver_at']}" if action == "defer" else ""
    console.print(f"message #{m['id']}: {m['status']}, {m['priority']}{when}")


_BY = click.option("--by", default=None, help="Who you are (default: operator).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the message as JSON.")


@inbox.command(
    "defer",
    epilog="\b\nExamples:\n  cao inbox defer 42 --for 600\n"
    "  cao inbox defer 42 --until 2026-12-02T09:00:00Z --reason 'tomorrow'",
)
@click.argument("message_id", callback=server.checked_message_id)
@click.option("--for", "seconds", type=SECONDS, default=None, help="Seconds from now.")
@click.option("--until", default=None, help="A time (ISO 8601 with a zone).")
@click.option("--reason", default=None, help="Why (on the timeline).")
@_BY
@_JSON
@click.pass_context
def inbox_defer(ctx: click.Context, /, message_id: int, as_json: bool, **body: Any) -> None:
    """Hold a pending message until a time: not delivered before it, though its agent is idle."""
    if (body["seconds"] is None) == (body["until"] is None):
        raise click.UsageError("say until when: give --for SECONDS or --until TIME, one of them", ctx)
    _changed(ctx, message_id, "defer", {k: v for k, v in body.items() if v is not None}, as_json)


@inbox.command("drop", epilog="\b\nExample:\n  cao inbox drop 42 --reason 'superseded by the new plan'")
@click.argument("message_id", callback=server.checked_message_id)
@click.option("--reason", required=True, help="Why (kept with the message).")
@_BY
@_JSON
@click.pass_context
def inbox_drop(ctx: click.Context, /, message_id: int, as_json: bool, **body: Any) -> None:
    """Drop a pending message: it is never delivered; the reason is kept with it."""
    _changed(ctx, message_id, "drop", {k: v for k, v in body.items() if v is not None}, as_json)


@inbox.command(
    "prioritize", epilog="\b\nExample:\n  cao inbox prioritize 42 urgent --reason 'blocks the release'"
)
@click.argument("message_id", callback=server.checked_message_id)
@click.argument("priority", type=click.Choice(["urgent", "high", "normal", "low"]))
@click.option("--reason", default=None, help="Why (on the timeline).")
@_BY
@_JSON
@click.pass_context
def inbox_prioritize(ctx: click.Context, /, message_id: int, as_json: bool, **body: Any) -> None:
    """Change a pending message's priority (its queue is served by priority, then order)."""
    _changed(ctx, message_id, "prioritize", {k: v for k, v in body.items() if v is not None}, as_json)


@inbox.command("read", epilog="\b\nExamples:\n  cao inbox read 42\n  cao inbox read 42 > body.txt")
@click.argument("message_id", callback=server.checked_message_id)
@_JSON
@click.pass_context
def inbox_read(ctx: click.Context, message_id: int, as_json: bool) -> None:
    """Print a message's whole body, byte for byte (a long one is announced in the pane, not typed)."""
    m = server.for_context(ctx).post(f"/messages/{message_id}/read", json={})
    if as_json:
        _print_json(m)
        return
    sys.stdout.write(m["message"])
    sys.stdout.flush()


@cli.command(epilog="\b\nExamples:\n  cao message 42\n  cao message 42 --json")
@click.argument("message_id", callback=server.checked_message_id)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_context
def message(ctx: click.Context, message_id: int, as_json: bool) -> None:
    """Show one message's whole lifecycle."""
    data = server.for_context(ctx).get(f"/messages/{message_id}")
    if as_json:
        _print_json(data)
        return
    table = Table(show_header=False, title=f"message #{data['id']}")
    for key in (
        "status",
        "sender_id",
        "receiver_id",
        "created_at",
        "claimed_at",
        "delivered_at",
        "attempts",
        "last_error",
        "waiting_reason",
        "idempotency_key",
    ):
        value = data.get(key)
        if key.endswith("_at") and value is not None:
            when = time.localtime(epoch(value))
            value = time.strftime("%Y-%m-%d %H:%M:%S", when) + f" ({_age(value)} ago)"
        table.add_row(
            key, _styled(str(value)) if key == "status" else str(value if value is not None else "-")
        )
    table.add_row("message", escape(data["message"]))
    console.print(table)


@cli.command(epilog="Example:\n\n\b\n  cao cancel 42")
@click.argument("message_id", callback=server.checked_message_id)
@click.pass_context
def cancel(ctx: click.Context, message_id: int) -> None:
    """Cancel a pending message (it will not be delivered)."""
    data = server.for_context(ctx).post(f"/messages/{message_id}/cancel")
    console.print(f"message #{data['id']} {data['status']}")


# -- a session's coordination board ------------------------------------------------------------
@cli.group(
    epilog="\b\nExamples:\n  cao board list demo\n  cao board get demo build/status\n"
    "  cao board set demo build/status green --expected-version 0\n"
    "  cao board set demo plan '{\"step\": 2}' --json-value --expected-version 3\n"
    "  cao board rm demo build/status --expected-version 1",
)
def board() -> None:
    """A session's coordination board: versioned facts its agents share, that wake no one.

    A write names the version it replaces (--expected-version: 0 for a key that must not exist
    yet); if someone wrote the key since, nothing is written and the current version is shown
    (exit 1). Writing never types anything into any agent's pane.
    """


def _value_text(value: Any, width: int | None = None) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _facts_table(title: str, facts: list[dict[str, Any]], *, history: bool = False) -> Table:
    table = Table(title=title)
    for col in (
        ("version", "key", "value", "writer", "age") if not history else ("version", "value", "writer", "age")
    ):
        table.add_column(col, overflow="fold", no_wrap=col in ("version", "age"))
    for f in facts:
        value = "[dim](deleted)[/dim]" if f["deleted"] else escape(_value_text(f["value"], 60))
        cells = [str(f["version"]), *([] if history else [escape(f["key"])]), value]
        table.add_row(*cells, escape(f["writer"]), f"{_age(f['at'])} ago")
    return table


def _board_write(ctx: click.Context, method: str, path: str, **kwargs: Any) -> Any:
    """The write's answer, or exit 1 with the server's words; a conflict also shows the current one."""
    client = server.for_context(ctx)
    resp = client.response(method, path, **kwargs)
    if resp.status_code == 409 and "current_version" in resp.json():
        body = resp.json()
        now = "deleted" if body.get("current_deleted") else _value_text(body.get("current_value"), 200)
        raise click.ClickException(
            f"{body['detail']} (HTTP 409)\ncurrent: version {body['current_version']}: {now}"
        )
    return client.answer(resp)


@board.command(
    "list", epilog="\b\nExamples:\n  cao board list demo\n  cao board list demo --prefix build/ --json"
)
@click.argument("session")
@click.option("--prefix", default=None, help="Only keys that start with this.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of facts.")
@click.pass_context
def board_list(ctx: click.Context, session: str, prefix: str | None, as_json: bool) -> None:
    """List a session's facts (current versions), sorted by key."""
    facts = server.for_context(ctx).get(board_path(session), params={"prefix": prefix} if prefix else None)
    if as_json:
        _print_json(facts)
        return
    if not facts:
        console.print(
            f"no facts{f' starting with {escape(prefix)}' if prefix else ''} on {escape(session)}'s board"
        )
        return
    console.print(_facts_table(f"board of {facts[0]['session_name']}", facts))


@board.command(
    "get",
    epilog="\b\nExamples:\n  cao board get demo build/status\n  cao board get demo build/status --history\n"
    "  cao board get demo build/status --json | jq .value",
)
@click.argument("session")
@click.argument("key")
@click.option("--history", is_flag=True, help="Every kept version, newest first (deletions too).")
@click.option("--json", "as_json", is_flag=True, help="Print the fact (or its versions) as JSON.")
@click.pass_context
def board_get(ctx: click.Context, session: str, key: str, history: bool, as_json: bool) -> None:
    """Show one fact: its value, version, writer and age."""
    params = {"history": "true"} if history else None
    data = server.for_context(ctx).get(board_path(session, key), params=params)
    if as_json:
        _print_json(data)
    elif history:
        console.print(_facts_table(f"{escape(key)} on {data[0]['session_name']}'s board", data, history=True))
    else:
        table = Table(show_header=False, title=f"{escape(key)} on {data['session_name']}'s board")
        table.add_row("version", str(data["version"]))
        table.add_row("writer", escape(data["writer"]))
        table.add_row("written", f"{data['at']} ({_age(data['at'])} ago)")
        table.add_row("value", escape(json.dumps(data["value"], ensure_ascii=False, indent=2)))
        console.print(table)


_EXPECTED = click.option(
    "--expected-version",
    "expected_version",
    type=click.IntRange(0),
    required=True,
    help="The version this replaces (`cao board get` shows it); 0: the key must not exist yet.",
)
_WRITER = click.option("--by", default="cli", show_default=True, help="Who writes (shown as the writer).")


@board.command(
    "set",
    epilog="\b\nExamples:\n  cao board set demo build/status green --expected-version 0\n"
    '  cao board set demo plan \'{"step": 2, "owner": "1a2b3c4d"}\' --json-value --expected-version 3',
)
@click.argument("session")
@click.argument("key")
@click.argument("value")
@_EXPECTED
@click.option(
    "--json-value", is_flag=True, help="VALUE is JSON (a number, a list, an object…), not a string."
)
@_WRITER
@click.option("--json", "as_json", is_flag=True, help="Print the new version as JSON.")
@click.pass_context
def board_set(
    ctx: click.Context,
    session: str,
    key: str,
    value: str,
    expected_version: int,
    json_value: bool,
    by: str,
    as_json: bool,
) -> None:
    """Write VALUE to KEY over --expected-version. Types nothing into any pane."""
    parsed: Any = value
    if json_value:
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise click.BadParameter(
                f"not JSON ({exc}); quote a JSON value, or leave out --json-value", param_hint="VALUE"
            ) from None
    body = {"value": parsed, "expected_version": expected_version, "by": by}
    fact = _board_write(ctx, "PUT", board_path(session, key), json=body)
    if as_json:
        _print_json(fact)
    else:
        console.print(
            f"{escape(fact['key'])} is at version {fact['version']} on {fact['session_name']}'s board"
        )


@board.command("rm", epilog="\b\nExample:\n  cao board rm demo build/status --expected-version 4")
@click.argument("session")
@click.argument("key")
@_EXPECTED
@_WRITER
@click.option("--json", "as_json", is_flag=True, help="Print the deletion (a version of its own) as JSON.")
@click.pass_context
def board_rm(
    ctx: click.Context, session: str, key: str, expected_version: int, by: str, as_json: bool
) -> None:
    """Delete KEY at --expected-version; its history stays (`cao board get --history`)."""
    params = {"expected_version": expected_version, "by": by}
    fact = _board_write(ctx, "DELETE", board_path(session, key), params=params)
    if as_json:
        _print_json(fact)
    else:
        console.print(
            f"{escape(fact['key'])} deleted (version {fact['version']}) from {fact['session_name']}'s board"
        )


@cli.command(epilog="\b\nExamples:\n  cao dashboard\n  cao dashboard --open")
@click.option("--open", "open_", is_flag=True, help="Open it in the default web browser too.")
@click.pass_context
def dashboard(ctx: click.Context, open_: bool) -> None:
    """Print the web dashboard's address (with a one-time login link when a token is set).

    The link works once, within two minutes: run the command again for another."""
    client = server.for_context(ctx)
    client.get("/health")  # reachable?
    path = "/"
    if apitoken.read(server.settings()):
        path = str(client.post("/login-codes")["url"])
    url = f"{client.base_url}{path}"
    console.print(f"dashboard: [bold]{url}[/]")
    if open_:
        import webbrowser

        webbrowser.open(url)


@cli.command(
    epilog="\b\nExamples:\n  cao watch\n  cao watch --json --for 60 > events.jsonl\n"
    "  cao watch --attention      # who waits for a person, who failed, what finished"
)
@click.option("--json", "as_json", is_flag=True, help="Print every event as a JSON line instead of tables.")
@click.option("--for", "duration", type=click.FloatRange(0.1), default=None, help="Stop after SECONDS.")
@click.option(
    "--attention", is_flag=True, help="Only what needs a person: workers blocked, failed, finished, exited."
)
@click.pass_context
def watch(ctx: click.Context, as_json: bool, duration: float | None, attention: bool) -> None:
    """Follow the fleet live: statuses and messages as they change (cao-server's event stream)."""
    from cao.watch import Watcher

    Watcher(
        server.for_context(ctx), as_json=as_json, duration=duration, console=console, attention=attention
    ).run()


@cli.command("profiles", epilog="\b\nExamples:\n  cao profiles\n  cao profiles --json | jq '.[].name'")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list (with each system prompt).")
@click.pass_context
def profiles_(ctx: click.Context, as_json: bool) -> None:
    """List agent profiles: built-in ones and those installed in cao-server's agent store."""
    rows = server.for_context(ctx).get("/profiles")
    if as_json:
        _print_json(rows)
        return
    table = Table(title="agent profiles")
    for col in ("name", "description", "provider", "source"):
        table.add_column(col, overflow="fold")
    for p in rows:
        table.add_row(p["name"], escape(p["description"]), p["provider"] or "-", escape(p["source"]))
    console.print(table)


REQUEST_SOURCE = "the request"  # how cao-server names a profile text it was sent


@cli.command(
    "install",
    epilog="\b\nExamples:\n  cao install ./profiles/tester.md\n"
    "  cao install reviewer        # copy the built-in into the store to edit it",
)
@click.argument("name_or_path")
@click.option("--json", "as_json", is_flag=True, help="Print the installed profile as JSON.")
@click.pass_context
def install(ctx: click.Context, name_or_path: str, as_json: bool) -> None:
    """Install an agent profile (a .md file, or a built-in's NAME) into cao-server's agent store
    ($CAO_HOME/agent-store).

    The file is read here and sent to the server, which validates it before writing anything; an
    installed profile replaces one of the same name.
    """
    path = Path(name_or_path).expanduser()
    if path.is_file():
        try:
            body = {"text": path.read_text(encoding="utf-8")}
        except (OSError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"can't read {path}: {exc}; pass a UTF-8 profile .md file") from None
    elif os.sep in name_or_path or name_or_path.endswith(".md"):
        raise click.ClickException(f"no profile file at {path}; pass an existing .md file or a built-in name")
    else:
        body = {"builtin": name_or_path}
    try:
        profile = server.for_context(ctx).post("/profiles", json=body)
    except click.ClickException as exc:  # name the file, as a local install did, not "the request"
        if "text" in body and exc.message.startswith(f"{REQUEST_SOURCE}:"):
            raise click.ClickException(f"{path}{exc.message.removeprefix(REQUEST_SOURCE)}") from None
        raise
    if as_json:
        _print_json(profile)
    else:
        console.print(f"installed profile [bold]{profile['name']}[/] at {escape(profile['path'])}")


@cli.command(
    epilog="\b\nExamples:\n  cao demo\n  cao demo --keep   # leave the agents running to look at\n"
    "  cao demo --worktrees\n  cao demo --coordination   # results as data, a 'blocked' notice, no polling"
)
@click.option("--keep", is_flag=True, help="Leave the server and agents running (prints how to attach).")
@click.option("--timeout", default=60.0, show_default=True, help="Give up after this many seconds.")
@click.option(
    "--worktrees",
    is_flag=True,
    help="Give each worker its own git worktree, then merge both branches into the supervisor's.",
)
@click.option(
    "--coordination",
    is_flag=True,
    help="A lead gets a worker's structured result and another's 'blocked on a permission prompt' notice.",
)
def demo(keep: bool, timeout: float, worktrees: bool, coordination: bool) -> None:
    """Watch three scripted agents coordinate through the inbox (no API key needed)."""
    if coordination:
        from cao.demo_coord import run as run_coordination

        run_coordination(keep, timeout)
        return
    from cao.demo import run

    run(keep, timeout, worktrees)


def main() -> NoReturn:
    try:
        cli.main(prog_name="cao", standalone_mode=True)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(1)
    sys.exit(0)


from cao import clicoord, cliexplain, clihosts, cliusage  # noqa: E402, F401 - they register their commands on the group above

if __name__ == "__main__":
    main()
