"""Trigger 2b on the in-memory pane backend: a pane that printed and went quiet wakes delivery for
its terminal, through the same kick as the other triggers (docs/tmux.md#output-wakes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cao.core import Cao
from cao.settings import Settings
from cao.states import Trigger
from cao.testing.clock import FakeClock
from cao.testing.panes import MemoryPanes

pytestmark = pytest.mark.fast


def _core(tmp_path: Path, **knobs: object) -> tuple[Cao, MemoryPanes]:
    clock = FakeClock()
    io = MemoryPanes(clock)
    settings = Settings(home=tmp_path / "cao", server_url="http://127.0.0.1:9", **knobs)  # type: ignore[arg-type]
    return Cao(settings, environ={"PATH": "/usr/bin:/bin"}, clock=clock, pane_io=io), io


def test_output_of_a_watched_receivers_pane_kicks_it_with_the_output_trigger(tmp_path: Path):
    core, _io = _core(tmp_path)
    try:
        kicks: list[tuple[str, str]] = []
        core.engine.kick = lambda rid, trigger: kicks.append((rid, trigger))  # type: ignore[method-assign]
        t = core.lifecycle.create(provider="scripted", agent_profile="developer")
        pane = core.store.get_terminal(t.id).pane_id or ""
        core.engine.forget_panes()  # its create drew before its row had the pane: read again
        core.engine.on_pane_quiet(pane)
        assert kicks == [], "no mail waiting: nothing to wake"
        core.engine.watched.add(t.id)
        core.engine.on_pane_quiet(pane)
        assert kicks == [(t.id, Trigger.OUTPUT)]
        core.engine.on_pane_quiet("%999")  # a pane that is no terminal's
        assert kicks == [(t.id, Trigger.OUTPUT)]
        assert core.engine.stats["output_wakes"] == 2
        assert core.engine.output_quiet(pane) == 0.01  # the scripted provider's threshold
    finally:
        core.stop()


def test_the_memory_backend_reports_what_a_pane_draws(tmp_path: Path):
    core, io = _core(tmp_path)
    try:
        woke: list[str] = []
        io.watch_output(woke.append, lambda _p: 0.0)
        t = core.lifecycle.create(provider="scripted", agent_profile="developer")
        pane = core.store.get_terminal(t.id).pane_id or ""
        before = len(woke)
        io.type(pane, "hello")
        assert woke[before:] and set(woke[before:]) == {pane}
    finally:
        core.stop()


def test_output_wakes_off_leaves_the_backend_unwatched(tmp_path: Path):
    core, io = _core(tmp_path, output_wakes=False)
    try:
        t = core.lifecycle.create(provider="scripted", agent_profile="developer")
        assert t.id and io.output_wakes == 0 and io.refresh_output_watch() == 0
    finally:
        core.stop()


def test_a_new_terminals_pane_is_found_on_its_first_wake(tmp_path: Path):
    core, _io = _core(tmp_path)
    try:
        first = core.lifecycle.create(provider="scripted", agent_profile="developer")
        core.engine.on_pane_quiet(core.store.get_terminal(first.id).pane_id or "")  # map read now
        second = core.lifecycle.create(provider="scripted", agent_profile="developer")
        core.engine.forget_panes()
        kicks: list[str] = []
        core.engine.kick = lambda rid, trigger: kicks.append(rid)  # type: ignore[method-assign]
        core.engine.watched.add(second.id)
        core.engine.on_pane_quiet(core.store.get_terminal(second.id).pane_id or "")
        assert kicks == [second.id]
    finally:
        core.stop()
