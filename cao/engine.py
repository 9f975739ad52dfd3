"""The delivery engine: the three triggers that wake the one delivery function, and housekeeping.

    send (API) ──commit──► immediate(receiver) ─┐
    PollingObserverVFS on logs/terminal/*.log   ├─► kick(receiver) ─► the receiver's serial runner
    tmux %output, then the pane quiet (2b)      │
    reconcile sweep (every 30 s, grace window) ─┘      (one at a time per receiver, coalesced,
                                                        a thread pool across receivers)
                                                          │ recover(receiver) if a claim went stale
                                                          └ Delivery.deliver(receiver)

Triggers only *wake* delivery; ``Delivery.deliver`` decides (cao/delivery.py). Recovery of a stale
claim runs in the receiver's own runner, so it never races that receiver's deliveries in this
process; across processes the claim, the fence and the nonce keep it exactly-once.

Housekeeping (same thread as the sweep, every ``log_cap_interval``): pane logs are truncated as
soon as they pass the cap, so an agent printing in a loop can't fill the disk between sweeps.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from watchdog.events import EVENT_TYPE_CREATED, EVENT_TYPE_MODIFIED, FileSystemEvent, FileSystemEventHandler
from watchdog.observers.polling import PollingObserverVFS

import providers
from cao.attention import TIMELINE_KEEP_SECONDS
from cao.delivery import Delivery, Outcome

if TYPE_CHECKING:
    from cao.lifecycle import Lifecycle
from cao.errors import StoreBusy, StoreGone
from cao.states import ENDED, Trigger

logger = logging.getLogger(__name__)
PANE_MAP_MISS_REREAD = 0.05  # seconds: an unknown pane's output reads the pane map again, at most this often


class _LogEvents(FileSystemEventHandler):
    """Watchdog callback: only wakes the engine for the terminal whose log changed."""

    def __init__(self, wake: Callable[[str], None]) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in (EVENT_TYPE_MODIFIED, EVENT_TYPE_CREATED):
            return
        path = event.src_path if isinstance(event.src_path, str) else event.src_path.decode()
        name = os.path.basename(path)
        if name.endswith(".log"):
            self.wake(name[:-4])


class _Either:
    """The logs to poll: receivers with mail waiting, and terminals coordination follows."""

    def __init__(self, *sets: set[str]) -> None:
        self.sets = sets

    def __bool__(self) -> bool:
        return any(self.sets)

    def __contains__(self, name: object) -> bool:
        return any(name in s for s in self.sets)


def inbox_log_observer(
    watched: set[str] | _Either, *, interval: float, everything: Callable[[], bool] = lambda: False
) -> PollingObserverVFS:
    """watchdog's PollingObserverVFS over ``logs/terminal/``, polling only the logs that matter:
    each poll lists just the log files of receivers that have messages waiting (``watched``) — or
    all of them while someone listens to the event stream (``everything()``: live statuses) — so
    50 idle agents with empty inboxes and no listener cost nothing and the interval can be tens of
    milliseconds."""

    def listdir(path: str | None) -> Iterator[os.DirEntry[str]]:
        every = everything()
        if not watched and not every:
            return iter(())
        with os.scandir(path) as entries:
            return iter([e for e in entries if e.name.endswith(".log") and (every or e.name[:-4] in watched)])

    return PollingObserverVFS(os.stat, listdir, polling_interval=interval)


class DeliveryEngine:
    """Runs the three triggers and a thread pool; deliveries to different receivers run in parallel,
    deliveries to one receiver are coalesced (one runner at a time, re-run if woken meanwhile)."""

    def __init__(self, delivery: Delivery, *, clock: Callable[[], float] = time.time) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.delivery = delivery
        self.settings = delivery.settings
        self.store = delivery.store
        self.status = delivery.status
        self.logs = delivery.logs
        self.lifecycle: Lifecycle | None = None  # set by Cao: finishes deletes, restores log pipes
        self.clock = clock
        self.pool = ThreadPoolExecutor(
            max_workers=self.settings.delivery_workers, thread_name_prefix="cao-deliver"
        )
        self._lock = threading.Lock()
        self._running: dict[str, str] = {}  # receiver -> trigger of the current run
        self._again: dict[str, str] = {}
        self._recover: set[str] = set()  # receivers with a stale claim to resolve in their runner
        self._retries: dict[str, tuple[float, threading.Timer]] = {}  # receiver -> (due, its timer)
        self._stop = threading.Event()
        self._observer: PollingObserverVFS | None = None
        self.watched: set[str] = set()  # receivers with messages waiting: their logs are polled
        # terminals whose work coordination follows (cao/coordination.py): their logs are polled
        # too, and a change re-reads their status (``on_work_log`` says whether it is due)
        self.attending: set[str] = set()
        self.on_work_log: Callable[[str], bool] = lambda _tid: False
        self.ticks: list[Callable[[], object]] = []  # run on every housekeeping tick (wake-ups, notices)
        self._housekeeper: threading.Thread | None = None
        # checks of the files under CAO_HOME that clients read (run with the pipe check): each
        # writes its file again when an operator deleted or changed it under the running server
        self.keepers: list[Callable[[], object]] = []
        self.events = delivery.events
        self._refreshing: set[str] = set()  # terminals whose status is being re-read for listeners
        self.stats: dict[str, int] = {"kicks": 0, "runs": 0, "delivered": 0, "sweeps": 0, "logs_capped": 0}
        self._panes: dict[str, tuple[str, float]] = {}  # pane id -> (terminal id, its output_quiet)
        self._panes_read = 0.0  # monotonic time of that map's read; 0: read it again
        self.foreign: Callable[[str], bool] = lambda _rid: False  # another host's receiver (cao/hosts.py)

    # -- waking -------------------------------------------------------------------------------
    def kick(self, receiver_id: str, trigger: str) -> None:
        with self._lock:
            self.stats["kicks"] += 1
            if receiver_id in self._running:
                # A log change can't prove "idle" while a run is under way; a send or sweep can.
                if trigger not in (Trigger.WATCHDOG, Trigger.OUTPUT) or receiver_id not in self._again:
                    self._again[receiver_id] = trigger
                return
            self._running[receiver_id] = trigger
        try:
            self.pool.submit(self._run, receiver_id, trigger)
        except RuntimeError:  # pool shut down
            with self._lock:
                self._running.pop(receiver_id, None)

    def immediate(self, receiver_id: str) -> None:
        """Trigger 1: right after a send commits (never waits for tmux). Another host's receiver:
        that host is told through the store (LISTEN/NOTIFY) and its engine takes it from there."""
        if self.delivery.faults.active("skip_immediate"):  # DELIVERY.md scenario 12: make it miss
            return
        if self.foreign(receiver_id):
            self.store.notify_wake([receiver_id])
            return
        self.kick(receiver_id, Trigger.IMMEDIATE)

    def _run(self, receiver_id: str, trigger: str) -> None:
        while True:
            retry_after: float | None = None
            try:
                with self._lock:
                    recover = receiver_id in self._recover
                    self._recover.discard(receiver_id)
                if recover:
                    self.delivery.recover(receiver_id, older_than=self.clock() - self.settings.lease_seconds)
                self.stats["runs"] += 1
                result = self.delivery.deliver(receiver_id, trigger=trigger)
                if result.outcome == Outcome.DELIVERED:
                    self.stats["delivered"] += result.count
                    key = f"delivered_by_{trigger}"
                    self.stats[key] = self.stats.get(key, 0) + result.count
                    trigger = Trigger.AFTER_DELIVERY
                    continue  # more may be pending; the gate decides
                if result.outcome == Outcome.RETRY:
                    retry_after = self.settings.retry_delay
                elif result.look_again_in is not None:
                    retry_after = result.look_again_in
            except StoreBusy:
                logger.warning("database busy; delivery will retry", extra={"terminal_id": receiver_id})
                retry_after = self.settings.retry_delay
            except StoreGone:  # the database file was deleted or replaced: deliver nothing more
                with self._lock:
                    self._again.pop(receiver_id, None)
                    self._running.pop(receiver_id, None)
                return
            except Exception:
                logger.exception("delivery run crashed", extra={"terminal_id": receiver_id})
            waiting = self._still_pending(receiver_id)
            self.delivery.faults.hit("before_watch")
            with self._lock:
                if waiting:
                    armed_now = receiver_id not in self.watched
                    self.watched.add(receiver_id)
                    fresh = self._ensure_watchdog()
                    if armed_now and (fresh or self.events.listening) and retry_after is None:
                        # A fresh watch takes its first look at this log now (and one polling every
                        # log for listeners looked before we added it): a receiver that turned ready
                        # since our screen read would never wake it. (A running watch sees a newly
                        # watched log as created on its next poll, which wakes it.)
                        self._again.setdefault(receiver_id, Trigger.WATCH_ARMED)
                else:
                    self.watched.discard(receiver_id)
                if retry_after is not None:  # even if a re-run follows: it may wait on the clock too
                    self._retry_later(receiver_id, retry_after)
                nxt = self._again.pop(receiver_id, None)
                if nxt is None:
                    self._running.pop(receiver_id, None)
                    return
                trigger = nxt

    def _retry_later(self, receiver_id: str, delay: float) -> None:
        """One timer per receiver (call with ``_lock`` held): an earlier one already set stands."""
        due = time.monotonic() + delay
        current = self._retries.get(receiver_id)
        if self._stop.is_set() or (current is not None and current[0] <= due):
            return
        timer = threading.Timer(delay, self._retry_now, (receiver_id, due))
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no thread to spare: leave it to the next trigger or the sweep
            logger.exception("retry timer could not start", extra={"terminal_id": receiver_id})
            return
        if current is not None:
            current[1].cancel()  # replaced by an earlier one: don't keep its thread asleep
        self._retries[receiver_id] = (due, timer)

    def _retry_now(self, receiver_id: str, due: float) -> None:
        with self._lock:
            current = self._retries.get(receiver_id)
            if current is None or current[0] != due:
                return  # replaced by an earlier timer (this one fired before its cancel)
            del self._retries[receiver_id]
        self.kick(receiver_id, Trigger.RETRY)

    def _still_pending(self, receiver_id: str) -> bool:
        try:
            return self.store.has_pending(receiver_id)
        except Exception:
            logger.exception("pending check failed", extra={"terminal_id": receiver_id})
            return True

    # -- trigger 2: the watchdog ----------------------------------------------------------------
    def _ensure_watchdog(self) -> bool:
        """Start the observer when some receiver has mail waiting (call with ``_lock`` held); True
        if it was started now.

        It polls every ``watch_interval`` (default 50 ms) while it runs; the sweep stops it once
        no receiver is waiting, so an idle server with 50 quiet agents wakes only for housekeeping.
        """
        if self._observer is not None or self._stop.is_set():
            return False
        logs = self.logs.dir
        logs.mkdir(parents=True, exist_ok=True)
        observer = inbox_log_observer(
            _Either(self.watched, self.attending),
            interval=self.settings.watch_interval,
            everything=lambda: self.events.listening,
        )
        observer.schedule(_LogEvents(self._on_log_change), str(logs), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer
        return True

    def _park_watchdog(self) -> None:
        with self._lock:
            observer = (
                self._observer if not (self.watched or self.attending or self.events.listening) else None
            )
            if observer is not None:
                self._observer = None
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)

    @property
    def watchdog_running(self) -> bool:
        return self._observer is not None

    def _on_log_change(self, terminal_id: str) -> None:
        if terminal_id in self.watched:
            self.kick(terminal_id, Trigger.WATCHDOG)
        if self.events.listening or self.on_work_log(terminal_id):
            self.refresh_status(terminal_id)

    # -- trigger 2b: pane output (tmux control mode, cao/tmux/control.py) -------------------------
    def on_pane_quiet(self, pane_id: str) -> None:
        """A pane printed and has been quiet for its provider's ``output_quiet``: the moment a busy
        receiver's turn ends. Wakes it like a log change would, without waiting for a poll."""
        tid = self._terminal_of(pane_id)
        if tid is None:
            return
        self.stats["output_wakes"] = self.stats.get("output_wakes", 0) + 1
        if tid in self.watched:
            self.kick(tid, Trigger.OUTPUT)
        if self.events.listening or self.on_work_log(tid):
            self.refresh_status(tid)

    def output_quiet(self, pane_id: str) -> float:
        """How long ``pane_id`` must be quiet after printing before it is woken (its provider's)."""
        entry = self._pane_map().get(pane_id)
        return entry[1] if entry is not None else 0.01

    def forget_panes(self) -> None:
        """Terminals came or went: the pane → terminal map is read again on its next use."""
        self._panes_read = 0.0

    def _terminal_of(self, pane_id: str) -> str | None:
        entry = self._pane_map().get(pane_id)
        if entry is None and time.monotonic() - self._panes_read > PANE_MAP_MISS_REREAD:
            # a pane we don't know yet: a new terminal (its pane prints before its row has it)
            self._panes_read = 0.0
            entry = self._pane_map().get(pane_id)
        return entry[0] if entry is not None else None

    def _pane_map(self) -> dict[str, tuple[str, float]]:
        if self._panes_read:
            return self._panes
        fresh: dict[str, tuple[str, float]] = {}
        try:
            for t in self.store.list_terminals(local=True):
                if t.pane_id is not None and t.state not in ENDED:
                    try:
                        quiet = providers.get(t.provider).output_quiet
                    except Exception:
                        quiet = 0.01
                    fresh[t.pane_id] = (t.id, quiet)
        except Exception:
            logger.debug("pane map read failed", exc_info=True)
            return self._panes
        self._panes, self._panes_read = fresh, time.monotonic()
        return fresh

    def attend(self) -> None:
        """Coordination follows a terminal now: make sure its log is polled."""
        with self._lock:
            if self.attending:
                self._ensure_watchdog()

    # -- live status for event listeners ------------------------------------------------------
    def listeners_changed(self) -> None:
        """Someone started (or stopped) listening to events: watch every pane log (or park)."""
        if self.events.listening:
            with self._lock:
                self._ensure_watchdog()
            for t in self.store.list_terminals(local=True):
                self.refresh_status(t.id)
        else:
            self._park_watchdog()

    def refresh_status(self, terminal_id: str) -> None:
        """Re-read one terminal's status (coalesced); a change is published by the terminal layer."""
        with self._lock:
            if terminal_id in self._refreshing:
                return
            self._refreshing.add(terminal_id)
        try:
            self.pool.submit(self._refresh, terminal_id)
        except RuntimeError:
            with self._lock:
                self._refreshing.discard(terminal_id)

    def _refresh(self, terminal_id: str) -> None:
        with self._lock:
            self._refreshing.discard(terminal_id)
        try:
            self.status.status(self.store.get_terminal(terminal_id))
        except Exception:  # a terminal deleted meanwhile, a tmux hiccup: the next change retries
            logger.debug("status refresh failed", extra={"terminal_id": terminal_id}, exc_info=True)

    # -- trigger 3: the reconcile sweep ---------------------------------------------------------
    def sweep_step(self, now: float | None = None) -> dict[str, int]:
        """One sweep: finish interrupted deletes, hand stale claims to their receivers' runners,
        kick receivers whose mail waited past the grace window, park an idle watchdog."""
        now = self.clock() if now is None else now
        self.stats["sweeps"] += 1
        finished = self.lifecycle.finish_deletes() if self.lifecycle is not None else []
        stale = {
            batch[0].receiver_id
            for _, batch in self.store.stale_claims(older_than=now - self.settings.lease_seconds)
        }
        with self._lock:
            self._recover.update(stale)
        for rid in stale:
            self.kick(rid, Trigger.RECOVER)
        receivers = self.store.receivers_with_pending(older_than=now - self.settings.sweep_grace)
        for rid in receivers:
            self.kick(rid, Trigger.SWEEP)
        self._park_watchdog()
        self.cap_logs()
        self.store.prune_timeline(older_than=now - TIMELINE_KEEP_SECONDS)
        self.store.prune_notifications(older_than=now - TIMELINE_KEEP_SECONDS)
        return {"kicked": len(receivers), "stale_claims": len(stale), "finished_deletes": len(finished)}

    def cap_logs(self) -> int:
        """Keep pane logs under the cap (cao/panelog.py)."""
        capped = len(self.logs.cap(self.settings.log_cap_bytes))
        self.stats["logs_capped"] += capped
        return capped

    def _housekeeping_loop(self) -> None:
        """The sweep every ``sweep_interval``; in between, every ``log_cap_interval``: the log cap,
        the database file's identity, and the pane log pipes (``pipe_check_interval``)."""
        next_sweep = time.monotonic() + self.settings.sweep_interval
        next_pipes = time.monotonic() + self.settings.pipe_check_interval
        tick = min(self.settings.log_cap_interval, self.settings.sweep_interval)
        while not self._stop.wait(tick):
            try:
                self.store.verify()
                for tick_fn in self.ticks:
                    try:
                        tick_fn()
                    except StoreGone:
                        raise
                    except Exception:
                        logger.exception("housekeeping tick failed")
                for e in self.store.expire_due():  # deadlines are kept while receivers stay busy
                    self.delivery.forget(e.receiver_id)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.settings.sweep_interval
                    self.sweep_step()
                else:
                    self.cap_logs()
                if time.monotonic() >= next_pipes:
                    next_pipes = time.monotonic() + self.settings.pipe_check_interval
                    if self.lifecycle is not None:
                        self.lifecycle.restore_pipes()
                        for tid in self.lifecycle.found_dead:
                            self.refresh_status(tid)
                    for keep in self.keepers:
                        try:
                            keep()
                        except Exception:
                            logger.exception("a file under CAO_HOME could not be written again")
            except StoreGone:
                continue  # logged once by the store; nothing more to do until a restart
            except Exception:
                logger.exception("housekeeping failed")

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        self.delivery.recover()  # nothing else of this process runs yet: serial by construction
        self._housekeeper = threading.Thread(target=self._housekeeping_loop, name="cao-sweep", daemon=True)
        self._housekeeper.start()
        for rid in self.store.receivers_with_pending():
            self.kick(rid, Trigger.STARTUP)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            observer, self._observer = self._observer, None
            for _, timer in self._retries.values():
                timer.cancel()
            self._retries.clear()
        if observer is not None:
            observer.stop()
            observer.join(timeout=5)
        if self._housekeeper is not None:
            self._housekeeper.join(timeout=5)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def idle(self) -> bool:
        with self._lock:
            return not self._running
