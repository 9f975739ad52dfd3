"""A listing reads every terminal's status from one batched look at the panes (not one tmux call
per terminal), and reads the same statuses, and finds the same panes gone, as one look each."""

from __future__ import annotations

from pathlib import Path

import pytest

from cao.core import Cao
from cao.settings import Settings
from cao.states import Status
from cao.testing.clock import FakeClock
from cao.testing.panes import MemoryPanes

pytestmark = pytest.mark.fast


def _core(tmp_path: Path) -> tuple[Cao, MemoryPanes]:
    clock = FakeClock()
    io = MemoryPanes(clock)
    settings = Settings(home=tmp_path / "cao", server_url="http://127.0.0.1:9")
    return Cao(settings, environ={"PATH": "/usr/bin:/bin"}, clock=clock, pane_io=io), io


def test_a_listing_is_one_look_and_reads_what_one_look_each_reads(tmp_path: Path):
    core, io = _core(tmp_path)
    try:
        made = [core.lifecycle.create(provider="scripted", agent_profile="developer") for _ in range(5)]
        busy, exited = made[1], made[3]
        io.type(core.store.get_terminal(busy.id).pane_id or "", "work 0.1\r")  # a turn
        io.exit(core.store.get_terminal(exited.id).pane_id or "")  # its program is gone
        singles = {t.id: core.status.status(core.store.get_terminal(t.id)) for t in made if t.id != exited.id}
        before = io.batched_looks
        listed = {v["id"]: v["status"] for v in core.list_terminals()}
        assert io.batched_looks == before + 1, "one batched look for the whole listing"
        assert listed[exited.id] == Status.GONE
        assert core.store.get_terminal(exited.id).state == "gone", "found gone for good, as one look would"
        assert {k: v for k, v in listed.items() if k != exited.id} == singles
        assert len(set(listed.values())) >= 3, listed  # idle, the worked one's, gone: not one copied
        session = made[0].session_name.removeprefix("cao-")
        before = io.batched_looks
        view = core.session_view(session)
        assert io.batched_looks == before + 1
        in_session = {t["id"]: t["status"] for t in view["terminals"]}  # type: ignore[union-attr]
        assert in_session and in_session == {k: listed[k] for k in in_session}
    finally:
        core.stop()
