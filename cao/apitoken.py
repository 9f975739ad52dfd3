"""The API token: cao-server publishes the one it uses, and its clients find it there.

``CAO_API_TOKEN`` in cao-server's environment turns bearer-token checks on (docs/security.md).
The server writes the token it uses to ``$CAO_HOME/api-token`` (mode 0600, replaced atomically)
and removes the file when it runs without one. Clients (``cao``, ``cao-mcp-server``, the bundled
scripted agent) send ``CAO_API_TOKEN`` if they have it, else the file's content, so nobody copies
the token around: the agents' environment already carries ``CAO_HOME``. After a 401 a client reads
the file again and retries once, so a rotated token reaches long-running MCP servers too.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Generator
from pathlib import Path

import httpx

from cao.errors import InvalidInput
from cao.settings import Settings

MIN_LENGTH = 16
GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"


def check(token: str) -> str:
    """A token cao-server accepts: at least 16 printable ASCII characters, no spaces."""
    if len(token) < MIN_LENGTH or not token.isascii() or not token.isprintable() or " " in token:
        raise InvalidInput(
            f"CAO_API_TOKEN must be at least {MIN_LENGTH} printable ASCII characters without spaces; "
            f"make one with: export CAO_API_TOKEN=$({GENERATE})"
        )
    return token


def publish(settings: Settings) -> None:
    """Write the server's token where its clients look (or remove a stale one when there is none)."""
    path = settings.token_file
    if settings.api_token is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, settings.api_token.encode() + b"\n")
    finally:
        os.close(fd)
    os.replace(tmp, path)


def keep(settings: Settings) -> bool:
    """Publish the token again if ``$CAO_HOME/api-token`` was deleted or changed while the server
    runs: every client (``cao``, the agents' MCP servers, the scripted agent) reads it there, and
    without it they all got 401 until a restart. Returns whether it had to."""
    if settings.api_token is None or read_file(settings.token_file) == settings.api_token:
        return False
    if settings.token_file.is_dir():
        return False  # an operator's directory there: the next start says so
    publish(settings)
    logging.getLogger(__name__).warning(
        "api-token was deleted or changed under the running server; written again"
    )
    return True


def read(settings: Settings) -> str | None:
    """The token a client sends: ``CAO_API_TOKEN``, else the server's published file, else none."""
    if settings.api_token:
        return settings.api_token
    return read_file(settings.token_file)


def read_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


class BearerAuth(httpx.Auth):
    """httpx auth for cao-server: the current token on every request; after a 401, re-read and retry
    once if the token changed (the server was restarted with a new one)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = read(self.settings)
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code == 401:
            fresh = read(self.settings)
            if fresh and fresh != token:
                request.headers["Authorization"] = f"Bearer {fresh}"
                yield request
