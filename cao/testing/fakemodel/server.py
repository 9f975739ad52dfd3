"""The app (every API's routes plus ``/_fake/*`` control) and how it is served: in-process
(:class:`FakeModelServer`, on a thread) or as ``python -m cao.testing.fakemodel`` (:func:`main`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
import time
from types import TracebackType

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cao.testing import fakemodel
from cao.testing.fakemodel import anthropic, gemini, openai_chat, openai_responses
from cao.testing.fakemodel.script import JSON
from cao.testing.fakemodel.wire import RequestLog, log_entry, read_json

APIS = (anthropic, openai_responses, openai_chat, gemini)


def create_app(log: RequestLog | None = None) -> Starlette:
    """The Starlette app; ``log`` is the request log it fills (a new one by default)."""
    log = log if log is not None else RequestLog()

    async def fake_requests(request: Request) -> Response:
        if request.method == "DELETE":
            log.clear()
            return JSONResponse({"cleared": True})
        bodies = request.query_params.get("bodies", "1") not in ("0", "false", "no")
        return JSONResponse(log.items(bodies=bodies))

    async def fake_health(request: Request) -> Response:
        return JSONResponse({"ok": True, "requests": len(log.items(bodies=False))})

    async def root(request: Request) -> Response:
        log.add({**log_entry(request, "none", None), "kind": "probe"})  # Claude sends HEAD / at start
        return JSONResponse({"ok": True})

    async def not_found(request: Request) -> Response:
        log.add({**log_entry(request, "unknown", await read_json(request)), "kind": "unknown"})
        return JSONResponse(
            {"error": {"message": f"fake model server: no route {request.url.path}"}}, status_code=404
        )

    app = Starlette(
        routes=[
            *(route for api in APIS for route in api.routes(log)),
            Route("/_fake/requests", fake_requests, methods=["GET", "DELETE"]),
            Route("/_fake/health", fake_health, methods=["GET"]),
            Route("/", root, methods=["GET", "HEAD"]),
            Route("/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
        ]
    )
    app.state.request_log = log
    return app


def _tcp_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _unix_socket(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _server(app: Starlette, verbose: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=1,
        lifespan="off",
    )
    return uvicorn.Server(config)


class FakeModelServer:
    """The fake model server on a background thread: ``with FakeModelServer() as fake: fake.url``."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", uds: str | None = None) -> None:
        self.host = host
        self.log = RequestLog()
        self.app = create_app(self.log)
        self._sockets = [_tcp_socket(host, port)]
        if uds:
            self._sockets.append(_unix_socket(uds))
        self.port: int = self._sockets[0].getsockname()[1]
        self._server = _server(self.app, verbose=False)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def requests(self, bodies: bool = True) -> list[JSON]:
        return self.log.items(bodies=bodies)

    def start(self, timeout: float = 10.0) -> FakeModelServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": self._sockets}, name="fakemodel", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake model server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cao.testing.fakemodel", description=fakemodel.__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, default=18081)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--uds", help="also serve on this Unix socket (reachable from outside a netns)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    sockets = [_tcp_socket(args.host, args.port)]
    if args.uds:
        sockets.append(_unix_socket(args.uds))
    port = sockets[0].getsockname()[1]
    print(f"fakemodel listening on http://{args.host}:{port}", flush=True)
    _server(create_app(), verbose=args.verbose).run(sockets=sockets)
