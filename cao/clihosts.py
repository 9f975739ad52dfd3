"""``cao hosts``: the cao-servers sharing a store (docs/multi-host.md). Registered on cao/cli.py's
group when it loads."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from cao import client as server
from cao.cli import _print_json, cli, console
from cao.names import quote_segment, validate_host_name


def _checked_host(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from cao.errors import InvalidInput

    try:
        return validate_host_name(value)
    except InvalidInput as exc:
        raise click.BadParameter(exc.message) from None


@cli.group(
    invoke_without_command=True,
    epilog="\b\nExamples:\n  cao hosts\n  cao hosts --json\n  cao hosts fail build-2 --reason 'disk died'",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of hosts.")
@click.pass_context
def hosts(ctx: click.Context, as_json: bool) -> None:
    """The cao-servers sharing this store: alive or not, version, heartbeat, agents."""
    if ctx.invoked_subcommand is not None:
        return
    rows = server.for_context(ctx).get("/hosts")
    if as_json:
        _print_json(rows)
        return
    if not rows:
        console.print("no hosts yet (a cao-server registers itself when it starts)")
        return
    table = Table(title="cao hosts")
    for col in ("host", "state", "url", "version", "heartbeat", "agents", "note"):
        table.add_column(col, no_wrap=col in ("host", "url"))
    for h in rows:
        state = h["state"] + (" (this one)" if h.get("this_host") else "")
        colour = "green" if h["alive"] else "red"
        table.add_row(
            escape(h["name"]),
            f"[{colour}]{escape(state)}[/]",
            escape(h["url"]),
            escape(h["version"]),
            f"{h['heartbeat_age']:.1f}s ago",
            str(h["agents"]),
            escape(h.get("note") or ""),
        )
    console.print(table)


@hosts.command(
    "fail",
    epilog="\b\nExample:\n  cao hosts fail build-2 --reason 'machine lost'\n\n"
    "Its terminals become gone and their undelivered mail fails (receiver_gone); a host whose lease "
    "is live is refused. Its name is then free for another machine.",
)
@click.argument("name", callback=_checked_host)
@click.option("--reason", required=True, help="Why (kept with the host and its terminals).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def hosts_fail(ctx: click.Context, name: str, reason: str, as_json: bool) -> None:
    """Give up on a host that is down: its terminals are gone for good, their mail fails."""
    done = server.for_context(ctx).post(f"/hosts/{quote_segment(name)}/fail", json={"reason": reason})
    if as_json:
        _print_json(done)
        return
    console.print(
        f"host {escape(name)} failed: {len(done['terminals_gone'])} terminal(s) gone, "
        f"{done['messages_failed']} message(s) failed"
    )


@cli.group(epilog="\b\nExample:\n  CAO_DATABASE_URL=postgresql://cao@db/cao cao db copy")
def db() -> None:
    """The store itself (docs/multi-host.md)."""


@db.command(
    "copy",
    epilog="\b\nExamples:\n"
    "  export CAO_DATABASE_URL=postgresql://cao:PASSWORD@db.internal:5432/cao\n"
    "  cao db copy                       # $CAO_HOME/cao.db into it; then start cao-server on it\n"
    "  cao db copy --from old/cao.db --host build-1 --json\n\n"
    "Stop cao-server first (this home's lock is taken for the copy). The URL is read from\n"
    "CAO_DATABASE_URL unless --to gives one (a command line is seen by ps).",
)
@click.option(
    "--to",
    "to",
    default=None,
    metavar="URL",
    help="The empty PostgreSQL database (default: CAO_DATABASE_URL).",
)
@click.option(
    "--from",
    "from_",
    default=None,
    type=click.Path(dir_okay=False),
    help="The SQLite file (default: $CAO_HOME/cao.db).",
)
@click.option(
    "--host",
    default=None,
    help="The host its terminals belong to (default: CAO_HOST_NAME or this machine's name).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def db_copy(to: str | None, from_: str | None, host: str | None, as_json: bool) -> None:
    """Copy this home's SQLite store into an empty PostgreSQL database, exactly (one transaction,
    every table's count verified; a non-empty target is refused)."""
    from cao.errors import CaoError
    from cao.settings import Settings, database_url, host_name
    from cao.store.copy import copy_store

    try:
        settings = Settings.from_env()
        url = database_url(to, "--to") if to is not None else settings.database_url
        name = host_name(host, "--host") if host is not None else settings.host_name
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    if url is None:
        raise click.UsageError("no target: set CAO_DATABASE_URL (or give --to postgresql://…)")
    source = Path(from_) if from_ else settings.db_path
    if not source.is_file():  # before the lock below, which would make its directory
        raise click.ClickException(f"{source} is not a cao database file; give --from the path of cao.db")
    # a cao-server running on the file's home would write on after the copy: refused (a store is
    # always its home's cao.db, and the server holds a lock on that directory; a cao.db that is a
    # link: the link's directory and its target's)
    held = _hold_dirs([source.absolute().parent, source.resolve().parent])
    try:
        done = copy_store(source, url, host=name)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    finally:
        for fd in held:
            os.close(fd)
    if as_json:
        _print_json(done)
        return
    console.print(
        f"copied {done['total']} rows from {escape(done['from'])} to {escape(done['to'])} "
        f"(host {escape(name)}):"
    )
    for table, n in done["rows"].items():
        console.print(f"  {table}: {n}")


def _hold_dirs(dirs: list[Path]) -> list[int]:
    """The lock each cao-server holds on its home directory, taken on each of ``dirs`` (nothing
    written there; a directory named twice, by a link or ``..``, once); refused naming the first
    one a running server holds."""
    import fcntl

    held: list[int] = []
    seen: set[tuple[int, int]] = set()
    try:
        for where in dirs:
            fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                os.close(fd)
                continue
            seen.add((st.st_dev, st.st_ino))
            held.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise click.ClickException(
                    f"a cao-server is already using {where}; stop it first (it would write on after the copy)"
                ) from None
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held
