"""``cao-mcp-server``: the MCP tools agents use to work together (thin: call the HTTP API).

Every agent CLI that cao launches starts one of these over stdio. It speaks for one terminal, its
*caller* (``CAO_TERMINAL_ID``, set by cao in every agent's environment), and reaches cao-server at
``CAO_SERVER_URL`` with its API token, if any (``CAO_API_TOKEN``, else ``$CAO_HOME/api-token``). Tools:

    send_message(message, receiver_id=None)   into an inbox; no receiver = the caller's supervisor
    assign(agent_profile, message, ...)        start a worker, queue its task, return its id at once
    handoff(agent_profile, message, timeout)   start a worker, run one task, return its answer, remove it
    worker_diff(worker_id, full), merge_worker(worker_id, into)   review and merge a worker's branch
    my_inbox(status=None), my_workers(), whoami()
    board_get(key), board_list(prefix=""), board_set(key, value, expected_version)
                                               the caller's session's board: facts that wake no one

**Idempotency of send_message.** An MCP retry is a *new* ``tools/call`` request (a new JSON-RPC id)
with the same tool name and arguments, sent after the first one failed or timed out, possibly after
cao-server committed the message. So the key can't come from the request id or a per-call counter:
it is derived from what is sent. The first send of a (receiver, text) pair gets a fresh key
(``mcp-<caller>-<process tag>-<n>``); an identical send within ``RETRY_WINDOW`` seconds of the last
one reuses it, and cao-server answers with the first message's receipt (``duplicate: true``)
instead of storing a second. The window slides with each retry. An agent that really wants to send
the same text twice in a row is told so and changes the text. Keys live in this process: a retry
after the MCP server itself restarted is a new message.

**handoff is cao-server's.** The tool calls ``POST /terminals/run-step`` (cao/handoff.py: one
implementation for agents and the reference's clients), asking it to remove the worker whether it
answers or fails, under a job id. While that request runs, the worker's status is read with short
requests (``POLL_INTERVAL``) for MCP progress notifications on every status change and at least
every ``PROGRESS_EVERY`` seconds (clients that reset their request timeout on progress keep
waiting). If the call is cancelled (the client gave up), the worker is sent its exit command and
deleted, shielded from cancellation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from mcp.server.mcpserver.exceptions import ToolError

from cao.names import board_path
from cao.states import AnswerSource, Kind, Status

logger = logging.getLogger(__name__)

RETRY_WINDOW = 300.0  # seconds an identical send_message counts as a retry (sliding)
POLL_INTERVAL = 0.5  # seconds between status reads while handoff waits
PROGRESS_EVERY = 5.0  # seconds between progress notifications when nothing changes
EXIT_GRACE = 3.0  # seconds a worker gets to leave after its exit command, before it is killed
HTTP_TIMEOUT = 20.0  # one request; no request waits for an agent
MAX_TIMEOUT = 24 * 3600.0
STEP_GRACE = 120.0  # seconds a handoff's request may outlast its timeout (start-up, the answer's read)

Report = Callable[[float, float, str], Awaitable[None]]

INSTRUCTIONS = """\
You are one of several coding agents, each in its own terminal, coordinated by cao.
- handoff: give a task to a new worker and wait for its answer (the worker is removed afterwards).
- assign: give a task to a new worker and carry on; its result arrives as a `result` message, and a
  `notice` tells you when a worker finishes, waits at a permission prompt, fails or exits.
- report_result: as a worker, report on your task to your supervisor (done / failed / blocked).
- send_message: message another agent by terminal id; leave receiver_id out to reach your supervisor.
- check_inbox / read_message / ack: see what waits and what reached you; ack what you handled.
- schedule_wakeup: a message to yourself later (once or every N minutes).
- use_worktree=true on assign/handoff gives a worker its own git worktree and branch; review its
  work with worker_diff and merge it into your branch with merge_worker.
- board_get, board_list, board_set: your session's shared board of facts (who owns what, build
  status, decisions). Writing one interrupts no one; the others read it when they look.
Messages to you arrive as your input, headed `[cao message #N from <terminal id>]`; answer with
send_message. my_inbox, my_workers and whoami show your messages, your workers and who you are."""

ASSIGN_NOTE = """\
---
(cao) You are worker {worker} ({profile}); terminal {supervisor} assigned you this task and is your \
supervisor. When you finish, or if you can't go on, report with the report_result tool: \
status done, failed or blocked, a summary, and details (branch, files, tests) if any; it reaches \
{supervisor} as your result. For questions on the way, use send_message without a receiver_id."""


def _canonical(value: Any) -> str:
    """A JSON value as one text: 1, 1.0 and true are three different values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
        self._board_sent: dict[tuple[str, str, int], float] = {}  # board writes sent lately (retries)
        self._count = 0
        self._session: str | None = None  # the caller's session (a terminal never changes it)

    # -- plumbing ----------------------------------------------------------------------------------
    async def _call(self, method: str, path: str, *, what: str, busy_retries: int = 0, **kw: Any) -> Any:
        """One request; failures become ToolError naming ``what`` was being done and the fix."""
        resp = await self._response(method, path, what=what, busy_retries=busy_retries, **kw)
        if resp.status_code >= 400:
            raise ToolError(f"{what}: {_detail(resp)} (HTTP {resp.status_code})")
        return resp.json()

    async def _response(
        self, method: str, path: str, *, what: str, busy_retries: int = 0, **kw: Any
    ) -> httpx.Response:
        """The answer, whatever its status, but for an unreachable or busy server (Unreachable)."""
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
            return resp
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
    async def send_message(
        self, message: str, receiver_id: str | None = None, **attention: Any
    ) -> dict[str, Any]:
        """``attention``: priority, if_busy, ttl_seconds, kind, topic (None: the server's default)."""
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
                **{k: v for k, v in attention.items() if v is not None},
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
    async def _start_worker(
        self,
        me: dict[str, Any],
        agent_profile: str,
        working_directory: str | None,
        use_worktree: bool | None = None,
        notify: bool | None = None,
        host: str | None = None,
    ) -> dict[str, Any]:
        """A worker in the caller's session, supervised by the caller; cao-server chooses its
        provider (the profile's pinned one, else the caller's: cao/launch.py). ``host``: the host
        whose tmux runs it (several cao-servers sharing a store; cao/hosts.py)."""
        body: dict[str, Any] = {
            "agent_profile": agent_profile,
            "supervisor_id": me["id"],
            "working_directory": working_directory or me["working_directory"],
        }
        if use_worktree is not None:  # else the profile's default
            body["use_worktree"] = use_worktree
        if notify is not None:
            body["notify"] = notify
        if host is not None:
            body["host"] = host
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
                if resp.status_code == 404 or resp.json().get("status") == Status.GONE:
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
        notify: bool | None = None,
        host: str | None = None,
    ) -> dict[str, Any]:
        if not message.strip():
            raise ToolError("message is empty; describe the task for the worker")
        me = await self.me()
        worker = await self._start_worker(me, agent_profile, working_directory, use_worktree, notify, host)
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
                    "kind": Kind.TASK.value,
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
                f"worker {wid} gets the task as soon as it is ready and reports its result with "
                "report_result; the result arrives in your input as a cao message, and a notice tells you "
                "if it finishes without one, waits at a permission prompt, fails or exits. See it working "
                "with my_workers."
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
        notify: bool | None = None,
    ) -> str:
        """cao-server's one handoff (``POST /terminals/run-step``, cao/handoff.py), followed here:
        its job's worker is read while it runs, for progress notifications, and removed if this
        call is cancelled (the client gave up)."""
        if not message.strip():
            raise ToolError("message is empty; describe the task for the worker")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise ToolError(f"timeout must be between 0 and {MAX_TIMEOUT:g} seconds, got {timeout:g}")
        me = await self.me()
        job = secrets.token_hex(16)
        body: dict[str, Any] = {
            "agent": agent_profile,
            "prompt": message,
            "caller_id": me["id"],
            "session_name": me["session_name"],
            "timeout": timeout,
            "job_id": job,
            "remove_on_failure": True,
        }
        if use_worktree is not None:
            body["use_worktree"] = use_worktree
        if notify is not None:
            body["notify"] = notify
        done = anyio.Event()
        outcome: dict[str, Any] = {}

        async def step() -> None:
            try:
                outcome["result"] = await self._call(
                    "POST",
                    "/terminals/run-step",
                    json=body,
                    what=f"handing the task to a {agent_profile!r} worker",
                    timeout=httpx.Timeout(HTTP_TIMEOUT, read=timeout + STEP_GRACE),
                )
            except ToolError as exc:
                outcome["failure"] = exc
            finally:
                done.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(step)
                await self._follow(job, agent_profile, timeout, report, done)
        except BaseException:
            with anyio.move_on_after(self.exit_grace + 2 * HTTP_TIMEOUT, shield=True):
                await self._abandon(job)  # cancelled: the worker must not outlive the call
            raise
        if "failure" in outcome:
            raise outcome["failure"]
        result: dict[str, Any] = outcome["result"]
        wid = result["terminal_id"]
        answer = str(result.get("last_message") or "").strip() or f"(worker {wid} finished without a reply)"
        if result.get("answer_source") == AnswerSource.RESULT:
            answer = f"(cao) Worker {wid} reported this result:\n\n{answer}"
        elif result.get("answer_source") == AnswerSource.SCREEN:
            answer += (
                f"\n\n(cao) Worker {wid} reported no result (report_result); above is its last answer "
                "on its screen."
            )
        if result.get("worktree"):  # removed: uncommitted work became a wip commit on the branch
            answer += (
                f"\n\n(cao) Worker {wid} worked on branch {result['worktree']['branch']}; its work (if it "
                f"changed anything) stays there. Review it with worker_diff(worker_id={wid!r}) and merge "
                f"it with merge_worker(worker_id={wid!r}).)"
            )
        return answer

    async def _follow(
        self, job: str, profile: str, timeout: float, report: Report | None, done: anyio.Event
    ) -> None:
        """Progress while the step runs: the worker's status on every change, and at least every
        ``progress_every`` seconds (clients that reset their request timeout on progress wait on)."""
        started, wid, last, last_report = self.clock(), None, "", -1e9
        while not done.is_set():
            with contextlib.suppress(ToolError):
                if wid is None:
                    wid = (await self._call("GET", f"/handoff-results/{job}", what="following the handoff"))[
                        "terminal_id"
                    ]
                if wid is not None:
                    status = str(
                        (await self._call("GET", f"/terminals/{wid}", what="reading its status"))["status"]
                    )
                    now = self.clock()
                    if status != last or now - last_report >= self.progress_every:
                        note = f"worker {wid} ({profile}): {status}"
                        if status == Status.WAITING_USER_ANSWER:
                            note += " (it asks a question: answer it in its tmux pane)"
                        await _quietly(report, round(now - started, 1), timeout, note)
                        last, last_report = status, now
            with anyio.move_on_after(self.poll_interval):
                await done.wait()

    async def _abandon(self, job: str) -> None:
        """The handoff was cancelled: remove its worker (found through the job)."""
        try:
            wid = (await self._call("GET", f"/handoff-results/{job}", what="finding the worker"))[
                "terminal_id"
            ]
        except ToolError:
            return
        if wid:
            await self._remove(wid)

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

    # -- your own queue ------------------------------------------------------------------------------
    async def check_inbox(self) -> dict[str, Any]:
        """What waits for you (in the order it will be served) and what reached you but you have not
        acknowledged, with previews (read_message for a body). Changes nothing."""
        caller = self.caller()
        view = await self._call(
            "GET", f"/terminals/{caller}/inbox", what="reading your inbox", busy_retries=2
        )
        keys = ("id", "sender_id", "kind", "priority", "status", "created_at", "size")

        def brief(m: dict[str, Any], *more: str) -> dict[str, Any]:
            return {
                **{k: m.get(k) for k in (*keys, *more)},
                "preview": " ".join(str(m.get("message", "")).split())[:200],
            }

        waiting = [brief(m, "expires_at", "deliver_at") for m in view["waiting"]]
        unacked = [brief(m, "delivered_at", "read_at", "age_seconds") for m in view["unacked"]]
        return {
            "terminal_id": caller,
            "ack_cursor": view["ack_cursor"],
            "waiting": waiting,
            "unacked": unacked,
            "note": "ack(through_message_id, expected=ack_cursor) once you have handled what reached you",
        }

    async def ack(
        self,
        through_message_id: int | None = None,
        expected: int | None = None,
        message_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        caller = self.caller()
        body: dict[str, Any] = {"by": caller}
        if through_message_id is not None:
            body["through_message_id"] = int(through_message_id)
        if expected is not None:
            body["expected"] = int(expected)
        if message_ids:
            body["message_ids"] = [int(i) for i in message_ids]
        out: dict[str, Any] = await self._call(
            "POST", f"/terminals/{caller}/ack", json=body, what="acknowledging", busy_retries=2
        )
        return out

    async def report_result(
        self, status: str, summary: str, details: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        caller = self.caller()
        body: dict[str, Any] = {"by": caller, "status": status, "summary": summary}
        if details is not None:
            body["details"] = details
        out: dict[str, Any] = await self._call(
            "POST", f"/terminals/{caller}/result", json=body, what="reporting your result", busy_retries=2
        )
        keys = ("result_id", "status", "supervisor_id", "message_id", "duplicate", "note")
        return {k: out.get(k) for k in keys}

    async def schedule_wakeup(
        self,
        message: str,
        in_minutes: float | None = None,
        at: str | None = None,
        every_minutes: float | None = None,
    ) -> dict[str, Any]:
        caller = self.caller()
        if (in_minutes is None) == (at is None):
            raise ToolError("say when: give in_minutes or at (ISO 8601 with a zone), one of them")
        body: dict[str, Any] = {"by": caller, "message": message}
        if in_minutes is not None:
            body["in_seconds"] = float(in_minutes) * 60
        if at is not None:
            body["at"] = at
        if every_minutes is not None:
            body["every_seconds"] = float(every_minutes) * 60
        out: dict[str, Any] = await self._call(
            "POST", f"/terminals/{caller}/schedules", json=body, what="scheduling a wake-up", busy_retries=2
        )
        keys = ("id", "first_at", "every_seconds", "next_at", "state")
        return {**{k: out.get(k) for k in keys}, "note": f"cancel it with cancel_wakeup({out.get('id')})"}

    async def cancel_wakeup(self, schedule_id: int) -> dict[str, Any]:
        out: dict[str, Any] = await self._call(
            "POST",
            f"/schedules/{int(schedule_id)}/cancel",
            json={"by": self.caller()},
            what=f"cancelling wake-up {schedule_id}",
            busy_retries=2,
        )
        return {k: out.get(k) for k in ("id", "state", "closed_by")}

    async def my_wakeups(self) -> dict[str, Any]:
        caller = self.caller()
        rows = await self._call(
            "GET",
            "/schedules",
            params={"receiver_id": caller, "active": "true"},
            what="listing your wake-ups",
        )
        keys = ("id", "message", "first_at", "every_seconds", "next_at", "state")
        return {"terminal_id": caller, "wakeups": [{k: r.get(k) for k in keys} for r in rows]}

    async def read_message(self, message_id: int) -> dict[str, Any]:
        m = await self._call(
            "POST",
            f"/messages/{int(message_id)}/read",
            json={"by": self.caller()},
            what=f"reading message {message_id}",
            busy_retries=2,
        )
        keys = ("id", "sender_id", "kind", "priority", "status", "created_at", "message")
        return {k: m.get(k) for k in keys}

    async def manage(self, message_id: int, action: str, **fields: Any) -> dict[str, Any]:
        """defer, drop or prioritize one message of your own queue."""
        m = await self._call(
            "POST",
            f"/messages/{int(message_id)}/{action}",
            json={"by": self.caller(), **{k: v for k, v in fields.items() if v is not None}},
            what=f"{action} message {message_id}",
            busy_retries=2,
        )
        keys = ("id", "status", "priority", "deliver_at", "closed_reason")
        return {k: m.get(k) for k in keys}

    # -- the session's coordination board (cao/board.py) --------------------------------------------
    async def my_session(self) -> str:
        if self._session is None:
            self._session = str((await self.me())["session_name"])
        return self._session

    async def board_get(self, key: str) -> dict[str, Any]:
        session = await self.my_session()
        resp = await self._response("GET", board_path(session, key), what=f"reading {key!r}", busy_retries=2)
        if resp.status_code == 404 and "current_version" in resp.json():
            version = resp.json()["current_version"]
            return {
                "key": key,
                "exists": False,
                "version": version,
                "note": f"not on the board ({_detail(resp)}); board_set with expected_version 0 creates it",
            }
        if resp.status_code >= 400:
            raise ToolError(f"reading {key!r}: {_detail(resp)} (HTTP {resp.status_code})")
        return {"exists": True, **_fact(resp.json())}

    async def board_list(self, prefix: str = "") -> dict[str, Any]:
        session = await self.my_session()
        facts = await self._call(
            "GET",
            board_path(session),
            params={"prefix": prefix} if prefix else None,
            what="listing your session's board",
            busy_retries=2,
        )
        return {"session_name": session, "facts": [_fact(f) for f in facts], "count": len(facts)}

    async def board_set(self, key: str, value: Any, expected_version: int) -> dict[str, Any]:
        session = await self.my_session()
        # An MCP retry of a write that got through finds its own value there, one version on: it
        # counts as written only if this process sent this very write (same key, same value as
        # canonical JSON, same expected version) within the retry window, before this call.
        now = self.clock()
        self._board_sent = {k: t for k, t in self._board_sent.items() if now - t < self.retry_window}
        canon = _canonical(value)
        attempt = (key, canon, int(expected_version))
        again = attempt in self._board_sent
        self._board_sent[attempt] = now
        resp = await self._response(
            "PUT",
            board_path(session, key),
            json={"value": value, "expected_version": expected_version, "by": self.caller()},
            what=f"writing {key!r}",
            busy_retries=2,
        )
        body = resp.json()
        if resp.status_code == 409 and "current_version" in body:  # lost the race: say what won
            current = body["current_version"]
            if (
                again
                and body.get("current_writer") == self.caller()
                and not body.get("current_deleted")
                and _canonical(body.get("current_value")) == canon
            ):  # exactly what this write would have made: an MCP retry of a write that got through
                return {
                    "written": True,
                    "key": key,
                    "version": current,
                    "value": value,
                    "writer": self.caller(),
                    "at": body.get("current_at"),
                    "note": f"version {current}, written by this same call before (a retry); nobody was "
                    "interrupted",
                }
            return {
                "written": False,
                "key": key,
                "current_version": current,
                "current_value": body.get("current_value"),
                "current_writer": body.get("current_writer"),
                "current_deleted": body.get("current_deleted", False),
                "note": f"not written: {body['detail']}. If your change still applies to what is there "
                f"now, call board_set again with expected_version {current}",
            }
        if resp.status_code >= 400:
            raise ToolError(f"writing {key!r}: {_detail(resp)} (HTTP {resp.status_code})")
        return {
            "written": True,
            **_fact(body),
            "note": f"version {body['version']}; nobody was interrupted (the others see it when they read "
            "the board)",
        }


def _fact(f: dict[str, Any]) -> dict[str, Any]:
    return {k: f.get(k) for k in ("key", "version", "value", "writer", "at")}


# -- the MCP server ----------------------------------------------------------------------------------
