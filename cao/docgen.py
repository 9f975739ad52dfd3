"""Generate docs/cli.md from the commands' own --help (``python -m cao.docgen > docs/cli.md``).

tests/test_docs.py checks the committed file is up to date, so the reference never drifts.
"""

from __future__ import annotations

import click
from click.testing import CliRunner

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
    entries += [(f"cao {name}", cli_module.cli, [name]) for name in sorted(cli_module.cli.commands)]
    entries += [("cao-server", server.main, []), ("cao-mcp-server", mcp.main, [])]
    for title, command, args in entries:
        parts.append(f"## `{title}`\n\n```text\n{_help(command, args, title.split()[0])}\n```\n\n")
    return "".join(parts).rstrip() + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
