"""HTTP routes of cao-server (thin: validate, call the library off the event loop, map errors).

Route shapes follow the reference orchestrator so its clients keep working; every route that
takes parameters accepts them as a query string or as a JSON body. Errors are JSON:
``{"detail": "<what is wrong and what to do>", "error": "<ErrorClass>"}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

import cao
import providers
from cao.core import Cao
from cao.errors import CaoError, InvalidInput, NotFound, StoreBusy
from cao.store import MESSAGE_STATUSES
from cao.terminals import validate_terminal_id
from cao.tmux import session_name_for

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def _params(request: Request) -> dict[str, Any]:
    """Query parameters overlaid by a JSON object body (if any)."""
    params: dict[str, Any] = dict(request.query_params)
    raw = await request.body()
    if raw.strip():
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise InvalidInput(f"request body is not valid JSON ({exc}); send a JSON object") from None
        if not isinstance(data, dict):
            raise InvalidInput('request body must be a JSON object, e.g. {"message": "hi"}')
        params.update(data)
    return params


def _str(params: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise InvalidInput(f"{name} is required")
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    return value


async def _off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await run_in_threadpool(fn, *args, **kwargs)


def create_app(core: Cao) -> FastAPI:
    app = FastAPI(title="cao-server", version=cao.__version__)
    terms = core.terminals

    @app.exception_handler(CaoError)
    async def _cao_error(_request: Request, exc: CaoError) -> JSONResponse:
        headers = {"Retry-After": "1"} if isinstance(exc, StoreBusy) else None
        return JSONResponse(
            {"detail": exc.message, "error": type(exc).__name__}, status_code=exc.status_code, headers=headers
        )

    # -- health ---------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": cao.__version__, "providers": providers.names()}

    @app.get("/info")
    async def info() -> dict[str, Any]:
        def work() -> dict[str, Any]:
            s = core.settings
            return {
                "version": cao.__version__,
                "home": str(s.home),
                "database": str(s.db_path),
                "tmux_socket": s.tmux_socket,
                "tmux_running": core.tmux.is_alive(),
                "eager_delivery": s.eager_delivery,
                "watch_interval": s.watch_interval,
                "sweep_interval": s.sweep_interval,
                "sweep_grace": s.sweep_grace,
                "providers": providers.names(),
                "messages": core.store.counts_by_status(),
                "engine": dict(core.engine.stats),
            }

        return await _off_loop(work)

    # -- sessions -------------------------------------------------------------------------------
    def _session_view(name: str) -> dict[str, Any]:
        rows = core.store.list_terminals(session_name=name)
        return {
            "id": name,
            "name": name,
            "status": "active" if core.tmux.has_session(name) else "gone",
            "terminals": [terms.view(t).as_dict() for t in rows],
        }

    @app.post("/sessions", status_code=201)
    async def create_session(request: Request) -> dict[str, Any]:
        p = await _params(request)
        t = await _off_loop(
            terms.create,
            provider=_str(p, "provider"),
            agent_profile=_str(p, "agent_profile"),
            session_name=_str(p, "session_name"),
            working_directory=_str(p, "working_directory"),
            new_session=True,
        )
        return await _off_loop(lambda: terms.view(t).as_dict())

    @app.get("/sessions")
    async def list_sessions() -> list[dict[str, Any]]:
        def work() -> list[dict[str, Any]]:
            live = set(core.tmux.list_sessions())
            names = sorted({t.session_name for t in core.store.list_terminals()})
            return [
                {
                    "id": n,
                    "name": n,
                    "status": "active" if n in live else "gone",
                    "terminal_count": len(core.store.list_terminals(session_name=n)),
                }
                for n in names
            ]

        return await _off_loop(work)

    @app.get("/sessions/{name}")
    async def get_session(name: str) -> dict[str, Any]:
        def work() -> dict[str, Any]:
            session = session_name_for(name)
            view = _session_view(session)
            if not view["terminals"] and view["status"] == "gone":
                raise NotFound(f"session {session} not found; list sessions with `cao status`")
            return view

        return await _off_loop(work)

    @app.delete("/sessions/{name}")
    async def delete_session(name: str) -> dict[str, Any]:
        deleted = await _off_loop(terms.delete_session, name)
        return {"success": True, "deleted_terminals": deleted}

    @app.post("/sessions/{name}/terminals", status_code=201)
    async def add_terminal(name: str, request: Request) -> dict[str, Any]:
        p = await _params(request)
        t = await _off_loop(
            terms.create,
            provider=_str(p, "provider"),
            agent_profile=_str(p, "agent_profile"),
            session_name=name,
            working_directory=_str(p, "working_directory"),
            new_session=False,
            supervisor_id=_str(p, "supervisor_id"),
        )
        return await _off_loop(lambda: terms.view(t).as_dict())

    @app.get("/sessions/{name}/terminals")
    async def session_terminals(name: str) -> list[dict[str, Any]]:
        def work() -> list[dict[str, Any]]:
            return [
                terms.view(t).as_dict()
                for t in core.store.list_terminals(session_name=session_name_for(name))
            ]

        return await _off_loop(work)

    # -- terminals ------------------------------------------------------------------------------
    @app.get("/terminals")
    async def list_terminals() -> list[dict[str, Any]]:
        return await _off_loop(lambda: [terms.view(t).as_dict() for t in core.store.list_terminals()])

    @app.get("/terminals/{terminal_id}")
    async def get_terminal(terminal_id: str) -> dict[str, Any]:
        return await _off_loop(lambda: terms.view(terms.get(terminal_id)).as_dict())

    @app.post("/terminals/{terminal_id}/input")
    async def send_input(terminal_id: str, request: Request) -> dict[str, Any]:
        p = await _params(request)
        text = _str(p, "message", required=True)
        assert text is not None
        confirmed = await _off_loop(lambda: terms.send_input(terms.get(terminal_id), text))
        return {"success": True, "confirmed": confirmed}

    @app.get("/terminals/{terminal_id}/output")
    async def get_output(terminal_id: str, mode: str = "full", format: str = "json") -> Any:
        out = await _off_loop(lambda: terms.output(terms.get(terminal_id), mode))
        if format == "text":
            return PlainTextResponse(out)
        return {"output": out, "mode": mode}

    @app.post("/terminals/{terminal_id}/mcp-ready")
    async def mcp_ready(terminal_id: str) -> dict[str, Any]:
        """Called by cao-mcp-server when it starts: the agent's cao tools are about to be there."""

        def work() -> None:
            core.terminals.note_mcp_ready(terms.get(terminal_id))
            core.engine.kick(terminal_id, "mcp_ready")

        await _off_loop(work)
        return {"success": True}

    @app.post("/terminals/{terminal_id}/exit")
    async def exit_terminal(terminal_id: str) -> dict[str, Any]:
        confirmed = await _off_loop(lambda: terms.exit(terms.get(terminal_id)))
        return {"success": True, "confirmed": confirmed}

    @app.delete("/terminals/{terminal_id}")
    async def delete_terminal(terminal_id: str) -> dict[str, Any]:
        failed = await _off_loop(lambda: terms.delete(terms.get(terminal_id)))
        return {"success": True, "failed_messages": failed}

    # -- inbox ----------------------------------------------------------------------------------
    @app.post("/terminals/{receiver_id}/inbox/messages", status_code=201)
    async def send_message(receiver_id: str, request: Request) -> JSONResponse:
        p = await _params(request)
        body = p.get("message")
        if not isinstance(body, str) or body == "":
            raise InvalidInput("message is required and must be a non-empty string")
        sender = _str(p, "sender_id") or "cli"
        key = _str(p, "idempotency_key")
        receipt = await _off_loop(core.send_message, receiver_id, body, sender_id=sender, idempotency_key=key)
        return JSONResponse(receipt.as_dict(), status_code=200 if receipt.duplicate else 201)

    @app.get("/terminals/{terminal_id}/inbox/messages")
    async def list_inbox(
        terminal_id: str, status: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        validate_terminal_id(terminal_id)
        if status is not None and status not in MESSAGE_STATUSES:
            raise InvalidInput(f"status {status!r} is unknown; use one of {', '.join(MESSAGE_STATUSES)}")
        if not 1 <= limit <= 10000:
            raise InvalidInput("limit must be between 1 and 10000")

        def work() -> list[dict[str, Any]]:
            core.store.get_terminal(terminal_id, include_deleted=True)
            rows = core.store.list_messages(receiver_id=terminal_id, status=status, limit=limit)
            return [core.message_view(m) for m in rows]

        return await _off_loop(work)

    @app.get("/messages")
    async def list_messages(status: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if status is not None and status not in MESSAGE_STATUSES:
            raise InvalidInput(f"status {status!r} is unknown; use one of {', '.join(MESSAGE_STATUSES)}")
        if not 1 <= limit <= 10000:
            raise InvalidInput("limit must be between 1 and 10000")
        rows = await _off_loop(core.store.list_messages, status=status, limit=limit)
        return [core.message_view(m) for m in rows]

    @app.get("/messages/{message_id}")
    async def get_message(message_id: str) -> dict[str, Any]:
        return core.message_view(await _off_loop(core.store.get_message, _message_id(message_id)))

    @app.post("/messages/{message_id}/cancel")
    async def cancel_message(message_id: str) -> dict[str, Any]:
        return core.message_view(await _off_loop(core.store.cancel, _message_id(message_id)))

    return app


def _message_id(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"message id {raw!r} is malformed; message ids are positive integers")
    return int(raw)
