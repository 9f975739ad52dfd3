"""The engine's housekeeping on real files and a real tmux pane."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from cao.core import Cao
from cao.settings import Settings
from tests.helpers import SLOW, idle, new_terminal, read_records, status_of, wait_until, write_rules


def test_a_flooding_pane_log_is_capped_as_it_grows_not_once_a_sweep(
    make_core: Callable[..., Cao], settings: Settings
):
    """An agent printing in a loop: its log is truncated within one cap interval of passing the cap,
    while the sweep (60 s here) never runs."""
    cap = 256 * 1024
    s = settings.with_(log_cap_bytes=cap, log_cap_interval=0.2, sweep_interval=60.0)
    core = make_core(s)
    log = core.logs.path("f100d000")
    core.tmux.create_window(
        session_name="cao-flood",
        window_name="flood",
        command=["sh", "-c", "yes 'printing in a loop, forever'"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=s.home,
        log_path=log,
    )
    sizes: list[int] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        sizes.append(log.stat().st_size)
        time.sleep(0.01)
    wait_until(lambda: core.engine.stats["logs_capped"] >= 3, timeout=5, what="repeated truncation")
    assert core.engine.stats["sweeps"] == 0
    growth = max(b - a for a, b in itertools.pairwise(sizes) if b >= a)  # bytes per 10 ms sample
    per_interval = growth * (s.log_cap_interval / 0.01)
    assert max(sizes) <= cap + per_interval + 64 * 1024, (max(sizes), per_interval)
    assert max(sizes) < 50 * cap  # without the ticker it grows without bound until a sweep


def test_a_receiver_that_turns_ready_while_its_watch_is_being_armed_gets_its_mail_at_once(
    make_core: Callable[..., Cao], settings: Settings
):
    """The lost wake-up that once cost the demo a whole sweep: the first attempt reads a busy screen,
    the agent finishes its turn before the log watch is armed, and nothing changes afterwards. The
    watch's first snapshot already holds the finished screen, so no log event ever comes; the runner
    must look once more after arming instead of leaving the message to the sweep (600 s here)."""
    write_rules(settings.home, "worker", SLOW)
    core = make_core(settings.with_(sweep_interval=600.0, sweep_grace=600.0))
    tid = new_terminal(core, "worker")
    core.typist.send_input(core.store.get_terminal(tid), "work 1")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing")

    def turn_ends_first() -> None:  # between the busy read and the arming of the watch
        core.faults.hooks.pop("before_watch", None)
        wait_until(lambda: idle(core, tid), timeout=10, what="the turn ends")
        time.sleep(0.3)  # and the screen stays as it is: no log change to come after the arming

    core.faults.hooks["before_watch"] = turn_ends_first
    mid = core.send_message(tid, "token-after-the-turn", sender_id="s").message.id or 0
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10, what="delivery without the sweep")
    assert core.engine.stats["sweeps"] == 0
    assert [r["text"] for r in read_records(settings.home, tid)][-1].endswith("token-after-the-turn")


def test_mail_sent_to_a_terminal_still_being_created_is_delivered_once_it_is_live(
    make_core: Callable[..., Cao], settings: Settings
):
    """A message for a terminal whose row is still `starting` waits; the agent draws its prompt
    before the create finishes, so its log has nothing more to say. Finishing the create wakes
    the runner, not the sweep (600 s here)."""
    write_rules(settings.home, "worker", SLOW)
    core = make_core(settings.with_(sweep_interval=600.0, sweep_grace=600.0))
    sent: list[int] = []

    def send_while_starting() -> None:
        core.faults.hooks.clear()
        starting = [t for t in core.store.list_terminals() if t.state == "starting"]
        assert len(starting) == 1
        tid = starting[0].id
        sent.append(core.send_message(tid, "token-sent-early", sender_id="s").message.id or 0)
        log = core.logs.path(tid)
        wait_until(lambda: log.exists() and "❯" in log.read_text(errors="replace"), what="prompt drawn")
        wait_until(lambda: core.engine.idle(), what="the send's run is over")
        time.sleep(0.3)  # the watch has seen the finished screen; nothing changes after this

    core.faults.hooks["after_pane_created"] = send_while_starting
    term = core.create_terminal(provider="scripted", agent_profile="worker")
    wait_until(lambda: status_of(core, sent[0]) == "delivered", timeout=10, what="delivered, no sweep")
    assert core.engine.stats["sweeps"] == 0
    assert [r["text"] for r in read_records(settings.home, str(term["id"]))][-1].endswith("token-sent-early")
