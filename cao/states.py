"""The states a terminal and a message can be in, and the reasons a message waits or fails.

One place for the words that the store writes, the API shows and the code compares.

    terminal:  starting ──► live ──► gone (for good: its pane exited, was killed, or another pane
                  │           │                 took its id; never live again)
                  └───────────┴──► deleting ──► deleted        (delete: row first, then the pane)

    message:   pending ──claim──► delivering ──ack──► delivered
                  ▲                    │
                  └──── release ───────┤──► failed (receiver_gone, or past the retry limit)
       from pending only: cancelled (operator), expired (its deadline passed), dropped (the
       receiver or the operator, with a reason), superseded (a newer notice on the same topic)

Attention (docs/attention.md): every message has a priority and a kind (the registry is
cao/attention.py) and says what to do if its receiver is busy.
"""

from __future__ import annotations

from enum import StrEnum


class TerminalState(StrEnum):
    STARTING = "starting"  # row written, pane being created (or creation interrupted)
    LIVE = "live"
    GONE = "gone"
    DELETING = "deleting"  # row marked, pane not yet verified dead (the sweep finishes it)
    DELETED = "deleted"


# a terminal in one of these states has no pane cao may ever touch again
ENDED = (TerminalState.GONE, TerminalState.DELETING, TerminalState.DELETED)


class Status(StrEnum):
    """The status a terminal shows (``GET /terminals/{id}``): what its provider reads on the screen
    (providers/base.py ``TerminalStatus``, the same words), ``starting`` until it has first been
    ready, and ``gone`` once its pane is gone for good."""

    STARTING = "starting"
    IDLE = "idle"
    PROCESSING = "processing"
    COMPLETED = "completed"
    WAITING_USER_ANSWER = "waiting_user_answer"
    ERROR = "error"
    UNKNOWN = "unknown"
    GONE = "gone"
    # its host's lease lapsed (or its API does not answer): nobody can read its pane from here
    HOST_UNREACHABLE = "host_unreachable"


class HostState(StrEnum):
    """A cao-server sharing the store (cao/hosts.py)."""

    UP = "up"  # running; live while its lease is
    STOPPED = "stopped_cleanly"  # its cao-server stopped; its terminals wait for it to start again
    FAILED = "failed"  # an operator failed it: its terminals are gone, its name is free


# ready for input: the idle prompt, a finished turn, a turn that failed with the prompt back
READY = (Status.IDLE, Status.COMPLETED, Status.ERROR)


class MessageStatus(StrEnum):
    PENDING = "pending"
    DELIVERING = "delivering"
    DELIVERED = "delivered"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # its deadline passed while it waited; never pasted
    DROPPED = "dropped"  # by its receiver or the operator, with who and why
    SUPERSEDED = "superseded"  # a newer notice from the same sender on the same topic replaced it


# a message in one of these states is final: nothing will ever paste it
FINAL = (
    MessageStatus.DELIVERED,
    MessageStatus.FAILED,
    MessageStatus.CANCELLED,
    MessageStatus.EXPIRED,
    MessageStatus.DROPPED,
    MessageStatus.SUPERSEDED,
)


class Priority(StrEnum):
    """A message's priority; a receiver's queue is served by priority, then commit order."""

    URGENT = "urgent"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


# stored as its rank (0 first); the order of the enum above
PRIORITY_RANK: dict[str, int] = {p.value: i for i, p in enumerate(Priority)}


class Kind(StrEnum):
    """What a message is (the registry with each kind's rules: cao/attention.py)."""

    CHAT = "chat"  # a person: the operator's `cao send`, the dashboard
    MESSAGE = "message"  # agent to agent
    TASK = "task"  # assign, handoff, a new terminal's first task
    RESULT = "result"  # a worker's report to its supervisor
    NOTICE = "notice"  # informational; coalesces per sender and topic; expires
    WAKEUP = "wakeup"  # scheduled


class IfBusy(StrEnum):
    """What the sender wants when the receiver is working."""

    WAIT = "wait"  # held until ready (as always)
    REFUSE = "refuse"  # nothing stored: 409 at once, the sender decides
    INTERRUPT = "interrupt"  # urgent only: into the running turn at its next safe point


class Channel(StrEnum):
    """How a delivered message reached its agent."""

    PASTE = "paste"  # bracketed paste + Enter into the input box
    HOOK = "hook"  # handed to the running turn by the CLI's lifecycle hook


class Event(StrEnum):
    """One change in a message's life, on an agent's timeline (store + event stream)."""

    QUEUED = "queued"
    HELD = "held"  # the gate is closed, with the reason
    INTERRUPTED = "interrupted"  # the CLI's interrupt key was sent for it
    HANDED = "handed"  # handed to the running turn through a hook
    DELIVERED = "delivered"
    READ = "read"
    DEFERRED = "deferred"
    PRIORITIZED = "prioritized"
    DROPPED = "dropped"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"
    CANCELLED = "cancelled"
    FAILED = "failed"
    ACKED = "acked"  # the receiver said it acted on it (ack: the cursor or by ids)
    SCHEDULED = "scheduled"  # a wake-up was scheduled for this agent (message_id: its first slot)
    UNSCHEDULED = "unscheduled"  # a wake-up schedule was cancelled


class AttentionState(StrEnum):
    """What an agent attends to, as its attention view shows it (from its status)."""

    IDLE = "idle"
    WORKING = "working"
    ANSWERING = "waiting for an answer"
    UNKNOWN = "unknown"
    GONE = "gone"


# its status → its attention state (anything else: unknown)
ATTENTION_OF: dict[str, AttentionState] = {
    Status.IDLE: AttentionState.IDLE,
    Status.COMPLETED: AttentionState.IDLE,
    Status.ERROR: AttentionState.IDLE,
    Status.PROCESSING: AttentionState.WORKING,
    Status.WAITING_USER_ANSWER: AttentionState.ANSWERING,
    Status.GONE: AttentionState.GONE,
}


class WorkState(StrEnum):
    """Where a terminal is in its work, as coordination follows it (cao/coordination.py): each
    change into ``finished``, ``blocked``, ``failed`` or ``exited`` is one notice event."""

    TASKED = "tasked"  # a task (or its supervisor's message) was delivered; no turn seen yet
    WORKING = "working"  # its turn on it runs
    FINISHED = "finished"  # the turn ended
    BLOCKED = "blocked"  # it waits at a permission or question prompt
    FAILED = "failed"  # an error turn, or a status unknown for long
    EXITED = "exited"  # its pane closed


# the changes that are notice events (a supervisor's notice, the operator's attention list)
NOTICE_STATES = (WorkState.FINISHED, WorkState.BLOCKED, WorkState.FAILED, WorkState.EXITED)


class ResultStatus(StrEnum):
    """What a worker reports about its task (report_result)."""

    DONE = "done"
    FAILED = "failed"
    BLOCKED = "blocked"


class AnswerSource(StrEnum):
    """Where a handoff's answer came from."""

    RESULT = "result"  # the worker reported it (report_result)
    SCREEN = "screen"  # none was reported: the last answer read from its screen


class WebhookState(StrEnum):
    """A notification's trip to CAO_NOTIFY_URL."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # the bounded retries ran out (the error is kept)


class ScheduleState(StrEnum):
    ACTIVE = "active"
    DONE = "done"  # a one-time wake-up whose message was created
    CANCELLED = "cancelled"


class WaitReason(StrEnum):
    """Why a pending message is not being pasted right now (stored with the message)."""

    STARTING = "receiver starting"
    BUSY = "receiver busy"
    ANSWER = "receiver waiting for a user answer"
    BOX_TEXT = "input box holds text"
    # ready by the CLI's hooks, but the box isn't where the provider looks: it can't be proven empty
    BOX_UNREADABLE = "receiver's input box not found (its screen matches nothing its provider knows)"
    MCP = "receiver's MCP tools not connected yet"
    UNREADABLE = "receiver's screen could not be read"
    IN_MODE = "a person is scrolling this pane (tmux copy mode)"  # the others: Blocked below
    UNKNOWN = "receiver status unknown (its screen matches nothing its provider knows)"
    RETRY = "retrying after a failed attempt"
    # an urgent interrupt's key would discard what can't be seen: its CLI hides the box mid-turn
    INTERRUPT_BOX = "urgent interrupt held: the input box can't be seen while the agent works"
    # its host is down or cut off: held, never failed by itself (cao hosts fail NAME to give up)
    HOST_UNREACHABLE = "receiver's host unreachable"


class Blocked(StrEnum):
    """Why nothing may be typed into a pane a person is using (read in the same tmux call as each
    paste and key; a message waits with this as its reason)."""

    COPY_MODE = WaitReason.IN_MODE.value  # scrolling, with the keys or the mouse wheel
    VIEW_MODE = "a person has this pane in tmux view mode"
    TREE_MODE = "a person has a tmux chooser open in this pane"
    CLOCK_MODE = "a person has the tmux clock open in this pane"
    OTHER_MODE = "a person has this pane in a tmux mode"
    INPUT_OFF = "input to this pane is turned off (tmux select-pane -d)"
    SYNCHRONIZED = "this pane's window has synchronize-panes on (cao's keys would reach a person's panes)"


class Held(StrEnum):
    """Why a message waits although its receiver could take it (attention, not the screen)."""

    DEFERRED = "deferred until {until}"
    INTERRUPT_NO_PATH = (
        "urgent interrupt held: {provider} has no way into a running turn; delivered when the turn ends"
    )
    INTERRUPT_SENT = "interrupt key sent; delivered when the prompt is back"
    INTERRUPT_HOOK = (
        "urgent: handed to the running turn at its next {event} hook, or pasted when the turn ends"
    )


class Trigger(StrEnum):
    """What woke a delivery run (cao/engine.py); kept in its log lines and counters."""

    IMMEDIATE = "immediate"  # trigger 1: right after a send committed
    WATCHDOG = "watchdog"  # trigger 2: the receiver's pane log changed
    OUTPUT = "output"  # trigger 2b: the receiver's pane printed and went quiet (tmux %output)
    WATCH_ARMED = "watch_armed"  # its log just joined a fresh watch: look once
    SWEEP = "sweep"  # trigger 3: the reconcile sweep
    RECOVER = "recover"  # a stale claim to resolve first
    RECOVERY = "recovery"  # acknowledged by the recovery itself
    RETRY = "retry"  # a timer: a failed attempt, or a gate that opens with time
    STARTUP = "startup"  # mail found at server start
    HOOK = "hook"  # the CLI's lifecycle hook reported a turn's end, a question, a session
    MCP_READY = "mcp_ready"  # the agent's cao MCP server reported in
    CREATED = "created"  # a terminal sent mail while it was starting finished its create
    AFTER_DELIVERY = "after_delivery"  # more may be pending after a delivery
    MANUAL = "manual"  # called directly (tests, tools)


class StepFailure(StrEnum):
    """Why a handoff step failed (the ``kind`` of ``POST /terminals/run-step``'s error body)."""

    ERROR = "error"  # the worker stopped with an error, or exited (502)
    TIMEOUT = "timeout"  # it did not become ready or finish in time (504)
    BUSY = "busy"  # a person is using its pane: text in its box, or scrolling it (409)


class WorktreeState(StrEnum):
    """A worker's git worktree (docs/worktrees.md)."""

    ACTIVE = "active"  # its worker runs in it
    REMOVED = "removed"  # the worker was deleted; its work saved on branches, the tree removed
    KEPT = "kept"  # the worker was deleted, the tree kept: something in it would have been lost


class JobState(StrEnum):
    """A handoff job's (``POST /terminals/run-step`` with a ``job_id``; GET /handoff-results)."""

    RUNNING = "running"
    COMPLETED = "completed"
    ERROR = "error"


class HookPhase(StrEnum):
    """What an agent CLI's lifecycle hook event says about its turn (see cao/hookstate.py)."""

    TURN_START = "turn_start"  # a prompt was submitted and a turn begins
    TURN_END = "turn_end"  # the turn finished; the CLI waits for input
    ASKING = "asking"  # the CLI waits for the user's answer (a permission prompt)
    SESSION_START = "session_start"
    SESSION_END = "session_end"


class FailureKind(StrEnum):
    """Why a ``failed`` message failed (a column beside its error text)."""

    RECEIVER_GONE = "receiver_gone"  # its receiver was deleted, exited or lost its pane
    RETRIES_EXHAUSTED = "retries_exhausted"  # CAO_DELIVERY_MAX_ATTEMPTS attempts went unconfirmed


RECEIVER_GONE = FailureKind.RECEIVER_GONE.value
