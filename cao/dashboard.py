"""What cao-server serves to people: the web dashboard, the event stream, a live terminal view.

    GET  /                              the dashboard (plain ES modules under cao/web/; no build step)
    GET  /ui/…                          its static files, xterm.js among them (cao/web/vendor/xterm/)
    POST /login-codes                   a one-time login code (needs the token; `cao dashboard` asks)
    GET  /login?code=…                  spends the code: sets the HttpOnly SameSite=Strict cookie
    GET  /events                        Server-Sent Events (cao/events.py), resumable with Last-Event-ID
    WS   /terminals/{id}/stream         the pane live: a snapshot (screen, cursor, size), then the bytes
                                        the pane writes to its log, as they come

Access rules are the API's (cao/security.py): same Host and Origin checks, the token as a bearer
header or the cookie. Input typed in the dashboard goes through ``POST /terminals/{id}/input``:
the same neutralised, identity-checked, serialised path as every other input.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from cao.core import Cao
from cao.errors import CaoError, InvalidInput
from cao.events import Event
from cao.security import TOKEN_COOKIE

logger = logging.getLogger(__name__)

WEB = Path(__file__).with_name("web")
KEEPALIVE_SECONDS = 15.0
STREAM_POLL_SECONDS = 0.05
STREAM_CHUNK = 64 * 1024


LOGIN_CODE_SECONDS = 120.0
LOGIN_CODES_MAX = 64  # outstanding at once; the oldest goes first


class LoginCodes:
    """Short-lived, single-use codes that a browser trades for the dashboard's cookie, so the link
    ``cao dashboard`` prints is not the API token itself (a link in a browser's history, a shell's
    scrollback or a screen share would otherwise be the token forever)."""

    def __init__(self, ttl: float = LOGIN_CODE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._codes: dict[str, float] = {}  # code -> expiry
        self._lock = threading.Lock()

    def issue(self) -> str:
        code = secrets.token_urlsafe(24)
        with self._lock:
            now = self.clock()
            self._codes = {c: t for c, t in self._codes.items() if t > now}
            while len(self._codes) >= LOGIN_CODES_MAX:
                self._codes.pop(next(iter(self._codes)))
            self._codes[code] = now + self.ttl
        return code

    def spend(self, code: str) -> bool:
        """True once for a code issued less than ``ttl`` seconds ago; False ever after."""
        with self._lock:
            expiry = self._codes.pop(code, None)
        return expiry is not None and expiry > self.clock()


def sse(event: Event) -> str:
    return f"id: {event['id']}\nevent: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def install(app: FastAPI, core: Cao) -> None:
    app.mount("/ui", StaticFiles(directory=WEB), name="ui")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(WEB / "index.html", headers={"Cache-Control": "no-cache"})

    codes = LoginCodes()

    @app.post("/login-codes", include_in_schema=False)
    async def login_code() -> dict[str, object]:
        """A one-time code for ``GET /login?code=…`` (this route needs the token, like the API)."""
        if core.settings.api_token is None:
            return {"code": None, "url": "/", "expires_in": None}
        code = codes.issue()
        return {"code": code, "url": f"/login?code={code}", "expires_in": codes.ttl}

    @app.get("/login", include_in_schema=False)
    async def login(code: str = "", token: str = "") -> Response:
        """``cao dashboard`` prints this with a one-time code; the cookie carries the token from then
        on. The token itself is not accepted here: a link must not be a lasting secret."""
        want = core.settings.api_token
        if want is None:
            return RedirectResponse("/", status_code=303)
        if not codes.spend(code):
            why = (
                "a login link carries a one-time code, not the token"
                if token and not code
                else f"this login link was used already or has expired (links work once, for {codes.ttl:g} s)"
            )
            return JSONResponse(
                {"detail": f"{why}; run `cao dashboard` for a new one", "error": "Unauthorized"},
                status_code=401,
            )
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(TOKEN_COOKIE, want, httponly=True, samesite="strict", path="/")
        return response

    @app.get("/events", include_in_schema=False)
    async def events(
        request: Request, last_event_id: str | None = None, keepalive: float = KEEPALIVE_SECONDS
    ) -> StreamingResponse:
        """Server-Sent Events; ``Last-Event-ID`` (header, or ``?last_event_id=``) resumes;
        ``keepalive`` (1-60 s) is how often a comment line shows the connection is alive."""
        last = request.headers.get("last-event-id") or last_event_id
        if not math.isfinite(keepalive):  # nan slips through min/max: every wait would be nan
            raise InvalidInput(f"keepalive must be a number of seconds (1-60), not {keepalive!r}")
        keepalive = min(max(keepalive, 1.0), 60.0)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:
            loop.call_soon_threadsafe(wake.set)

        sub = core.events.subscribe(notify, last_event_id=last)
        await run_in_threadpool(core.engine.listeners_changed)

        async def stream() -> AsyncIterator[str]:
            try:
                yield "retry: 1000\n\n"
                while True:
                    for event in sub.take():
                        yield sse(event)
                    if sub.overflowed:
                        reset = core.events.publish_reset_for(sub)
                        yield sse(reset)
                        return
                    wake.clear()
                    if sub.events:
                        continue
                    try:
                        await asyncio.wait_for(wake.wait(), keepalive)
                    except TimeoutError:
                        if await request.is_disconnected():
                            return
                        yield ": keepalive\n\n"
            finally:
                core.events.unsubscribe(sub)
                await run_in_threadpool(core.engine.listeners_changed)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.websocket("/terminals/{terminal_id}/stream")
    async def terminal_stream(ws: WebSocket, terminal_id: str) -> None:
        await ws.accept()
        try:
            terminal = await run_in_threadpool(core.terminal_row, terminal_id)
            path = core.logs.path(terminal.id)
            pos = _size(path)
            screen, x, y, cols, rows = await run_in_threadpool(core.panes.snapshot, terminal)
        except CaoError as exc:
            await ws.send_text(json.dumps({"type": "error", "detail": exc.message}))
            await ws.close(code=1000)
            return
        hello = {"type": "hello", "cols": cols, "rows": rows, "terminal_id": terminal.id}
        await ws.send_text(json.dumps(hello))
        await ws.send_bytes(_paint(screen, x, y))
        closed = asyncio.Event()

        async def watch_close() -> None:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError):
                while True:
                    message = await ws.receive()
                    if message["type"] == "websocket.disconnect":
                        break
            closed.set()

        watcher = asyncio.create_task(watch_close())
        try:
            while not closed.is_set():
                size = _size(path)
                if size < pos:  # the log was capped: repaint from the screen
                    screen, x, y, _, _ = await run_in_threadpool(core.panes.snapshot, terminal)
                    await ws.send_bytes(_paint(screen, x, y))
                    pos = size
                elif size > pos:
                    with path.open("rb") as fh:
                        fh.seek(pos)
                        data = fh.read(min(size - pos, STREAM_CHUNK))
                    pos += len(data)
                    await ws.send_bytes(data)
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closed.wait(), STREAM_POLL_SECONDS)
        except (WebSocketDisconnect, RuntimeError, CaoError):
            pass
        finally:
            watcher.cancel()
            with contextlib.suppress(Exception):
                await ws.close()


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _paint(screen: str, x: int, y: int) -> bytes:
    """Clear, draw the captured screen, put the cursor where tmux has it."""
    lines = screen.rstrip("\n").split("\n")
    return ("\x1b[0m\x1b[2J\x1b[H" + "\r\n".join(lines) + f"\x1b[0m\x1b[{y + 1};{x + 1}H").encode(
        "utf-8", "replace"
    )
