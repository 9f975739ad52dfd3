"""``cao-mcp-server``: MCP tools for agents (send_message, assign, handoff).

Placeholder until the MCP issue lands: it explains itself and exits with status 1.
"""

from __future__ import annotations

import click


@click.command(
    context_settings={"help_option_names": ["-h", "--help"]}, epilog="Example:\n\n\b\n  cao-mcp-server --help"
)
def main() -> None:
    """MCP server for agents (not implemented yet: coming with the MCP tools issue).

    It will run as a stdio MCP server started by each agent CLI, identify its caller from
    CAO_TERMINAL_ID and offer send_message, assign and handoff.
    """
    raise click.ClickException("cao-mcp-server is not implemented yet; use `cao send` meanwhile")
