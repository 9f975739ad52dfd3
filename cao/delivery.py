"""Inbox delivery: the one status-gated delivery function, and crash recovery.

    deliver(receiver)   (called by the engine's three triggers: cao/engine.py)
      pending? ─► read the screen (identity-checked) ─► gate: ready? box empty? ─► claim
        ─► [retried batch: look for each message's own header first] ─► fenced paste
        ─► confirm the submit ─► acknowledge (conditional on the claim, retried on a busy DB)

Exactly-once comes from three things that travel together (docs/inbox-delivery.md):
- the **claim** in the store: a conditional UPDATE only one caller wins per receiver; every
  acknowledgement names it and checks its row count (zero rows: ownership lost, nothing reported);
- the **fence**: each claim (and each recovery) takes the receiver's next fence number, and tmux
  pastes only if the pane has seen no newer one (checked and recorded in the same tmux call), so a
  deliverer whose lease expired can't paste after a recovery took over;
- the **nonce** in each message's header: evidence that a message arrived is its own header (or
  trailer) above the input box, which no body and no other message can produce.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from cao.clock import SYSTEM, Clock
from cao.errors import CaoError, FenceLost, PaneGone, PaneInMode, StoreBusy, TmuxError, TmuxServerDown
from cao.events import EventBus
from cao.panelog import PaneLogs
from cao.panes import Panes
from cao.paste import arrived, format_batch, header, is_ours
from cao.settings import Settings
from cao.states import (
    ENDED,
    RECEIVER_GONE,
    Blocked,
    Channel,
    Event,
    Held,
    HookPhase,
    IfBusy,
    TerminalState,
    Trigger,
    WaitReason,
)
from cao.status import StatusReader
from cao.store import Claim, Message, Store, Terminal
from cao.tmux import blocked_reason
from cao.typist import Typist
from providers.base import Provider, TerminalStatus

logger = logging.getLogger(__name__)

TAIL_BYTES = 2048
TRANSCRIPT_TAIL = 4 * 1024 * 1024  # bytes of a CLI's transcript file searched for a hand-over's header
# A provider with no cheap idle check on its log tail gets a full look at most this often on log
# changes (a spinner redraws ~10 times a second).
LOOK_EVERY = 0.25
# woken by the pane's own output: its log (or the arming of its watch), or tmux %output then quiet
LOG_TRIGGERS = (Trigger.WATCHDOG, Trigger.WATCH_ARMED, Trigger.OUTPUT)
MODE_POLL = 1.0  # seconds between looks while a person has the pane in a tmux mode


class Outcome(StrEnum):
    NOTHING = "nothing"  # no pending message
    WAITING = "waiting"  # gate closed (busy, starting, dialog, text in the box)
    LOST_RACE = "lost_race"  # another caller holds the claim, or took it over
    DELIVERED = "delivered"
    RETRY = "retry"  # paste or confirmation failed; back to pending
    FAILED = "failed"  # past the retry limit, or receiver gone


def gate(
    status: str, provider: Provider, *, eager: bool, ready: bool, mcp_ready: bool = True
) -> WaitReason | None:
    """``None`` when a paste may happen now, else why not (stored with the message).

    Ready: idle, completed, or a turn that failed with the prompt back (``error``). Eager delivery
    (flag + a provider that queues mid-turn input) opens the gate only for ``processing`` of an
    agent that has been ready before; a permission/question prompt or a start-up dialog
    (``waiting_user_answer``) always waits: Enter would pick an option.
    """
    if status == TerminalStatus.WAITING_USER_ANSWER:
        return WaitReason.ANSWER
    if status == TerminalStatus.UNKNOWN:  # never guess: the operator sees why (GET /terminals/{id})
        return WaitReason.UNKNOWN
    if status in (TerminalStatus.IDLE, TerminalStatus.COMPLETED, TerminalStatus.ERROR):
        return None if mcp_ready else WaitReason.MCP
    if status == TerminalStatus.PROCESSING:
        if not ready:
            return WaitReason.STARTING
        if eager and provider.accepts_input_while_processing:
            return None if mcp_ready else WaitReason.MCP
        return WaitReason.BUSY
    return WaitReason.UNREADABLE


@dataclass(frozen=True)
class Hand:
    """Messages handed to a running turn through its CLI's hook: the claim, and what to print."""

    claim: str
    message_ids: list[int]
    stdout: str

    def as_dict(self) -> dict[str, object]:
        return {"claim": self.claim, "message_ids": self.message_ids, "stdout": self.stdout}


@dataclass
class Result:
    outcome: Outcome
    count: int = 0
    reason: str | None = None
    # waiting for something that passes with time alone (no screen or log change will say so):
    # the engine looks again after this many seconds
    look_again_in: float | None = None


class Faults:
    """Test-only fault injection: ``os._exit(1)`` at a named point when ``CAO_FAULT_POINT`` names it;
    tests in the same process may also hang a callable on a point (``hooks``)."""

    def __init__(self, point: str | None) -> None:
        self.point = point
        self.hooks: dict[str, Callable[[], None]] = {}

    def active(self, name: str) -> bool:
        return self.point == name

    def hit(self, name: str) -> None:
        hook = self.hooks.get(name)
        if hook is not None:
            hook()
        if self.point == name:
            logger.error("fault point reached; exiting", extra={"fault_point": name})
            os._exit(1)


class Delivery:
    """The one status-gated delivery function (``deliver``) and crash recovery (``recover``)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        panes: Panes,
        status: StatusReader,
        typist: Typist,
        logs: PaneLogs,
        *,
        clock: Clock = SYSTEM,
        faults: Faults | None = None,
        events: EventBus | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.panes = panes
        self.status = status
        self.typist = typist
        self.logs = logs
        self.time = clock
        self.clock = clock.now
        self.sleep = clock.sleep
        self.faults = faults or Faults(settings.fault_point)
        self.events = events or EventBus()
        # receiver -> (reason stored, newest pending id it was stored for): skip repeated writes
        self._noted: dict[str, tuple[str, int]] = {}
        self._looked: dict[str, float] = {}  # receiver -> self.time.monotonic() of its last capture here

    # -- the delivery function ------------------------------------------------------------------
    def deliver(self, receiver_id: str, *, trigger: str = Trigger.MANUAL) -> Result:
        try:  # one read: the row, any outstanding claim, the newest message due, the next deferred
            terminal, outstanding, newest, due, interrupting = self.store.delivery_view(receiver_id)
        except StoreBusy:
            raise  # not "nothing pending": the engine retries it
        except CaoError:
            return Result(Outcome.NOTHING)
        if newest is None:
            self._noted.pop(receiver_id, None)
            self._looked.pop(receiver_id, None)
            if due is not None:  # only deferred mail: look again when the first falls due
                return Result(
                    Outcome.WAITING, reason=Event.DEFERRED, look_again_in=max(0.0, due - self.clock()) + 0.05
                )
            return Result(Outcome.NOTHING)
        if terminal.state in ENDED:
            n = self.store.fail_undelivered(receiver_id, RECEIVER_GONE)
            return Result(Outcome.FAILED, n, RECEIVER_GONE)
        if outstanding:
            return Result(Outcome.LOST_RACE)  # another deliverer (or a stale claim: the sweep recovers it)
        # over a budget (cao/usage.py): its tasks wait with the reason; other mail still goes
        if terminal.budget_hold is not None and not self.store.hold_tasks(receiver_id, terminal.budget_hold):
            return Result(Outcome.WAITING, reason=terminal.budget_hold)
        if terminal.state == TerminalState.STARTING:
            return self._wait(receiver_id, newest, WaitReason.STARTING)
        provider = self.panes.provider(terminal)
        eager = self.settings.eager_delivery and provider.accepts_input_while_processing
        if (
            trigger in LOG_TRIGGERS
            and not eager
            and not self._tail_idle(receiver_id, provider)
            and not self.status.hooks.ready(receiver_id)  # the CLI said its turn ended: look
        ):
            return Result(Outcome.WAITING, reason=WaitReason.BUSY)
        if trigger in LOG_TRIGGERS and provider.idle_tail_pattern is None:
            # no cheap check for this CLI: every spinner frame would be a capture; look at most
            # every LOOK_EVERY seconds, and once more after the last change
            wait = self._looked.get(receiver_id, 0.0) + LOOK_EVERY - self.time.monotonic()
            if wait > 0:
                return Result(Outcome.WAITING, reason=WaitReason.BUSY, look_again_in=wait)
        with self.panes.lock(receiver_id):
            return self._deliver_locked(terminal, provider, newest, trigger, interrupting)

    def _look(self, terminal: Terminal, provider: Provider) -> tuple[str, str, str | None]:
        """One identity-checked capture → (screen, status, why the gate is closed or None).

        The gate: ready (idle, completed, an error turn with the prompt back) or eager-busy, and an
        input box that is empty — or holds only cao's own unsubmitted paste of the oldest pending
        message (checked again, strictly, once the batch is claimed)."""
        self._looked[terminal.id] = self.time.monotonic()  # not the wall clock: a step back would stall
        screen, mode = self.panes.look(terminal)
        status = self.status.read(terminal, screen).status.value
        if terminal.ready_at is None:
            self.status.remember_status(terminal, status)  # first sight of ready
        self.status.note_status(terminal.id, status)
        why: str | None = gate(
            status,
            provider,
            eager=self.settings.eager_delivery,
            ready=terminal.ready_at is not None,
            mcp_ready=self.status.mcp_ready(terminal),
        )
        if mode:  # a person scrolls (copy mode) or a chooser is open: tmux would paste unbracketed
            return screen, status, blocked_reason(mode)
        raw_box = provider.input_text(screen)
        box = (raw_box or "").strip()
        if (
            why is None
            and raw_box is None
            and (status != TerminalStatus.PROCESSING or not provider.can_read(screen))
        ):
            # ready (or eager-busy) by the CLI's hooks only, on a screen the provider can't read:
            # a person's half-typed text, or an unknown menu, would take the paste and its Enter
            why = WaitReason.BOX_UNREADABLE
        if why is None and box:
            oldest = self.store.oldest_pending(terminal.id)
            if oldest is None or oldest.recheck is None or not box.startswith(header(oldest)):
                why = WaitReason.BOX_TEXT
        return screen, status, why

    def _deliver_locked(
        self, terminal: Terminal, provider: Provider, newest: int, trigger: str, interrupting: bool = False
    ) -> Result:
        rid = terminal.id
        # 1. status and gate (one identity-checked capture)
        try:
            screen, status, why = self._look(terminal, provider)
        except (PaneGone, TmuxServerDown):
            return Result(Outcome.FAILED, reason=RECEIVER_GONE)  # lose() failed its mail
        except TmuxError as exc:
            return self._hold(terminal, newest, WaitReason.UNREADABLE, exc.message)
        if why is not None:
            if why == WaitReason.BUSY and interrupting:  # an urgent interrupt waits: at a safe point?
                held = self._interrupt(terminal, provider, screen, newest)
                if held is not None:
                    if held.outcome == Outcome.WAITING and held.look_again_in is None:
                        # still a busy hold: look again when a fresh turn-start report stops
                        # counting (an interrupted turn reports no end, and its pane goes quiet)
                        held.look_again_in = self._opens_in(terminal, why)
                    return held
            return self._hold(terminal, newest, why)
        # 2. claim
        self.faults.hit("before_claim")
        claim = self.store.claim(
            rid, limit=self.settings.batch_max_messages, skip_tasks=terminal.budget_hold is not None
        )
        if claim is None:
            return Result(Outcome.LOST_RACE)
        self._noted.pop(rid, None)
        self.events.publish("message.claimed", receiver_id=rid, message_ids=claim.ids, claim=claim.token)
        self.faults.hit("after_claim")
        # Someone else claimed (and may have pasted) since the screen was read, or the agent was busy
        # (eager: it may open a prompt any moment): read it again before pasting.
        if claim.fence != terminal.fence + 1 or status == TerminalStatus.PROCESSING:
            try:
                screen, status, why = self._look(terminal, provider)
            except (PaneGone, TmuxServerDown):
                return Result(Outcome.FAILED, reason=RECEIVER_GONE)
            except TmuxError as exc:
                self.store.unclaim(claim.token)
                return self._hold(terminal, newest, WaitReason.UNREADABLE, exc.message)
            if why is not None:
                self.store.unclaim(claim.token)
                return self._hold(terminal, newest, why)
        return self._paste(terminal, provider, claim, screen, trigger, newest)

    def _paste(
        self, terminal: Terminal, provider: Provider, claim: Claim, screen: str, trigger: str, newest: int
    ) -> Result:
        rid = terminal.id
        todo = claim.messages
        done = 0
        lease = _Lease(self.store, claim.token, self.settings.lease_seconds / 3, self.clock)
        try:
            box = provider.input_text(screen)
            if claim.recheck:
                # pasted before (crash, unconfirmed submit): look for each one's own header first
                seen = self._seen(terminal, provider, todo, screen)
                if seen:
                    done = self._ack(claim, seen, trigger, found=True)
                    todo = [m for m in todo if m not in seen]
                late = [m.id or 0 for m in todo if m.expires_at is not None and m.expires_at <= self.clock()]
                typed = format_batch(todo, self.settings.inline_limit) if late else ""  # type: ignore[arg-type]
                if late and is_ours(box or "", todo[0], typed):
                    # typed before its deadline and still unsubmitted in the box (with the rest of
                    # its batch): Enter finishes that paste, as recovery does; expiring it would
                    # leave its text in the box, and the batch's next message could never prove the
                    # box its own (held as "input box holds text" for ever)
                    late = []
                if late:  # not found in the pane, not in the box, past its deadline: expired, never pasted
                    self.store.expire_claimed(claim.token, late)
                    todo = [m for m in todo if (m.id or 0) not in late]
                if not todo:
                    return Result(Outcome.DELIVERED, done)
                if box is None:
                    # the box can't be seen (busy, eager): the earlier paste may sit queued or in the
                    # box; pasting again could make it twice. Wait until the box shows.
                    self.store.unclaim(claim.token)
                    return self._wait(rid, newest, WaitReason.BUSY)
            pasted = format_batch(todo, self.settings.inline_limit)  # type: ignore[arg-type]
            first = header(todo[0])

            def proof() -> bool:  # the CLI's hook reported a prompt carrying this batch's own header
                return self.status.hooks.saw(rid, first)

            if (box or "").strip():
                if not (claim.recheck and is_ours(box or "", todo[0], pasted)):
                    self.store.unclaim(claim.token)  # not provably ours: a person's text, never submitted
                    return self._wait(rid, newest, WaitReason.BOX_TEXT)
                # cao's own earlier paste sits unsubmitted in the box: submit it, don't paste again
                self.panes.fence(terminal, claim.fence)
                confirmed = self.typist.submit(
                    terminal, None, before=screen, fence=claim.fence, renew=lease.renew, evidence=proof
                )
            else:
                confirmed = self.typist.submit(
                    terminal,
                    pasted,
                    before=screen,
                    fence=claim.fence,
                    after_paste=lambda: self.faults.hit("after_paste"),
                    renew=lease.renew,
                    evidence=proof,
                )
        except PaneInMode as exc:  # the mode began after the look: nothing was typed
            self.store.unclaim(claim.token)
            return self._hold(terminal, newest, blocked_reason(exc.mode))
        except FenceLost as exc:
            logger.warning(
                "delivery lost its claim; not acknowledged",
                extra={
                    "terminal_id": rid,
                    "message_ids": claim.ids,
                    "claim": claim.token,
                    "error": exc.message,
                },
            )
            return Result(Outcome.LOST_RACE, reason=exc.message)
        except (PaneGone, TmuxServerDown):
            return Result(Outcome.FAILED, reason=RECEIVER_GONE)  # lose() failed its mail
        except TmuxError as exc:
            return self._release(claim, rid, f"paste failed: {exc.message}")
        if not confirmed:
            return self._release(claim, rid, "submit not confirmed (the input box kept the text)")
        self.faults.hit("before_ack")
        n = self._ack(claim, todo, trigger)
        self.faults.hit("after_delivered")
        if n < len(todo):
            return Result(Outcome.LOST_RACE, done + n, "claim lost before the acknowledgement")
        return Result(Outcome.DELIVERED, done + n)

    def _interrupt(self, terminal: Terminal, provider: Provider, screen: str, newest: int) -> Result | None:
        """The receiver is busy and the head of its queue is urgent with ``if_busy=interrupt``: send
        the CLI's interrupt key once, at a safe point (the screen reads processing, no prompt is
        open, no tmux mode, nothing of a person's in the input box), and paste the message first
        when the prompt is back (it heads the queue). None: nothing to interrupt for."""
        head = self.store.oldest_pending(terminal.id)
        if head is None or head.if_busy != IfBusy.INTERRUPT or head.recheck is not None:
            return None
        rid = terminal.id
        if head.interrupt_at is not None:
            return self._wait(rid, newest, Held.INTERRUPT_SENT)
        if terminal.turn_channel is not None and provider.turn_channel == terminal.turn_channel:
            # handed to the running turn by its next hook (after a tool call): hand() below
            return self._wait(rid, newest, Held.INTERRUPT_HOOK.format(event=provider.turn_channel))
        if provider.interrupt_key is None:
            return self._wait(rid, newest, Held.INTERRUPT_NO_PATH.format(provider=provider.name))
        box = provider.input_text(screen)
        if box is None and not provider.interrupt_keeps_input:
            return self._wait(rid, newest, WaitReason.INTERRUPT_BOX)
        if (box or "").strip():
            return self._wait(rid, newest, WaitReason.BOX_TEXT)
        # look once more right before the key: a prompt that just opened must never get it
        again, status, why = self._look(terminal, provider)
        if (
            why != WaitReason.BUSY
            or status != TerminalStatus.PROCESSING
            or (provider.input_text(again) or "").strip()
        ):
            return None
        if not self.store.mark_interrupt(head.id or 0):  # at most once, recorded before the key goes
            return self._wait(rid, newest, Held.INTERRUPT_SENT)
        try:
            self.panes.keys(terminal, provider.interrupt_key)
        except PaneInMode as exc:
            return self._hold(terminal, newest, blocked_reason(exc.mode))
        except (PaneGone, TmuxServerDown):
            return Result(Outcome.FAILED, reason=RECEIVER_GONE)
        except TmuxError as exc:
            logger.warning("interrupt key failed", extra={"terminal_id": rid, "error": exc.message})
        self.events.publish(
            "message.interrupted", receiver_id=rid, message_ids=[head.id], key=provider.interrupt_key
        )
        waiting = self._wait(rid, newest, Held.INTERRUPT_SENT)
        waiting.look_again_in = 0.2  # the prompt comes back without a turn's end in the log, maybe
        return waiting

    # -- the turn-appending channel: a hook hands messages to the running turn -------------------------
    def hand(self, terminal: Terminal, event: str) -> Hand | None:
        """The CLI ran its turn-appending hook (``event``): claim the urgent interrupting messages
        heading the receiver's queue — with eager delivery on and a CLI that can't queue a paste
        mid-turn, any message heading it — (the same claim as every delivery) and give the hook
        their text to print. They are delivered when the hook says it printed them (``handed``); a hook
        that never says so leaves a claim that recovery resolves by evidence or by the lease."""
        provider = self.panes.provider(terminal)
        if terminal.turn_channel is None or event != terminal.turn_channel or terminal.state in ENDED:
            return None
        # eager delivery for a CLI where a mid-turn paste would cancel its turn: the hook is safer
        eager = self.settings.eager_delivery and not provider.accepts_input_while_processing
        claim = self.store.claim(
            terminal.id,
            limit=self.settings.batch_max_messages,
            handing="all" if eager else "interrupts",
            skip_tasks=terminal.budget_hold is not None,
        )
        if claim is None:
            return None
        self._noted.pop(terminal.id, None)
        self.faults.hit("after_hand_claim")
        text = format_batch(claim.messages, self.settings.inline_limit)  # type: ignore[arg-type]
        self.store.note_handed(claim.token, event)
        self.events.publish(
            "message.claimed", receiver_id=terminal.id, message_ids=claim.ids, claim=claim.token
        )
        return Hand(claim.token, claim.ids, provider.hand_output(text))

    def handed(self, terminal_id: str, token: str) -> int:
        """The hook printed the hand-over (its CLI adds it to the turn): delivered, channel ``hook``
        (conditional on the claim; 0: the claim was lost, e.g. recovered meanwhile)."""
        self.faults.hit("before_hand_ack")
        # only a claim handed to this terminal's hook (note_handed): a paste claim's token is on the
        # event stream, and confirming it would mark delivered what the deliverer has yet to type
        rows = [
            m for m in self.store.claimed(token) if m.receiver_id == terminal_id and m.channel == Channel.HOOK
        ]
        if not rows:
            return 0
        claim = Claim(token, 0, rows, recheck=False)
        return self._ack(claim, rows, Trigger.HOOK, channel=Channel.HOOK)

    def _seen(
        self, terminal: Terminal, provider: Provider, messages: list[Message], screen: str | None = None
    ) -> list[Message]:
        """The messages whose own marker (header or trailer, with its nonce) shows: in the pane's
        history above the input box, or in a prompt the CLI's hook reported. The history counts
        only on a screen the provider can read: on any other, the box (maybe holding cao's own
        unsubmitted paste) can't be told from the history."""
        screen = self.panes.screen(terminal) if screen is None else screen
        transcript = ""
        if provider.can_read(screen):
            transcript = provider.transcript(self.panes.screen(terminal, scrollback=True, join=True))
        transcript += self._cli_transcript(terminal)
        return [
            m for m in messages if arrived(m, transcript) or self.status.hooks.saw(terminal.id, header(m))
        ]

    def _cli_transcript(self, terminal: Terminal) -> str:
        """The tail of the CLI's own transcript file, as its hooks reported it (Claude Code writes
        what a hook handed to the turn there): evidence for a hand-over, never a screen. Only a
        file inside the terminal's own home counts."""
        path = self.status.hooks.transcript(terminal.id)
        if path is None:
            return ""
        home = (self.settings.home / "terminals" / terminal.id).resolve()
        try:
            real = Path(path).resolve()
            if not real.is_relative_to(home) or not real.is_file():
                return ""
            with real.open("rb") as fh:
                fh.seek(max(0, real.stat().st_size - TRANSCRIPT_TAIL))
                return "\n" + fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _ack(
        self,
        claim: Claim,
        messages: list[Message],
        trigger: str,
        *,
        found: bool = False,
        channel: Channel = Channel.PASTE,
    ) -> int:
        """Mark delivered, conditional on the claim, retrying while the database is busy."""
        ids = [m.id or 0 for m in messages]
        try:
            n = self.store.retrying(
                lambda: self.store.mark_delivered(claim.token, ids, channel=channel, found=found),
                for_seconds=self.settings.lease_seconds,
            )
        except StoreBusy:
            logger.error(
                "acknowledgement failed: database busy",
                extra={"terminal_id": messages[0].receiver_id, "message_ids": ids, "claim": claim.token},
            )
            return 0
        extra = {
            "terminal_id": messages[0].receiver_id,
            "message_ids": ids,
            "claim": claim.token,
            "trigger": trigger,
        }
        if n < len(ids):
            logger.warning("delivery lost its claim before the acknowledgement", extra=extra)
        else:
            logger.info("messages found already delivered" if found else "messages delivered", extra=extra)
            now = self.clock()
            for m in messages:
                self.events.publish(
                    "message.delivered",
                    receiver_id=m.receiver_id,
                    message_ids=[m.id],
                    latency_ms=round((now - m.created_at) * 1000, 1),
                    found=found,
                    channel=str(channel),
                )
        return n

    def _hold(self, terminal: Terminal, newest: int, why: str, detail: str = "") -> Result:
        """The gate is closed for ``why`` (a WaitReason or Blocked; ``detail`` goes with it into the
        stored text): note it, and say when to look again if only time opens it."""
        waiting = self._wait(terminal.id, newest, f"{why} ({detail})" if detail else why)
        waiting.look_again_in = self._opens_in(terminal, why)
        return waiting

    def _opens_in(self, terminal: Terminal, why: str) -> float | None:
        """Seconds until a closed gate opens by the clock alone, or None: a failed screen read (a
        tmux hiccup: an idle pane writes nothing more to wake us); the MCP wait's timeout;
        a fresh turn-start report that alone reads "busy" on a ready screen, or a fresh session-end
        report that alone reads "exited" (cao/hookstate.py: each counts for ``hook_settle`` seconds)."""
        now = self.clock()
        if why == WaitReason.UNREADABLE:
            return self.settings.retry_delay
        if why in set(Blocked):  # leaving a mode (or turning input on) writes nothing to the log
            return MODE_POLL
        if why == WaitReason.MCP:
            return max(0.0, terminal.created_at + self.settings.mcp_ready_timeout - now) + 0.05
        hook = self.status.hooks.state(terminal.id)
        if hook is None or (why, hook.phase) not in (
            (WaitReason.BUSY, HookPhase.TURN_START),
            (WaitReason.UNKNOWN, HookPhase.SESSION_END),
        ):
            return None
        left = hook.at + self.settings.hook_settle - now
        return left + 0.05 if left > 0 else None

    def _wait(self, receiver_id: str, newest: int, why: str) -> Result:
        """Gate closed: store the reason with the pending messages (once per reason and arrival)."""
        prior = self._noted.get(receiver_id)
        if prior is None or prior[0] != why or prior[1] < newest:
            try:
                self.store.note_waiting(receiver_id, why, changed=prior is None or prior[0] != why)
                self._noted[receiver_id] = (why, newest)
            except StoreBusy:
                pass  # only a note; the next attempt stores it
            if prior is None or prior[0] != why:
                self.events.publish("message.waiting", receiver_id=receiver_id, reason=str(why))
        return Result(Outcome.WAITING, reason=why)

    def forget(self, receiver_id: str) -> None:
        """Its queue changed outside a delivery (a message expired): note the next reason afresh."""
        self._noted.pop(receiver_id, None)

    def reason_for(self, receiver_id: str) -> str | None:
        """Why this receiver's mail waits right now, as last seen (a new message is stored with it)."""
        noted = self._noted.get(receiver_id)
        return noted[0] if noted else None

    def stored_with(self, receiver_id: str, reason: str, message_id: int) -> None:
        """A message was committed already carrying ``reason``: no separate note needed for it."""
        noted = self._noted.get(receiver_id)
        if noted is not None and noted[0] == reason and noted[1] < message_id:
            self._noted[receiver_id] = (reason, message_id)

    def _release(self, claim: Claim, receiver_id: str, error: str) -> Result:
        counts = self.store.retrying(
            lambda: self.store.release(
                claim.token, error, max_attempts=self.settings.max_attempts, recheck=True, pasted=True
            ),
            for_seconds=self.settings.lease_seconds,
        )
        logger.warning(
            "delivery attempt failed",
            extra={
                "terminal_id": receiver_id,
                "message_ids": claim.ids,
                "claim": claim.token,
                "error": error,
                **counts,
            },
        )
        kind = "message.failed" if counts["failed"] else "message.retried"
        self.events.publish(kind, receiver_id=receiver_id, message_ids=claim.ids, error=error)
        if counts["failed"]:
            return Result(Outcome.FAILED, counts["failed"], error)
        return Result(Outcome.RETRY, counts["pending"], error)

    def _tail_idle(self, receiver_id: str, provider: Provider) -> bool:
        tail = self.logs.tail(receiver_id, TAIL_BYTES)
        if tail is None:
            return True  # no log: let the screen decide
        if not tail.strip():
            return True  # truncated at the cap after its last frame: let the screen decide
        return provider.tail_looks_idle(tail)

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, receiver_id: str | None = None, *, older_than: float | None = None) -> dict[str, int]:
        """Resolve ``delivering`` rows left by a crash or a lease that expired (of one receiver, or
        all). Runs under the receiver's lock (the engine calls it from the receiver's runner).

        Per stale claim: take it over (new token, new fence), fence the pane so the old deliverer
        can't paste any more, let a paste already sent reach the screen, then look: a message
        whose own header (or trailer) shows above the input box → delivered; the batch's text
        sitting unsubmitted in the box under its header → Enter, confirmed → delivered; otherwise
        back to pending, marked so the next attempt looks again before it pastes. Nothing is ever
        submitted that cao can't prove is its own.
        """
        done = {"delivered": 0, "pending": 0, "failed": 0}
        for token, batch in self.store.stale_claims(older_than=older_than):
            rid = batch[0].receiver_id
            if receiver_id is not None and rid != receiver_id:
                continue
            with self.panes.lock(rid):
                for key, n in self._recover_claim(token, batch).items():
                    done[key] += n
        if any(done.values()):
            logger.info("interrupted deliveries resolved", extra=done)
        return done

    def _recover_claim(self, token: str, batch: list[Message]) -> dict[str, int]:
        rid = batch[0].receiver_id
        out = {"delivered": 0, "pending": 0, "failed": 0}
        try:
            terminal = self.store.get_terminal(rid, include_deleted=True)
        except CaoError:
            return out
        if terminal.state in ENDED:
            out["failed"] = self.store.fail_undelivered(rid, RECEIVER_GONE)
            return out
        took = self.store.take_over(token)
        if took is None:
            return out  # resolved meanwhile
        new_token, fence = took
        claim = Claim(new_token, fence, batch, recheck=True)
        provider = self.panes.provider(terminal)
        try:
            self.panes.fence(terminal, fence)
            self.sleep(self.settings.recovery_settle)
            seen = self._seen(terminal, provider, batch)
            if seen:
                out["delivered"] += self._ack(claim, seen, Trigger.RECOVERY, found=True)
            rest = [m for m in batch if m not in seen]
            if not rest:
                return out
            screen = self.panes.screen(terminal)
            box = provider.input_text(screen) or ""
            ours = is_ours(box, rest[0], format_batch(rest, self.settings.inline_limit))  # type: ignore[arg-type]
            if ours and self.typist.submit(terminal, None, before=screen, fence=fence):
                out["delivered"] += self._ack(claim, rest, Trigger.RECOVERY)
                return out
            counts = self.store.release(
                new_token,
                "recovered after an interrupted delivery (not seen in the pane)",
                max_attempts=10**9,
                count_attempt=False,
                recheck=True,
            )
            out["pending"] += counts["pending"]
        except FenceLost:
            pass  # a newer recovery owns it
        except (PaneGone, TmuxServerDown):
            out["failed"] += len(batch)  # lose() failed the mail
        except TmuxError as exc:
            counts = self.store.release(
                new_token,
                f"recovery failed: {exc.message}",
                max_attempts=10**9,
                count_attempt=False,
                recheck=True,
            )
            out["pending"] += counts["pending"]
        return out


class _Lease:
    """Renews a claim's lease while a delivery is in flight (at most every ``every`` seconds);
    raises :class:`FenceLost` when the claim was taken over meanwhile."""

    def __init__(self, store: Store, token: str, every: float, clock: Callable[[], float]) -> None:
        self.store, self.token, self.every, self.clock = store, token, every, clock
        self.last = clock()

    def renew(self) -> None:
        now = self.clock()
        if now - self.last < self.every:
            return
        self.last = now
        if not self.store.renew(self.token):
            raise FenceLost("the claim's lease was taken over while the delivery was in flight")
