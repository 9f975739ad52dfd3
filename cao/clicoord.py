"""``cao`` commands for coordination (docs/orchestration.md): acknowledge, results, wake-up
schedules, the operator's notifications. Registered on cao/cli.py's group when it loads."""

from __future__ import annotations

import re
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from cao import client as server
from cao.cli import _age, _print_json, _styled, cli, console, inbox

_JSON = click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
_BY = click.option("--by", default=None, help="Who you are (default: operator).")
SPAN_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?$")
UNITS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}


def _span(value: str | None, name: str) -> float | None:
    """``90``, ``90s``, ``10m``, ``2h`` → seconds."""
    if value is None:
        return None
    m = SPAN_RE.match(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a duration; use e.g. 90s, 10m or 2h", param_hint=name)
    return float(m.group(1)) * UNITS[m.group(2)]


@inbox.command(
    "ack",
    epilog="\b\nExamples:\n  cao inbox ack 1a2b3c4d --through 42\n"
    "  cao inbox ack 1a2b3c4d --through 42 --expected 40\n  cao inbox ack 1a2b3c4d --ids 42,43",
)
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.option("--through", type=click.IntRange(0), default=None, help="Everything delivered up to this id.")
@click.option("--expected", type=click.IntRange(0), default=None, help="The cursor you saw (else 409).")
@click.option("--ids", default=None, help="Or these message ids (comma-separated).")
@_BY
@_JSON
@click.pass_context
def inbox_ack(
    ctx: click.Context,
    terminal_id: str,
    through: int | None,
    expected: int | None,
    ids: str | None,
    by: str | None,
    as_json: bool,
) -> None:
    """Acknowledge messages a terminal has handled (its forward-only cursor, or by ids)."""
    body: dict[str, Any] = {"by": by} if by else {}
    if through is not None:
        body["through_message_id"] = through
    if expected is not None:
        body["expected"] = expected
    if ids:
        try:
            body["message_ids"] = [int(i) for i in ids.split(",") if i.strip()]
        except ValueError:
            raise click.BadParameter(
                "give message ids as numbers, e.g. --ids 42,43", param_hint="--ids"
            ) from None
    out = server.for_context(ctx).post(f"/terminals/{terminal_id}/ack", json=body)
    if as_json:
        _print_json(out)
        return
    what = (
        f"acknowledged {len(out['acked'])} message(s)"
        if out["acked"]
        else "nothing new (already acknowledged)"
    )
    console.print(f"{terminal_id}: {what}; cursor at {out['ack_cursor']}")


@cli.command(
    epilog="\b\nExamples:\n  cao results 1a2b3c4d\n  cao results 1a2b3c4d --json | jq '.[0].details'"
)
@click.argument("terminal_id", callback=server.checked_terminal_id)
@_JSON
@click.pass_context
def results(ctx: click.Context, terminal_id: str, as_json: bool) -> None:
    """The results a worker reported (report_result), newest first."""
    rows = server.for_context(ctx).get(f"/terminals/{terminal_id}/results")
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print(f"{terminal_id} has reported no result")
        return
    table = Table(title=f"results of {terminal_id}")
    for col in ("id", "task", "status", "to", "age", "summary"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            str(r["result_id"]),
            r["task_id"],
            r["status"],
            r["supervisor_id"] or "",
            _age(r["created_at"]),
            escape(r["summary"][:200]),
        )
    console.print(table)


@cli.command(epilog="\b\nExamples:\n  cao notifications\n  cao notifications --terminal 1a2b3c4d --json")
@click.option("--terminal", "terminal_id", default=None, help="Only this terminal's.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 1000))
@_JSON
@click.pass_context
def notifications(ctx: click.Context, terminal_id: str | None, limit: int, as_json: bool) -> None:
    """Worker events the operator hears about: finished, blocked at a prompt, failed, exited (with
    the webhook's state when CAO_NOTIFY_URL is set). Live: `cao watch --attention`."""
    params: dict[str, Any] = {"limit": limit, **({"terminal_id": terminal_id} if terminal_id else {})}
    rows = server.for_context(ctx).get("/notifications", params=params)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("no notifications")
        return
    console.print(notifications_table(rows))


def notifications_table(rows: list[dict[str, Any]], title: str = "notifications") -> Table:
    table = Table(title=title, expand=True)
    for col in ("id", "age", "terminal", "event", "reason", "notice", "webhook"):
        table.add_column(col, overflow="fold")
    for n in reversed(rows):
        hook = n.get("webhook") or "-"
        if n.get("webhook_error"):
            hook += f" ({n['webhook_error']})"
        table.add_row(
            str(n["id"]),
            _age(n["at"]),
            n["terminal_id"],
            _styled(_EVENT_STYLE.get(n["event"], n["event"])),
            escape(n.get("reason") or ""),
            f"#{n['message_id']} → {n['supervisor_id']}" if n.get("message_id") else "",
            escape(hook),
        )
    return table


_EVENT_STYLE = {
    "blocked": "waiting_user_answer",
    "failed": "error",
    "finished": "completed",
    "exited": "gone",
}


@cli.group(
    epilog="\b\nExamples:\n  cao schedule add 1a2b3c4d 'check the CI run' --in 10m\n"
    "  cao schedule add 1a2b3c4d 'stand-up: report progress' --in 0 --every 30m\n"
    "  cao schedule list\n  cao schedule rm 3"
)
def schedule() -> None:
    """Wake-ups: a message to an agent later, once or every N minutes (durable, one per slot)."""


@schedule.command(
    "add",
    epilog="\b\nExamples:\n  cao schedule add 1a2b3c4d 'check the CI run' --in 10m\n"
    "  cao schedule add 1a2b3c4d 'nightly summary' --at 2026-12-03T06:00:00Z --every 24h",
)
@click.argument("terminal_id", callback=server.checked_terminal_id)
@click.argument("message")
@click.option("--in", "in_", default=None, help="In this long: 90s, 10m, 2h (or give --at).")
@click.option("--at", default=None, help="At this time (ISO 8601 with a zone).")
@click.option("--every", default=None, help="Then again every: 30m, 1h (default: once).")
@_BY
@_JSON
@click.pass_context
def schedule_add(
    ctx: click.Context,
    terminal_id: str,
    message: str,
    in_: str | None,
    at: str | None,
    every: str | None,
    by: str | None,
    as_json: bool,
) -> None:
    """Schedule a wake-up for a terminal."""
    if (in_ is None) == (at is None):
        raise click.UsageError("say when: give --in or --at (one of them)")
    body: dict[str, Any] = {"message": message, **({"by": by} if by else {})}
    if in_ is not None:
        body["in_seconds"] = _span(in_, "--in")
    if at is not None:
        body["at"] = at
    if every is not None:
        body["every_seconds"] = _span(every, "--every")
    s = server.for_context(ctx).post(f"/terminals/{terminal_id}/schedules", json=body)
    if as_json:
        _print_json(s)
        return
    again = f", then every {s['every_seconds']:g} s" if s["every_seconds"] else ""
    console.print(f"wake-up {s['id']} for {terminal_id}: first at {s['first_at']}{again}")


@schedule.command("list", epilog="\b\nExamples:\n  cao schedule list\n  cao schedule list 1a2b3c4d --all")
@click.argument("terminal_id", required=False, callback=server.checked_terminal_id)
@click.option("--all", "all_", is_flag=True, help="Cancelled and finished ones too.")
@_JSON
@click.pass_context
def schedule_list(ctx: click.Context, terminal_id: str | None, all_: bool, as_json: bool) -> None:
    """List wake-ups (active ones unless --all)."""
    params: dict[str, Any] = {"active": "false" if all_ else "true"}
    if terminal_id:
        params["receiver_id"] = terminal_id
    rows = server.for_context(ctx).get("/schedules", params=params)
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("no wake-ups")
        return
    table = Table(title="wake-ups")
    for col in ("id", "for", "state", "next", "every", "slots", "by", "message"):
        table.add_column(col, overflow="fold")
    for s in rows:
        delivered = sum(1 for m in s["slots"] if m["delivered_at"])
        table.add_row(
            str(s["id"]),
            s["receiver_id"],
            s["state"],
            s["next_at"] or "-",
            f"{s['every_seconds']:g} s" if s["every_seconds"] else "once",
            f"{delivered}/{len(s['slots'])} delivered"
            + (f", {s['skipped']} skipped" if s["skipped"] else ""),
            escape(s["created_by"]),
            escape(" ".join(s["message"].split())[:60]),
        )
    console.print(table)


@schedule.command("rm", epilog="\b\nExample:\n  cao schedule rm 3")
@click.argument("schedule_id")
@_BY
@_JSON
@click.pass_context
def schedule_rm(ctx: click.Context, schedule_id: str, by: str | None, as_json: bool) -> None:
    """Cancel a wake-up (its slots still waiting are cancelled too)."""
    s = server.for_context(ctx).post(f"/schedules/{schedule_id}/cancel", json={"by": by} if by else {})
    if as_json:
        _print_json(s)
        return
    console.print(f"wake-up {s['id']}: {s['state']}")
