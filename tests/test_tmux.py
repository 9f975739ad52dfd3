"""The tmux layer against a real tmux server on a private socket."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cao.errors import PaneGone, TmuxServerDown
from cao.tmux import Tmux
from tests.helpers import pid_alive, wait_until

# DELIVERY.md / ATTENTION.md on both tmux clients: control mode, and forced off (docs/tmux.md)
pytestmark = pytest.mark.tmux_clients

SHELL = ["/bin/sh", "-c"]


def _window(
    tmux: Tmux, tmp_path: Path, script: str, *, session: str = "cao-t", env: dict[str, str] | None = None
):
    return tmux.create_window(
        session_name=session,
        window_name="w",
        command=[*SHELL, script],
        env=env or {"PATH": os.environ["PATH"], "TERM": "xterm-256color"},
        cwd=tmp_path,
        log_path=tmp_path / "logs" / "t.log",
        width=120,
        height=30,
        history_limit=5000,
    )


def test_pane_environment_is_exactly_the_allow_list(
    tmux: Tmux, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("CAO_TEST_SECRET", "leaked")
    info = _window(
        tmux, tmp_path, "env | sort > env.txt; sleep 30", env={"PATH": os.environ["PATH"], "ONLY_ME": "yes"}
    )
    out = wait_until(
        lambda: (tmp_path / "env.txt").exists() and (tmp_path / "env.txt").read_text(), what="env dump"
    )
    names = {line.split("=", 1)[0] for line in out.splitlines()}
    assert "ONLY_ME" in names
    assert "CAO_TEST_SECRET" not in names
    assert "TMUX" not in names  # tmux sets TMUX in panes; env -i keeps it out
    assert names <= {"PATH", "ONLY_ME", "PWD", "SHLVL", "_"}
    tmux.kill_pane(info.pane_id, info.pane_pid)


def test_session_window_naming_history_and_log_pipe(tmux: Tmux, tmp_path: Path):
    info = _window(tmux, tmp_path, "echo hello-from-pane; sleep 30")
    assert info.pane_id.startswith("%")
    assert tmux.list_sessions() == ["cao-t"]
    assert tmux.run(
        "display-message", "-p", "-t", info.pane_id, "#{window_name} #{history_limit}"
    ).split() == ["w", "5000"]
    wait_until(lambda: "hello-from-pane" in (tmp_path / "logs" / "t.log").read_text(), what="log pipe")
    assert "hello-from-pane" in tmux.capture(info.pane_id)
    # re-opening is idempotent: an open pipe stays open (pipe-pane -o would have toggled it off)
    assert tmux.ensure_pipe(info.pane_id, tmp_path / "logs" / "t.log") is False
    assert tmux.run("display-message", "-p", "-t", info.pane_id, "#{pane_pipe}").strip() == "1"
    assert {p.pane_id: p.pane_pid for p in tmux.list_panes()}[info.pane_id] == info.pane_pid
    tmux.kill_pane(info.pane_id, info.pane_pid)


def test_second_window_joins_existing_session_and_exact_names(tmux: Tmux, tmp_path: Path):
    a = _window(tmux, tmp_path, "sleep 30", session="cao-ab")
    b = _window(tmux, tmp_path, "sleep 30", session="cao-ab")
    assert a.pane_id != b.pane_id
    assert tmux.has_session("cao-ab")
    assert not tmux.has_session("cao-a")  # no prefix matching
    out = tmux.run("list-windows", "-t", "=cao-ab", "-F", "#{window_name}")
    assert out.split() == ["w", "w"]
    tmux.kill_session("cao-ab")
    assert not tmux.has_session("cao-ab")


def test_bracketed_paste_multiline_is_one_read_and_enter_follows(tmux: Tmux, tmp_path: Path):
    # `cat -v` shows the paste markers the program received.
    info = _window(tmux, tmp_path, "printf '\\033[?2004h'; stty raw -echo; exec cat -v > got.txt")
    # got.txt exists once the shell has set bracketed-paste mode and raw input and started cat
    wait_until(lambda: (tmp_path / "got.txt").exists(), what="cat started")
    tmux.paste(info.pane_id, "line one\nline two ünïcode", enter_delay=0.05)
    got = wait_until(
        lambda: (tmp_path / "got.txt").read_text() if "^M" in (tmp_path / "got.txt").read_text() else "",
        what="pasted text",
    )
    assert got.startswith("^[[200~line one")
    assert "line two" in got
    assert got.index("^[[201~") < got.rindex("^M")  # Enter after the closing marker
    tmux.kill_pane(info.pane_id, info.pane_pid)


def test_kill_pane_kills_process_group_even_if_sighup_ignored(tmux: Tmux, tmp_path: Path):
    script = "trap '' HUP TERM; (trap '' HUP; sleep 300) & echo $! > child.pid; sleep 300"
    info = _window(tmux, tmp_path, script)
    child = int(
        wait_until(
            lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text().strip(),
            what="child pid",
        )
    )
    tmux.kill_pane(info.pane_id, info.pane_pid, grace=0.5)
    for pid in (info.pane_pid, child):
        wait_until(lambda pid=pid: not pid_alive(pid), what=f"pid {pid} gone")
    assert info.pane_id not in tmux.list_panes()


def test_capture_of_missing_pane_and_missing_server(tmux: Tmux, tmp_path: Path):
    info = _window(tmux, tmp_path, "sleep 30")
    other = _window(tmux, tmp_path, "sleep 30")
    tmux.kill_pane(info.pane_id, info.pane_pid)
    with pytest.raises(PaneGone):
        tmux.capture(info.pane_id)
    tmux.kill_server()
    with pytest.raises(TmuxServerDown):
        tmux.capture(other.pane_id)
    assert tmux.list_panes() == []
    assert tmux.list_sessions() == []


def test_pane_io_checks_identity_and_fence_in_the_same_call(tmux: Tmux, tmp_path: Path):
    """Identity (server pid, pane id, pane pid, alive) and the paste fence are checked by tmux itself,
    in the call that does the work: a wrong pane is never read, typed into or killed."""
    from cao.errors import FenceLost, PaneMismatch
    from cao.tmux import PaneRef

    info = _window(tmux, tmp_path, "cat")
    ref = info.ref
    assert ref.server_pid > 0 and ref.pane_pid == info.pane_pid
    tmux.paste_checked(ref, "first-paste", fence=3, enter_count=0)
    wait_until(lambda: "first-paste" in tmux.capture_checked(ref), what="paste shown")
    with pytest.raises(FenceLost):  # an older claim (fence 2) lost the pane to fence 3
        tmux.paste_checked(ref, "stale-paste", fence=2)
    with pytest.raises(FenceLost):
        tmux.send_keys_checked(ref, "Enter", fence=2)
    tmux.send_keys_checked(ref, "typed", fence=3, literal=True)
    impostors = [
        PaneRef(ref.server_pid + 1, ref.pane_id, ref.pane_pid),  # a new tmux server reusing the id
        PaneRef(ref.server_pid, ref.pane_id, ref.pane_pid + 1),  # another process in that pane
    ]
    for bad in impostors:
        with pytest.raises(PaneMismatch):
            tmux.capture_checked(bad)
        with pytest.raises(PaneMismatch):
            tmux.paste_checked(bad, "never")
        with pytest.raises(PaneMismatch):
            tmux.kill_checked(bad)
    screen = tmux.capture_checked(ref)
    assert "stale-paste" not in screen and "never" not in screen and "typed" in screen
    assert "cao-" not in tmux.run("list-buffers", "-F", "#{buffer_name}")  # refused pastes leave no buffer
    tmux.kill_checked(ref)
    assert all(p.pane_id != ref.pane_id for p in tmux.list_panes())


def test_a_dead_pane_reads_as_not_the_terminals(tmux: Tmux, tmp_path: Path):
    """remain-on-exit keeps a pane whose program exited; its identity check says so."""
    from cao.errors import PaneMismatch

    info = _window(tmux, tmp_path, "exit 3")
    wait_until(lambda: any(p.dead for p in tmux.list_panes() if p.pane_id == info.pane_id), what="pane dead")
    with pytest.raises(PaneMismatch, match="exited"):
        tmux.capture_checked(info.ref)


def test_many_panes_are_looked_at_in_one_call_each_with_its_own_identity(tmux: Tmux, tmp_path: Path):
    """A listing's batched look (``look_many``): one tmux call for every pane, each screen the
    same as its own look's, and a pane that is gone or not the one named reads so, alone."""
    from cao.errors import PaneMismatch
    from cao.tmux import PaneRef
    from cao.tmux import client as tmux_client

    infos = [_window(tmux, tmp_path, f"printf 'pane {i} says hi\\n'; cat") for i in range(4)]
    for i, info in enumerate(infos):
        wait_until(lambda i=i, info=info: f"pane {i} says hi" in tmux.capture_checked(info.ref), what="drawn")
    refs = [info.ref for info in infos]
    calls = tmux.stats["control"] + tmux.stats["forked"]
    looks = tmux.look_many(refs)
    assert tmux.stats["control"] + tmux.stats["forked"] == calls + 1, "one tmux call for all four"
    for ref in refs:
        assert looks[ref.pane_id] == tmux.look_checked(ref)
    impostor = PaneRef(refs[1].server_pid, refs[1].pane_id, refs[1].pane_pid + 1)  # another program there
    tmux.kill_checked(refs[2])  # this one is gone: tmux stops a command list at it
    mixed = tmux.look_many([refs[0], impostor, refs[2], refs[3]])
    assert isinstance(mixed[impostor.pane_id], PaneMismatch)
    assert isinstance(mixed[refs[2].pane_id], PaneGone)
    for ref in (refs[0], refs[3]):
        assert mixed[ref.pane_id] == tmux.look_checked(ref)
    # more panes than one call carries: still every pane's own screen
    old = tmux_client.LOOK_BATCH
    tmux_client.LOOK_BATCH = 2
    try:
        assert tmux.look_many([refs[0], refs[1], refs[3]]) == {
            r.pane_id: tmux.look_checked(r) for r in (refs[0], refs[1], refs[3])
        }
    finally:
        tmux_client.LOOK_BATCH = old
