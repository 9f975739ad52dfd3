"""HTTP routes of cao-server (thin: validate, call the library off the event loop, map errors).

Route shapes follow the reference orchestrator (cli-agent-orchestrator) so its clients keep
working (docs/compatibility.md); every route that takes parameters accepts them as a query string
or as a JSON body. Errors are JSON:
``{"detail": "<what is wrong and what to do>", "error": "<ErrorClass>"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

import cao
import providers
from cao import dashboard, inputs, security
from cao.core import Cao
from cao.errors import CaoError, InvalidInput, StoreBusy
from cao.hookstate import HOOK_KEY_HEADER

logger = logging.getLogger(__name__)
T = TypeVar("T")


# Free text that may hold anything printable, newlines included (like ``message``).
FREE_TEXT = frozenset({"initial_message", "prompt"})


async def _params(request: Request) -> dict[str, Any]:
    """Query parameters and a JSON object body (if any) together, every text value checked; a
    parameter may come either way, not both."""
    params: dict[str, Any] = dict(request.query_params)
    raw = await request.body()
    if raw.strip():
        body = inputs.json_object(raw)
        if twice := sorted(set(params) & set(body)):
            # one of the two would be dropped unchecked: say so instead of guessing which is meant
            raise InvalidInput(
                f"{', '.join(twice)} given both in the query string and in the JSON body; pass each once"
            )
        params.update(body)
    for name, value in params.items():
        if not isinstance(value, str):
            continue
        if name in FREE_TEXT:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(f"{name} is not valid text (it has a lone UTF-16 surrogate)") from None
            if "\x00" in value:
                raise InvalidInput(f"{name} contains a NUL character; remove it")
        else:
            inputs.check_text(name, value)
    return params


def _bool(params: dict[str, Any], name: str, default: bool = False) -> bool:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
        return value.lower() in ("true", "1", "yes")
    raise InvalidInput(f"{name} must be true or false")


def _number(params: dict[str, Any], name: str, default: float) -> float:
    value = params.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise InvalidInput(f"{name} must be a number of seconds")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a number of seconds") from None


HOOK_TEXT = ("source", "last_message", "notification_type", "message", "title", "reason")


def _hook_report(raw: bytes) -> dict[str, Any]:
    """A lifecycle hook report: ``{"event": name, "prompts": [text…], "last_message": …, …}``
    (other keys are ignored; events are ordered as cao-server receives them)."""
    report = inputs.json_object(raw)
    event = report.get("event")
    if not isinstance(event, str) or not event.strip() or len(event) > 100:
        raise InvalidInput("event must be the hook event's name (1-100 characters), e.g. Stop")
    inputs.check_text("event", event)
    prompts = report.get("prompts", [])
    if not isinstance(prompts, list) or len(prompts) > 16 or not all(isinstance(p, str) for p in prompts):
        raise InvalidInput("prompts must be a list of at most 16 strings")
    for name in HOOK_TEXT:
        if report.get(name) is not None and not isinstance(report[name], str):
            raise InvalidInput(f"{name} must be a string")
    for name, value in [*((n, report.get(n)) for n in HOOK_TEXT), *(("prompts", p) for p in prompts)]:
        if isinstance(value, str) and "\x00" in value:
            raise InvalidInput(f"{name} contains a NUL character; remove it")
    return report


def _maybe_bool(params: dict[str, Any], name: str) -> bool | None:
    """A flag that may be left out (``None``: the default decides, e.g. the profile's)."""
    return None if params.get(name) is None else _bool(params, name)


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
    security.install(app, core.settings)  # host/origin/token/size checks, JSON errors, honest schema
    dashboard.install(app, core)  # the web dashboard, /events (SSE), the live terminal WebSocket

    @app.exception_handler(CaoError)
    async def _cao_error(_request: Request, exc: CaoError) -> JSONResponse:
        headers = {"Retry-After": "1"} if isinstance(exc, StoreBusy) else None
        body = {"detail": exc.message, "error": type(exc).__name__, **getattr(exc, "fields", {})}
        return JSONResponse(body, status_code=exc.status_code, headers=headers)

    # -- health ---------------------------------------------------------------------------------
    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any] | JSONResponse:
        if core.store.gone is not None:  # the database file was deleted or replaced: not healthy
            return JSONResponse({"status": "store_gone", "detail": core.store.gone}, status_code=503)
        return {
            "status": "ok",
            "version": cao.__version__,
            "providers": providers.names(),
            "default_provider": providers.default_name(),  # what a create without one runs
            "terminal_backend": "tmux",
        }

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return await _off_loop(core.info)

    # -- sessions -------------------------------------------------------------------------------
    @app.post("/sessions", status_code=201)
    async def create_session(request: Request) -> dict[str, Any]:
        p = await _params(request)
        _bool(p, "defer_init")  # accepted: cao-server always answers once the pane exists
        return await _off_loop(
            core.create_terminal,
            provider=_str(p, "provider"),
            agent_profile=_str(p, "agent_profile"),
            session_name=_str(p, "session_name"),
            working_directory=_str(p, "working_directory"),
            new_session=True,
            caller_id=_str(p, "caller_id"),
            initial_message=_str(p, "initial_message"),
            use_worktree=_maybe_bool(p, "use_worktree"),
        )

    @app.get("/sessions")
    async def list_sessions() -> list[dict[str, Any]]:
        return await _off_loop(core.list_sessions)

    @app.get("/sessions/{name}")
    async def get_session(name: str) -> dict[str, Any]:
        return await _off_loop(core.session_view, name)

    @app.delete("/sessions/{name}")
    async def delete_session(name: str) -> dict[str, Any]:
        deleted = await _off_loop(core.delete_session, name)
        return {"success": True, "deleted_terminals": deleted}

    @app.post("/sessions/{name}/terminals", status_code=201)
    async def add_terminal(name: str, request: Request) -> dict[str, Any]:
        p = await _params(request)
        _bool(p, "defer_init")  # accepted: cao-server always answers once the pane exists
        return await _off_loop(
            core.create_terminal,
            provider=_str(p, "provider"),
            agent_profile=_str(p, "agent_profile"),
            session_name=name,
            working_directory=_str(p, "working_directory"),
            new_session=False,
            supervisor_id=_str(p, "supervisor_id"),
            caller_id=_str(p, "caller_id"),
            initial_message=_str(p, "initial_message"),
            use_worktree=_maybe_bool(p, "use_worktree"),
        )

    @app.get("/sessions/{name}/terminals")
    async def session_terminals(name: str) -> list[dict[str, Any]]:
        return await _off_loop(core.list_terminals, name)

    # -- terminals ------------------------------------------------------------------------------
    @app.get("/terminals")
    async def list_terminals() -> list[dict[str, Any]]:
        return await _off_loop(core.list_terminals)

    @app.post("/terminals/run-step")
    async def run_step(request: Request) -> dict[str, Any]:
        """One agent step, start to answer (the reference's handoff): see Cao.run_step."""
        p = await _params(request)
        prompt = _str(p, "prompt", required=True)
        agent = _str(p, "agent", required=True)
        assert prompt is not None and agent is not None
        return await _off_loop(
            core.run_step,
            provider=_str(p, "provider"),
            agent=agent,
            prompt=prompt,
            session_name=_str(p, "session_name"),
            reuse_terminal_id=_str(p, "reuse_terminal_id"),
            teardown=_bool(p, "teardown", default=True),
            remove_on_failure=_bool(p, "remove_on_failure", default=False),
            timeout=_number(p, "timeout", 600.0),
            working_directory=_str(p, "working_directory"),
            caller_id=_str(p, "caller_id"),
            job_id=_str(p, "job_id"),
            use_worktree=_maybe_bool(p, "use_worktree"),
        )

    @app.get("/handoff-results/{job_id}")
    async def handoff_result(job_id: str) -> dict[str, Any]:
        return await _off_loop(core.handoff_result, job_id)

    @app.get("/terminals/{terminal_id}")
    async def get_terminal(terminal_id: str) -> dict[str, Any]:
        return await _off_loop(core.terminal_view, terminal_id)

    @app.get("/terminals/{terminal_id}/siblings")
    async def siblings(terminal_id: str, request: Request) -> list[dict[str, Any]]:
        """The other live terminals of its session (``depth``, ``cross_session``: accepted, no
        effect; cao has no terminal groups)."""
        await _params(request)
        return await _off_loop(core.siblings, terminal_id)

    @app.get("/terminals/{terminal_id}/working-directory")
    async def working_directory(terminal_id: str) -> dict[str, Any]:
        return {"working_directory": await _off_loop(core.working_directory, terminal_id)}

    @app.post("/terminals/{terminal_id}/key")
    async def send_key(terminal_id: str, request: Request) -> dict[str, Any]:
        p = await _params(request)
        key = _str(p, "key", required=True)
        assert key is not None
        await _off_loop(core.send_key, terminal_id, key)
        return {"success": True}

    @app.post("/terminals/{terminal_id}/input")
    async def send_input(terminal_id: str, request: Request) -> dict[str, Any]:
        p = await _params(request)
        text = _str(p, "message", required=True)
        assert text is not None
        confirmed = await _off_loop(core.send_input, terminal_id, text)
        return {"success": True, "confirmed": confirmed}

    @app.get("/terminals/{terminal_id}/output")
    async def get_output(terminal_id: str, mode: str = "full", format: str = "json") -> Any:
        out = await _off_loop(core.output, terminal_id, mode)
        if format == "text":
            return PlainTextResponse(out)
        return {"output": out, "mode": mode}

    @app.post("/terminals/{terminal_id}/mcp-ready")
    async def mcp_ready(terminal_id: str) -> dict[str, Any]:
        """Called by cao-mcp-server when it starts: the agent's cao tools are about to be there."""

        await _off_loop(core.mcp_ready, terminal_id)
        return {"success": True}

    @app.post("/terminals/{terminal_id}/hooks")
    async def hook_event(terminal_id: str, request: Request) -> dict[str, Any]:
        """Called by ``python -m cao.hook`` when the agent CLI runs a lifecycle hook (cao/hookstate.py)."""
        report = _hook_report(await request.body())
        key = request.headers.get(HOOK_KEY_HEADER, "")  # never None here: the key is always checked
        phase = await _off_loop(core.hook, terminal_id, report, key=key)
        return {"success": True, "phase": phase}

    @app.post("/terminals/{terminal_id}/exit")
    async def exit_terminal(terminal_id: str) -> dict[str, Any]:
        confirmed = await _off_loop(core.exit_terminal, terminal_id)
        return {"success": True, "confirmed": confirmed}

    # -- worktrees: review and merge (docs/worktrees.md) ---------------------------------------
    @app.get("/worktrees")
    async def list_worktrees() -> list[dict[str, Any]]:
        return await _off_loop(core.worktrees)

    @app.get("/terminals/{terminal_id}/diff")
    async def worker_diff(terminal_id: str, full: bool = False, into: str | None = None) -> dict[str, Any]:
        """The worker's changes on its branch (and uncommitted, while its worktree exists)."""
        if into is not None:
            inputs.check_text("into", into)
        return await _off_loop(core.diff, terminal_id, stat=not full, into=into)

    @app.post("/terminals/{terminal_id}/merge")
    async def merge_worker(terminal_id: str, request: Request) -> dict[str, Any]:
        """Merge the worker's branch into ``into`` (default: the branch it was made from)."""
        p = await _params(request)
        return await _off_loop(core.merge, terminal_id, into=_str(p, "into"))

    @app.delete("/terminals/{terminal_id}")
    async def delete_terminal(terminal_id: str) -> dict[str, Any]:
        failed = await _off_loop(core.delete_terminal, terminal_id)
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
        terminal_id: str, status: str | None = None, limit: int = 10
    ) -> list[dict[str, Any]]:
        """The reference's list: oldest first, ISO times (our full view: /messages?receiver_id=)."""
        return await _off_loop(core.reference_inbox, terminal_id, status=status, limit=limit)

    @app.get("/messages")
    async def list_messages(
        status: str | None = None, limit: int = 50, receiver_id: str | None = None
    ) -> list[dict[str, Any]]:
        return await _off_loop(core.list_messages, status=status, limit=limit, receiver_id=receiver_id)

    @app.get("/messages/{message_id}")
    async def get_message(message_id: str) -> dict[str, Any]:
        return await _off_loop(core.get_message, _message_id(message_id))

    @app.post("/messages/{message_id}/cancel")
    async def cancel_message(message_id: str) -> dict[str, Any]:
        return await _off_loop(core.cancel_message, _message_id(message_id))

    return app


def _message_id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise InvalidInput(f"message id {raw!r} is malformed; message ids are positive integers")
    return int(raw)
