"""``cao explain`` and ``cao rules``: why an agent reads the status it does, and the screen rules
a user can fix (docs/providers.md). Registered on cao/cli.py's group when it loads."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

import providers
from cao import client as server
from cao import screenrules
from cao.cli import _print_json, cli, console
from cao.errors import CaoError
from cao.settings import Settings
from providers import rules


def _offline_rules(provider: str, rules_file: Path | None) -> None:
    """Put the user's override files in effect here, as cao-server would at start (or, with
    ``--rules``, that draft file for this provider instead of its own)."""
    try:
        if rules_file is not None:
            owner = screenrules.owner_for(provider)
            rules.reset_overrides()
            rules.apply_overrides(owner, screenrules.read_file(rules_file, owner))
        else:
            screenrules.install(Settings.from_env().home)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None


@cli.command(
    epilog="\b\nExamples:\n  cao explain 1a2b3c4d\n  cao explain 1a2b3c4d --report > misread.md\n"
    "  cao explain --screen saved.txt --provider claude_code\n"
    "  cao explain --screen saved.txt --provider qwen_code --rules draft.rules"
)
@click.argument("terminal_id", required=False, callback=server.checked_terminal_id)
@click.option(
    "--screen",
    "screen_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Read a saved screen (capture-pane -p) offline instead of a live terminal.",
)
@click.option("--provider", default=None, help="With --screen: the provider that reads it.")
@click.option(
    "--rules",
    "rules_file",
    type=click.Path(path_type=Path),
    default=None,
    help="With --screen: try this override file instead of $CAO_HOME/providers/<provider>.rules.",
)
@click.option("--report", is_flag=True, help="Print a bug report: this explanation and the redacted screen.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@click.pass_context
def explain(
    ctx: click.Context,
    terminal_id: str | None,
    screen_file: Path | None,
    provider: str | None,
    rules_file: Path | None,
    report: bool,
    as_json: bool,
) -> None:
    """Why an agent reads the status it does: what decided it (pane, screen or the CLI's hook),
    the provider's rules that matched and on which lines, the input box, the latest hook event,
    and for `unknown` the rules that came closest.

    With --screen FILE --provider NAME it reads a saved screen offline, with your override files
    (or the --rules draft), the way cao-server would."""
    from cao import explain as ex

    if screen_file is None:
        if terminal_id is None:
            raise click.UsageError("give a terminal id, or --screen FILE --provider NAME for a saved screen")
        if provider or rules_file:
            raise click.UsageError("--provider and --rules go with --screen (a live terminal has its own)")
        data = server.for_context(ctx).get(f"/terminals/{terminal_id}/explain", params={"report": report})
        if report:
            click.echo(data["bug_report"])
        elif as_json:
            _print_json(data)
        else:
            click.echo(ex.render(data))
        return
    if terminal_id is not None:
        raise click.UsageError("give a terminal id or --screen, not both")
    if not provider:
        raise click.UsageError(f"--screen needs --provider NAME; one of: {', '.join(providers.names())}")
    try:
        reader = providers.get(provider)
        screen = ex.read_screen_file(screen_file)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    _offline_rules(provider, rules_file)
    data = ex.explain_screen(reader, screen)
    if report:
        click.echo(ex.bug_report(data, screen, homes=(str(Path.home()),)))
    elif as_json:
        _print_json(data)
    else:
        click.echo(ex.render(data))


@cli.command(
    "rules",
    epilog="\b\nExamples:\n  cao rules claude_code\n  cao rules qwen_code --json\n"
    "  cao rules qwen_code --check draft.rules",
)
@click.argument("provider")
@click.option(
    "--check",
    "check_file",
    type=click.Path(path_type=Path),
    default=None,
    help="Check this override file for PROVIDER (errors name the line) without using it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rules as JSON.")
def rules_(provider: str, check_file: Path | None, as_json: bool) -> None:
    """The named screen rules PROVIDER reads with, and the overrides in effect from
    $CAO_HOME/providers/<owner>.rules (docs/providers.md: the file's format)."""
    try:
        owner = screenrules.owner_for(provider)
        if check_file is not None:
            found = screenrules.read_file(check_file, owner)
            console.print(f"{escape(str(check_file))}: ok, {len(found)} rule(s) changed for {owner}")
            return
        screenrules.install(Settings.from_env().home)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    own = rules.rules_of(owner)
    shared = rules.shared_rules()
    rows = [
        {
            "rule": r.name,
            "owner": r.owner,
            "pattern": r.pattern,
            "built_in": r.default.pattern,
            "override": r.origin or None,
            "doc": r.doc or None,
        }
        for r in [*own.values(), *shared.values()]
    ]
    if as_json:
        _print_json(
            {
                "provider": provider,
                "file": str(rules.override_path(Settings.from_env().home, owner)),
                "rules": rows,
            }
        )
        return
    table = Table(title=f"{provider}: screen rules (override file: $CAO_HOME/providers/{owner}.rules)")
    for col in ("rule", "pattern", "override"):
        table.add_column(col, overflow="fold")
    for row in rows:
        name = row["rule"] if row["owner"] != rules.SHARED else f"[dim]{row['rule']} (shared)[/dim]"
        table.add_row(name, escape(str(row["pattern"])), escape(str(row["override"] or "")))
    console.print(table)
