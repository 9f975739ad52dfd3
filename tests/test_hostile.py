"""DELIVERY.md scenarios 33-36 and what a hostile world did to them (issue 18): a person scrolling
the pane (tmux copy mode and the other modes), typing over a person's half-typed text, another
server's agents on the same tmux server, the database swapped or deleted under a running server,
and the 500s that a pane closed behind cao's back or a full disk used to cause.

Real tmux server on a private socket, real SQLite file, real scripted agents; what an agent received
is read from its own record, and the tmux modes are entered the way a person's keys or mouse enter
them (the commands their bindings run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao, StepFailed
from cao.errors import BoxOccupied, PaneInMode
from cao.states import WaitReason
from tests.conftest import read_records, wait_until, write_rules
from tests.test_delivery import _idle, _new_terminal, _settle, _status_of

# A body whose lines would each be an Enter if pasted without bracket markers: "/exit" ends the
# scripted agent (as it ends Claude Code), "!" lines run shell commands in Claude Code.
HOSTILE = "first line of the task\n/exit\n!touch /tmp/cao-pwned\nlast line"

# What a person's keys and mouse do, as the tmux commands their default bindings run.
MODES = {
    "copy-mode": ("copy-mode",),  # prefix [ (keyboard scrolling)
    "wheel": ("copy-mode", "-e"),  # the mouse wheel's WheelUpPane binding with `mouse on`
    "clock-mode": ("clock-mode",),  # prefix t
    "choose-tree": ("choose-tree",),  # prefix s / w
}


def _pane(core: Cao, tid: str) -> str:
    return core.store.get_terminal(tid).pane_id or ""


def _enter_mode(core: Cao, tid: str, how: str) -> None:
    cmd, *args = MODES[how]
    core.tmux.run(cmd, *args, "-t", _pane(core, tid))
    wait_until(lambda: _mode(core, tid), what=f"{how} entered")


def _mode(core: Cao, tid: str) -> str:
    return core.tmux.run("display-message", "-p", "-t", _pane(core, tid), "#{pane_mode}").strip()


def _leave_mode(core: Cao, tid: str) -> None:
    """The person leaves: copy mode by its cancel command (q), any other mode with `copy-mode -q`
    (keys sent without a client don't end the clock or a chooser)."""
    if _mode(core, tid) == "copy-mode":
        core.tmux.run("send-keys", "-t", _pane(core, tid), "-X", "cancel")
    core.tmux.run("copy-mode", "-q", "-t", _pane(core, tid))
    assert not _mode(core, tid)


# -- 33: a pane in a tmux mode gets nothing ---------------------------------------------------------
@pytest.mark.parametrize("how", list(MODES))
def test_33_nothing_is_pasted_into_a_pane_in_a_tmux_mode_and_it_arrives_whole_after(core: Cao, how: str):
    tid = _new_terminal(core)
    _enter_mode(core, tid, how)
    receipt = core.send_message(tid, HOSTILE, sender_id="s")
    mid = receipt.message.id or 0
    wait_until(
        lambda: (core.store.get_message(mid).waiting_reason or "").startswith(WaitReason.IN_MODE),
        what="the reason shown",
    )
    core.engine.kick(tid, "sweep")  # every trigger goes through the same gate
    wait_until(core.engine.idle)
    assert _status_of(core, mid) == "pending" and core.store.get_message(mid).attempts == 0
    assert read_records(core.settings.home, tid) == []  # not one line reached the agent
    assert _idle(core, tid)  # "/exit" did not run
    assert _mode(core, tid)  # still in it: cao never leaves the mode for the person
    _leave_mode(core, tid)
    wait_until(lambda: _status_of(core, mid) == "delivered", timeout=10)
    _settle(core, tid)
    [rec] = read_records(core.settings.home, tid)
    assert [m["body"] for m in rec["messages"]] == [HOSTILE]  # one message, whole


def test_33b_a_mode_entered_after_the_look_refuses_the_paste_in_the_same_tmux_call(core: Cao):
    """The person starts scrolling between cao's screen read and its paste: tmux itself refuses
    (the mode is checked in the paste's own command), the claim goes back unspent."""
    tid = _new_terminal(core)
    core.faults.hooks["after_claim"] = lambda: _enter_mode(core, tid, "copy-mode")
    mid = core.send_message(tid, HOSTILE, sender_id="s").message.id or 0
    wait_until(
        lambda: (core.store.get_message(mid).waiting_reason or "").startswith(WaitReason.IN_MODE),
        what="the reason shown",
    )
    del core.faults.hooks["after_claim"]
    wait_until(core.engine.idle)
    message = core.store.get_message(mid)
    assert message.status == "pending" and message.attempts == 0 and message.claim is None
    assert read_records(core.settings.home, tid) == []
    _leave_mode(core, tid)
    wait_until(lambda: _status_of(core, mid) == "delivered", timeout=10)
    assert [m["body"] for r in read_records(core.settings.home, tid) for m in r["messages"]] == [HOSTILE]


def test_33c_typed_input_keys_and_the_interrupt_key_wait_for_the_mode(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings.with_(input_wait_timeout=0.5))
    tid = _new_terminal(core)
    _enter_mode(core, tid, "wheel")
    with TestClient(create_app(core)) as client:
        r = client.post(f"/terminals/{tid}/input", json={"message": HOSTILE})
        assert r.status_code == 409 and "scrolling" in r.json()["detail"], r.text
        assert "nothing is typed" in r.json()["detail"]
        for key in ("Enter", "q", "C-c", "Escape"):  # q or Escape would also end the person's mode
            r = client.post(f"/terminals/{tid}/key", json={"key": key})
            assert r.status_code == 409 and "scrolling" in r.json()["detail"], (key, r.text)
        assert _mode(core, tid) == "copy-mode"
        assert read_records(core.settings.home, tid) == []
        _leave_mode(core, tid)
        r = client.post(f"/terminals/{tid}/input", json={"message": "typed after"})
        assert r.status_code == 200, r.text
    _settle(core, tid)
    [rec] = read_records(core.settings.home, tid)
    assert rec["text"] == "typed after"


def test_33d_typed_input_goes_in_once_the_person_stops_scrolling_within_the_wait(core: Cao):
    tid = _new_terminal(core)
    _enter_mode(core, tid, "copy-mode")
    later = threading.Timer(0.5, _leave_mode, (core, tid))
    later.start()
    try:
        assert core.send_input(tid, "typed while scrolling") is True
    finally:
        later.cancel()
    _settle(core, tid)
    assert [r["text"] for r in read_records(core.settings.home, tid)] == ["typed while scrolling"]


# -- 34: typed input never lands on a person's half-typed text --------------------------------------
def test_34_typed_input_never_joins_a_persons_half_typed_text(make_core: Callable[..., Cao], settings):
    core = make_core(settings.with_(input_wait_timeout=0.5))
    tid = _new_terminal(core)
    core.tmux.send_keys(_pane(core, tid), "rm -rf ~/proj && ", literal=True)  # a person, mid-command
    term = core.store.get_terminal(tid)
    wait_until(lambda: (core.terminals.provider(term).input_text(core.terminals.screen(term)) or "").strip())
    with TestClient(create_app(core)) as client:
        r = client.post(f"/terminals/{tid}/input", json={"message": "deploy the release"})
        assert r.status_code == 409, r.text
        assert "holds someone's text" in r.json()["detail"] and "nothing was typed" in r.json()["detail"]
    with pytest.raises(BoxOccupied):
        core.send_input(tid, "deploy the release")
    assert read_records(core.settings.home, tid) == []  # nothing submitted: not one turn of both
    box = core.terminals.provider(term).input_text(core.terminals.screen(term)) or ""
    assert box.strip() == "rm -rf ~/proj &&"  # and nothing appended to it
    core.tmux.send_keys(_pane(core, tid), "C-c")  # the person clears the box
    assert core.send_input(tid, "deploy the release") is True
    _settle(core, tid)
    assert [r["text"] for r in read_records(core.settings.home, tid)] == ["deploy the release"]


def test_34b_handoff_to_a_worker_a_person_is_typing_in_fails_clearly(make_core: Callable[..., Cao], settings):
    core = make_core(settings.with_(input_wait_timeout=0.3))
    write_rules(settings.home, "w", {"record": True})
    tid = _new_terminal(core, "w")
    core.tmux.send_keys(_pane(core, tid), "half a thought", literal=True)
    term = core.store.get_terminal(tid)
    wait_until(lambda: (core.terminals.provider(term).input_text(core.terminals.screen(term)) or "").strip())
    with pytest.raises(StepFailed, match="holds someone's text") as failed:
        core.run_step(provider="scripted", agent="w", prompt="the task", reuse_terminal_id=tid, timeout=5)
    assert failed.value.status_code == 409
    assert read_records(settings.home, tid) == []


def test_in_mode_error_names_the_mode_and_the_way_out():
    from cao.tmux import in_mode_error

    err = in_mode_error("copy-mode")
    assert isinstance(err, PaneInMode) and err.status_code == 409 and not err.typed
    assert "scrolling" in err.message and "q or Escape" in err.message
    assert "view mode" in in_mode_error("view-mode").message
    assert "weird-mode" in in_mode_error("weird-mode").message
