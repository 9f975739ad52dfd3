"""``cao usage``: what each agent has cost (tokens, USD), per task and model, and the budgets
(docs/usage.md). Registered on cao/cli.py's group when it loads."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from cao import client as server
from cao import usage as book
from cao.cli import _print_json, cli, console, usage_cell
from cao.settings import Settings


def _money(value: Any) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _tokens_table(title: str, rows: list[dict[str, Any]], key: str) -> Table:
    table = Table(title=title)
    for col in (key, "input", "output", "cache read", "cache write", "responses", "cost"):
        table.add_column(col, justify="left" if col == key else "right")
    for r in rows:
        table.add_row(
            escape(str(r.get(key) or "-")),
            f"{r['input_tokens']:,}",
            f"{r['output_tokens']:,}",
            f"{r['cache_read_tokens']:,}",
            f"{r['cache_write_tokens']:,}",
            str(r["responses"]),
            _money(r["cost_usd"]),
        )
    return table


@cli.command(
    epilog="\b\nExamples:\n  cao usage\n  cao usage --session team\n  cao usage 1a2b3c4d\n"
    "  cao usage 1a2b3c4d --json\n  cao usage --check      (check prices.toml and budgets.toml)"
)
@click.argument("terminal_id", required=False, callback=server.checked_terminal_id)
@click.option("--session", callback=server.checked_session_name, help="Only this session's terminals.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.option(
    "--check", is_flag=True, help="Check $CAO_HOME/prices.toml and budgets.toml here (no server needed)."
)
@click.pass_context
def usage(
    ctx: click.Context, terminal_id: str | None, session: str | None, as_json: bool, check: bool
) -> None:
    """Tokens and cost of each agent, read from its CLI's own records (transcripts, session
    files), priced by $CAO_HOME/prices.toml over the built-in list prices; with TERMINAL_ID, per
    task and per model. "unknown" where a CLI records nothing (never 0). Budgets
    ($CAO_HOME/budgets.toml) are shown with what they have used."""
    if terminal_id and session:
        raise click.UsageError("give a terminal id or --session, not both")
    if check and (terminal_id or session):
        raise click.UsageError("--check reads the files only; it takes no terminal id or --session")
    if check:
        home = Settings.from_env().home
        try:
            config = book.load_config(home)
        except book.UsageConfigError as exc:
            raise click.ClickException(exc.message) from None
        console.print(
            f"ok: {len(config.prices)} price entries of yours (before {len(book.BUILTIN_PRICES)} built-in), "
            f"{len(config.budgets)} budgets ({home})"
        )
        return
    client = server.for_context(ctx)
    if terminal_id:
        data = client.get(f"/terminals/{terminal_id}/usage")
        if as_json:
            _print_json(data)
            return
        if not data.get("known"):
            console.print(f"{terminal_id}: usage unknown ({escape(str(data.get('why')))})")
            return
        console.print(
            f"{terminal_id} ({escape(data['provider'])}): {data['tokens']:,} tokens, "
            f"{data['responses']} responses, {_money(data['cost_usd'])}"
        )
        if data.get("unpriced_models"):
            console.print(
                f"[yellow]no price for:[/] {escape(', '.join(data['unpriced_models']))} (prices.toml)"
            )
        console.print(_tokens_table("per task", data["by_task"], "task_id"))
        console.print(_tokens_table("per model", data["by_model"], "model"))
        if data.get("budget_hold"):
            console.print(f"[yellow]{escape(data['budget_hold'])}[/yellow]")
        return
    data = client.get(f"/sessions/{session}/usage" if session else "/usage")
    if as_json:
        _print_json(data)
        return
    table = Table(title="cao usage")
    for col in ("session", "terminal", "profile", "provider", "state", "tokens · cost"):
        table.add_column(col)
    for t in data["terminals"]:
        table.add_row(
            t["session_name"], t["terminal_id"], t["agent_profile"], t["provider"], t["state"], usage_cell(t)
        )
    console.print(table)
    total = data["total"]
    unknown = f", {data['terminals_unknown']} with unknown usage" if data["terminals_unknown"] else ""
    console.print(f"total: {total['tokens']:,} tokens, {_money(total['cost_usd'])}{unknown}")
    for b in data["budgets"]:
        limits = " and ".join(
            x
            for x in (
                b["usd"] is not None and f"${b['usd']:.2f}",
                b["tokens"] is not None and f"{int(b['tokens']):,} tokens",
            )
            if x
        )
        spent = _money(b["spent_usd"])
        if b["spent_usd"] is None and b.get("spent_usd_known"):  # a model has no price
            spent = f"at least ${b['spent_usd_known']:.2f}"
        console.print(
            f"budget {b['scope']} {escape(b['name'])} ({escape(b['applies_to'])}): {limits}; used "
            f"{spent}, {b['spent_tokens']:,} tokens — {b['state']}"
        )
