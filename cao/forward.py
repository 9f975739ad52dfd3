"""Pane operations on another host's terminal, forwarded to that host's API (cao/hosts.py).

Any host answers for every terminal: what lives in the store (its inbox, its messages, acks,
results, schedules) is served here; what needs its pane (its live view, output, typed input, keys,
exit, delete, explain, usage read from its CLI's files, its worktree) is asked of the host whose tmux
runs it, with the shared token, and its answer is passed back as it came. Nothing here ever
touches another host's pane itself (cao/panes.py refuses to).

An ASGI layer inside the guard (cao/security.py: the caller's token, Host and Origin are checked
before anything is forwarded). A forwarded request carries ``X-Cao-Forwarded``: the host that gets
it serves it itself, whatever it believes, so two hosts can never bounce a request between them.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from cao.errors import CaoError, HostUnreachable
from cao.security import read_body, replay

if TYPE_CHECKING:
    from cao.core import Cao

FORWARDED_HEADER = b"x-cao-forwarded"

# the routes that need the terminal's pane, tmux or files (method, what follows /terminals/{id})
PANE_ROUTES = frozenset(
    {
        ("GET", ""),
        ("DELETE", ""),
        ("GET", "/output"),
        ("POST", "/input"),
        ("POST", "/key"),
        ("POST", "/exit"),
        ("GET", "/explain"),
        ("GET", "/usage"),
        ("GET", "/diff"),
        ("POST", "/merge"),
        ("POST", "/mcp-ready"),
        ("POST", "/hooks"),
        ("POST", "/hooks/handed"),
    }
)
ROUTE = re.compile(r"^/terminals/(?P<id>[0-9a-f]{8})(?P<rest>(?:/[a-z-]+){0,2})$")


class Forwarder:
    def __init__(self, app: ASGIApp, core: Cao) -> None:
        self.app = app
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.core.hosts.shared:
            await self.app(scope, receive, send)
            return
        m = ROUTE.match(scope.get("path", ""))
        headers = dict(scope.get("headers") or [])
        if (
            m is None
            or (scope["method"], m["rest"]) not in PANE_ROUTES
            or FORWARDED_HEADER in headers
            or not await run_in_threadpool(
                self.core.hosts.needs_owner, m["id"], scope["method"] == "GET" and m["rest"] == ""
            )
        ):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        host_name = str(self.core.hosts.owner(m["id"]))
        try:
            status, content, ctype = await run_in_threadpool(
                self._forward, host_name, scope, body, headers.get(b"content-type")
            )
        except HostUnreachable as exc:
            if scope["method"] == "GET" and m["rest"] == "":
                # its row is here: the view says host_unreachable (status.py asks nobody then)
                await self.app(scope, replay(body), send)
                return
            await _send(send, exc.status_code, _error(exc), b"application/json")
            return
        except CaoError as exc:
            await _send(send, exc.status_code, _error(exc), b"application/json")
            return
        await _send(send, status, content, ctype.encode())

    def _forward(
        self, host_name: str, scope: Scope, body: bytes, content_type: bytes | None
    ) -> tuple[int, bytes, str]:
        host = self.core.hosts.peer(host_name)
        query = scope.get("query_string", b"").decode("latin-1")
        path = scope["path"] + (f"?{query}" if query else "")
        return self.core.hosts.peers.request(
            host,
            scope["method"],
            path,
            body=body or None,
            content_type=content_type.decode("latin-1") if content_type else None,
        )


def _error(exc: CaoError) -> bytes:
    return json.dumps({"detail": exc.message, "error": type(exc).__name__}).encode()


async def _send(send: Send, status: int, content: bytes, content_type: bytes) -> None:
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", content_type),
        (b"content-length", str(len(content)).encode()),
    ]
    if status == 503:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def install(app: Any, core: Cao) -> None:
    """Before the guard is installed (so the guard wraps it: nothing unauthenticated is forwarded)."""
    app.add_middleware(Forwarder, core=core)
