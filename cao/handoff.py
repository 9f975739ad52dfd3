"""One agent step, start to answer — the one handoff (``POST /terminals/run-step``; the agents'
MCP ``handoff`` tool calls the same route, cao/mcp/tools.py):

    create a worker (or reuse one) ─► type the task once it is ready ─► wait for its answer
      ─► return it ─► delete the worker (``teardown``; a failed one too with ``remove_on_failure``)

With a ``job_id`` the state and the result are kept under that id (``GET /handoff-results/{id}``),
so a client whose request timed out — or an MCP server following the step — can read them.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

from cao.clock import SYSTEM, Clock
from cao.coordination import result_text, result_view
from cao.errors import BoxOccupied, CaoError, InvalidInput, PaneGone, PaneInMode, TmuxServerDown
from cao.lifecycle import Lifecycle
from cao.names import validate_terminal_id
from cao.paste import is_blank
from cao.states import AnswerSource, JobState, Status, StepFailure, TerminalState
from cao.status import StatusReader
from cao.store import Store, TaskResult, Terminal
from cao.timefmt import iso
from cao.typist import Typist

logger = logging.getLogger(__name__)

JOB_ID_RE = re.compile(r"^[0-9a-f]{32}$")
STEP_POLL = 0.2  # seconds between status reads while a step waits
MAX_STEP_TIMEOUT = 24 * 3600.0
LONG_WORK = (
    "Retry with a larger timeout, split the task, or use assign for long work (the worker reports back)"
)


class StepFailed(CaoError):
    """A step failed: the worker errored (502), ran out of time (504) or a person is using its
    pane (409: text in its box, or scrolling it).

    ``fields`` go into the error body next to ``detail``, so the reference's clients read ``kind``
    and ``terminal_id`` without parsing the text."""

    def __init__(self, message: str, *, kind: str, terminal_id: str | None) -> None:
        super().__init__(message)
        self.status_code = {StepFailure.TIMEOUT: 504, StepFailure.BUSY: 409}.get(StepFailure(kind), 502)
        self.fields = {"kind": kind, "terminal_id": terminal_id}


def check_job_id(job_id: str) -> str:
    if not JOB_ID_RE.match(job_id):
        raise InvalidInput("job_id must be a 32-character lowercase hex string (e.g. uuid4().hex)")
    return job_id


class Handoffs:
    def __init__(
        self,
        store: Store,
        status: StatusReader,
        typist: Typist,
        lifecycle: Lifecycle,
        create: Callable[..., dict[str, Any]],
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        self.store = store
        self.status = status
        self.typist = typist
        self.lifecycle = lifecycle
        self.create = create  # Cao.create_terminal: provider aliases, the supervisor link
        self.clock = clock

    def run(
        self,
        *,
        provider: str | None,
        agent: str,
        prompt: str,
        session_name: str | None = None,
        reuse_terminal_id: str | None = None,
        teardown: bool = True,
        remove_on_failure: bool = False,
        timeout: float = 600.0,
        working_directory: str | None = None,
        caller_id: str | None = None,
        job_id: str | None = None,
        use_worktree: bool | None = None,
        notify: bool | None = None,
    ) -> dict[str, object]:
        """Create a worker (or reuse one), type ``prompt`` once it is ready, wait until it has
        answered, return its last message, and delete it (``teardown``, only a worker created
        here, only on success: a failed one stays for inspection, as in the reference, unless
        ``remove_on_failure``). Raises :class:`StepFailed` (kind ``error``, ``timeout`` or ``busy``)
        naming the worker."""
        if job_id is not None:
            check_job_id(job_id)
        if not 0 < timeout <= MAX_STEP_TIMEOUT:
            raise InvalidInput(f"timeout must be between 0 and {MAX_STEP_TIMEOUT:g} seconds")
        if is_blank(prompt):
            raise InvalidInput("prompt is empty (only whitespace or invisible characters)")
        if job_id is not None:
            self.store.put_handoff_job(job_id, JobState.RUNNING)
        worker: Terminal | None = None
        created: dict[str, Any] = {}
        try:
            if reuse_terminal_id:
                worker = self.store.get_terminal(validate_terminal_id(reuse_terminal_id))
            else:
                if working_directory is None and caller_id:
                    working_directory = self.store.get_terminal(
                        validate_terminal_id(caller_id)
                    ).working_directory
                created = self.create(
                    provider=provider,
                    agent_profile=agent,
                    session_name=session_name,
                    working_directory=working_directory,
                    new_session=session_name is None,
                    caller_id=caller_id,
                    use_worktree=use_worktree,
                    notify=notify,
                )
                worker = self.store.get_terminal(str(created["id"]))
            if job_id is not None:
                self.store.put_handoff_job(job_id, JobState.RUNNING, terminal_id=worker.id)
            removed = remove_on_failure and not reuse_terminal_id
            task = f"j{job_id}" if job_id is not None else f"s{secrets.token_hex(8)}"
            answer, reported = self._step(worker, prompt, timeout, removed, task)
            if job_id is not None:
                self.store.put_handoff_job(job_id, JobState.COMPLETED, last_message=answer)
        except CaoError as exc:
            if job_id is not None:
                wid = worker.id if worker else None
                self.store.put_handoff_job(job_id, JobState.ERROR, terminal_id=wid, error_message=exc.message)
            if worker is not None and remove_on_failure and not reuse_terminal_id:
                self._remove(worker)
            raise
        if teardown and not reuse_terminal_id:
            self._remove(worker)
        out: dict[str, object] = {
            "terminal_id": worker.id,
            "last_message": answer,
            "status": JobState.COMPLETED.value,
            "replayed": False,
            **answer_fields(reported),
        }
        if created.get("worktree"):
            out["worktree"] = created["worktree"]
        return out

    def _remove(self, worker: Terminal) -> None:
        try:
            self.lifecycle.delete(self.store.get_terminal(worker.id, include_deleted=True))
        except CaoError as exc:  # the answer (or the failure) is in hand; a failed cleanup must not hide it
            logger.warning("worker not removed", extra={"terminal_id": worker.id, "error": exc.message})

    def _step(
        self, terminal: Terminal, prompt: str, timeout: float, removed: bool, task: str
    ) -> tuple[str, TaskResult | None]:
        """Type the prompt (held until the agent is ready), wait for the answer, return it: the
        result the worker reported for this attempt (``task``) as soon as it did, else its last
        answer on the screen once its turn ended."""
        tid = terminal.id
        gone = " It has been removed." if removed else ""
        self.store.set_task(tid, task, tasked=False)  # the attempt first: a report can't come too early
        try:
            self.typist.send_input(terminal, prompt)
        except (PaneGone, TmuxServerDown) as exc:
            raise StepFailed(
                f"worker terminal {tid} is gone: {exc.message}.{gone}",
                kind=StepFailure.ERROR,
                terminal_id=tid,
            ) from None
        except (BoxOccupied, PaneInMode) as exc:  # a person types in it or scrolls it: nothing typed
            raise StepFailed(
                f"worker terminal {tid}: {exc.message}", kind=StepFailure.BUSY, terminal_id=tid
            ) from None
        except CaoError as exc:
            if exc.status_code == 409:  # never became ready: nothing was typed
                raise StepFailed(
                    f"worker terminal {tid} did not become ready: {exc.message}.{gone}",
                    kind=StepFailure.TIMEOUT,
                    terminal_id=tid,
                ) from None
            raise
        self.store.set_task(tid, task)  # typed: it has work now (its notices follow this attempt)
        deadline = self.clock.monotonic() + timeout
        busy_seen = False
        while True:
            reported = self.store.get_result(tid, task)
            if reported is not None:
                return result_text(terminal, reported), reported
            current = self.store.get_terminal(tid, include_deleted=True)
            status = self.status.status(current)
            if status == Status.COMPLETED or (status == Status.IDLE and busy_seen):
                reported = self.store.get_result(tid, task)  # reported in its last moments
                if reported is not None:
                    return result_text(terminal, reported), reported
                return self.status.output(current, "last"), None
            if status == Status.ERROR:
                why = self.status.output(current, "last")
                fix = " It has been removed; fix the cause (see the error) or retry." if removed else ""
                raise StepFailed(
                    f"worker terminal {tid} stopped with an error: {why}.{fix}",
                    kind=StepFailure.ERROR,
                    terminal_id=tid,
                )
            if status == Status.GONE or current.state != TerminalState.LIVE:
                why = current.gone_reason or current.state
                raise StepFailed(
                    f"worker terminal {tid} exited before it answered ({why}).{gone}",
                    kind=StepFailure.ERROR,
                    terminal_id=tid,
                )
            busy_seen = busy_seen or status in (Status.PROCESSING, Status.WAITING_USER_ANSWER)
            if self.clock.monotonic() > deadline:
                left = (
                    "it has been stopped and removed"
                    if removed
                    else "it is still running: look at it, or delete it"
                )
                raise StepFailed(
                    f"worker terminal {tid} did not finish the task within {timeout:g} s (last status: "
                    f"{status}); {left}. {LONG_WORK}",
                    kind=StepFailure.TIMEOUT,
                    terminal_id=tid,
                )
            self.clock.sleep(STEP_POLL)

    def result(self, job_id: str) -> dict[str, object]:
        job = self.store.get_handoff_job(check_job_id(job_id))
        reported = self.store.get_result(job.terminal_id, f"j{job_id}") if job.terminal_id else None
        return {
            "job_id": job.job_id,
            "state": job.state,
            "terminal_id": job.terminal_id,
            "last_message": job.last_message,
            "error_message": job.error_message,
            "created_at": iso(job.created_at),
            "updated_at": iso(job.updated_at),
            **(answer_fields(reported) if job.state == JobState.COMPLETED else {}),
        }


def answer_fields(reported: TaskResult | None) -> dict[str, object]:
    """Which answer a step returned: the worker's reported result, or its screen's last answer."""
    if reported is None:
        return {
            "answer_source": AnswerSource.SCREEN.value,
            "result": None,
            "answer_note": "the worker reported no result (report_result): this is its last answer on "
            "the screen",
        }
    return {
        "answer_source": AnswerSource.RESULT.value,
        "result": result_view(reported),
        "answer_note": "the result the worker reported (report_result)",
    }
