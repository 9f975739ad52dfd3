"""Inbox delivery: the one status-gated delivery function and the three triggers that call it.

    send (API) ──commit──► kick(receiver) ─┐
    PollingObserver on logs/terminal/*.log ├─► DeliveryEngine ──► Delivery.deliver(receiver)
    reconcile sweep (every 30 s, grace) ───┘      (per-receiver       read status → gate → claim
                                                   coalescing,         → paste → confirm → record
                                                   thread pool)

Triggers only *wake* delivery; ``Delivery.deliver`` decides. Exactly-once comes from the claim in
the store (a conditional UPDATE only one caller wins, per receiver), not from the triggers
agreeing with each other. See docs/inbox-delivery.md for the full contract.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingEmitter, PollingObserver

from cao.errors import CaoError, PaneGone, TmuxError, TmuxServerDown
from cao.settings import Settings
from cao.store import Message, Store
from cao.terminals import Terminals
from providers.base import Provider, TerminalStatus

logger = logging.getLogger(__name__)

TAIL_BYTES = 2048
PASTE_RE = re.compile(r"\[Pasted", re.I)  # CLIs' placeholder for a long paste in the input box
_C0_KEEP = {"\n", "\t"}


class Outcome(StrEnum):
    NOTHING = "nothing"  # no pending message
    WAITING = "waiting"  # gate closed (busy, starting, error, tmux down)
    LOST_RACE = "lost_race"  # another caller holds the claim
    DELIVERED = "delivered"
    RETRY = "retry"  # paste or confirmation failed; back to pending
    FAILED = "failed"  # past the retry limit, or receiver gone


def neutralise(body: str) -> str:
    """Make a body safe to paste: no escape sequence, paste marker or control key survives.

    ESC becomes the visible ``␛`` (so ``ESC[201~`` can't end the bracketed paste), other C0
    controls their Unicode control pictures, CR/CRLF a newline, C1 controls ``<U+XXXX>``.
    Printable text (any language) is untouched.
    """
    body = body.replace("\r\n", "\n").replace("\r", "\n")
    out: list[str] = []
    for ch in body:
        code = ord(ch)
        if code < 0x20 and ch not in _C0_KEEP:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("␡")
        elif 0x80 <= code < 0xA0:
            out.append(f"<U+{code:04X}>")
        else:
            out.append(ch)
    return "".join(out)


def header(message: Message) -> str:
    return f"[cao message #{message.id} from {message.sender_id}]"


def format_batch(messages: list[Message]) -> str:
    """One paste carrying several messages, in order, each attributed to its sender."""
    return "\n\n".join(f"{header(m)}\n{neutralise(m.body)}" for m in messages)


def gate(status: str, provider: Provider, *, eager: bool, ready: bool, mcp_ready: bool = True) -> str | None:
    """``None`` when a paste may happen now, else why not (shown to operators)."""
    if status in (TerminalStatus.IDLE, TerminalStatus.COMPLETED):
        return None if mcp_ready else "receiver's MCP tools not connected yet"
    if status in (TerminalStatus.PROCESSING, TerminalStatus.WAITING_USER_ANSWER):
        if not ready:
            return "receiver starting"
        if eager and provider.accepts_input_while_processing:
            return None
        return (
            "receiver busy" if status == TerminalStatus.PROCESSING else "receiver waiting for a user answer"
        )
    if status == TerminalStatus.ERROR:
        return "receiver in error"
    return "receiver gone"


@dataclass
class Result:
    outcome: Outcome
    count: int = 0
    reason: str | None = None


class Faults:
    """Test-only fault injection: ``os._exit(1)`` at a named point when ``CAO_FAULT_POINT`` names it."""

    def __init__(self, point: str | None) -> None:
        self.point = point

    def active(self, name: str) -> bool:
        return self.point == name

    def hit(self, name: str) -> None:
        if self.point == name:
            logger.error("fault point reached; exiting", extra={"fault_point": name})
            os._exit(1)


class Delivery:
    """The one status-gated delivery function (``deliver``) and crash recovery."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        terminals: Terminals,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.terminals = terminals
        self.tmux = terminals.tmux
        self.clock = clock
        self.faults = Faults(settings.fault_point)
        self.waiting: dict[str, tuple[str, float]] = {}  # receiver -> (why still pending, since)

    # -- the delivery function ------------------------------------------------------------------
    def deliver(self, receiver_id: str, *, trigger: str = "manual") -> Result:
        if not self.store.has_pending(receiver_id):
            self.waiting.pop(receiver_id, None)
            return Result(Outcome.NOTHING)
        try:
            terminal = self.store.get_terminal(receiver_id, include_deleted=True)
        except CaoError:
            return Result(Outcome.NOTHING)
        if terminal.state == "deleted":
            n = self.store.fail_all_pending([receiver_id], "receiver_gone")
            return Result(Outcome.FAILED, n, "receiver_gone")
        provider = self.terminals.provider(terminal)
        eager = self.settings.eager_delivery and provider.accepts_input_while_processing
        if trigger == "watchdog" and not eager and not self._tail_idle(receiver_id, provider):
            return Result(Outcome.WAITING, reason="receiver busy")
        # 1. status
        try:
            screen = self.terminals.screen(terminal)
        except TmuxServerDown:
            self.terminals.mark_gone(terminal)
            return self._wait(receiver_id, "tmux server not running")
        except PaneGone as exc:
            self.terminals.mark_gone(terminal)
            return self._fail_attempt(receiver_id, f"receiver pane gone: {exc}")
        status = provider.detect_status(screen).value
        if terminal.ready_at is None or terminal.state != "live":
            self.terminals.remember_status(terminal, status)  # first sight of ready, or back from gone
        # 2. gate
        why = gate(
            status,
            provider,
            eager=self.settings.eager_delivery,
            ready=terminal.ready_at is not None,
            mcp_ready=self.terminals.mcp_ready(terminal),
        )
        if why is not None:
            return self._wait(receiver_id, why)
        # 3. claim
        claim, batch = self.store.claim(receiver_id, limit=self.settings.batch_max_messages)
        if not batch:
            return Result(Outcome.LOST_RACE)
        self.waiting.pop(receiver_id, None)
        self.faults.hit("after_claim")
        ids = [m.id for m in batch]
        assert terminal.pane_id is not None
        try:
            # A retried batch may have arrived after all (a slow agent): look before pasting again.
            if any(m.attempts > 0 for m in batch) and self._in_scrollback(terminal.pane_id, batch[0]):
                self.store.mark_delivered(claim)
                logger.info(
                    "message found already delivered", extra={"terminal_id": receiver_id, "message_ids": ids}
                )
                return Result(Outcome.DELIVERED, len(batch))
            confirmed = self.terminals.submit(
                terminal,
                format_batch(batch),
                before=screen,
                after_paste=lambda: self.faults.hit("after_paste"),
            )
        except (PaneGone, TmuxServerDown) as exc:
            self.terminals.mark_gone(terminal)
            return self._release(claim, receiver_id, f"paste failed: receiver pane gone ({exc.message})")
        except TmuxError as exc:
            return self._release(claim, receiver_id, f"paste failed: {exc.message}")
        if not confirmed:
            return self._release(claim, receiver_id, "submit not confirmed (the input box kept the text)")
        self.store.mark_delivered(claim)
        self.faults.hit("after_delivered")
        logger.info(
            "messages delivered",
            extra={"terminal_id": receiver_id, "message_ids": ids, "trigger": trigger},
        )
        return Result(Outcome.DELIVERED, len(batch))

    def _wait(self, receiver_id: str, why: str) -> Result:
        prior = self.waiting.get(receiver_id)
        if prior is None or prior[0] != why:
            self.waiting[receiver_id] = (why, self.clock())
        return Result(Outcome.WAITING, reason=why)

    def _release(self, claim: str, receiver_id: str, error: str) -> Result:
        counts = self.store.release(claim, error, max_attempts=self.settings.max_attempts)
        logger.warning(
            "delivery attempt failed", extra={"terminal_id": receiver_id, "error": error, **counts}
        )
        self._wait(receiver_id, error)
        if counts["failed"]:
            return Result(Outcome.FAILED, counts["failed"], error)
        return Result(Outcome.RETRY, counts["pending"], error)

    def _fail_attempt(self, receiver_id: str, error: str) -> Result:
        """The pane is gone: count an attempt against the oldest pending batch."""
        claim, batch = self.store.claim(receiver_id, limit=self.settings.batch_max_messages)
        if not batch:
            return Result(Outcome.LOST_RACE)
        return self._release(claim, receiver_id, error)

    def _tail_idle(self, receiver_id: str, provider: Provider) -> bool:
        path = self.terminals.log_path(receiver_id)
        try:
            with path.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - TAIL_BYTES))
                tail = fh.read().decode("utf-8", "replace")
        except OSError:
            return True  # no log: let the screen decide
        return provider.tail_looks_idle(tail)

    def _in_scrollback(self, pane_id: str, message: Message) -> bool:
        return header(message) in self.tmux.capture(pane_id, scrollback=True, join=True)

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, *, older_than: float | None = None) -> dict[str, int]:
        """Resolve ``delivering`` rows left by a crash (or a lease that expired).

        If the paste still sits unsubmitted in the input box (its header, or the placeholder some
        CLIs show for long pastes such as ``[Pasted text #1 +41 lines]``), Enter is pressed and the
        batch counts as delivered. Otherwise the header is looked for in the receiver's scrollback:
        found → delivered; not found → back to pending, to be pasted once.
        """
        done = {"delivered": 0, "pending": 0, "failed": 0}
        for claim, batch in self.store.stale_claims(older_than=older_than):
            receiver_id = batch[0].receiver_id
            try:
                terminal = self.store.get_terminal(receiver_id, include_deleted=True)
                if terminal.state == "deleted" or terminal.pane_id is None:
                    raise PaneGone("receiver deleted")
                provider = self.terminals.provider(terminal)
                marker = header(batch[0])
                box = provider.input_text(self.tmux.capture(terminal.pane_id)) or ""
                if box.strip() and (
                    marker in box or marker.startswith(box.split(" [+")[0]) or PASTE_RE.search(box)
                ):
                    self.tmux.send_keys(terminal.pane_id, "Enter")
                    done["delivered"] += self.store.mark_delivered(claim)
                    continue
                if marker in self.tmux.capture(terminal.pane_id, scrollback=True, join=True):
                    done["delivered"] += self.store.mark_delivered(claim)
                    continue
            except (PaneGone, TmuxServerDown):
                counts = self.store.release(claim, "receiver gone during recovery", max_attempts=10**9)
                done["pending"] += counts["pending"]
                continue
            except CaoError:
                continue
            counts = self.store.release(
                claim,
                "recovered after an interrupted delivery (not pasted)",
                max_attempts=10**9,
                count_attempt=False,
            )
            done["pending"] += counts["pending"]
        if any(done.values()):
            logger.info("interrupted deliveries resolved", extra=done)
        return done


class _LogEvents(FileSystemEventHandler):
    """Watchdog callback: only wakes the engine for the terminal whose log changed."""

    def __init__(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in ("modified", "created"):
            return
        path = event.src_path if isinstance(event.src_path, str) else event.src_path.decode()
        name = os.path.basename(path)
        if name.endswith(".log"):
            self.wake(name[:-4])


class InboxLogObserver(PollingObserver):
    """watchdog's PollingObserver over ``logs/terminal/``, polling only the logs that matter.

    Each poll snapshots just the log files of receivers that have messages waiting (``watched``),
    so 50 idle agents with empty inboxes cost nothing, and the poll interval can be short enough
    to catch "turned idle" within tens of milliseconds.
    """

    def __init__(self, watched: set[str], *, timeout: float) -> None:
        self.watched = watched

        def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
            if not self.watched:
                return iter(())
            with os.scandir(path) as entries:
                return iter([e for e in entries if e.name[:-4] in self.watched and e.name.endswith(".log")])

        BaseObserver.__init__(self, partial(PollingEmitter, listdir=listdir), timeout=timeout)  # type: ignore[arg-type]


class DeliveryEngine:
    """Runs the three triggers and a thread pool; deliveries to different receivers run in parallel,
    deliveries to one receiver are coalesced (one runner at a time, re-run if woken meanwhile)."""

    def __init__(self, delivery: Delivery, *, clock: Callable[[], float] = time.time) -> None:
        self.delivery = delivery
        self.settings = delivery.settings
        self.store = delivery.store
        self.clock = clock
        self.pool = ThreadPoolExecutor(
            max_workers=self.settings.delivery_workers, thread_name_prefix="cao-deliver"
        )
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}  # receiver -> trigger of the next run
        self._again: dict[str, str] = {}
        self._stop = threading.Event()
        self._observer: InboxLogObserver | None = None
        self.watched: set[str] = set()  # receivers with messages waiting: their logs are polled
        self._sweeper: threading.Thread | None = None
        self.stats: dict[str, int] = {"kicks": 0, "runs": 0, "delivered": 0, "sweeps": 0}

    # -- waking -------------------------------------------------------------------------------
    def kick(self, receiver_id: str, trigger: str) -> None:
        with self._lock:
            self.stats["kicks"] += 1
            if receiver_id in self._running:
                # A log change can't prove "idle" while a run is under way; a send or sweep can.
                if trigger != "watchdog" or receiver_id not in self._again:
                    self._again[receiver_id] = trigger
                return
            self._running[receiver_id] = trigger
        try:
            self.pool.submit(self._run, receiver_id, trigger)
        except RuntimeError:  # pool shut down
            with self._lock:
                self._running.pop(receiver_id, None)

    def immediate(self, receiver_id: str) -> None:
        """Trigger 1: right after a send commits (never waits for tmux)."""
        if self.delivery.faults.active("skip_immediate"):  # DELIVERY.md scenario 12: make it miss
            return
        self.kick(receiver_id, "immediate")

    def _run(self, receiver_id: str, trigger: str) -> None:
        while True:
            try:
                self.stats["runs"] += 1
                result = self.delivery.deliver(receiver_id, trigger=trigger)
                if result.outcome == Outcome.DELIVERED:
                    self.stats["delivered"] += result.count
                    key = f"delivered_by_{trigger}"
                    self.stats[key] = self.stats.get(key, 0) + result.count
                    trigger = "after_delivery"
                    continue  # more may be pending; the gate decides
            except Exception:
                logger.exception("delivery run crashed", extra={"terminal_id": receiver_id})
            waiting = self._still_pending(receiver_id)
            with self._lock:
                if waiting:
                    self.watched.add(receiver_id)
                    self._ensure_watchdog()
                else:
                    self.watched.discard(receiver_id)
                nxt = self._again.pop(receiver_id, None)
                if nxt is None:
                    self._running.pop(receiver_id, None)
                    return
                trigger = nxt

    def _still_pending(self, receiver_id: str) -> bool:
        try:
            return self.store.has_pending(receiver_id)
        except Exception:
            logger.exception("pending check failed", extra={"terminal_id": receiver_id})
            return True

    # -- trigger 2: the watchdog ----------------------------------------------------------------
    def _ensure_watchdog(self) -> None:
        """Start the observer when some receiver has mail waiting (call with ``_lock`` held).

        It polls every ``watch_interval`` (default 50 ms) while it runs; the sweep stops it once
        no receiver is waiting, so an idle server with 50 quiet agents wakes only for the sweep.
        """
        if self._observer is not None or self._stop.is_set():
            return
        logs = self.settings.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        observer = InboxLogObserver(self.watched, timeout=self.settings.watch_interval)
        observer.schedule(_LogEvents(self._on_log_change), str(logs), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def _park_watchdog(self) -> None:
        with self._lock:
            observer = self._observer if not self.watched else None
            if observer is not None:
                self._observer = None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)

    @property
    def watchdog_running(self) -> bool:
        return self._observer is not None

    def _on_log_change(self, terminal_id: str) -> None:
        self.kick(terminal_id, "watchdog")

    # -- trigger 3: the reconcile sweep ---------------------------------------------------------
    def sweep_step(self, now: float | None = None) -> dict[str, int]:
        now = self.clock() if now is None else now
        self.stats["sweeps"] += 1
        recovered = self.delivery.recover(older_than=now - self.settings.lease_seconds)
        receivers = self.store.receivers_with_pending(older_than=now - self.settings.sweep_grace)
        for rid in receivers:
            self.kick(rid, "sweep")
        self._park_watchdog()
        self._cap_logs()
        return {"kicked": len(receivers), **recovered}

    def _cap_logs(self) -> None:
        """Keep pane logs under the cap: truncate (the pipe appends with O_APPEND, so it goes on)."""
        cap = self.settings.log_cap_bytes
        try:
            entries = list(os.scandir(self.settings.logs_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                if entry.is_file() and entry.stat().st_size > cap:
                    os.truncate(entry.path, 0)
            except OSError:
                continue

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.settings.sweep_interval):
            try:
                self.sweep_step()
            except Exception:
                logger.exception("reconcile sweep failed")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.delivery.recover()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="cao-sweep", daemon=True)
        self._sweeper.start()
        for rid in self.store.receivers_with_pending():
            self.kick(rid, "startup")

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def idle(self) -> bool:
        with self._lock:
            return not self._running
