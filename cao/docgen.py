"""Generate the references that must not drift: docs/cli.md from the commands' own --help
(``python -m cao.docgen > docs/cli.md``), and the knob table in docs/providers.md from the
providers' declarations (``python -m cao.docgen --knobs docs/providers.md`` rewrites it in place).

tests/test_docs.py checks the committed files are up to date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click
from click.testing import CliRunner

import providers
from cao import cli as cli_module
from cao import mcp, server

HEADER = """# Command reference

Generated from `--help` by `make docs` (`python -m cao.docgen`); a test fails when it is stale.

"""


def _help(command: click.Command, args: list[str], prog: str) -> str:
    result = CliRunner().invoke(command, [*args, "--help"], prog_name=prog, terminal_width=100)
    return result.output.rstrip()


def render() -> str:
    parts = [HEADER]
    entries: list[tuple[str, click.Command, list[str]]] = [("cao", cli_module.cli, [])]
    for name in sorted(cli_module.cli.commands):
        entries.append((f"cao {name}", cli_module.cli, [name]))
        group = cli_module.cli.commands[name]
        if isinstance(group, click.Group):  # its subcommands too: their options are the reference
            entries += [(f"cao {name} {sub}", cli_module.cli, [name, sub]) for sub in sorted(group.commands)]
    entries += [("cao-server", server.main, []), ("cao-mcp-server", mcp.main, [])]
    for title, command, args in entries:
        parts.append(f"## `{title}`\n\n```text\n{_help(command, args, title.split()[0])}\n```\n\n")
    return "".join(parts).rstrip() + "\n"


KNOBS_BEGIN = "<!-- knobs: generated from the providers' declarations by `make docs`; do not edit -->"
KNOBS_END = "<!-- /knobs -->"
KINDS = {"flag": "true/false", "number": "a number", "text": "text", "path": "a path"}


def render_knobs() -> str:
    """The table of every provider knob (``providers.all_knobs()``): what it takes, its default,
    which providers read it and what it does."""
    readers: dict[str, list[str]] = {}
    for name in providers.names():
        for knob in providers.get(name).knobs:
            readers.setdefault(knob.name, []).append(f"`{name}`")
    rows = ["| variable | takes | default | read by | meaning |", "|---|---|---|---|---|"]
    for knob in providers.all_knobs():
        cells = (
            f"`{knob.name}`",
            KINDS[knob.kind],
            knob.default_text,
            ", ".join(readers[knob.name]),
            knob.doc,
        )
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def with_knobs(markdown: str) -> str:
    """``markdown`` with the text between the knob table's markers replaced by ``render_knobs()``."""
    pattern = re.compile(re.escape(KNOBS_BEGIN) + r"\n.*?" + re.escape(KNOBS_END), re.S)
    if not pattern.search(markdown):
        raise SystemExit(f"no knob table markers ({KNOBS_BEGIN} ... {KNOBS_END}) found")
    return pattern.sub(lambda _: f"{KNOBS_BEGIN}\n{render_knobs()}{KNOBS_END}", markdown)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--knobs"] and len(args) == 2:
        path = Path(args[1])
        path.write_text(with_knobs(path.read_text()))
        return
    if args:
        raise SystemExit("usage: python -m cao.docgen [--knobs docs/providers.md]")
    print(render(), end="")


if __name__ == "__main__":
    main()
