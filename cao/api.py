"""HTTP routes of cao-server (thin: validate, call the library off the event loop, map errors).

Route shapes follow the reference orchestrator (cli-agent-orchestrator) so its clients keep
working (docs/compatibility.md); every route that takes parameters accepts them as a query string
or as a JSON body, as its declaration below says (cao/params.py: the route reads them through it,
the OpenAPI schema is written from it). Errors are JSON:
``{"detail": "<what is wrong and what to do>", "error": "<ErrorClass>"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

import cao
import providers
from cao import dashboard, forward, inputs, security
from cao.core import Cao
from cao.errors import CaoError, InvalidInput, StoreBusy
from cao.handoff import JOB_ID_RE, MAX_STEP_TIMEOUT
from cao.hook import TEXT_LIMIT as HOOK_TEXT_LIMIT
from cao.hookstate import HOOK_KEY_HEADER
from cao.names import TERMINAL_ID_RE, validate_message_id
from cao.params import NAME_SCHEMA, Param, Params, Values, path, query
from cao.settings import HOST_NAME_RE
from cao.states import IfBusy, Kind, Priority, ResultStatus
from cao.store import MESSAGE_STATUSES
from cao.store.board import KEY_PATTERN, MAX_KEY_CHARS, MAX_VERSION, MAX_VERSIONS

logger = logging.getLogger(__name__)
T = TypeVar("T")


# -- what each route takes -------------------------------------------------------------------------
# Query string or JSON body (cao/params.py); a route reads them in the order declared here.
_DEFER_INIT = Param(
    "defer_init",
    "flag",
    default=False,
    ignored=True,
    doc="accepted: cao-server always answers once the pane exists",
)
_PROVIDER = Param("provider", doc="the agent CLI to run (GET /health lists them)")
_PROFILE = Param("agent_profile", doc="the agent profile (default: developer)")
_WORKDIR = Param("working_directory", "path", doc="where the agent starts")
_CALLER = Param("caller_id", doc="the terminal that creates this one, where its replies go")
_TASK = Param("initial_message", "free_text", doc="the first task, into the new agent's inbox; empty: none")
_WORKTREE = Param("use_worktree", "flag", doc="its own git worktree and branch (default: the profile's)")
_NOTIFY = Param(
    "notify",
    "flag",
    doc="its supervisor gets a notice when it finishes, blocks, fails or exits (default true)",
)
_HOST = Param("host", doc="the host whose tmux runs it (GET /hosts lists them; default: this one)")
NEW_SESSION = Params(
    _HOST,
    _DEFER_INIT,
    _PROVIDER,
    _PROFILE,
    Param("session_name", doc="random if omitted"),
    _WORKDIR,
    _CALLER,
    _TASK,
    _WORKTREE,
    _NOTIFY,
)
NEW_TERMINAL = Params(
    _HOST,
    _DEFER_INIT,
    _PROVIDER,
    _PROFILE,
    _WORKDIR,
    Param("supervisor_id", doc="the same link as caller_id (pass one of them)"),
    _CALLER,
    _TASK,
    _WORKTREE,
    _NOTIFY,
)
RUN_STEP = Params(
    Param("prompt", "free_text", required=True, doc="the task, typed when the worker is ready; not blank"),
    Param("agent", required=True, doc="the worker's agent profile"),
    _PROVIDER,
    Param("session_name", doc="default: a new session"),
    Param("reuse_terminal_id", doc="type into this terminal instead of starting a worker"),
    Param("teardown", "flag", default=True, doc="delete the worker after a success"),
    Param("remove_on_failure", "flag", default=False, doc="delete the worker after a failure too"),
    Param(
        "timeout",
        "seconds",
        default=600.0,
        constraints={"exclusiveMinimum": 0, "maximum": int(MAX_STEP_TIMEOUT)},
    ),
    Param("working_directory", "path", doc="default: the caller's"),
    _CALLER,
    Param(
        "job_id",
        doc="keeps the state and result for GET /handoff-results/{job_id}",
        constraints={"pattern": JOB_ID_RE.pattern},
    ),
    _WORKTREE,
    _NOTIFY,
)
FAIL_HOST = Params(Param("reason", required=True, doc="why (kept with the host and its terminals)"))
SIBLINGS = Params()  # depth, cross_session: accepted (checked as text), no effect: cao has no groups
KEY = Params(Param("key", required=True, doc="one named key: Escape, C-c, Enter, Up, a letter…"))
INPUT = Params(Param("message", "message", required=True))
INSTALL_PROFILE = Params(
    Param("text", "message", doc="a profile's markdown (front matter, then the system prompt)"),
    Param("builtin", doc="or a built-in profile's name: copy it into the store to edit it there"),
)
MERGE = Params(Param("into", doc="the branch to merge into (default: the one its worktree came from)"))
_PRIORITIES = {"enum": list(Priority)}
_BY = Param("by", doc="who: the receiving agent's terminal id (its own queue only), or an operator's name")
SEND = Params(
    Param("message", "message", required=True, missing="message is required and must be a non-empty string"),
    Param("sender_id", default="cli", doc="a terminal id, or a name like cli"),
    Param("idempotency_key", doc="a retry with the same key and intent answers the first receipt"),
    Param("priority", doc="urgent|high|normal|low (default: the kind's)", constraints=_PRIORITIES),
    Param(
        "kind",
        doc="chat (a person's; the default from a name), message (the default from a terminal), "
        "task, result, notice, wakeup",
        constraints={"enum": list(Kind)},
    ),
    Param(
        "if_busy",
        doc="wait (default), refuse (409 when the receiver isn't ready, nothing stored), "
        "interrupt (urgent only)",
        constraints={"enum": list(IfBusy)},
    ),
    Param("ttl_seconds", "seconds", doc="still pending this long after the send: expired, never pasted"),
    Param("expires_at", doc="the same as a time (ISO 8601 with a zone); not with ttl_seconds"),
    Param("deliver_at", doc="not before this time (ISO 8601 with a zone)"),
    Param("topic", doc="notices from one sender on one topic coalesce: the newest replaces the pending one"),
)
DEFER = Params(
    Param("until", doc="ISO 8601 with a zone"),
    Param("seconds", "seconds", doc="or this many seconds from now"),
    _BY,
    Param("reason", doc="why (on the timeline)"),
)
DROP = Params(_BY, Param("reason", required=True, doc="why (shown with the message)"))
PRIORITIZE = Params(
    Param("priority", required=True, doc="urgent|high|normal|low", constraints=_PRIORITIES),
    _BY,
    Param("reason", doc="why (on the timeline)"),
)
READ = Params(_BY)
CANCEL = Params(_BY)
ACK = Params(
    Param("through_message_id", "count", doc="everything delivered to you up to this id (the cursor)"),
    Param(
        "message_ids",
        "json",
        doc="or these ids (a list), the cursor unchanged",
        constraints={"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 500},
    ),
    Param("expected", "count", doc="the cursor you last saw: another one is a 409 (check_inbox shows it)"),
    _BY,
)
RESULT = Params(
    Param("status", required=True, doc="done|failed|blocked", constraints={"enum": list(ResultStatus)}),
    Param("summary", "free_text", required=True, doc="what came of the task (at most 4000 characters)"),
    Param(
        "details",
        "json",
        doc="an object: branch, commit, files, artifacts, tests, notes",
        constraints={"type": "object"},
    ),
    _BY,
)
SCHEDULE = Params(
    Param("message", "message", required=True, doc="what the wake-up tells the agent"),
    Param("at", doc="the first time (ISO 8601 with a zone)"),
    Param("in_seconds", "seconds", doc="or this many seconds from now"),
    Param("every_seconds", "seconds", doc="then again every this many seconds (default: once)"),
    _BY,
)
ATTENTION = ("priority", "kind", "if_busy", "ttl_seconds", "expires_at", "deliver_at", "topic")
_EXPECTED = Param(
    "expected_version",
    "integer",
    required=True,
    missing="expected_version is required: 0 for a key that must not exist yet, else the version you read",
    doc="the version this write replaces: 0 = the key must not exist yet; stale: 409 with current_version",
    constraints={"minimum": 0, "maximum": MAX_VERSION},
)
_WRITER = Param(
    "by", doc="who writes: a terminal of this session (its own board only), or an operator's name"
)
BOARD_SET = Params(
    Param(
        "value",
        "json",
        required=True,
        missing="value is required: any JSON value but null (to remove a key, DELETE it)",
        doc="the fact: any JSON value but null, at most 64 KiB as JSON",
    ),
    _EXPECTED,
    _WRITER,
)
BOARD_DELETE = Params(_EXPECTED, _WRITER)
# path and query parameters FastAPI reads from the signature, with what core checks in their schema
TerminalId = Annotated[str, path(pattern=TERMINAL_ID_RE.pattern)]
MessageId = Annotated[str, path(pattern="^[0-9]{1,18}$")]
Status = Annotated[str | None, query(enum=list(MESSAGE_STATUSES))]
BoardKey = Annotated[str, path(pattern=KEY_PATTERN, maxLength=MAX_KEY_CHARS)]

HOOK_TEXT = ("source", "last_message", "notification_type", "message", "title", "reason", "transcript_path")


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
        if isinstance(value, str):
            inputs.check_free_text(name, value)  # no NUL, no lone surrogate
            if len(value) > HOOK_TEXT_LIMIT:
                raise InvalidInput(
                    f"{name} is {len(value)} characters; at most {HOOK_TEXT_LIMIT} "
                    "(python -m cao.hook cuts texts to that length)"
                )
    return report


async def _off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except OSError as exc:  # a full disk, a read-only mount: the operator's to fix, not a crash
        mapped = inputs.file_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def create_app(core: Cao) -> FastAPI:
    app = FastAPI(title="cao-server", version=cao.__version__)
    forward.install(app, core)  # pane operations on another host's terminal go to that host
    # host/origin/token/size checks, JSON errors, honest schema; peers' signatures on the store's clock
    security.install(app, core.settings, core.clock)
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
    async def create_session(request: Request, p: Annotated[Values, Depends(NEW_SESSION)]) -> dict[str, Any]:
        return await _off_loop(core.create_terminal, new_session=True, forwarded=_forwarded(request), **p)

    @app.get("/sessions")
    async def list_sessions() -> list[dict[str, Any]]:
        return await _off_loop(core.list_sessions)

    @app.get("/sessions/{name}")
    async def get_session(name: str) -> dict[str, Any]:
        return await _off_loop(core.session_view, name)

    @app.delete("/sessions/{name}")
    async def delete_session(
        name: str, request: Request, host: Annotated[str | None, query(pattern=HOST_NAME_RE.pattern)] = None
    ) -> dict[str, Any]:
        """Its terminals on every host (``host``: only that host's)."""
        deleted = await _off_loop(core.delete_session, name, host=host, forwarded=_forwarded(request))
        return {"success": True, "deleted_terminals": deleted}

    @app.post("/sessions/{name}/terminals", status_code=201)
    async def add_terminal(
        name: str, request: Request, p: Annotated[Values, Depends(NEW_TERMINAL)]
    ) -> dict[str, Any]:
        return await _off_loop(
            core.create_terminal, session_name=name, new_session=False, forwarded=_forwarded(request), **p
        )

    @app.get("/sessions/{name}/terminals")
    async def session_terminals(name: str) -> list[dict[str, Any]]:
        return await _off_loop(core.list_terminals, name)

    # -- a session's coordination board (cao/board.py): facts that wake no one --------------------
    @app.get("/sessions/{name}/board", dependencies=[Depends(_one_segment_session)])
    async def board_list(
        name: str,
        prefix: Annotated[str | None, query(pattern="^[A-Za-z0-9._:/-]*$", maxLength=MAX_KEY_CHARS)] = None,
    ) -> list[dict[str, Any]]:
        """The live facts (current versions), sorted by key; only those starting with ``prefix``."""
        return await _off_loop(core.board_list, name, prefix=prefix)

    @app.get("/sessions/{name}/board/{key:path}", dependencies=[Depends(_one_segment_session)])
    async def board_get(
        name: str,
        key: BoardKey,
        history: bool = False,
        limit: Annotated[int, query(minimum=1, maximum=MAX_VERSIONS)] = MAX_VERSIONS,
    ) -> Any:
        """One fact's current version; ``history=true``: its kept versions, newest first."""
        if history:
            return await _off_loop(core.board_history, name, key, limit=limit)
        return await _off_loop(core.board_get, name, key)

    @app.put("/sessions/{name}/board/{key:path}", dependencies=[Depends(_one_segment_session)])
    async def board_set(name: str, key: BoardKey, p: Annotated[Values, Depends(BOARD_SET)]) -> dict[str, Any]:
        """Write a fact over ``expected_version``; pastes nothing, wakes no one."""
        return await _off_loop(core.board_set, name, key, **p)

    @app.delete("/sessions/{name}/board/{key:path}", dependencies=[Depends(_one_segment_session)])
    async def board_delete(
        name: str, key: BoardKey, p: Annotated[Values, Depends(BOARD_DELETE)]
    ) -> dict[str, Any]:
        """Delete a fact at its current version: a tombstone version, the history stays."""
        return await _off_loop(core.board_delete, name, key, **p)

    # -- terminals ------------------------------------------------------------------------------
    @app.get("/terminals")
    async def list_terminals(
        request: Request, host: Annotated[str | None, query(pattern=HOST_NAME_RE.pattern)] = None
    ) -> list[dict[str, Any]]:
        """Every host's terminals (``host``: one host's), each with its live status."""
        return await _off_loop(core.list_terminals, host=host, forwarded=_forwarded(request))

    # -- hosts sharing the store (cao/hosts.py, docs/multi-host.md) --------------------------------
    @app.get("/hosts")
    async def list_hosts() -> list[dict[str, Any]]:
        """The cao-servers sharing this store: alive or not, version, heartbeat, agents."""
        return await _off_loop(core.hosts.listing)

    @app.post("/hosts/{name}/fail")
    async def fail_host(
        name: Annotated[str, path(pattern=HOST_NAME_RE.pattern)], p: Annotated[Values, Depends(FAIL_HOST)]
    ) -> dict[str, Any]:
        """Give up on a host that is down: its terminals become gone, their mail fails."""
        return await _off_loop(core.fail_host, name, **p)

    @app.post("/terminals/run-step")
    async def run_step(p: Annotated[Values, Depends(RUN_STEP)]) -> dict[str, Any]:
        """One agent step, start to answer (the reference's handoff): see Cao.run_step."""
        return await _off_loop(core.run_step, **p)

    # -- agent profiles ---------------------------------------------------------------------------
    @app.get("/profiles")
    async def list_profiles() -> list[dict[str, Any]]:
        """Every agent profile: the built-ins and those installed in $CAO_HOME/agent-store."""
        return await _off_loop(core.profiles)

    @app.get("/profiles/{name}")
    async def get_profile(name: Annotated[str, path(**NAME_SCHEMA)]) -> dict[str, Any]:
        return await _off_loop(core.profile, name)

    @app.post("/profiles", status_code=201)
    async def install_profile(p: Annotated[Values, Depends(INSTALL_PROFILE)]) -> dict[str, Any]:
        """Install (or replace) a profile from its text, or copy a built-in into the store."""
        return await _off_loop(core.install_profile, **p)

    @app.get("/handoff-results/{job_id}")
    async def handoff_result(job_id: Annotated[str, path(pattern=JOB_ID_RE.pattern)]) -> dict[str, Any]:
        return await _off_loop(core.handoff_result, job_id)

    @app.get("/terminals/{terminal_id}")
    async def get_terminal(terminal_id: TerminalId) -> dict[str, Any]:
        return await _off_loop(core.terminal_view, terminal_id)

    @app.get("/terminals/{terminal_id}/siblings", dependencies=[Depends(SIBLINGS)])
    async def siblings(terminal_id: TerminalId) -> list[dict[str, Any]]:
        """The other live terminals of its session (``depth``, ``cross_session``: accepted, no
        effect; cao has no terminal groups)."""
        return await _off_loop(core.siblings, terminal_id)

    @app.get("/terminals/{terminal_id}/working-directory")
    async def working_directory(terminal_id: TerminalId) -> dict[str, Any]:
        return {"working_directory": await _off_loop(core.working_directory, terminal_id)}

    @app.post("/terminals/{terminal_id}/key")
    async def send_key(terminal_id: TerminalId, p: Annotated[Values, Depends(KEY)]) -> dict[str, Any]:
        await _off_loop(core.send_key, terminal_id, p["key"])
        return {"success": True}

    @app.post("/terminals/{terminal_id}/input")
    async def send_input(terminal_id: TerminalId, p: Annotated[Values, Depends(INPUT)]) -> dict[str, Any]:
        confirmed = await _off_loop(core.send_input, terminal_id, p["message"])
        return {"success": True, "confirmed": confirmed}

    @app.get("/terminals/{terminal_id}/output")
    async def get_output(
        terminal_id: TerminalId,
        mode: Annotated[str, query(enum=["full", "last"])] = "full",
        format: Annotated[str, query(enum=["json", "text"])] = "json",
    ) -> Any:
        if format not in ("json", "text"):
            raise InvalidInput(f"format {format[:40]!r} is not one of json, text; leave it out for JSON")
        out = await _off_loop(core.output, terminal_id, mode)
        if format == "text":
            return PlainTextResponse(out)
        return {"output": out, "mode": mode}

    @app.post("/terminals/{terminal_id}/mcp-ready")
    async def mcp_ready(terminal_id: TerminalId) -> dict[str, Any]:
        """Called by cao-mcp-server when it starts: the agent's cao tools are about to be there."""

        await _off_loop(core.mcp_ready, terminal_id)
        return {"success": True}

    @app.post("/terminals/{terminal_id}/hooks")
    async def hook_event(terminal_id: TerminalId, request: Request) -> dict[str, Any]:
        """Called by ``python -m cao.hook`` when the agent CLI runs a lifecycle hook (cao/hookstate.py)."""
        report = _hook_report(await request.body())
        key = request.headers.get(HOOK_KEY_HEADER, "")  # never None here: the key is always checked
        return await _off_loop(core.hook, terminal_id, report, key=key)

    @app.post("/terminals/{terminal_id}/hooks/handed")
    async def hook_handed(terminal_id: TerminalId, request: Request) -> dict[str, Any]:
        """Called by ``python -m cao.hook`` once it printed a hand-over (``hand`` in the answer to
        its report): the messages are delivered, channel ``hook``. 409: the claim was lost."""
        body = inputs.json_object(await request.body())
        claim = body.get("claim")
        if not isinstance(claim, str) or not claim.isalnum() or len(claim) > 64:
            raise InvalidInput("claim must be the token the hook report's answer gave (hand.claim)")
        key = request.headers.get(HOOK_KEY_HEADER, "")
        n = await _off_loop(core.hook_handed, terminal_id, claim, key=key)
        return {"success": True, "delivered": n}

    @app.post("/terminals/{terminal_id}/exit")
    async def exit_terminal(terminal_id: TerminalId) -> dict[str, Any]:
        confirmed = await _off_loop(core.exit_terminal, terminal_id)
        return {"success": True, "confirmed": confirmed}

    # -- worktrees: review and merge (docs/worktrees.md) ---------------------------------------
    @app.get("/worktrees")
    async def list_worktrees() -> list[dict[str, Any]]:
        return await _off_loop(core.worktrees)

    @app.get("/terminals/{terminal_id}/diff")
    async def worker_diff(
        terminal_id: TerminalId, full: bool = False, into: Annotated[str | None, query(**NAME_SCHEMA)] = None
    ) -> dict[str, Any]:
        """The worker's changes on its branch (and uncommitted, while its worktree exists)."""
        if into is not None:
            inputs.check_text("into", into)
        return await _off_loop(core.diff, terminal_id, stat=not full, into=into)

    @app.post("/terminals/{terminal_id}/merge")
    async def merge_worker(terminal_id: TerminalId, p: Annotated[Values, Depends(MERGE)]) -> dict[str, Any]:
        """Merge the worker's branch into ``into`` (default: the branch it was made from)."""
        return await _off_loop(core.merge, terminal_id, into=p["into"])

    @app.delete("/terminals/{terminal_id}")
    async def delete_terminal(terminal_id: TerminalId) -> dict[str, Any]:
        failed = await _off_loop(core.delete_terminal, terminal_id)
        return {"success": True, "failed_messages": failed}

    # -- inbox ----------------------------------------------------------------------------------
    @app.post("/terminals/{receiver_id}/inbox/messages", status_code=201)
    async def send_message(receiver_id: TerminalId, p: Annotated[Values, Depends(SEND)]) -> JSONResponse:
        receipt = await _off_loop(
            core.send_message,
            receiver_id,
            p["message"],
            sender_id=p["sender_id"],
            idempotency_key=p["idempotency_key"],
            **{k: p[k] for k in ATTENTION},
        )
        return JSONResponse(receipt.as_dict(), status_code=200 if receipt.duplicate else 201)

    @app.get("/terminals/{terminal_id}/attention")
    async def attention(
        terminal_id: TerminalId, limit: Annotated[int, query(minimum=1, maximum=10000)] = 200
    ) -> dict[str, Any]:
        """What the agent attends to: its state, its queue in serving order, its timeline."""
        return await _off_loop(core.attention, terminal_id, limit=limit)

    @app.get("/terminals/{terminal_id}/usage")
    async def terminal_usage(terminal_id: TerminalId) -> dict[str, Any]:
        """Tokens and cost of the terminal's CLI so far, per task attempt and per model, read now
        from the CLI's own records (``known: false`` with why when it records none: never 0)."""
        return await _off_loop(core.terminal_usage, terminal_id)

    @app.get("/usage")
    async def usage_overview() -> dict[str, Any]:
        """Every terminal's tokens and cost (deleted ones too), the sum, and each budget's use."""
        return await _off_loop(core.usage_overview)

    @app.get("/sessions/{name}/usage")
    async def session_usage(name: str) -> dict[str, Any]:
        """One session's terminals' tokens and cost, the sum, and the budgets."""
        return await _off_loop(core.usage_overview, name)

    @app.get("/terminals/{terminal_id}/explain")
    async def explain(terminal_id: TerminalId, report: bool = False) -> dict[str, Any]:
        """Why the terminal reads the status it does: what decided (pane, screen or hook), the
        provider's rules that matched and on which lines, the input box, the latest hook event and
        its age, what the other signal said, the rules that came closest when nothing matched;
        ``report=true`` adds ``bug_report`` (that and the redacted screen, as text)."""
        return await _off_loop(core.explain, terminal_id, report=report)

    @app.get("/terminals/{terminal_id}/inbox/messages")
    async def list_inbox(
        terminal_id: TerminalId,
        status: Status = None,
        limit: Annotated[int, query(minimum=1, maximum=100)] = 10,
    ) -> list[dict[str, Any]]:
        """The reference's list: oldest first, ISO times (our full view: /messages?receiver_id=)."""
        return await _off_loop(core.reference_inbox, terminal_id, status=status, limit=limit)

    @app.get("/messages")
    async def list_messages(
        status: Status = None,
        limit: Annotated[int, query(minimum=1, maximum=10000)] = 50,
        receiver_id: Annotated[str | None, query(pattern=TERMINAL_ID_RE.pattern)] = None,
    ) -> list[dict[str, Any]]:
        return await _off_loop(core.list_messages, status=status, limit=limit, receiver_id=receiver_id)

    @app.get("/messages/{message_id}")
    async def get_message(message_id: MessageId) -> dict[str, Any]:
        return await _off_loop(core.get_message, _message_id(message_id))

    @app.post("/messages/{message_id}/cancel")
    async def cancel_message(message_id: MessageId, p: Annotated[Values, Depends(CANCEL)]) -> dict[str, Any]:
        return await _off_loop(core.cancel_message, _message_id(message_id), **p)

    @app.post("/messages/{message_id}/defer")
    async def defer_message(message_id: MessageId, p: Annotated[Values, Depends(DEFER)]) -> dict[str, Any]:
        """Not delivered before ``until`` (or ``seconds`` from now); a pending message only."""
        return await _off_loop(core.defer_message, _message_id(message_id), **p)

    @app.post("/messages/{message_id}/drop")
    async def drop_message(message_id: MessageId, p: Annotated[Values, Depends(DROP)]) -> dict[str, Any]:
        """Never delivered; the reason is kept with it. A person's chat: the operator only."""
        return await _off_loop(core.drop_message, _message_id(message_id), **p)

    @app.post("/messages/{message_id}/prioritize")
    async def prioritize_message(
        message_id: MessageId, p: Annotated[Values, Depends(PRIORITIZE)]
    ) -> dict[str, Any]:
        return await _off_loop(core.prioritize_message, _message_id(message_id), **p)

    # -- coordination: acks, results, notifications, wake-ups ----------------------------------------
    @app.get("/terminals/{terminal_id}/inbox")
    async def check_inbox(terminal_id: TerminalId) -> dict[str, Any]:
        """What waits (serving order) and what was delivered but not acknowledged; changes nothing."""
        return await _off_loop(core.check_inbox, terminal_id)

    @app.post("/terminals/{terminal_id}/ack")
    async def ack(terminal_id: TerminalId, p: Annotated[Values, Depends(ACK)]) -> dict[str, Any]:
        """Acknowledge: through an id (forward-only cursor, CAS on ``expected``) or by ids."""
        return await _off_loop(
            core.ack,
            terminal_id,
            by=p["by"],
            through=p["through_message_id"],
            ids=p["message_ids"],
            expected=p["expected"],
        )

    @app.post("/terminals/{terminal_id}/result", status_code=201)
    async def report_result(terminal_id: TerminalId, p: Annotated[Values, Depends(RESULT)]) -> JSONResponse:
        """A worker's report on its task, to its supervisor; an exact retry answers the first (200)."""
        out = await _off_loop(core.report_result, terminal_id, **p)
        return JSONResponse(out, status_code=200 if out["duplicate"] else 201)

    @app.get("/terminals/{terminal_id}/results")
    async def results(terminal_id: TerminalId) -> list[dict[str, Any]]:
        return await _off_loop(core.results, terminal_id)

    @app.get("/notifications")
    async def notifications(
        limit: Annotated[int, query(minimum=1, maximum=1000)] = 100,
        terminal_id: Annotated[str | None, query(pattern=TERMINAL_ID_RE.pattern)] = None,
    ) -> list[dict[str, Any]]:
        """Worker events (finished, blocked, failed, exited), oldest first, with the webhook's state."""
        return await _off_loop(core.notifications, limit=limit, terminal_id=terminal_id)

    @app.post("/terminals/{terminal_id}/schedules", status_code=201)
    async def add_schedule(
        terminal_id: TerminalId, p: Annotated[Values, Depends(SCHEDULE)]
    ) -> dict[str, Any]:
        """A wake-up: once (at / in_seconds) or repeating (every_seconds); durable, one per slot."""
        return await _off_loop(core.schedule, terminal_id, **p)

    @app.get("/schedules")
    async def list_schedules(
        receiver_id: Annotated[str | None, query(pattern=TERMINAL_ID_RE.pattern)] = None,
        active: bool = False,
    ) -> list[dict[str, Any]]:
        return await _off_loop(core.schedules, receiver_id, active_only=active)

    @app.get("/schedules/{schedule_id}")
    async def get_schedule(schedule_id: MessageId) -> dict[str, Any]:
        return await _off_loop(core.get_schedule, _message_id(schedule_id))

    @app.post("/schedules/{schedule_id}/cancel")
    async def cancel_schedule(
        schedule_id: MessageId, p: Annotated[Values, Depends(CANCEL)]
    ) -> dict[str, Any]:
        """Cancel a wake-up and its slots still waiting."""
        return await _off_loop(core.cancel_schedule, _message_id(schedule_id), **p)

    @app.post("/messages/{message_id}/read")
    async def read_message(message_id: MessageId, p: Annotated[Values, Depends(READ)]) -> dict[str, Any]:
        """The whole body (``message``); by its receiver, recorded as read."""
        return await _off_loop(core.read_message, _message_id(message_id), **p)

    return app


def _one_segment_session(request: Request) -> None:
    """A session name is one path segment: an encoded '/' in it (``/sessions/a%2Fb/board/x``) is
    decoded before routing and would name another session's key; refused instead."""
    raw = bytes(request.scope.get("raw_path") or b"").split(b"?", 1)[0]
    parts = raw.split(b"/")
    if len(parts) > 2 and b"%2f" in parts[2].lower():
        raise InvalidInput("a session name can't contain '/'; use letters, digits, '_' or '-'")


def _forwarded(request: Request) -> bool:
    """Another host forwarded this request (cao/forward.py): serve it here, never forward it on."""
    return forward.FORWARDED_HEADER.decode() in request.headers


def _message_id(raw: str) -> int:
    return validate_message_id(raw)
