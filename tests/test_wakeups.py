"""Lost wake-ups: ways a ready receiver's mail could wait for the reconcile sweep.

Each test sets the sweep to 600 s, so only the fast paths (immediate, watchdog, hook, a timed
look again) can deliver, and asserts that no sweep ran. Each failed before its fix, except the
box typed-then-cleared case (a guard: it always worked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from cao.core import Cao
from cao.errors import TmuxError
from cao.settings import Settings
from providers.base import Provider
from providers.scripted import ScriptedProvider
from tests.helpers import SLOW, idle, new_terminal, status_of, wait_until, write_rules

NO_SWEEP = dict(sweep_interval=600.0, sweep_grace=600.0)


# -- 1. the MCP-ready timeout opens the gate, and nothing wakes the runner ---------------------------
def test_mail_held_for_mcp_is_delivered_when_the_mcp_timeout_passes(
    make_core: Callable[..., Cao], settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """A CLI whose cao MCP server never reports in (the agent is idle, its screen static): the
    gate says 'wait for MCP' until CAO_MCP_READY_TIMEOUT passes, then opens with nothing on screen
    to say so. The mail (typically the terminal's initial task) must not wait for the sweep."""
    monkeypatch.setattr(ScriptedProvider, "waits_for_mcp", True)  # as every real provider declares
    core = make_core(settings.with_(mcp_ready_timeout=2.0, **NO_SWEEP))
    tid = new_terminal(core, "developer")
    mid = core.send_message(tid, "token-after-mcp-timeout", sender_id="s").message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason is not None, what="held for MCP")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=8, what="after the MCP wait")
    assert core.engine.stats["sweeps"] == 0


# -- 2. a provider without its own idle-tail pattern (the contract test checks every saved screen)
def test_a_busy_receiver_with_the_default_tail_pattern_turning_idle_is_woken_by_the_watchdog(
    make_core: Callable[..., Cao], settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """A provider that sets no idle-tail pattern (Kimi CLI) gets the base class's: it must let a
    busy receiver's turn end through to the full look (it once matched nothing but an empty
    line, so without hooks — CAO_HOOKS=false, or a lost Stop report — its mail waited a sweep)."""
    monkeypatch.setattr(ScriptedProvider, "idle_tail_pattern", Provider.idle_tail_pattern)
    write_rules(settings.home, "worker", SLOW)
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    mid = core.send_message(tid, "token-kimi-like", sender_id="s").message.id or 0
    wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=5, what="delivered by the watchdog")
    assert core.engine.stats["sweeps"] == 0


# -- 3. a transient tmux error on the screen read ---------------------------------------------------
def _fail_one_capture(core: Cao, *, armed: bool = True) -> list[int]:
    """``[armed, failures]``: once armed (``state[0] = 1``), the next screen read (the gate's look)
    made by a delivery thread raises a TmuxError, once."""
    real = core.panes.look
    state = [int(armed), 0]

    def flaky(terminal, **kw):  # type: ignore[no-untyped-def]
        if state[0] and not state[1] and threading.current_thread().name.startswith("cao-deliver"):
            state[1] += 1
            raise TmuxError("tmux capture-pane did not answer within 30 s")
        return real(terminal, **kw)

    core.panes.look = flaky  # type: ignore[method-assign]
    return state


def test_a_transient_screen_read_error_on_an_idle_receiver_is_retried(
    make_core: Callable[..., Cao], settings: Settings
):
    """One capture fails (a tmux command that timed out, a busy server): the attempt waits with
    'screen could not be read', and the idle receiver's log never changes: it must look again.
    (No %output wakes: the start screen's last frame can still be settling when the mail comes.)"""
    core = make_core(settings.with_(output_wakes=False, **NO_SWEEP))
    tid = new_terminal(core, "developer")
    state = _fail_one_capture(core)
    mid = core.send_message(tid, "token-after-a-tmux-hiccup", sender_id="s").message.id or 0
    wait_until(lambda: state[1] == 1 and core.engine.idle(), what="the failed attempt is over")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=8, what="delivered without the sweep")
    assert core.engine.stats["sweeps"] == 0
    assert core.engine.stats.get("delivered_by_retry") == 1, str(core.engine.stats)  # the look again


def test_a_transient_screen_read_error_when_a_watched_receiver_turns_idle_is_retried(
    make_core: Callable[..., Cao], settings: Settings
):
    """The receiver is busy, its mail waits and its log is watched. The turn ends; the watchdog's
    run fails to capture the screen once (and cao's own re-runs may follow it at once). The idle
    screen never changes again, so only a timed look again finds it."""
    write_rules(settings.home, "worker", SLOW)
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    state = _fail_one_capture(core, armed=False)
    mid = core.send_message(tid, "token-after-a-tmux-hiccup", sender_id="s").message.id or 0
    wait_until(lambda: tid in core.engine.watched and core.engine.idle(), what="busy, watched")
    state[0] = 1
    wait_until(lambda: state[1] == 1, timeout=10, what="the watchdog's run failed to read the screen")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=8, what="delivered without the sweep")
    assert core.engine.stats["sweeps"] == 0


# -- 4. a person types in the box, then clears it ---------------------------------------------------
def test_text_typed_in_the_box_then_cleared_lets_the_mail_in_at_once(
    make_core: Callable[..., Cao], settings: Settings
):
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "developer")
    pane = core.store.get_terminal(tid)
    target = f"{pane.session_name}:{pane.name}"
    import subprocess

    def keys(*k: str) -> None:
        subprocess.run(["tmux", "-L", settings.tmux_socket, "send-keys", "-t", target, *k], check=True)

    keys("-l", "half typed")
    wait_until(lambda: "half typed" in core.panes.screen(core.store.get_terminal(tid)), what="typed")
    mid = core.send_message(tid, "token-after-clear", sender_id="s").message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason == "input box holds text", what="box text")
    wait_until(lambda: core.engine.idle(), what="runs over")
    time.sleep(0.3)
    for _ in range(len("half typed")):
        keys("BSpace")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=5, what="box emptied")
    assert core.engine.stats["sweeps"] == 0


# -- 5. the pane log is truncated by the log cap right after the ready frame ------------------------
def test_a_log_truncated_by_the_cap_after_the_ready_frame_does_not_hide_the_ready_screen(
    make_core: Callable[..., Cao], settings: Settings
):
    """The agent ends a long turn with a big answer: the log passes the cap, the ready frame is
    written, the cap truncates the file to 0 before the watchdog's run reads the tail. The run's
    pre-check sees an empty tail (for the scripted provider's '^❯ ': not idle) and nothing is
    written afterwards. (watch_interval 1 s makes the truncation win the race every time; at the
    defaults — 50 ms watch, 2 s cap tick — it loses it a few % of the time.) An empty tail says
    nothing, so the screen decides."""
    big = "x" * 150 + "\n"
    rules = {"record": True, "rules": [{"match": r"^work", "delay": 1.5, "reply": big * 60}]}
    write_rules(settings.home, "worker", rules)
    core = make_core(
        # the watchdog's race, so no %output wake (it would look before the cap truncates)
        settings.with_(
            log_cap_bytes=4096, log_cap_interval=0.05, watch_interval=1.0, output_wakes=False, **NO_SWEEP
        )
    )
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    mid = core.send_message(tid, "token-after-the-cap", sender_id="s").message.id or 0
    wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=6, what="delivered by the watchdog")
    assert core.engine.stats["sweeps"] == 0
    assert core.engine.stats["logs_capped"] >= 1


# -- 6. a turn-start report whose turn never shows on screen ---------------------------------------
def test_mail_held_by_a_fresh_turn_start_report_is_delivered_when_the_settle_window_passes(
    make_core: Callable[..., Cao], settings: Settings
):
    """The CLI reported a turn start (UserPromptSubmit) but its screen stays idle (a command that
    runs no model turn, or a Stop report that never arrived). For hook_settle seconds the status
    reads 'processing'; when the window passes the gate opens, and only the clock says so."""
    core = make_core(settings.with_(hook_settle=1.5, **NO_SWEEP))
    tid = new_terminal(core, "developer")
    core.hook(tid, {"event": "UserPromptSubmit"})
    mid = core.send_message(tid, "token-after-settle", sender_id="s").message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason is not None, what="held")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=6, what="after the settle")
    assert core.engine.stats["sweeps"] == 0


def test_a_busy_read_of_the_store_when_a_watched_receiver_turns_idle_is_retried(
    make_core: Callable[..., Cao], settings: Settings
):
    """Same shape with the store: the run's first read meets a locked database. That is not
    "nothing pending": the engine retries it."""
    import threading

    from cao.errors import StoreBusy

    write_rules(settings.home, "worker", SLOW)
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    real = core.store.delivery_view
    state = [0, 0]

    def busy_once(receiver_id):  # type: ignore[no-untyped-def]
        in_runner = threading.current_thread().name.startswith("cao-deliver")
        if state[0] and not state[1] and in_runner and idle(core, tid):  # woken by the turn's end
            state[1] += 1
            raise StoreBusy("the database stayed locked past the busy timeout")
        return real(receiver_id)

    core.store.delivery_view = busy_once  # type: ignore[method-assign]
    mid = core.send_message(tid, "token-after-a-busy-read", sender_id="s").message.id or 0
    wait_until(lambda: tid in core.engine.watched and core.engine.idle(), what="busy, watched")
    state[0] = 1
    wait_until(lambda: state[1] == 1, timeout=10, what="the run after the turn met a busy store")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=8, what="delivered without the sweep")
    assert core.engine.stats["sweeps"] == 0


def test_a_session_start_report_wakes_mail_held_by_a_turn_start_report(
    make_core: Callable[..., Cao], settings: Settings
):
    """A turn start was reported and the mail waits (busy by the hook); then the CLI reports a new
    session (Claude Code's /clear does): it waits for input, so its mail goes at once — not when
    the turn start ages out (60 s here) or at the sweep."""
    core = make_core(settings.with_(hook_settle=60.0, **NO_SWEEP))
    tid = new_terminal(core, "developer")
    core.hook(tid, {"event": "UserPromptSubmit"})
    mid = core.send_message(tid, "token-after-clear", sender_id="s").message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason == "receiver busy", what="held")
    wait_until(core.engine.idle, what="the runs are over: only the report can wake it now")
    core.hook(tid, {"event": "SessionStart"})
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=5, what="delivered on the report")
    assert core.engine.stats["sweeps"] == 0


def test_a_session_end_report_from_a_cli_still_at_its_prompt_holds_mail_only_while_fresh(
    make_core: Callable[..., Cao], settings: Settings
):
    """A CLI reports its session ended (Claude Code's /clear does, before its new session's
    report — which may be lost), yet its box stays up. While fresh the report reads "exited" (an
    exit ends the pane within moments); once `hook_settle` passes the screen decides, and the
    held mail goes in then, with nothing on screen to say so."""
    core = make_core(settings.with_(hook_settle=1.5, **NO_SWEEP))
    tid = new_terminal(core, "developer")
    core.hook(tid, {"event": "SessionEnd"})
    mid = core.send_message(tid, "token-after-session-end", sender_id="s").message.id or 0
    wait_until(
        lambda: (core.store.get_message(mid).waiting_reason or "").startswith("receiver status unknown"),
        what="held as exited",
    )
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=6, what="after the settle")
    assert core.engine.stats["sweeps"] == 0


def _count_delivery_captures(core: Cao) -> list[int]:
    """Screen captures made by delivery threads (the gate's looks and every other read)."""
    count = [0]
    for name in ("look", "screen"):
        real = getattr(core.panes, name)

        def counting(terminal, _real=real, **kw):  # type: ignore[no-untyped-def]
            if threading.current_thread().name.startswith("cao-deliver"):
                count[0] += 1
            return _real(terminal, **kw)

        setattr(core.panes, name, counting)
    return count


def test_a_provider_without_a_tail_check_is_looked_at_a_few_times_a_second_not_every_frame(
    make_core: Callable[..., Cao], settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """Kimi CLI and Hermes have no cheap idle check on the log tail: a busy one with mail waiting
    redraws its spinner ~10 times a second, each a log change. Delivery looks at most every 250 ms
    (and once more after the last change), and the mail still goes in right after the turn."""
    monkeypatch.setattr(ScriptedProvider, "idle_tail_pattern", None)
    rules = {"record": True, "rules": [{"match": r"^work", "delay": 3.0, "reply": "worked"}]}
    write_rules(settings.home, "worker", rules)
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    mid = core.send_message(tid, "token-throttled", sender_id="s").message.id or 0
    wait_until(lambda: tid in core.engine.watched and core.engine.idle(), what="busy, watched")
    looks = _count_delivery_captures(core)
    started = time.monotonic()
    wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
    busy_for = time.monotonic() - started
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=5, what="delivered after the turn")
    assert core.engine.stats["sweeps"] == 0
    # ~10 frames a second unthrottled; at most 4 looks a second (+ the ones after the turn)
    assert looks[0] <= busy_for * 4 + 4, (looks[0], busy_for)


def test_a_retry_timer_that_cannot_start_leaves_the_receiver_to_the_next_trigger(
    make_core: Callable[..., Cao], settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """No thread to spare for the look-again timer: the receiver's runner must still end (not stay
    "running" for good, swallowing every later kick); the sweep (0.5 s here) then delivers."""
    core = make_core(settings)
    tid = new_terminal(core, "developer")
    _fail_one_capture(core)
    real_start = threading.Timer.start
    starts = [0]

    def start_once(timer: threading.Timer) -> None:
        if not starts[0]:
            starts[0] += 1
            raise RuntimeError("can't start new thread")
        real_start(timer)

    monkeypatch.setattr(threading.Timer, "start", start_once)
    mid = core.send_message(tid, "token-no-thread", sender_id="s").message.id or 0
    wait_until(lambda: starts[0] == 1, what="the timer failed to start")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=8, what="delivered by a later trigger")


def test_a_busy_store_right_after_a_create_does_not_fail_the_create(
    make_core: Callable[..., Cao], settings: Settings
):
    """The create is done when the pending-mail check meets a locked database: answering "nothing
    was written, retry" would leave a live agent without its task, and a retry would make two."""
    from cao.errors import StoreBusy

    core = make_core(settings)
    real = core.store.has_pending
    calls = [0]

    def busy_once(receiver_id: str) -> bool:
        if threading.current_thread() is threading.main_thread() and not calls[0]:
            calls[0] += 1
            raise StoreBusy("the database stayed locked past the busy timeout")
        return real(receiver_id)

    core.store.has_pending = busy_once  # type: ignore[method-assign]
    view = core.create_terminal(provider="scripted", agent_profile="developer", initial_message="your task")
    assert calls[0] == 1
    made = core.store.list_terminals()
    assert [t.id for t in made] == [view["id"]] and made[0].initial_message_id is not None


def test_a_failed_second_look_after_the_claim_is_looked_at_again(
    make_core: Callable[..., Cao], settings: Settings
):
    """Eager delivery looks again after its claim; that capture fails once, after the busy
    receiver's turn ended and its screen went quiet. The look again finds it ready."""
    rules = {"record": True, "rules": [{"match": r"^work", "delay": 2.0, "reply": "worked"}]}
    write_rules(settings.home, "worker", rules)
    core = make_core(settings.with_(eager_delivery=True, **NO_SWEEP))
    tid = new_terminal(core, "worker", provider="scripted_eager")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    state = _fail_one_capture(core, armed=False)

    def turn_ends() -> None:
        core.faults.hooks.pop("after_claim", None)
        wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
        time.sleep(0.3)  # the screen is quiet from here on
        state[0] = 1

    core.faults.hooks["after_claim"] = turn_ends
    with core.engine._lock:  # watched already, as after an earlier wait: no re-run after arming
        core.engine.watched.add(tid)
    mid = core.send_message(tid, "token-second-look", sender_id="s").message.id or 0
    wait_until(lambda: state[1] == 1, timeout=10, what="the look after the claim failed")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=6, what="delivered without the sweep")
    assert core.engine.stats["sweeps"] == 0


def test_a_wall_clock_stepped_back_does_not_stall_the_look_throttle(
    make_core: Callable[..., Cao], settings: Settings, monkeypatch: pytest.MonkeyPatch
):
    """A provider without a tail check is looked at every 250 ms at most; the clock it measures that
    by must not be the wall clock, which NTP may step back a minute while a turn runs."""
    monkeypatch.setattr(ScriptedProvider, "idle_tail_pattern", None)
    rules = {"record": True, "rules": [{"match": r"^work", "delay": 2.0, "reply": "worked"}]}
    write_rules(settings.home, "worker", rules)
    core = make_core(settings.with_(**NO_SWEEP))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")
    mid = core.send_message(tid, "token-after-clock-step", sender_id="s").message.id or 0
    wait_until(lambda: tid in core.engine.watched and core.engine.idle(), what="busy, watched")
    with core.engine._lock:  # the step lands right after a look, with no look-again timer pending
        for _, timer in core.engine._retries.values():
            timer.cancel()
        core.engine._retries.clear()
        core.delivery.clock = lambda: time.time() - 60.0  # the wall clock stepped back a minute
    wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=5, what="delivered after the turn")
