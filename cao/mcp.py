"""``cao-mcp-server``: the MCP tools agents use to work together (thin: call the HTTP API).

Every agent CLI that cao launches starts one of these over stdio. It speaks for one terminal, its
*caller* (``CAO_TERMINAL_ID``, set by cao in every agent's environment), and reaches cao-server at
``CAO_SERVER_URL`` with its API token, if any (``CAO_API_TOKEN``, else ``$CAO_HOME/api-token``). Tools:

    send_message(message, receiver_id=None)   into an inbox; no receiver = the caller's supervisor
    assign(agent_profile, message, ...)        start a worker, queue its task, return its id at once
    handoff(agent_profile, message, timeout)   start a worker, run one task, return its answer, remove it
    worker_diff(worker_id, full), merge_worker(worker_id, into)   review and merge a worker's branch
    my_inbox(status=None), my_workers(), whoami()

**Idempotency of send_message.** An MCP retry is a *new* ``tools/call`` request (a new JSON-RPC id)
with the same tool name and arguments, sent after the first one failed or timed out, possibly after
cao-server committed the message. So the key can't come from the request id or a per-call counter:
it is derived from what is sent. The first send of a (receiver, text) pair gets a fresh key
(``mcp-<caller>-<process tag>-<n>``); an identical send within ``RETRY_WINDOW`` seconds of the last
one reuses it, and cao-server answers with the first message's receipt (``duplicate: true``)
instead of storing a second. The window slides with each retry. An agent that really wants to send
the same text twice in a row is told so and changes the text. Keys live in this process: a retry
after the MCP server itself restarted is a new message.

**Waiting in handoff.** No request is held open for the task: the worker's status is polled with
short requests (``POLL_INTERVAL``), so neither an HTTP timeout nor a slow agent start cuts the wait
short; only ``timeout`` does. While waiting, MCP progress notifications go out on every status change
and at least every ``PROGRESS_EVERY`` seconds (clients that reset their request timeout on progress
keep waiting). Whatever happens (answer, error, timeout, cancellation) the worker is sent its exit
command and then deleted (pane and processes), shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import anyio
import click
import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

import cao
from cao import apitoken, profiles
from cao.errors import CaoError
from cao.settings import Settings

logger = logging.getLogger(__name__)

RETRY_WINDOW = 300.0  # seconds an identical send_message counts as a retry (sliding)
POLL_INTERVAL = 0.5  # seconds between status reads while handoff waits
PROGRESS_EVERY = 5.0  # seconds between progress notifications when nothing changes
EXIT_GRACE = 3.0  # seconds a worker gets to leave after its exit command, before it is killed
HTTP_TIMEOUT = 20.0  # one request; no request waits for an agent
MAX_TIMEOUT = 24 * 3600.0
READY = ("idle", "completed")

Report = Callable[[float, float, str], Awaitable[None]]

INSTRUCTIONS = """\
You are one of several coding agents, each in its own terminal, coordinated by cao.
- handoff: give a task to a new worker and wait for its answer (the worker is removed afterwards).
- assign: give a task to a new worker and carry on; it reports back to you with send_message.
- send_message: message another agent by terminal id; leave receiver_id out to reach your supervisor.
- use_worktree=true on assign/handoff gives a worker its own git worktree and branch; review its
  work with worker_diff and merge it into your branch with merge_worker.
Messages to you arrive as your input, headed `[cao message #N from <terminal id>]`; answer with
send_message. my_inbox, my_workers and whoami show your messages, your workers and who you are."""

ASSIGN_NOTE = """\
---
(cao) You are worker {worker} ({profile}); terminal {supervisor} assigned you this task and is your \
supervisor. When you finish, or if you are blocked, report back with the send_message tool: leave \
receiver_id out and the message reaches {supervisor}."""


class Unreachable(ToolError):
    """cao-server did not answer (or was busy): nothing is known to have happened; retry later."""


async def _quietly(report: Report | None, progress: float, total: float, message: str) -> None:
    if report is None:
        return
    try:
        await report(progress, total, message)
    except Exception:  # a client that went away must not fail the task
        logger.debug("progress notification failed", exc_info=True)


def _detail(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
    if isinstance(detail, list):  # FastAPI validation errors
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
    return str(detail)


@dataclass
class _Sent:
    key: str
    last_seen: float


class AgentTools:
    """What the tools do, over an injectable ``httpx.AsyncClient`` (``base_url`` = cao-server)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        terminal_id: str | None,
        *,
        retry_window: float = RETRY_WINDOW,
        poll_interval: float = POLL_INTERVAL,
        progress_every: float = PROGRESS_EVERY,
        exit_grace: float = EXIT_GRACE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.http = http
        self.terminal_id = terminal_id
        self.retry_window = retry_window
        self.poll_interval = poll_interval
        self.progress_every = progress_every
        self.exit_grace = exit_grace
        self.clock = clock
        self.process_tag = secrets.token_hex(4)
        self._sent: dict[str, _Sent] = {}
        self._count = 0
        self._profiles_dir: Path | None = None  # cao-server's profile store, asked once

    # -- plumbing ----------------------------------------------------------------------------------
    async def _call(self, method: str, path: str, *, what: str, busy_retries: int = 0, **kw: Any) -> Any:
        """One request; failures become ToolError naming ``what`` was being done and the fix."""
        for attempt in range(busy_retries + 1):
            try:
                resp = await self.http.request(method, path, **kw)
            except httpx.TransportError as exc:
                raise Unreachable(
                    f"{what}: cao-server is not reachable at {self.http.base_url} ({type(exc).__name__}); "
                    "check that cao-server is running and CAO_SERVER_URL points at it, then retry"
                ) from None
            if resp.status_code == 503 and attempt < busy_retries:
                await anyio.sleep(float(resp.headers.get("Retry-After", "1")))
                continue
            if resp.status_code == 503:
                raise Unreachable(f"{what}: {_detail(resp)} (HTTP 503)")
            if resp.status_code >= 400:
                raise ToolError(f"{what}: {_detail(resp)} (HTTP {resp.status_code})")
            return resp.json()
        raise AssertionError("unreachable")  # pragma: no cover

    def caller(self) -> str:
        if not self.terminal_id:
            raise ToolError(
                "this MCP server doesn't know which agent it serves: CAO_TERMINAL_ID is not set. cao sets "
                "it for every agent it launches; start the agent with cao (or pass --terminal-id)"
            )
        return self.terminal_id

    async def me(self) -> dict[str, Any]:
        caller = self.caller()
        term: dict[str, Any] = await self._call(
            "GET", f"/terminals/{caller}", what=f"looking up your terminal {caller}", busy_retries=2
        )
        return term

    def idempotency_key(self, receiver_id: str, message: str) -> str:
        """The same key for an identical send within the retry window (see the module docstring)."""
        now = self.clock()
        self._sent = {d: s for d, s in self._sent.items() if now - s.last_seen < self.retry_window}
        digest = hashlib.sha256(f"{receiver_id}\n{message}".encode()).hexdigest()
        sent = self._sent.get(digest)
        if sent is None:
            self._count += 1
            sent = _Sent(f"mcp-{self.terminal_id}-{self.process_tag}-{self._count}", now)
            self._sent[digest] = sent
        sent.last_seen = now
        return sent.key

    # -- send_message ------------------------------------------------------------------------------
    async def send_message(self, message: str, receiver_id: str | None = None) -> dict[str, Any]:
        caller = self.caller()
        if not message.strip():
            raise ToolError("message is empty; write the text to send")
        receiver = (receiver_id or "").strip() or await self._supervisor()
        receipt = await self._call(
            "POST",
            f"/terminals/{receiver}/inbox/messages",
            json={
                "sender_id": caller,
                "message": message,
                "idempotency_key": self.idempotency_key(receiver, message),
            },
            what=f"send_message to {receiver}",
            busy_retries=2,
        )
        if receipt["duplicate"]:
            note = (
                f"not sent again: an identical message to {receiver} was sent moments ago "
                f"(message #{receipt['message_id']}, {receipt['status']}), so this call counts as a retry "
                "of it. To send the same thing twice on purpose, change the text."
            )
        else:
            note = f"queued; it is pasted into {receiver}'s terminal as soon as that agent is ready"
        return {
            "message_id": receipt["message_id"],
            "receiver_id": receiver,
            "status": receipt["status"],
            "duplicate": receipt["duplicate"],
            "note": note,
        }

    async def _supervisor(self) -> str:
        me = await self.me()
        supervisor: str | None = me.get("supervisor_id")
        if not supervisor:
            raise ToolError(
                f"terminal {me['id']} has no supervisor (it wasn't started by assign or handoff), so "
                "send_message needs a receiver_id; find terminal ids with my_workers or whoami"
            )
        return supervisor

    # -- workers -----------------------------------------------------------------------------------
    async def _pinned_provider(self, agent_profile: str) -> str | None:
        """The provider the profile pins, read from cao-server's own profile store (or a built-in)."""
        try:
            if self._profiles_dir is None:
                info = await self._call("GET", "/info", what="reading cao-server's settings")
                self._profiles_dir = Settings(home=Path(info["home"])).profiles_dir
            return profiles.load(agent_profile, self._profiles_dir).provider
        except (CaoError, ToolError, KeyError):
            return None  # cao-server names the problem when it creates the worker

    async def _start_worker(
        self,
        me: dict[str, Any],
        agent_profile: str,
        working_directory: str | None,
        use_worktree: bool | None = None,
    ) -> dict[str, Any]:
        body = {
            "agent_profile": agent_profile,
            "provider": await self._pinned_provider(agent_profile) or me["provider"],
            "supervisor_id": me["id"],
            "working_directory": working_directory or me["working_directory"],
        }
        if use_worktree is not None:  # else the profile's default
            body["use_worktree"] = use_worktree
        worker: dict[str, Any] = await self._call(
            "POST",
            f"/sessions/{me['session_name']}/terminals",
            json=body,
            what=f"starting a {agent_profile!r} worker",
        )
        logger.info("worker started", extra={"terminal_id": worker["id"], "supervisor_id": me["id"]})
        return worker

    async def _remove(self, worker_id: str) -> None:
        """Exit command, a short grace to leave, then delete (kills the pane); never raises."""
        try:
            await self.http.post(f"/terminals/{worker_id}/exit")
            deadline = self.clock() + self.exit_grace
            while self.clock() < deadline:
                resp = await self.http.get(f"/terminals/{worker_id}")
                if resp.status_code == 404 or resp.json().get("status") == "gone":
                    break
                await anyio.sleep(0.1)
        except (httpx.HTTPError, ValueError):
            pass  # the delete below still kills it
        try:
            resp = await self.http.delete(f"/terminals/{worker_id}")
            if resp.status_code not in (200, 404):
                logger.warning("worker not removed: %s", _detail(resp), extra={"terminal_id": worker_id})
        except httpx.HTTPError as exc:
            logger.warning("worker not removed: %s", exc, extra={"terminal_id": worker_id})

    async def assign(
        self,
        agent_profile: str,
        message: str,
        working_directory: str | None = None,
        use_worktree: bool | None = None,
    ) -> dict[str, Any]:
        if not message.strip():
            raise ToolError("message is empty; describe the task for the worker")
        me = await self.me()
        worker = await self._start_worker(me, agent_profile, working_directory, use_worktree)
        wid = worker["id"]
        note = ASSIGN_NOTE.format(worker=wid, profile=agent_profile, supervisor=me["id"])
        try:
            receipt = await self._call(
                "POST",
                f"/terminals/{wid}/inbox/messages",
                json={
                    "sender_id": me["id"],
                    "message": f"{message}\n\n{note}",
                    "idempotency_key": f"assign-{wid}",
                },
                what=f"queueing the task for worker {wid}",
                busy_retries=2,
            )
        except ToolError:
            with anyio.CancelScope(shield=True):
                await self._remove(wid)  # a worker without its task would idle forever
            raise
        out = {
            "worker_id": wid,
            "agent_profile": worker["agent_profile"],
            "provider": worker["provider"],
            "session_name": worker["session_name"],
            "message_id": receipt["message_id"],
            "note": (
                f"worker {wid} gets the task as soon as it is ready and reports back with send_message; "
                "the report arrives in your input as a cao message. See it working with my_workers."
            ),
        }
        if worker.get("worktree"):
            out["branch"] = worker["worktree"]["branch"]
            out["worktree"] = worker["worktree"]["path"]
            out["note"] += (
                f" It works in its own git worktree on branch {out['branch']}: review its work with "
                "worker_diff and merge it into your branch with merge_worker."
            )
        return out

    # -- handoff -----------------------------------------------------------------------------------
    async def handoff(
        self,
        agent_profile: str,
        message: str,
        timeout: float = 600.0,
        report: Report | None = None,
        use_worktree: bool | None = None,
    ) -> str:
        if not message.strip():
            raise ToolError("message is empty; describe the task for the worker")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds, got {timeout:g}")
        me = await self.me()
        worker = await self._start_worker(me, agent_profile, None, use_worktree)
        wid = worker["id"]
        try:
            answer = await self._run_task(worker, message, timeout, report)
        finally:
            with anyio.move_on_after(self.exit_grace + 2 * HTTP_TIMEOUT, shield=True):
                await self._remove(wid)
        if worker.get("worktree"):  # removed: uncommitted work became a wip commit on the branch
            answer += (
                f"\n\n(cao) Worker {wid} worked on branch {worker['worktree']['branch']}; its work (if "
                f"it changed anything) stays there. Review it with worker_diff(worker_id={wid!r}) and "
                f"merge it with merge_worker(worker_id={wid!r}).)"
            )
        return answer

    async def _run_task(
        self, worker: dict[str, Any], message: str, timeout: float, report: Report | None
    ) -> str:
        wid, started = worker["id"], self.clock()
        deadline = started + timeout
        async with self._status_events(wid) as wake:
            await self._wait(worker, started, deadline, timeout, report, task_sent=False, wake=wake)
            await self._call(
                "POST",
                f"/terminals/{wid}/input",
                json={"message": message},
                what=f"sending the task to {wid}",
            )
            await self._wait(worker, started, deadline, timeout, report, task_sent=True, wake=wake)
        out = await self._call(
            "GET", f"/terminals/{wid}/output", params={"mode": "last"}, what=f"reading {wid}'s answer"
        )
        answer = str(out.get("output") or "").strip()
        return answer or f"(worker {wid} finished without a reply)"

    async def _wait(
        self,
        worker: dict[str, Any],
        started: float,
        deadline: float,
        timeout: float,
        report: Report | None,
        *,
        task_sent: bool,
        wake: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Read the worker's status until it is ready (before the task) or done (after it); errors
        fail fast. ``wake(seconds)`` returns early when the event stream reports a status change of
        the worker, so the reads follow the worker instead of a fixed beat."""
        wid, profile = worker["id"], worker["agent_profile"]
        status, last_status, last_report, busy_seen = "starting", "", -1e9, False
        while True:
            try:
                term = await self._call("GET", f"/terminals/{wid}", what=f"reading {wid}'s status")
                status = str(term["status"])
            except Unreachable as exc:  # a blip: keep polling until the deadline
                logger.warning("status read failed: %s", exc, extra={"terminal_id": wid})
            if status == "error":
                raise ToolError(
                    f"worker {wid} ({profile}) stopped with an error: {await self._last_words(wid)}. "
                    "It has been removed; fix the cause (see the error) or retry the handoff"
                )
            if status == "gone":
                raise ToolError(
                    f"worker {wid} ({profile}) exited before it finished (its pane is gone); it has been "
                    "removed. Retry the handoff, or check the agent CLI starts (`cao launch --agents "
                    f"{profile}`)"
                )
            if not task_sent and status in READY and term.get("mcp_ready") is not False:
                return
            if task_sent:
                if status == "completed" or (status == "idle" and busy_seen):
                    return
                busy_seen = busy_seen or status in ("processing", "waiting_user_answer")
            now = self.clock()
            if now >= deadline:
                doing = "finish the task" if task_sent else "become ready"
                raise ToolError(
                    f"worker {wid} ({profile}) did not {doing} within {timeout:g} s (last status: {status}); "
                    "it has been stopped and removed. Retry with a larger timeout, split the task, or use "
                    "assign for long work (the worker reports back by message)"
                )
            if status != last_status or now - last_report >= self.progress_every:
                note = f"worker {wid} ({profile}): {status}"
                if status == "waiting_user_answer":
                    note += f" (it asks a question: answer it in tmux session {worker['session_name']})"
                await _quietly(report, round(now - started, 1), timeout, note)
                last_status, last_report = status, now
            if wake is not None:
                await wake(self.poll_interval)
            else:
                await anyio.sleep(self.poll_interval)

    @contextlib.asynccontextmanager
    async def _status_events(self, wid: str) -> AsyncIterator[Callable[[float], Awaitable[None]]]:
        """Follow cao-server's event stream for ``wid``'s status changes while a handoff waits (the
        status reads stay the source of truth; this only says when to read). Without a stream
        (an older server, a dropped connection) the reads keep their plain beat."""
        send, receive = anyio.create_memory_object_stream[None](64)
        needle = f'"terminal_id":"{wid}"'

        async def follow() -> None:
            with contextlib.suppress(httpx.HTTPError, anyio.EndOfStream, anyio.ClosedResourceError):
                async with self.http.stream(
                    "GET", "/events", params={"keepalive": 15}, timeout=httpx.Timeout(HTTP_TIMEOUT, read=None)
                ) as resp:
                    if resp.status_code != 200:
                        return
                    async for line in resp.aiter_lines():
                        if line.startswith("data:") and needle in line and '"type":"terminal.' in line:
                            with contextlib.suppress(anyio.WouldBlock):
                                send.send_nowait(None)

        async def wake(seconds: float) -> None:
            with anyio.move_on_after(seconds):
                await receive.receive()
            while True:  # several changes at once: one read covers them
                try:
                    receive.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                try:
                    yield wake
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # the waiting body's own error, not a group of them
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _last_words(self, worker_id: str) -> str:
        try:
            out = await self._call(
                "GET", f"/terminals/{worker_id}/output", params={"mode": "last"}, what="reading the error"
            )
            return str(out.get("output") or "").strip() or "(no error text on its screen)"
        except ToolError as exc:
            return f"(could not read its screen: {exc})"

    # -- reads -------------------------------------------------------------------------------------
    async def whoami(self) -> dict[str, Any]:
        me = await self.me()
        return {
            "terminal_id": me["id"],
            "session_name": me["session_name"],
            "agent_profile": me["agent_profile"],
            "provider": me["provider"],
            "status": me["status"],
            "supervisor_id": me.get("supervisor_id"),
            "working_directory": me["working_directory"],
            "server_url": str(self.http.base_url).rstrip("/"),
        }

    async def my_workers(self) -> dict[str, Any]:
        caller = self.caller()
        rows = await self._call("GET", "/terminals", what="listing terminals", busy_retries=2)
        keys = (
            "id",
            "agent_profile",
            "provider",
            "status",
            "session_name",
            "working_directory",
            "last_active",
        )
        workers = [
            {**{k: t.get(k) for k in keys}, "branch": (t.get("worktree") or {}).get("branch")}
            for t in rows
            if t.get("supervisor_id") == caller
        ]
        return {"supervisor_id": caller, "workers": workers}

    # -- review and merge (workers with their own git worktree) ------------------------------------
    async def worker_diff(self, worker_id: str, full: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = await self._call(
            "GET",
            f"/terminals/{worker_id}/diff",
            params={"full": "true" if full else "false"},
            what=f"reading worker {worker_id}'s changes",
        )
        return data

    async def merge_worker(self, worker_id: str, into: str | None = None) -> dict[str, Any]:
        resp = await self.http.post(f"/terminals/{worker_id}/merge", json={"into": into} if into else {})
        if resp.status_code == 409 and "conflicts" in resp.json():
            body = resp.json()
            return {"merged": False, "detail": body["detail"], "conflicts": body["conflicts"]}
        if resp.status_code >= 400:
            raise ToolError(f"merging worker {worker_id}: {_detail(resp)} (HTTP {resp.status_code})")
        data: dict[str, Any] = resp.json()
        return data

    async def my_inbox(self, status: str | None = None) -> dict[str, Any]:
        caller = self.caller()
        params = {"receiver_id": caller, **({"status": status} if status else {})}
        rows = await self._call(
            "GET",
            "/messages",
            params=params,
            what="reading your inbox",
            busy_retries=2,
        )
        keys = ("id", "sender_id", "status", "message", "created_at", "delivered_at", "last_error")
        return {"terminal_id": caller, "messages": [{k: m.get(k) for k in keys} for m in rows]}


# -- the MCP server ----------------------------------------------------------------------------------
TerminalId = Annotated[str, Field(description="A terminal id: 8 hex digits, e.g. 1a2b3c4d.")]
ProfileName = Annotated[
    str,
    Field(description="Agent profile of the worker, e.g. developer or reviewer (`cao profiles` lists them)."),
]


def build_server(tools: AgentTools) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("cao", instructions=INSTRUCTIONS, version=cao.__version__)

    @server.tool()
    async def send_message(
        message: Annotated[str, Field(description="The text to send.")],
        receiver_id: Annotated[
            str | None, Field(description="Terminal id of the receiver; leave out to reach your supervisor.")
        ] = None,
    ) -> dict[str, Any]:
        """Put a message in another agent's inbox; it is pasted into that agent's terminal when it is ready.

        Returns at once with the message id. Without receiver_id the message goes to your supervisor
        (the agent that assigned you your task). Retrying an identical call doesn't send it twice.
        """
        return await tools.send_message(message, receiver_id)

    @server.tool()
    async def assign(
        agent_profile: ProfileName,
        message: Annotated[str, Field(description="The task: everything the worker needs to do it.")],
        working_directory: Annotated[
            str | None, Field(description="Directory the worker starts in (default: yours).")
        ] = None,
        use_worktree: Annotated[
            bool | None,
            Field(
                description="Give the worker its own git worktree on a new branch from your HEAD, so "
                "parallel workers don't edit the same files (default: its profile's setting)."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a new worker agent on a task and return its terminal id at once (don't wait for it).

        The worker gets the task through its inbox, with a note saying you are its supervisor. It
        reports back with send_message; the report arrives in your input as a cao message. Use it for
        parallel or long tasks; use handoff when you need the answer before going on.
        """
        return await tools.assign(agent_profile, message, working_directory, use_worktree)

    @server.tool()
    async def handoff(
        agent_profile: ProfileName,
        message: Annotated[str, Field(description="The task: everything the worker needs to do it.")],
        timeout: Annotated[
            float,
            Field(description="Seconds to wait for the answer (start-up included).", gt=0, le=MAX_TIMEOUT),
        ] = 600.0,
        use_worktree: Annotated[
            bool | None,
            Field(description="Run the worker in its own git worktree (its branch stays for merge_worker)."),
        ] = None,
        ctx: Context[Any, Any] | None = None,
    ) -> str:
        """Start a new worker agent, give it one task, wait for it to finish and return its answer.

        The worker is stopped and removed afterwards, also on error or timeout. Use it for
        self-contained tasks whose result you need now; use assign for work that takes long.
        """
        report = ctx.report_progress if ctx is not None else None
        return await tools.handoff(agent_profile, message, timeout, report, use_worktree)

    @server.tool()
    async def worker_diff(
        worker_id: TerminalId,
        full: Annotated[bool, Field(description="The whole patch instead of the stat.")] = False,
    ) -> dict[str, Any]:
        """Show what a worker with its own git worktree changed: its branch's commits and what it
        has not committed yet, against the branch it was made from (stat, or the full patch)."""
        return await tools.worker_diff(worker_id, full)

    @server.tool()
    async def merge_worker(
        worker_id: TerminalId,
        into: Annotated[
            str | None, Field(description="Branch to merge into (default: the one it was made from).")
        ] = None,
    ) -> dict[str, Any]:
        """Merge a worker's branch into yours (or `into`). On a conflict nothing changes: you get
        merged=false and the conflicted files' text; resolve it in the worker and merge again."""
        return await tools.merge_worker(worker_id, into)

    @server.tool()
    async def my_inbox(
        status: Annotated[
            str | None,
            Field(
                description="Only messages in this status: pending, delivering, delivered, failed, cancelled."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """List the newest messages sent to you (sender, status, text), newest first."""
        return await tools.my_inbox(status)

    @server.tool()
    async def my_workers() -> dict[str, Any]:
        """List the workers you started (assign or handoff) that still exist, with their live status."""
        return await tools.my_workers()

    @server.tool()
    async def whoami() -> dict[str, Any]:
        """Your terminal id, session, profile, provider, status and supervisor (if any)."""
        return await tools.whoami()

    return server


async def serve(server_url: str, terminal_id: str | None, auth: httpx.Auth | None = None) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=HTTP_TIMEOUT, auth=auth) as http:
        if terminal_id:  # tell cao-server this agent's tools are up: it holds input until then
            try:
                await http.post(f"/terminals/{terminal_id}/mcp-ready")
            except httpx.HTTPError as exc:
                logger.warning("could not report in to cao-server: %s", exc)
        await build_server(AgentTools(http, terminal_id)).run_stdio_async()


EPILOG = """\b
Example (an agent CLI's MCP configuration; cao's providers write it for you):
  {"mcpServers": {"cao": {"command": "cao-mcp-server",
                          "env": {"CAO_TERMINAL_ID": "1a2b3c4d",
                                  "CAO_SERVER_URL": "http://127.0.0.1:9889",
                                  "CAO_HOME": "/home/me/.cao"}}}}

\b
Try it by hand:
  CAO_TERMINAL_ID=1a2b3c4d cao-mcp-server     # then speak MCP (JSON-RPC) on stdin
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option(
    "--terminal-id",
    envvar="CAO_TERMINAL_ID",
    default=None,
    help="The terminal whose agent this server speaks for (default: $CAO_TERMINAL_ID).",
)
@click.option(
    "--server-url", default=None, help="cao-server URL (default: $CAO_SERVER_URL or http://127.0.0.1:9889)."
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Log level (logs go to stderr; stdout carries the protocol).",
)
@click.version_option(cao.__version__, "--version", prog_name="cao-mcp-server")
def main(terminal_id: str | None, server_url: str | None, log_level: str) -> None:
    """MCP server (stdio) with the tools agents use to work together.

    Tools: send_message, assign, handoff, worker_diff, merge_worker, my_inbox, my_workers, whoami.
    Each agent CLI started by cao runs one; it acts as that agent (CAO_TERMINAL_ID) against
    cao-server (CAO_SERVER_URL), sending the server's API token if it has one (CAO_API_TOKEN,
    else $CAO_HOME/api-token).
    """
    logging.basicConfig(
        stream=sys.stderr, level=log_level.upper(), format="%(levelname)s %(name)s %(message)s"
    )
    try:
        settings = Settings.from_env()
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    url = server_url or settings.server_url
    anyio.run(serve, url.rstrip("/"), terminal_id, apitoken.BearerAuth(settings))


if __name__ == "__main__":
    main()
