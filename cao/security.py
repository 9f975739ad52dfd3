"""Who may drive cao-server, and how much they may send: one ASGI layer in front of every route.

cao-server types into agent CLIs that run tools, so whoever gets a request through to a route can
run commands as the user. Each check stops one way in (the threat model is docs/security.md):

    check (in this order)            answer  stops
    URL longer than 64 KiB           414     huge request lines (uvicorn reads them: H11_MAX_EVENT)
    control character in the path    422     NUL and friends reaching tmux or SQLite
    Host not ours                    400     DNS rebinding: evil.example re-pointed at 127.0.0.1
    Origin not ours (state changes)  403     a web page's cross-site requests (simple ones: no preflight)
    bearer token (when configured)   401     anyone else who can reach the port
    a body not application/json      415     form and text/plain posts
    a body over 1 MiB                413     counted as it arrives: nothing bigger is ever buffered

"Ours" is a loopback name (127.0.0.1, localhost, [::1]) with the server's port, the address it is
bound to, or a name in ``CAO_ALLOWED_HOSTS``; an Origin is ours when it is the server's own origin
or listed in ``CAO_ALLOWED_ORIGINS``. Requests without a body (the reference orchestrator's
query-string POSTs) need no content type. ``GET /health`` needs no token (liveness probes).
"""

from __future__ import annotations

import hmac
import logging
import time
import unicodedata
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.responses import JSONResponse

from cao import apitoken, peerauth
from cao.settings import Settings

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_URL_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024  # a 256 KiB message with room for JSON escapes
H11_MAX_EVENT = 1024 * 1024  # uvicorn reads request lines and headers this long, so long URLs get a 414
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OPEN_ROUTES = frozenset({("GET", "/health"), ("HEAD", "/health"), ("GET", "/"), ("GET", "/login")})
OPEN_PREFIXES = ("/ui/",)  # the dashboard's static files: no secrets, and the page asks for the token
TOKEN_COOKIE = "cao_token"  # set by GET /login?token=… for the dashboard (HttpOnly, SameSite=Strict)


def split_host(value: str) -> tuple[str, int | None] | None:
    """``"[::1]:9889"`` → ``("::1", 9889)``, ``"Localhost"`` → ``("localhost", None)``; None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
    else:
        name, sep, port = value.partition(":")
        rest = sep + port
    if rest == "":
        port_number = None
    elif rest[:1] == ":" and 1 < len(rest) <= 6 and rest[1:].isascii() and rest[1:].isdigit():
        port_number = int(rest[1:])
    else:
        return None
    name = name.rstrip(".")
    return (name, port_number) if name else None


@dataclass(frozen=True)
class Policy:
    """What the guard lets through, built once from Settings."""

    port: int
    token: str | None
    own_names: frozenset[str]
    hosts: frozenset[tuple[str, int | None]]  # (name, None) = any port
    any_host: bool
    origins: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        bound = settings.api_host.strip("[]").lower()
        own = LOOPBACK_NAMES if bound in WILDCARD_ADDRESSES else LOOPBACK_NAMES | {bound}
        # the name it gives other hosts sharing its store (CAO_SERVER_URL): they reach it by that
        advertised = split_host(urlsplit(settings.server_url).netloc)
        if advertised is not None and advertised[0] not in WILDCARD_ADDRESSES:
            own = own | {advertised[0]}
        hosts = {parsed for word in settings.allowed_hosts if (parsed := split_host(word)) is not None}
        return cls(
            port=settings.api_port,
            token=settings.api_token,
            own_names=frozenset(own),
            hosts=frozenset(hosts),
            any_host="*" in settings.allowed_hosts,
            origins=frozenset(o.strip().lower().rstrip("/") for o in settings.allowed_origins),
        )

    def host_allowed(self, host: str) -> bool:
        parsed = split_host(host)
        if parsed is None:
            return False
        name, port = parsed
        if self.any_host or (name, None) in self.hosts or (name, port or 80) in self.hosts:
            return True
        return name in self.own_names and (self.port == 0 or (port or 80) == self.port)

    def origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if origin in self.origins:
            return True
        scheme, sep, rest = origin.partition("://")
        parsed, own = split_host(rest), split_host(host)
        if not sep or scheme not in ("http", "https") or parsed is None or own is None:
            return False
        name, port = parsed[0], parsed[1] or (443 if scheme == "https" else 80)
        if (name, port) == (own[0], own[1] or 80):  # same origin: a page cao-server served itself
            return True
        return name in LOOPBACK_NAMES and self.port != 0 and port == self.port

    def token_ok(self, authorization: str | None, cookie: str | None = None) -> bool:
        """A bearer token, or (for the dashboard in a browser) the ``cao_token`` cookie."""
        if self.token is None:
            return True
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        given = credentials.strip().encode()
        if scheme.lower() == "bearer" and hmac.compare_digest(given, self.token.encode()):
            return True
        value = _cookie(cookie, TOKEN_COOKIE)
        return value is not None and hmac.compare_digest(value.encode(), self.token.encode())


class Refused(Exception):
    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"detail": self.detail, "error": self.error}, status_code=self.status, headers=self.headers
        )


class _BodyTooLarge(Exception):
    """Raised from the counting receive channel; caught by the guard (never a CaoError, so no route
    handler answers it first)."""


def too_large() -> Refused:
    return Refused(
        413,
        "PayloadTooLarge",
        f"request body over {MAX_BODY_BYTES // 1024} KiB; a message may be at most 256 KiB of text",
    )


class Guard:
    """The ASGI middleware: checks every HTTP request before any route sees it."""

    def __init__(self, app: ASGIApp, policy: Policy, peers: peerauth.Verifier | None = None) -> None:
        self.app = app
        self.policy = policy
        self.peers = peers  # another host's signed request (cao/peerauth.py), when there is a token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            try:
                self.check_websocket(scope, _headers(scope))
            except Refused as refused:
                logger.warning(
                    "websocket refused",
                    extra={"status": refused.status, "reason": refused.error, "path": scope["path"][:200]},
                )
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008, "reason": refused.error})
                return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        try:
            signed = self.check(scope, headers)
            if signed is not None:  # a good signature: now the body it covers (bounded)
                body = await read_body(receive)
                why = peerauth.body_refusal(signed, body)
                if why is not None:
                    raise Refused(401, "Unauthorized", f"refused as another host's request: {why}")
                receive = replay(body)
        except _BodyTooLarge:
            await self.refuse(scope, receive, send, too_large())
            return
        except Refused as refused:
            await self.refuse(scope, receive, send, refused)
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    raise _BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _BodyTooLarge:
            if started:  # nothing more can be said on this connection
                raise
            await self.refuse(scope, receive, send, too_large())

    def check(self, scope: Scope, headers: dict[str, str]) -> str | None:
        """Refuses what may not pass; for another host's signed request, the hash its body must
        have (everything else of it is checked here, before any of the body is read)."""
        method, path = scope["method"], scope["path"]
        if len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") > MAX_URL_BYTES:
            raise Refused(
                414,
                "URITooLong",
                f"URL longer than {MAX_URL_BYTES // 1024} KiB; send long values in a JSON body",
            )
        if any(unicodedata.category(ch) == "Cc" for ch in path):
            raise Refused(422, "InvalidInput", "the URL path contains a control character; remove it")
        host = headers.get("host", "")
        if not self.policy.host_allowed(host):
            raise Refused(
                400,
                "HostNotAllowed",
                f"Host {host[:100]!r} is not one of this server's names; use "
                f"http://127.0.0.1:{self.policy.port} or add it to CAO_ALLOWED_HOSTS (docs/security.md)",
            )
        origin = headers.get("origin")
        if method in STATE_CHANGING and origin is not None and not self.policy.origin_allowed(origin, host):
            raise Refused(
                403,
                "OriginNotAllowed",
                f"cross-origin request from {origin[:100]!r} refused; if that web page may drive your "
                "agents, add its origin to CAO_ALLOWED_ORIGINS (docs/security.md)",
            )
        open_route = (method, path) in OPEN_ROUTES or (method == "GET" and path.startswith(OPEN_PREFIXES))
        signed = None
        if open_route or self.policy.token_ok(headers.get("authorization"), headers.get("cookie")):
            pass
        elif self.peers is not None and peerauth.HEADER in headers:
            signed = self.check_peer(scope, headers)
        else:
            raise Refused(
                401,
                "Unauthorized",
                "missing or wrong API token; send `Authorization: Bearer <token>` (cao and its agents read "
                "CAO_API_TOKEN, else $CAO_HOME/api-token, which cao-server writes)",
                {"WWW-Authenticate": "Bearer"},
            )
        length = headers.get("content-length", "").strip()
        has_body = "transfer-encoding" in headers or length not in ("", "0")
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if has_body and media_type != "application/json":
            raise Refused(
                415,
                "UnsupportedMediaType",
                f"request body of type {media_type or 'unknown'!r} refused; send JSON with "
                "`Content-Type: application/json`, or the parameters as a query string without a body",
            )
        if length.isascii() and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise too_large()
        return signed

    def check_peer(self, scope: Scope, headers: dict[str, str]) -> str:
        """Another host's request: signed for exactly this request, fresh, never seen. The hash
        its body must have."""
        assert self.peers is not None
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        host = headers.get("host", "")
        try:
            return self.peers.check_head(headers[peerauth.HEADER], scope["method"], host, target)
        except peerauth.Refusal as why:
            raise Refused(401, "Unauthorized", f"refused as another host's request: {why}") from None

    def check_websocket(self, scope: Scope, headers: dict[str, str]) -> None:
        """A WebSocket is never protected by CORS: its Origin must be ours whenever a browser
        sends one, besides the Host and token checks every request gets."""
        host = headers.get("host", "")
        if not self.policy.host_allowed(host):
            raise Refused(400, "HostNotAllowed", f"Host {host[:100]!r} is not one of this server's names")
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin, host):
            raise Refused(403, "OriginNotAllowed", f"cross-origin WebSocket from {origin[:100]!r} refused")
        if not self.policy.token_ok(headers.get("authorization"), headers.get("cookie")):
            raise Refused(401, "Unauthorized", "missing or wrong API token")

    async def refuse(self, scope: Scope, receive: Receive, send: Send, refused: Refused) -> None:
        client = scope.get("client")
        logger.warning(
            "request refused",
            extra={
                "status": refused.status,
                "reason": refused.error,
                "method": scope["method"],
                "path": scope["path"][:200],
                "client": client[0] if client else None,
            },
        )
        await refused.response()(scope, receive, send)


async def read_body(receive: Receive) -> bytes:
    """A request's whole body (at most ``MAX_BODY_BYTES``: else ``_BodyTooLarge``)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replay(body: bytes) -> Receive:
    """A receive channel that gives ``body`` once, then waits for the client to go away."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive


def _headers(scope: Scope) -> dict[str, str]:
    """Header names lowercased; a repeated header keeps its first value (Host and Origin can't repeat)."""
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


def install(app: FastAPI, settings: Settings, clock: Callable[[], float] | None = None) -> None:
    """Put the guard in front of every route; odd input becomes 4xx JSON; the schema says so.
    ``clock``: the time peer signatures are checked by (the database's, on a shared store)."""
    from cao import inputs, openapi

    peers = None
    if settings.api_token is not None:
        apitoken.check(settings.api_token)
        if settings.database_url is not None:  # hosts sharing a store forward to each other
            peers = peerauth.Verifier(settings.api_token, clock or time.time, name=settings.host_name)
    app.add_middleware(Guard, policy=Policy.from_settings(settings), peers=peers)
    inputs.install_error_handlers(app)
    openapi.install(app, token=settings.api_token is not None)


def _cookie(header: str | None, name: str) -> str | None:
    for part in (header or "").split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value.strip()
    return None
