"""``cao-mcp-server``: the MCP tools agents use to work together (thin: call the HTTP API).

cao/mcp/tools.py is what the tools do (``AgentTools``); cao/mcp/server.py is how agents see them
and the command that serves them over stdio.
"""

from __future__ import annotations

from cao.mcp.server import build_server, main, serve
from cao.mcp.tools import AgentTools

__all__ = ["AgentTools", "build_server", "main", "serve"]
