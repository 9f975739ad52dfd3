"""The orchestrator as a library: one object that owns the store, tmux, terminals and delivery.

``cao-server`` wraps it in HTTP; tests use it directly. Construction has no side effects beyond
opening the database; ``start()`` adopts surviving panes, resolves interrupted deliveries and
starts the triggers; ``stop()`` stops them (terminals keep running: they belong to tmux).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import providers
from cao import attention, profiles, screenrules
from cao.board import Board
from cao.clock import SYSTEM, Clock
from cao.coordination import Coordination
from cao.delivery import Delivery, Faults
from cao.engine import DeliveryEngine
from cao.errors import (
    CaoError,
    Conflict,
    HostUnreachable,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReceiverBusy,
    ReceiverGone,
    StoreGone,
)
from cao.events import EventBus
from cao.handoff import Handoffs, StepFailed  # noqa: F401 - StepFailed: the API maps it
from cao.hosts import Hosts, StoreClock
from cao.inbox import Inbox, event_view
from cao.launch import LaunchPlanner
from cao.lifecycle import Lifecycle
from cao.names import TERMINAL_ID_RE, validate_host_name, validate_terminal_id
from cao.panelog import PaneLogs
from cao.panes import PaneIO, Panes
from cao.paste import is_blank
from cao.settings import Settings
from cao.states import (
    ENDED,
    READY,
    Event,
    FailureKind,
    HookPhase,
    IfBusy,
    Kind,
    MessageStatus,
    Status,
    TerminalState,
    Trigger,
)
from cao.status import StatusReader
from cao.store import MAX_BODY_BYTES, MESSAGE_STATUSES, Message, MessageEvent, Store, Terminal
from cao.timefmt import iso
from cao.tmux import Tmux, session_name_for
from cao.typist import Typist
from cao.usage import UsageBook
from cao.worktrees import Git, Workspaces

logger = logging.getLogger(__name__)

SCHEDULE_SENDER = "schedule-"  # the sender name of a wake-up's slots (cao/store/coordination.py)
WORKER_TOPIC = "worker."  # the topics of cao's notices about a worker (cao/coordination.py)
SENDER_RE_HINT = "a terminal id (8 hex digits) or a name like 'cli' or 'operator'"

# The reference orchestrator's provider names (cli-agent-orchestrator 2.1-2.5). Three of them are
# the same CLIs as ours; the rest have no cao provider (CAO_PROVIDER_ALIASES can map them).
REFERENCE_PROVIDERS = (
    "kiro_cli",
    "q_cli",
    "claude_code",
    "codex",
    "gemini_cli",
    "kimi_cli",
    "copilot_cli",
    "opencode_cli",
    "cursor_cli",
    "hermes",
    "antigravity_cli",
    "omp",
    "grok_cli",
    "mcode",
)
# Named keys POST /terminals/{id}/key accepts (the reference's list): no text, no key sequences.
KEY_RE = re.compile(r"^(?:Up|Down|Left|Right|Enter|Tab|Escape|Space|[A-Za-z0-9]|[CMS]-[A-Za-z0-9])$")


# queue changes that only the timeline tells of: also as message.<event> for listeners of those
ALSO_AS_MESSAGE_EVENT = frozenset(
    {
        Event.DEFERRED,
        Event.PRIORITIZED,
        Event.DROPPED,
        Event.EXPIRED,
        Event.SUPERSEDED,
        Event.READ,
        Event.HANDED,
    }
)


class BadRequest(InvalidInput):
    """A malformed value on a route whose reference clients expect 400 rather than 422."""

    status_code = 400


@dataclass(frozen=True)
class Receipt:
    message: Message
    duplicate: bool

    def as_dict(self) -> dict[str, object]:
        """The receipt: the reference's keys (``success``, ISO 8601 ``created_at``) plus ours."""
        m = self.message
        return {
            "success": True,
            "message_id": m.id,
            "sender_id": m.sender_id,
            "receiver_id": m.receiver_id,
            "status": m.status,
            "created_at": iso(m.created_at),
            "duplicate": self.duplicate,
            "priority": attention.priority_name(m.priority),
            "kind": m.kind,
            "if_busy": m.if_busy,
            "expires_at": iso(m.expires_at),
            "deliver_at": iso(m.not_before),
        }


def validate_sender(sender_id: str) -> str:
    if not sender_id or len(sender_id) > 64 or not all(c.isalnum() or c in "-_." for c in sender_id):
        raise InvalidInput(f"sender_id {sender_id!r} is not valid; use {SENDER_RE_HINT}")
    return sender_id


class Cao:
    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Clock = SYSTEM,
        pane_io: PaneIO | None = None,
    ) -> None:
        """``pane_io``: the pane backend (default: tmux on ``settings.tmux_socket``; the fast test
        tier passes cao/testing/panes.py's in-memory one). ``clock``: the library's time."""
        settings.ensure_dirs()
        # the user's screen-rule fixes ($CAO_HOME/providers/*.rules): checked before anything starts
        self.rule_overrides = screenrules.install(settings.home)
        self.provider_aliases = _check_aliases(settings.provider_aliases)
        self.settings = settings
        if settings.database_url is not None:  # hosts share the store: one time, the database's
            clock = StoreClock(clock)
        self.time = clock
        self.clock = clock.now
        now = clock.now
        self.store = Store(settings.db_location, busy_timeout=settings.busy_timeout, clock=now)
        try:
            self._assemble(settings, clock, environ, pane_io)
        except BaseException:  # a refused file (prices, budgets): no connection left open
            self.store.close()
            raise

    def _assemble(
        self, settings: Settings, clock: Clock, environ: Mapping[str, str] | None, pane_io: PaneIO | None
    ) -> None:
        now = clock.now
        self.tmux: PaneIO = (
            pane_io if pane_io is not None else Tmux(settings.tmux_socket, control=settings.tmux_control)
        )
        self.faults = Faults(settings.fault_point)
        self.events = EventBus(clock=now)
        env = dict(os.environ if environ is None else environ)
        self.logs = PaneLogs(settings.logs_dir)
        home_tag = hashlib.sha256(str(settings.home.resolve()).encode()).hexdigest()[:12]
        self.panes = Panes(self.tmux, self.store, home_tag=home_tag, events=self.events)
        self.status = StatusReader(settings, self.store, self.panes, events=self.events, clock=now)
        self.typist = Typist(settings, self.store, self.panes, self.status, clock=clock)
        self.workspaces = Workspaces(settings, self.store, Git(env), events=self.events, clock=now)
        self.planner = LaunchPlanner(settings, self.workspaces, environ=env, clock=now)
        self.lifecycle = Lifecycle(
            settings,
            self.store,
            self.tmux,
            self.panes,
            self.status,
            self.logs,
            self.planner,
            self.workspaces,
            events=self.events,
            fault=self.faults.hit,
        )
        self.delivery = Delivery(
            settings,
            self.store,
            self.panes,
            self.status,
            self.typist,
            self.logs,
            clock=clock,
            faults=self.faults,
            events=self.events,
        )
        self.engine = DeliveryEngine(self.delivery, clock=now)
        self.engine.ticks.append(self.tmux.check_socket)  # a /tmp cleaner removed the socket file
        if settings.output_wakes:  # trigger 2b: a busy receiver's pane went quiet (tmux %output)
            self.tmux.watch_output(self.engine.on_pane_quiet, self.engine.output_quiet)
            self.engine.ticks.append(self._watch_output)
        self.inbox = Inbox(self.store, now)
        self.coordination = Coordination(settings, self.store, self.inbox, events=self.events, clock=now)
        self._follow_work()
        self.board = Board(self.store, self.events, self.inbox.actor)
        self.store.on_event = self._told
        self.engine.lifecycle = self.lifecycle
        self.engine.keepers.append(self.status.keep_secret)
        self.handoffs = Handoffs(
            self.store,
            self.status,
            self.typist,
            self.lifecycle,
            self.create_terminal,
            clock=clock,
        )
        # what each agent costs ($CAO_HOME/prices.toml, budgets.toml: checked here, like the rules)
        self.usage = UsageBook(
            settings.home,
            self.store,
            events=self.events,
            clock=now,
            wake=lambda rid: self.engine.immediate(rid) if self.started else None,
            skew=self._store_skew,
        )
        self.engine.ticks.append(self.usage.tick)
        self.lifecycle.retiring.append(self.usage.read)
        # the other cao-servers sharing the store (cao/hosts.py): who owns a terminal, forwarding
        self.hosts = Hosts(
            settings,
            self.store,
            clock,
            home_tag,
            _version(),
            on_wake=self._woken_elsewhere,
            on_fenced=self._fenced,
        )
        self.status.remote = self.hosts.remote_statuses
        self.inbox.host_down = self.hosts.down_reason
        self.engine.foreign = self.hosts.is_foreign
        self.on_fenced: list[Callable[[str], None]] = []  # cao-server: stop the process
        self.started = False

    def _store_skew(self) -> float:
        """The store's time minus this machine's wall clock: 0 on a SQLite file (one clock)."""
        clock = self.time
        return clock.now() - clock.base.now() if isinstance(clock, StoreClock) else 0.0

    def _woken_elsewhere(self, receiver_ids: list[str]) -> None:
        """Another host committed mail for these receivers of ours ([]: the wake listener
        reconnected, and notices sent meanwhile are lost: look at every receiver with mail)."""
        if not self.started:
            return
        for rid in receiver_ids or self.store.receivers_with_pending():
            self.engine.immediate(rid)

    def _fenced(self, why: str) -> None:
        """This process lost its host name: deliver nothing more, and let cao-server stop."""
        if self.started:
            self.engine.stop()
            self.started = False
        for listener in self.on_fenced:
            listener(why)

    def _follow_work(self) -> None:
        """Coordination hears every status read and pane loss, and wakes delivery and status reads
        through the engine (cao/coordination.py)."""
        coord, engine = self.coordination, self.engine
        coord.wake = lambda rid: engine.immediate(rid) if self.started else None
        coord.refresh = engine.refresh_status
        coord.attend = engine.attend
        engine.attending = coord.attending
        engine.on_work_log = coord.on_log
        engine.ticks.append(coord.tick)
        self.status.on_status = coord.observe
        self.panes.on_gone(coord.gone)
        self.lifecycle.deleted_listeners.append(coord.deleted)

    def _told(self, event: MessageEvent) -> None:
        """A timeline event committed: on the event stream too."""
        fields = event_view(event)
        fields["event_id"] = fields.pop("id")  # the bus gives every event its own id
        self.events.publish("timeline", **fields)
        if event.event in ALSO_AS_MESSAGE_EVENT and event.message_id is not None:
            self.events.publish(
                f"message.{event.event}",
                message_ids=[event.message_id],
                receiver_id=event.receiver_id,
                reason=event.reason,
                actor=event.actor,
            )

    def start(self) -> dict[str, list[str]]:
        self.hosts.register()  # before anything looks at panes: the engine sees this host's only
        adopted = self.lifecycle.adopt()
        self.coordination.start()
        rows = {t.id: t for t in self.store.list_terminals(include_deleted=True, local=True)}
        trees = self.workspaces.adopt(rows)  # orphans are listed, never removed
        adopted["worktrees_adopted"], adopted["worktree_orphans"] = trees["adopted"], trees["orphans"]
        self.engine.start()
        self.started = True
        self.hosts.start()
        logger.info("cao started", extra={"adopted": len(adopted["adopted"]), "gone": len(adopted["gone"])})
        return adopted

    def _watch_output(self) -> None:
        """Housekeeping: an output watch on each session with terminals (new ones, a tmux restart)."""
        sessions = {t.session_name for t in self.store.list_terminals(local=True) if t.state not in ENDED}
        self.engine.forget_panes()
        self.tmux.refresh_output_watch(sorted(sessions))

    def stop(self) -> None:
        if self.started:
            self.engine.stop()
            self.coordination.stop()
            self.started = False
        self.hosts.stop()
        self.tmux.shutdown()
        self.store.close()

    # -- the inbox ------------------------------------------------------------------------------
    def send_message(
        self,
        receiver_id: str,
        body: str,
        *,
        sender_id: str = "cli",
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Receipt:
        """Commit a message, then wake delivery (the caller never waits for tmux). ``options``:
        the attention options (cao/attention.py ``resolve``: kind, priority, if_busy, ttl_seconds,
        expires_at, deliver_at, topic)."""
        validate_terminal_id(receiver_id)
        validate_sender(sender_id)
        if options.get("kind") in (Kind.RESULT, Kind.WAKEUP):
            raise InvalidInput(
                f"kind {options['kind']} is cao's own: a result comes from its worker's report_result "
                "(POST /terminals/{id}/result), a wake-up from a schedule (POST /terminals/{id}/schedules)"
            )
        if sender_id.startswith(SCHEDULE_SENDER):
            raise InvalidInput(
                f"sender_id {sender_id!r} is a wake-up schedule's name (cao sends as it); send as yourself"
            )
        if str(options.get("topic") or "").startswith(WORKER_TOPIC):
            raise InvalidInput(
                f"topic {options['topic']!r} is cao's own (a worker's notices); pick a topic not starting "
                f"with {WORKER_TOPIC!r}"
            )
        wants = attention.resolve(
            now=self.clock(), sender_is_terminal=bool(TERMINAL_ID_RE.fullmatch(sender_id)), **options
        )
        if idempotency_key is not None and not (1 <= len(idempotency_key) <= 200):
            raise InvalidInput("idempotency_key must be 1-200 characters")
        if is_blank(body):
            raise InvalidInput("message is empty (only whitespace or invisible characters); send some text")
        if sender_id == receiver_id:
            raise InvalidInput(
                f"terminal {receiver_id} can't send a message to itself; pick another receiver"
            )
        if wants.if_busy == IfBusy.REFUSE:
            self._refuse_if_busy(receiver_id)
        message, duplicate = self.store.add_message(
            sender_id=sender_id,
            receiver_id=receiver_id,
            body=body,
            idempotency_key=idempotency_key,
            attention=wants,
            before_commit=lambda: self.faults.hit("before_commit"),
            # stored with the row in the same insert: no second write to say why it waits
            waiting_reason=(hint := self.delivery.reason_for(receiver_id)),
        )
        self.faults.hit("after_commit")
        if not duplicate:
            if hint is not None:
                self.delivery.stored_with(receiver_id, hint, message.id or 0)
            self.events.publish(
                "message.queued", message_id=message.id, sender_id=sender_id, receiver_id=receiver_id
            )
            if self.started:
                self.engine.immediate(receiver_id)
        return Receipt(message, duplicate)

    def _refuse_if_busy(self, receiver_id: str) -> None:
        """``if_busy=refuse``: the receiver's status now (one screen read); not ready → 409 and
        nothing stored."""
        terminal = self.store.get_terminal(receiver_id)
        if terminal.state in ENDED:
            return  # the send itself says so, with its words
        status = self.status.status(terminal)
        if status == Status.GONE:  # its pane closed, not yet noticed: waiting would never deliver
            raise ReceiverGone(
                f"receiver terminal {receiver_id} is gone (its agent exited or its pane was closed); "
                f"nothing was stored; delete it with `cao shutdown {receiver_id}` and send to a live one"
            )
        if status not in READY:
            raise ReceiverBusy(
                f"receiver {receiver_id} is {status}; nothing was stored (if_busy=refuse). Send with "
                "if_busy=wait to have it delivered when the agent is ready",
                status=str(status),
            )

    def message_view(self, message: Message) -> dict[str, object]:
        return self.inbox.view(message)

    # -- a receiver's queue: defer, drop, re-prioritise, read, its attention view -------------------
    def defer_message(self, message_id: int, **kwargs: Any) -> dict[str, object]:
        m = self.inbox.defer(message_id, **kwargs)
        if self.started:
            self.engine.immediate(m.receiver_id)  # it may be due at once, or later: the runner says when
        return self.message_view(m)

    def drop_message(self, message_id: int, **kwargs: Any) -> dict[str, object]:
        return self.message_view(self.inbox.drop(message_id, **kwargs))

    def prioritize_message(self, message_id: int, **kwargs: Any) -> dict[str, object]:
        m = self.inbox.prioritize(message_id, **kwargs)
        if self.started:
            self.engine.immediate(m.receiver_id)
        return self.message_view(m)

    def read_message(self, message_id: int, *, by: str | None = None) -> dict[str, object]:
        return self.message_view(self.inbox.read(message_id, by=by))

    def attention(self, terminal_id: str, *, limit: int = 200) -> dict[str, object]:
        validate_terminal_id(terminal_id)
        terminal = self.store.get_terminal(terminal_id, include_deleted=True)
        status = str(self.view(terminal).get("status", "unknown"))
        view = self.inbox.attention(terminal_id, status, limit=limit)
        mail = self.coordination.inbox_view(terminal_id)
        view["ack_cursor"], view["unacked"] = mail["ack_cursor"], mail["unacked"]
        view["work_state"] = terminal.work_state
        view["task_id"] = terminal.task_id
        return view

    def explain(self, terminal_id: str, *, report: bool = False) -> dict[str, Any]:
        """Why the terminal reads its status (cao/explain.py); ``report``: with a bug report (the
        explanation and the screen, redacted) ready to paste into an issue."""
        from cao import explain

        validate_terminal_id(terminal_id)
        terminal = self.store.get_terminal(terminal_id, include_deleted=True)
        out, screen = self.status.explain(terminal)
        out["terminal"] = {
            "id": terminal.id,
            "name": terminal.name,
            "session_name": terminal.session_name,
            "state": terminal.state,
        }
        out["text"] = explain.render(out)  # what `cao explain` prints (the dashboard shows it)
        if report:
            homes = (str(self.settings.home.resolve()), str(self.settings.home), os.path.expanduser("~"))
            out["bug_report"] = explain.bug_report(out, screen, homes=homes)
        return out

    # -- coordination: acks, results, notifications, wake-ups (cao/coordination.py) ---------------
    def terminal_usage(self, terminal_id: str, *, fresh: bool = True) -> dict[str, object]:
        """Tokens and cost of one terminal, per task and model (``fresh``: its CLI's records are
        read now, not at the last housekeeping look)."""
        terminal = self.store.get_terminal(validate_terminal_id(terminal_id), include_deleted=True)
        if fresh and terminal.state == TerminalState.LIVE:
            self.usage.refresh([terminal.id])
            terminal = self.store.get_terminal(terminal.id, include_deleted=True)
        return {"terminal_id": terminal.id, "provider": terminal.provider, **self.usage.view(terminal)}

    def usage_overview(self, session_name: str | None = None, *, fresh: bool = True) -> dict[str, object]:
        """Every terminal's tokens and cost (one session's, or all, deleted ones included: money
        spent stays spent), the sum, and the budgets with what they have used."""
        if fresh:
            self.usage.refresh()
        rows = self.store.list_terminals(include_deleted=True)
        if session_name:
            rows = [t for t in rows if t.session_name == session_name_for(session_name)]
            if not rows:
                raise NotFound(f"session {session_name} not found; list sessions with `cao status`")
        total, unknown = self.usage.totals(rows)
        return {
            "terminals": [
                {
                    "terminal_id": t.id,
                    "session_name": t.session_name,
                    "agent_profile": t.agent_profile,
                    "provider": t.provider,
                    "state": t.state,
                    **self.usage.brief(t),
                }
                for t in rows
            ],
            "total": total.as_dict(),
            "terminals_unknown": unknown,
            "budgets": self.usage.budgets_view(),
        }

    def check_inbox(self, terminal_id: str) -> dict[str, Any]:
        return self.coordination.inbox_view(terminal_id)

    def ack(self, terminal_id: str, **kwargs: Any) -> dict[str, Any]:
        return self.coordination.ack(terminal_id, **kwargs)

    def report_result(self, terminal_id: str, **kwargs: Any) -> dict[str, Any]:
        return self.coordination.report_result(terminal_id, **kwargs)

    def results(self, terminal_id: str) -> list[dict[str, object]]:
        return self.coordination.results(terminal_id)

    def notifications(self, **kwargs: Any) -> list[dict[str, object]]:
        return self.coordination.notifications(**kwargs)

    def schedule(self, receiver_id: str, **kwargs: Any) -> dict[str, Any]:
        return self.coordination.schedule(receiver_id, **kwargs)

    def schedules(self, receiver_id: str | None = None, *, active_only: bool = False) -> list[dict[str, Any]]:
        return self.coordination.schedules(receiver_id, active_only=active_only)

    def get_schedule(self, schedule_id: int) -> dict[str, Any]:
        return self.coordination.schedule_view(self.store.get_schedule(schedule_id))

    def cancel_schedule(self, schedule_id: int, *, by: str | None = None) -> dict[str, Any]:
        return self.coordination.cancel_schedule(schedule_id, by=by)

    def list_inbox(
        self, terminal_id: str, *, status: str | None = None, limit: int = 50
    ) -> list[dict[str, object]]:
        validate_terminal_id(terminal_id)
        _check_listing(status, limit)
        self.store.get_terminal(terminal_id, include_deleted=True)
        rows = self.store.list_messages(receiver_id=terminal_id, status=status, limit=limit)
        return [self.message_view(m) for m in rows]

    def list_messages(
        self, *, status: str | None = None, limit: int = 50, receiver_id: str | None = None
    ) -> list[dict[str, object]]:
        if receiver_id is not None:
            return self.list_inbox(receiver_id, status=status, limit=limit)
        _check_listing(status, limit)
        return [self.message_view(m) for m in self.store.list_messages(status=status, limit=limit)]

    def reference_inbox(
        self, terminal_id: str, *, status: str | None = None, limit: int = 10
    ) -> list[dict[str, object]]:
        """A receiver's messages as the reference orchestrator lists them: oldest first, ISO 8601
        times, 10 by default (at most 100), 400 for an unknown status. Our fuller view, newest
        first, is ``GET /messages?receiver_id=``."""
        validate_terminal_id(terminal_id)
        if status is not None and status not in MESSAGE_STATUSES:
            raise BadRequest(f"Invalid status: {status}. Valid values: {', '.join(MESSAGE_STATUSES)}")
        if not 1 <= limit <= 100:
            raise InvalidInput("limit must be between 1 and 100")
        self.store.get_terminal(terminal_id, include_deleted=True)
        rows = self.store.list_messages(receiver_id=terminal_id, status=status, limit=limit, order="asc")
        return [
            {
                "id": m.id,
                "sender_id": m.sender_id,
                "receiver_id": m.receiver_id,
                "message": m.body,
                "status": m.status,
                "created_at": iso(m.created_at),
            }
            for m in rows
        ]

    def get_message(self, message_id: int) -> dict[str, object]:
        return self.message_view(self.store.get_message(message_id))

    def cancel_message(self, message_id: int, *, by: str | None = None) -> dict[str, object]:
        message = self.inbox.cancel(message_id, by=by)
        self.events.publish("message.cancelled", message_id=message.id, receiver_id=message.receiver_id)
        return self.message_view(message)

    # -- terminals and sessions (what the HTTP routes call) ---------------------------------------
    def create_terminal(
        self,
        *,
        provider: str | None = None,
        caller_id: str | None = None,
        supervisor_id: str | None = None,
        initial_message: str | None = None,
        notify: bool | None = None,
        host: str | None = None,
        forwarded: bool = False,
        **kwargs: Any,
    ) -> dict[str, object]:
        """A new terminal. ``caller_id`` (the reference's name) and ``supervisor_id`` (ours) are one
        link: the terminal that created this one, where its replies go. ``initial_message`` is its
        first task: committed to its inbox with the terminal, pasted once the agent is ready (the
        reference's ``defer_init`` + ``initial_message``; ``initial_delivery`` tracks it)."""
        if caller_id and supervisor_id and caller_id != supervisor_id:
            raise InvalidInput(
                f"caller_id {caller_id} and supervisor_id {supervisor_id} differ; they name the same "
                "link (the terminal that created this one), pass one of them"
            )
        supervisor = caller_id or supervisor_id
        if supervisor:
            validate_terminal_id(supervisor)
        if host is not None and host != self.hosts.name:  # that host's tmux runs it: it creates it
            self.hosts.not_a_loop(validate_host_name(host), forwarded)
            params = dict(
                kwargs,
                provider=provider,
                caller_id=supervisor,
                initial_message=initial_message,
                notify=notify,
                host=host,
            )
            return self.hosts.create_on(host, params)
        if initial_message is not None:
            if is_blank(initial_message):
                raise InvalidInput("initial_message is empty (only whitespace or invisible characters)")
            if len(initial_message.encode("utf-8", "surrogatepass")) > MAX_BODY_BYTES:
                raise PayloadTooLarge(
                    f"initial_message is over the {MAX_BODY_BYTES}-byte (256 KiB) limit; nothing was created"
                )
        terminal = self.lifecycle.create(
            provider=self.resolve_provider(provider), supervisor_id=supervisor, **kwargs
        )
        if notify is False:  # its supervisor asked to hear nothing about it (assign/handoff notify=false)
            self.store.update_terminal(terminal.id, notify_supervisor=0)
            terminal.notify_supervisor = 0
        # sent to while starting: that run only saw STARTING. Best effort: the terminal exists now,
        # so a busy store must not turn this create into a "nothing was written, retry" error.
        try:
            pending = self.store.has_pending(terminal.id)
        except CaoError:
            pending = True  # a run that finds nothing costs one read
        if pending:
            self.engine.kick(terminal.id, Trigger.CREATED)
        if initial_message is not None:
            try:
                receipt = self.send_message(
                    terminal.id,
                    initial_message,
                    sender_id=supervisor or "cli",
                    idempotency_key=f"initial-{terminal.id}",
                    kind=Kind.TASK,
                )
                self.store.update_terminal(terminal.id, initial_message_id=receipt.message.id)
                terminal.initial_message_id = receipt.message.id
            except BaseException:
                self.lifecycle.delete(terminal)  # a worker without its task would idle forever
                raise
        return self.view(terminal)

    def resolve_provider(self, name: str | None) -> str | None:
        """One of our provider names for ``name`` (ours, or an alias the operator configured); an
        unknown name is a 422 that lists ours and says how the reference's names map."""
        if name is None or name in providers.names():
            return name
        if name in self.provider_aliases:
            return self.provider_aliases[name]
        shared = [n for n in REFERENCE_PROVIDERS if n in providers.names()]
        others = [n for n in REFERENCE_PROVIDERS if n not in providers.names()]
        aliases = ", ".join(f"{k}={v}" for k, v in self.provider_aliases.items())
        raise InvalidInput(
            f"unknown provider {name!r}; choose one of: {', '.join(providers.names())}. "
            f"The reference orchestrator's {', '.join(shared)} are the same CLIs here (same names); "
            f"its {', '.join(others)} have no cao provider: pick one of ours, or let cao-server run one "
            "of ours under that name with CAO_PROVIDER_ALIASES (e.g. kiro_cli=claude_code; "
            "docs/compatibility.md)" + (f". Aliases configured: {aliases}" if aliases else "")
        )

    def view(self, terminal: Terminal, *, status: str | None = None) -> dict[str, object]:
        """A terminal as the API shows it: our fields plus the reference's ``caller_id`` and
        ``initial_delivery`` (``status``: already read, by a listing's batched look)."""
        out = self.status.view(terminal, status=status).as_dict()
        out["caller_id"] = terminal.supervisor_id
        out["host"] = terminal.host or self.hosts.name  # the host whose tmux runs it
        # In the reference's vocabulary: cao keeps none of its own tools from an agent (a profile's
        # native allowed_tools limit what its CLI may do, which that vocabulary can't express).
        out["allowed_tools"] = ["*"]
        out["initial_delivery"] = self._initial_delivery(terminal)
        out["worktree"] = self.workspaces.view(terminal.id)
        out["usage"] = self.usage.brief(terminal)  # tokens and cost so far (None: unknown)
        return out

    def _initial_delivery(self, terminal: Terminal) -> dict[str, object] | None:
        """The state of the task a terminal was created with: pending, delivered or failed."""
        if terminal.initial_message_id is None:
            return None
        try:
            m = self.store.get_message(terminal.initial_message_id)
        except NotFound:
            return None
        # the reference's words: pending (also while it is being pasted), delivered, failed (+ kind)
        out: dict[str, object] = {"message_id": m.id}
        if m.status in (MessageStatus.PENDING, MessageStatus.DELIVERING):
            out["state"] = MessageStatus.PENDING.value
        elif m.status == MessageStatus.DELIVERED:
            out.update(state=MessageStatus.DELIVERED.value, delivered_at=iso(m.delivered_at))
        else:
            kind: str = MessageStatus.FAILED.value
            if m.status == MessageStatus.CANCELLED:
                kind = MessageStatus.CANCELLED.value
            elif m.failure == FailureKind.RECEIVER_GONE:
                kind = FailureKind.RECEIVER_GONE.value
            out.update(state=MessageStatus.FAILED.value, kind=kind, message=m.last_error or m.status)
        return out

    def terminal_row(self, terminal_id: str) -> Terminal:
        """A terminal that isn't deleted (404 otherwise), by its id (422 when malformed)."""
        return self.store.get_terminal(validate_terminal_id(terminal_id))

    def terminal_view(self, terminal_id: str) -> dict[str, object]:
        return self.view(self.terminal_row(terminal_id))

    def list_terminals(
        self, session_name: str | None = None, *, host: str | None = None, forwarded: bool = False
    ) -> list[dict[str, object]]:
        """Every host's terminals (``host``: one host's), with live statuses: this host's from one
        batched look, each other host's from one request to it (cao/hosts.py)."""
        session = session_name_for(session_name) if session_name else None
        rows = self.store.list_terminals(session_name=session)
        if host is not None:
            self.hosts.not_a_loop(validate_host_name(host), forwarded)
            if host != self.hosts.name and host not in {h.name for h in self.store.list_hosts()}:
                raise InvalidInput(self.hosts.unknown_host(host))
            rows = [t for t in rows if (t.host or self.hosts.name) == host]
        if session is not None and not rows and not self.tmux.has_session(session):
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        statuses = self.status.statuses(rows)  # one tmux call for the lot
        return [self.view(t, status=statuses[t.id]) for t in rows]

    def siblings(self, terminal_id: str) -> list[dict[str, object]]:
        """The other live terminals of this terminal's session. cao has no terminal groups, so the
        session is the group the reference's ``GET /terminals/{id}/siblings`` answers with."""
        me = self.terminal_row(terminal_id)
        rows = [
            t
            for t in self.store.list_terminals(session_name=me.session_name)
            if t.id != me.id and t.state not in ENDED
        ]
        statuses = self.status.statuses(rows)
        return [self.view(t, status=statuses[t.id]) for t in rows]

    def working_directory(self, terminal_id: str) -> str:
        """The directory the agent was started in (agent CLIs don't change their own directory)."""
        return self.terminal_row(terminal_id).working_directory

    def send_input(self, terminal_id: str, text: str) -> bool:
        return self.typist.send_input(self.terminal_row(terminal_id), text)

    def send_key(self, terminal_id: str, key: str) -> None:
        """Press one named key (Escape, C-c, Enter, Up, a letter…): checked against an allow-list,
        then through the identity-checked path, serialised with delivery to that terminal."""
        if not KEY_RE.match(key or ""):
            raise InvalidInput(
                f"key {key[:40]!r} is not allowed; use Up, Down, Left, Right, Enter, Tab, Escape, Space, "
                "a single letter or digit, or C-/M-/S- with one (e.g. C-c)"
            )
        self.typist.send_key(self.terminal_row(terminal_id), key)

    def output(self, terminal_id: str, mode: str = "full") -> str:
        return self.status.output(self.terminal_row(terminal_id), mode)

    def exit_terminal(self, terminal_id: str) -> bool:
        return self.typist.exit(self.terminal_row(terminal_id))

    def delete_terminal(self, terminal_id: str) -> int:
        return self.lifecycle.delete(self.terminal_row(terminal_id))

    # -- worktrees: review and merge (docs/worktrees.md) -----------------------------------------
    def _worker(self, terminal_id: str) -> Terminal:
        """A terminal, deleted ones included: a deleted worker's branch can still be merged."""
        return self.store.get_terminal(validate_terminal_id(terminal_id), include_deleted=True)

    def diff(self, terminal_id: str, *, stat: bool = True, into: str | None = None) -> dict[str, object]:
        """What a worker changed on its branch (and, while its worktree exists, not committed yet)."""
        self._worker(terminal_id)
        return self.workspaces.diff(terminal_id, stat=stat, into=into)

    def merge(self, terminal_id: str, *, into: str | None = None) -> dict[str, object]:
        """Merge a worker's branch into ``into`` (default: the branch it was made from); a
        conflict changes nothing and is answered 409 with the conflicted files."""
        worker = self._worker(terminal_id)
        return self.workspaces.merge(
            terminal_id, into=into, label=f"cao worker {worker.agent_profile} {worker.id}"
        )

    def worktrees(self) -> list[dict[str, object]]:
        """Every worktree cao made (active, removed, kept) and orphans found at start."""
        return self.workspaces.listing()

    def mcp_ready(self, terminal_id: str) -> None:
        row = self.terminal_row(terminal_id)
        self.panes.check_local(row)  # its own host hears from its agent's tools
        self.status.note_mcp_ready(row)
        self.engine.kick(terminal_id, Trigger.MCP_READY)

    def hook(
        self, terminal_id: str, report: dict[str, object], *, key: str | None = None
    ) -> dict[str, object]:
        """One lifecycle event reported by the agent CLI's hook (cao/hookstate.py). A turn's end, its
        session's start (or a question, or its exit) wakes delivery to that agent at once and
        refreshes its status for listeners. ``key`` (the HTTP route always passes one, ``""`` when
        the request had none) must be the terminal's own hook key; in-process callers pass None."""
        terminal = self.terminal_row(terminal_id)
        if key is not None:
            self.status.check_hook_key(terminal_id, key)
        if terminal.state in ENDED:
            return {"success": True, "phase": None}  # a late event from a CLI that is gone: nothing to do
        event = str(report["event"])
        phase = self.status.note_hook(terminal, event, report)
        if phase in (HookPhase.TURN_END, HookPhase.SESSION_START, HookPhase.ASKING, HookPhase.SESSION_END):
            self.engine.kick(terminal_id, Trigger.HOOK)
        out: dict[str, object] = {"success": True, "phase": phase.value if phase else None}
        if phase is not None:
            self.engine.refresh_status(terminal_id)
        elif (hand := self.delivery.hand(terminal, event)) is not None:  # a turn-appending hook
            out["hand"] = hand.as_dict()
        return out

    def hook_handed(self, terminal_id: str, claim: str, *, key: str | None = None) -> int:
        """The hook program printed a hand-over: its messages are delivered (channel ``hook``)."""
        self.terminal_row(terminal_id)
        if key is not None:
            self.status.check_hook_key(terminal_id, key)
        n = self.delivery.handed(terminal_id, claim)
        if n == 0:
            raise Conflict(
                f"claim {claim} holds no message of terminal {terminal_id} any more (recovered meanwhile?)"
            )
        self.engine.kick(terminal_id, Trigger.AFTER_DELIVERY)
        return n

    def session_view(self, name: str) -> dict[str, object]:
        """The session and its terminals, oldest first. ``session`` and each terminal's
        ``tmux_session``, ``tmux_window`` and ``pending_inbox_count`` are the reference's shape;
        the top-level ``id``, ``name`` and ``status`` are ours (both are there)."""
        session = session_name_for(name)
        rows = self.store.list_terminals(session_name=session)
        alive = self.tmux.has_session(session) or any(
            self.hosts.is_foreign(t) and t.state not in ENDED for t in rows
        )
        if not rows and not alive:
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        pending = self.store.pending_counts([t.id for t in rows])
        statuses = self.status.statuses(rows)
        terminals = []
        for t in rows:
            view = self.view(t, status=statuses[t.id])
            view.update(
                tmux_session=t.session_name, tmux_window=t.name, pending_inbox_count=pending.get(t.id, 0)
            )
            terminals.append(view)
        head = {"id": session, "name": session, "status": "active" if alive else "gone"}
        return {**head, "session": head, "terminals": terminals}

    def list_sessions(self) -> list[dict[str, object]]:
        live = set(self.tmux.list_sessions())
        counts: dict[str, int] = {}
        for t in self.store.list_terminals():
            counts[t.session_name] = counts.get(t.session_name, 0) + 1
            if self.hosts.is_foreign(t) and t.state not in ENDED:
                live.add(t.session_name)  # its tmux session is on that host
        return [
            {"id": n, "name": n, "status": "active" if n in live else "gone", "terminal_count": counts[n]}
            for n in sorted(counts)
        ]

    def delete_session(self, name: str, *, host: str | None = None, forwarded: bool = False) -> list[str]:
        """Delete the session's terminals: this host's here, each other host's by that host
        (``host``: only that host's; a request forwarded by another host: only this host's)."""
        session = session_name_for(name)
        if host is not None:
            self.hosts.not_a_loop(validate_host_name(host), forwarded)
            if host == self.hosts.name:
                return self.lifecycle.delete_session(name)
            return self.hosts.delete_session_on(host, name)
        if forwarded:
            return self.lifecycle.delete_session(name)
        rows = self.store.list_terminals(session_name=session)
        # other hosts with agents of it (a terminal of a failed host: its row is deleted here)
        served = {t.id for t in rows if self.hosts.owner_serves(t)}
        elsewhere = sorted({str(t.host) for t in rows if t.id in served})
        deleted: list[str] = []
        failed: list[str] = []
        for host in elsewhere:
            try:
                deleted += self.hosts.delete_session_on(host, name)
            except CaoError as exc:
                failed.append(exc.message)
        for t in rows:
            if self.hosts.is_foreign(t) and t.id not in served:
                self.lifecycle.delete(t)
                deleted.append(t.id)
        try:
            deleted += self.lifecycle.delete_session(name)
        except NotFound:
            if not elsewhere and not deleted:
                raise
        if failed:
            raise HostUnreachable(
                f"session {session}: deleted {', '.join(deleted) or 'nothing'}; not deleted: "
                + "; ".join(failed)
                + ". Delete the session again once that host is back (or fail it: `cao hosts fail`)"
            )
        return deleted

    def fail_host(self, name: str, *, reason: str) -> dict[str, object]:
        """An operator gives up on a host that is down (cao/store/hosts.py ``fail_host``)."""
        validate_host_name(name)
        if name == self.hosts.name:
            raise Conflict(f"host {name} is this cao-server, which is running; stop it instead")
        done = self.store.fail_host(name, reason=reason)
        for tid in done["terminals_gone"]:
            self.events.publish("terminal.gone", terminal_id=tid, reason=f"host {name} failed: {reason}")
        return done

    # -- a session's coordination board (cao/board.py): facts that wake no one -------------------
    # A session some terminal of this server ever ran in has a board (404 otherwise), also once its
    # terminals are gone. A write never pastes anything and never wakes delivery: it is published
    # as ``board.set`` and read when an agent asks.
    def board_list(self, session_name: str, *, prefix: str | None = None) -> list[dict[str, object]]:
        """The live facts (their current versions), sorted by key; those starting with ``prefix``."""
        return self.board.listing(session_name, prefix=prefix)

    def board_get(self, session_name: str, key: str) -> dict[str, object]:
        """A fact's current version (404 with ``current_version`` when missing or deleted)."""
        return self.board.get(session_name, key)

    def board_history(self, session_name: str, key: str, *, limit: int = 100) -> list[dict[str, object]]:
        """A fact's kept versions, newest first, deletions included."""
        return self.board.history(session_name, key, limit=limit)

    def board_set(
        self, session_name: str, key: str, value: Any, *, expected_version: int, by: str | None = None
    ) -> dict[str, object]:
        """Write ``value`` over version ``expected_version`` (0: the key must not exist yet); a stale
        one is a 409 with the current version. ``by``: a terminal of that session, or an operator."""
        return self.board.write(session_name, key, value, expected_version=expected_version, by=by)

    def board_delete(
        self, session_name: str, key: str, *, expected_version: int, by: str | None = None
    ) -> dict[str, object]:
        """Delete a fact at its current version: a tombstone version (the history stays)."""
        return self.board.delete(session_name, key, expected_version=expected_version, by=by)

    # -- one agent step (the reference's handoff: POST /terminals/run-step; cao/handoff.py) --------
    def run_step(self, **kwargs: Any) -> dict[str, object]:
        return self.handoffs.run(**kwargs)

    def handoff_result(self, job_id: str) -> dict[str, object]:
        return self.handoffs.result(job_id)

    # -- agent profiles (the store is a folder of cao-server's; clients read it through here) --
    def profiles(self) -> list[dict[str, object]]:
        """Every agent profile, built-in or installed, sorted by name (a file shadows a built-in)."""
        return [p.as_dict() for p in profiles.list(self.settings.profiles_dir)]

    def profile(self, name: str) -> dict[str, object]:
        return profiles.load(name, self.settings.profiles_dir).as_dict()

    def install_profile(self, text: str | None = None, builtin: str | None = None) -> dict[str, object]:
        """Install a profile from its text (a .md file's content), or copy a built-in into the
        store to edit it there; exactly one of the two. Validated before anything is written."""
        if bool(text) == bool(builtin):
            raise InvalidInput(
                "give exactly one of text (a profile's markdown: front matter and system prompt) "
                "or builtin (a built-in profile's name, to copy it into the store)"
            )
        store = self.settings.profiles_dir
        if text:
            profile, path = profiles.install_text(text, store, source="the request")
        else:
            profile, path = profiles.install_builtin(builtin or "", store)
        return {**profile.as_dict(), "path": str(path)}

    def info(self) -> dict[str, object]:
        s = self.settings
        try:
            messages: dict[str, int] | None = self.store.counts_by_status()
        except StoreGone:
            messages = None  # "store" says why
        return {
            "version": _version(),
            "home": str(s.home),
            "database": self.store.where,  # a server's URL without its password
            "host": self.hosts.name,  # this server's name among the hosts sharing the store
            "host_fenced": self.hosts.fenced,
            "host_instance": self.hosts.instance,  # which process answers (hosts check their own URL)
            "tmux_socket": s.tmux_socket,
            "tmux_running": self.tmux.is_alive(),
            "eager_delivery": s.eager_delivery,
            "watch_interval": s.watch_interval,
            "sweep_interval": s.sweep_interval,
            "sweep_grace": s.sweep_grace,
            "providers": providers.names(),
            "worktrees_dir": str(s.worktrees_dir),
            "messages": messages,
            "engine": dict(self.engine.stats),
            "tmux": self.tmux.describe(),
            "event_listeners": self.events.listeners,
            "store": self.store.gone or "ok",
            # panes tagged as this home's agents with no row (the database was lost): kept, never killed
            "orphan_panes": [
                {"pane_id": p.pane_id, "terminal_id": p.terminal_id, "session_name": p.session_name}
                for p in self.lifecycle.orphans
            ],
        }


def _version() -> str:
    import cao

    return cao.__version__


def _check_aliases(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    aliases = dict(pairs)
    for name, target in aliases.items():
        if name in providers.names():
            raise InvalidInput(f"CAO_PROVIDER_ALIASES: {name} is already a cao provider; alias other names")
        if target not in providers.names():
            raise InvalidInput(
                f"CAO_PROVIDER_ALIASES: {name}={target} names no cao provider; use one of "
                f"{', '.join(providers.names())}"
            )
    return aliases


def _check_listing(status: str | None, limit: int) -> None:
    if status is not None and status not in MESSAGE_STATUSES:
        raise InvalidInput(f"status {status!r} is unknown; use one of {', '.join(MESSAGE_STATUSES)}")
    if not 1 <= limit <= 10000:
        raise InvalidInput("limit must be between 1 and 10000")
