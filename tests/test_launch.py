"""The launch planner's one provider-choice policy (cao/launch.py), without tmux."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cao.core import Cao
from cao.errors import InvalidInput
from cao.settings import Settings
from cao.store import Terminal
from cao.testing.clock import FakeClock
from cao.testing.panes import MemoryPanes

pytestmark = pytest.mark.fast


def _core(tmp_path: Path) -> Cao:
    clock = FakeClock()
    settings = Settings(home=tmp_path / "cao", server_url="http://127.0.0.1:9")
    return Cao(settings, environ={"PATH": "/usr/bin:/bin"}, clock=clock, pane_io=MemoryPanes(clock))


def _supervisor(provider: str) -> Terminal:
    return Terminal(
        id="5e5e5e5e",
        name="boss-5e5e",
        session_name="cao-s",
        provider=provider,
        agent_profile="developer",
        working_directory="/",
        created_at=0.0,
        last_active=0.0,
    )


def _plan(core: Cao, profile: str, supervisor: Terminal) -> str:
    return core.planner.plan(
        "0a0a0a0a",
        session="cao-s",
        provider=None,
        agent_profile=profile,
        working_directory=str(core.settings.home),
        supervisor=supervisor,
        use_worktree=None,
        hook_key="k",
    ).terminal.provider


def test_a_scripted_rules_file_is_no_profile_for_the_supervisors_cli(tmp_path: Path):
    """A worker inherits its supervisor's CLI; a name that is only a scripted agent's rules file
    is then no profile for it: refused as unknown, as it is when the request names that CLI."""
    core = _core(tmp_path)
    core.settings.scripted_dir.mkdir(parents=True, exist_ok=True)
    (core.settings.scripted_dir / "slowpoke.json").write_text(json.dumps({"rules": []}))
    try:
        assert _plan(core, "slowpoke", _supervisor("scripted_eager")) == "scripted_eager"
        with pytest.raises(InvalidInput, match="agent profile 'slowpoke' not found"):
            _plan(core, "slowpoke", _supervisor("claude_code"))
    finally:
        core.stop()


class Boom(Exception):
    pass


def _fail_add(core: Cao) -> None:
    def add(_terminal: Terminal) -> None:
        raise Boom("the database refused the row")

    core.store.add_terminal = add  # type: ignore[method-assign]


def _fail_window(core: Cao) -> None:
    def create_window(**_kw: object) -> None:
        raise Boom("tmux failed")

    core.lifecycle.io.create_window = create_window  # type: ignore[method-assign]


def _fail_after_pane(core: Cao) -> None:
    def fault(name: str) -> None:
        if name == "after_pane_created":
            raise Boom("failed after the pane was made")

    core.lifecycle.fault = fault


def _lose_row(core: Cao) -> None:
    core.store.set_pane = lambda *_a, **_k: False  # type: ignore[method-assign]


@pytest.mark.parametrize("fail", [_fail_add, _fail_window, _fail_after_pane, _lose_row])
def test_a_create_that_fails_half_way_leaves_no_pane_row_home_or_log(tmp_path: Path, fail):
    core = _core(tmp_path)
    try:
        fail(core)
        with pytest.raises(Exception):  # noqa: B017 - each failure raises its own
            core.lifecycle.create(provider="scripted", agent_profile="developer")
        io = core.lifecycle.io
        assert isinstance(io, MemoryPanes) and io.panes == {}
        assert core.store.list_terminals() == []  # a tombstone (deleted) at most
        homes = core.settings.home / "terminals"
        assert not homes.exists() or list(homes.iterdir()) == []  # its CLI's config (and hook key)
        logs = core.settings.logs_dir
        assert not logs.exists() or list(logs.iterdir()) == []  # a pane log nothing would remove
    finally:
        core.stop()
