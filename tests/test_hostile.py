"""DELIVERY.md scenarios 33-36 and what a hostile world did to them (issue 18): a person scrolling
the pane (tmux copy mode and the other modes), typing over a person's half-typed text, another
server's agents on the same tmux server, the database swapped or deleted under a running server,
and the 500s that a pane closed behind cao's back or a full disk used to cause.

Real tmux server on a private socket, real SQLite file, real scripted agents; what an agent received
is read from its own record, and the tmux modes are entered the way a person's keys or mouse enter
them (the commands their bindings run).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from cao.errors import BoxOccupied, NotFound, PaneGone, PaneInMode
from cao.handoff import StepFailed
from tests.helpers import idle, new_terminal, read_records, settle, status_of, wait_until, write_rules

# DELIVERY.md / ATTENTION.md on both tmux clients: control mode, and forced off (docs/tmux.md)
pytestmark = pytest.mark.tmux_clients

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


REASONS = {  # what a message waiting on each shows
    "copy-mode": "a person is scrolling this pane (tmux copy mode)",
    "wheel": "a person is scrolling this pane (tmux copy mode)",
    "clock-mode": "a person has the tmux clock open in this pane",
    "choose-tree": "a person has a tmux chooser open in this pane",
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
    tid = new_terminal(core)
    _enter_mode(core, tid, how)
    receipt = core.send_message(tid, HOSTILE, sender_id="s")
    mid = receipt.message.id or 0
    wait_until(lambda: core.store.get_message(mid).waiting_reason == REASONS[how], what="the reason shown")
    core.engine.kick(tid, "sweep")  # every trigger goes through the same gate
    wait_until(core.engine.idle)
    assert status_of(core, mid) == "pending" and core.store.get_message(mid).attempts == 0
    assert read_records(core.settings.home, tid) == []  # not one line reached the agent
    assert idle(core, tid)  # "/exit" did not run
    assert _mode(core, tid)  # still in it: cao never leaves the mode for the person
    _leave_mode(core, tid)
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10)
    settle(core, tid)
    [rec] = read_records(core.settings.home, tid)
    assert [m["body"] for m in rec["messages"]] == [HOSTILE]  # one message, whole


def test_33b_a_mode_entered_after_the_look_refuses_the_paste_in_the_same_tmux_call(core: Cao):
    """The person starts scrolling between cao's screen read and its paste: tmux itself refuses
    (the mode is checked in the paste's own command), the claim goes back unspent."""
    tid = new_terminal(core)
    core.faults.hooks["after_claim"] = lambda: _enter_mode(core, tid, "copy-mode")
    mid = core.send_message(tid, HOSTILE, sender_id="s").message.id or 0
    wait_until(
        lambda: (
            core.store.get_message(mid).waiting_reason == "a person is scrolling this pane (tmux copy mode)"
        ),
        what="the reason shown",
    )
    del core.faults.hooks["after_claim"]
    wait_until(core.engine.idle)
    message = core.store.get_message(mid)
    assert message.status == "pending" and message.attempts == 0 and message.claim is None
    assert read_records(core.settings.home, tid) == []
    _leave_mode(core, tid)
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10)
    assert [m["body"] for r in read_records(core.settings.home, tid) for m in r["messages"]] == [HOSTILE]


def test_33c_typed_input_keys_and_the_interrupt_key_wait_for_the_mode(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings.with_(input_wait_timeout=0.5))
    tid = new_terminal(core)
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
    settle(core, tid)
    [rec] = read_records(core.settings.home, tid)
    assert rec["text"] == "typed after"


def test_33d_typed_input_goes_in_once_the_person_stops_scrolling_within_the_wait(core: Cao):
    tid = new_terminal(core)
    _enter_mode(core, tid, "copy-mode")
    later = threading.Timer(0.5, _leave_mode, (core, tid))
    later.start()
    try:
        assert core.send_input(tid, "typed while scrolling") is True
    finally:
        later.cancel()
    settle(core, tid)
    assert [r["text"] for r in read_records(core.settings.home, tid)] == ["typed while scrolling"]


# -- 34: typed input never lands on a person's half-typed text --------------------------------------
def test_34_typed_input_never_joins_a_persons_half_typed_text(make_core: Callable[..., Cao], settings):
    core = make_core(settings.with_(input_wait_timeout=0.5))
    tid = new_terminal(core)
    core.tmux.send_keys(_pane(core, tid), "rm -rf ~/proj && ", literal=True)  # a person, mid-command
    term = core.store.get_terminal(tid)
    wait_until(lambda: (core.panes.provider(term).input_text(core.panes.screen(term)) or "").strip())
    with TestClient(create_app(core)) as client:
        r = client.post(f"/terminals/{tid}/input", json={"message": "deploy the release"})
        assert r.status_code == 409, r.text
        assert "holds someone's text" in r.json()["detail"] and "nothing was typed" in r.json()["detail"]
    with pytest.raises(BoxOccupied):
        core.send_input(tid, "deploy the release")
    assert read_records(core.settings.home, tid) == []  # nothing submitted: not one turn of both
    box = core.panes.provider(term).input_text(core.panes.screen(term)) or ""
    assert box.strip() == "rm -rf ~/proj &&"  # and nothing appended to it
    core.tmux.send_keys(_pane(core, tid), "C-c")  # the person clears the box
    assert core.send_input(tid, "deploy the release") is True
    settle(core, tid)
    assert [r["text"] for r in read_records(core.settings.home, tid)] == ["deploy the release"]


def test_34b_handoff_to_a_worker_a_person_is_typing_in_fails_clearly(make_core: Callable[..., Cao], settings):
    core = make_core(settings.with_(input_wait_timeout=0.3))
    write_rules(settings.home, "w", {"record": True})
    tid = new_terminal(core, "w")
    core.tmux.send_keys(_pane(core, tid), "half a thought", literal=True)
    term = core.store.get_terminal(tid)
    wait_until(lambda: (core.panes.provider(term).input_text(core.panes.screen(term)) or "").strip())
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


# -- 35: another cao-server's agents on the same tmux server ----------------------------------------
@pytest.mark.sqlite_only("two homes on one tmux server, each with its own store file")
def test_35_a_session_of_another_cao_server_is_never_deleted_by_name(
    make_core: Callable[..., Cao], settings, tmp_path
):
    """Two cao-servers (two CAO_HOMEs) on one tmux server: deleting a session by its name on one
    used to kill the other's agents (and the tmux server with its last session)."""
    mine = make_core(settings)
    other = make_core(settings.with_(home=tmp_path / "other-home"))
    theirs = new_terminal(other, session="shared")
    with pytest.raises(NotFound, match="no terminals of this cao-server"):
        mine.delete_session("shared")
    with TestClient(create_app(mine)) as client:
        r = client.delete("/sessions/shared")
        assert r.status_code == 404 and "nothing was touched" in r.json()["detail"]
    assert idle(other, theirs)  # still running
    # a terminal of ours added to their session, then our session deleted: only ours goes
    ours = mine.lifecycle.create(provider="scripted", session_name="shared", new_session=False).id
    wait_until(lambda: idle(mine, ours))
    assert mine.delete_session("shared") == [ours]
    assert idle(other, theirs) and mine.tmux.has_session("cao-shared")
    # and a restart of ours adopts, kills and lists nothing of theirs
    mine.stop()
    again = make_core(settings)
    assert again.info()["orphan_panes"] == [] and idle(other, theirs)


@pytest.mark.sqlite_only("a copy of the database file in another home")
def test_35b_a_copy_of_another_homes_database_reaches_none_of_its_panes(
    make_core: Callable[..., Cao], settings, tmp_path
):
    """Another home's cao.db copied and served by a second cao-server on the same tmux server: its
    rows name the first server's panes exactly (server pid, pane id, pane pid), so the pane's
    @cao_home tag is part of every identity check: not adopted, not pasted into, not killed."""
    theirs = make_core(settings)
    tid = new_terminal(theirs)
    copy_home = tmp_path / "copy-home"
    copy_home.mkdir()
    _backup(settings.db_path, copy_home / "cao.db")
    mine = make_core(settings.with_(home=copy_home))
    row = mine.store.get_terminal(tid, include_deleted=True)
    assert row.state == "gone" and "another cao home" in (row.gone_reason or "")
    with pytest.raises(NotFound):
        mine.send_message(tid, "never to the other home's agent", sender_id="s")
    mine.delete_terminal(tid)
    assert idle(theirs, tid) and read_records(settings.home, tid) == []
    from cao.tmux import PaneRef

    forged = PaneRef(row.tmux_server_pid or 0, row.pane_id or "", row.pane_pid or 0, mine.panes.home_tag)
    with pytest.raises(PaneGone, match="another cao home"):
        mine.tmux.paste_checked(forged, "forged")
    assert idle(theirs, tid) and read_records(settings.home, tid) == []


# -- 36: the database deleted or replaced under a running server ------------------------------------
# (A `cp older.db cao.db` over the live file is not among them: under SQLite's write-ahead log the
# copy mixes with pages the log still holds, which neither SQLite nor cao can tell; docs say so.)
def _restore(older, live) -> None:
    import sqlite3

    with sqlite3.connect(older) as src, sqlite3.connect(live) as dst:
        src.backup(dst)


def _pending_receipt(client: TestClient, tid: str, body: str):
    return client.post(f"/terminals/{tid}/inbox/messages", json={"message": body, "sender_id": "s"})


@pytest.mark.sqlite_only("the database file deleted under the server")
def test_36_a_deleted_database_refuses_writes_and_its_agents_survive_the_restart(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings)
    tid = new_terminal(core)
    pane = _pane(core, tid)
    with TestClient(create_app(core)) as client:
        assert _pending_receipt(client, tid, "before").status_code == 201
        for suffix in ("", "-wal", "-shm"):
            settings.db_path.with_name(settings.db_path.name + suffix).unlink(missing_ok=True)
        r = _pending_receipt(client, tid, "after the delete")
        assert r.status_code == 503 and "was deleted" in r.json()["detail"], r.text
        assert "nothing was written" in r.json()["detail"]
        assert client.post("/sessions", json={}).status_code == 503  # no create either
        assert client.get("/health").status_code == 503
        assert "was deleted" in client.get("/info").json()["store"]
    core.stop()
    restarted = make_core(settings)  # a new, empty database: the agent has no row there
    orphans = restarted.info()["orphan_panes"]
    assert [(o["pane_id"], o["terminal_id"]) for o in orphans] == [(pane, tid)]
    assert restarted.tmux.run("display-message", "-p", "-t", pane, "#{pane_dead}").strip() == "0"  # alive


@pytest.mark.sqlite_only("the database file replaced by an older copy")
@pytest.mark.parametrize("how", ["renamed over", "restored in place"])
def test_36b_a_database_replaced_by_an_older_copy_is_noticed_before_any_receipt(
    make_core: Callable[..., Cao], settings, how: str
):
    import sqlite3

    core = make_core(settings)
    tid = new_terminal(core)
    older = settings.home / "older.db"
    with sqlite3.connect(settings.db_path) as src, sqlite3.connect(older) as dst:
        src.backup(dst)  # a consistent older copy
    with TestClient(create_app(core)) as client:
        for n in range(3):
            assert _pending_receipt(client, tid, f"after the copy {n}").status_code == 201
        if how == "renamed over":  # mv older.db cao.db
            older.replace(settings.db_path)
        else:  # sqlite3 cao.db ".restore older.db": the same file, its content rewound
            _restore(older, settings.db_path)
        r = _pending_receipt(client, tid, "after the swap")
        assert r.status_code == 503 and "nothing was written" in r.json()["detail"], r.text
        assert ("replaced" if how == "renamed over" else "older copy") in r.json()["detail"], r.text
        assert _pending_receipt(client, tid, "and again").status_code == 503  # for good
    assert core.store.gone is not None


@pytest.mark.sqlite_only("the database file rewound in place")
def test_36c_housekeeping_notices_a_rewound_database_without_a_send(make_core: Callable[..., Cao], settings):
    import sqlite3

    core = make_core(settings.with_(log_cap_interval=0.05, sweep_interval=0.5))
    tid = new_terminal(core)
    older = settings.home / "older.db"
    with sqlite3.connect(settings.db_path) as src, sqlite3.connect(older) as dst:
        src.backup(dst)
    mid = core.send_message(tid, "one", sender_id="s").message.id
    wait_until(lambda: status_of(core, mid or 0) == "delivered")
    _restore(older, settings.db_path)
    wait_until(lambda: core.store.gone is not None, timeout=5, what="the rewind noticed")
    assert "older copy" in (core.store.gone or "")


# -- 6: no 500s -------------------------------------------------------------------------------------
def test_deleting_a_terminal_whose_pane_was_closed_behind_caos_back_is_no_500(core: Cao):
    tid = new_terminal(core)
    core.tmux.run("kill-pane", "-t", _pane(core, tid))
    with TestClient(create_app(core)) as client:
        r = client.delete(f"/terminals/{tid}")
        assert r.status_code == 200, r.text
        exit_gone = client.post(f"/terminals/{new_terminal(core)}/exit")
        assert exit_gone.status_code == 200
        tid2 = new_terminal(core)
        core.tmux.run("kill-pane", "-t", _pane(core, tid2))
        r = client.post(f"/terminals/{tid2}/exit")  # nothing to exit: not "confirmed"
        assert r.status_code == 410 and "no longer exists" in r.json()["detail"], r.text


def test_bad_knobs_of_small_routes_are_clear_4xx(core: Cao):
    tid = new_terminal(core)
    with TestClient(create_app(core)) as client:
        r = client.get("/events", params={"keepalive": "nan"})
        assert r.status_code == 422 and "keepalive" in r.json()["detail"], r.text
        big = "x" * (256 * 1024 + 1)
        r = client.post(f"/terminals/{tid}/input", json={"message": big})
        assert r.status_code == 413 and "nothing was typed" in r.json()["detail"]
        assert client.post(f"/terminals/{tid}/input", json={"message": "x" * 256 * 1024}).status_code == 200
    settle(core, tid)
    assert len(read_records(core.settings.home, tid)[0]["text"]) == 256 * 1024


def test_a_deleted_terminals_pane_log_goes_with_it(core: Cao):
    tid = new_terminal(core)
    log = core.logs.path(tid)
    assert log.exists()
    core.delete_terminal(tid)
    assert not log.exists() and not (core.settings.home / "terminals" / tid).exists()


# -- a full disk: 507 "nothing written", and the pane log pipes come back ---------------------------
@pytest.fixture
def small_fs(tmp_path):
    """A 6 MB tmpfs to fill up (mounting needs root; elsewhere these tests skip, saying so)."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill up needs root")
    where = tmp_path / "small"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where):
    """Fill the filesystem to the last byte; returns the filler's path (delete it to free space)."""
    import os

    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.sqlite_only("the disk under the database file full")
def test_a_full_disk_is_507_nothing_written_and_the_same_request_works_after(
    make_core: Callable[..., Cao], settings, small_fs
):
    core = make_core(settings.with_(home=small_fs / "cao"))
    tid = new_terminal(core)
    with TestClient(create_app(core)) as client:
        filler = _fill(small_fs)
        before = core.store.counts_by_status()
        for _ in range(5):
            r = _pending_receipt(client, tid, "x" * 200_000)
            assert r.status_code == 507 and "nothing was written" in r.json()["detail"], r.text
        r = client.post("/sessions", json={"provider": "scripted"})
        assert r.status_code == 507 and "full" in r.json()["detail"], r.text
        assert core.store.counts_by_status() == before  # nothing half-written
        assert len(core.store.list_terminals()) == 1
        assert client.post(f"/terminals/{tid}/input", json={"message": "a turn"}).status_code == 200
        wait_until(
            lambda: client.get(f"/terminals/{tid}").json().get("status") == "completed",
            what=client.get(f"/terminals/{tid}").text,
        )
        for route in ("/terminals", f"/terminals/{tid}", "/info", "/messages"):  # the operator can look
            assert client.get(route).status_code == 200, route
        filler.unlink()
        r = _pending_receipt(client, tid, "after the disk had room again")
        assert r.status_code == 201, r.text
        wait_until(lambda: status_of(core, r.json()["message_id"]) == "delivered")


def test_pane_log_pipes_closed_by_a_full_disk_are_reopened(make_core: Callable[..., Cao], settings, small_fs):
    core = make_core(settings.with_(home=small_fs / "cao", scripted_record=False, pipe_check_interval=1000))
    tid = new_terminal(core)
    pane = _pane(core, tid)

    def piped() -> bool:
        return core.tmux.run("display-message", "-p", "-t", pane, "#{pane_pipe}").strip() == "1"

    filler = _fill(small_fs)

    def output_until_closed() -> bool:  # the log's last page may take a little: print more
        core.send_input(tid, "make some output " * 500)
        return wait_until(lambda: not piped(), timeout=2, what="") if piped() else True

    wait_until(  # the pipe's `cat` fails to write and exits
        lambda: _try(output_until_closed), timeout=20, interval=0.1, what="the pipe closed by the full disk"
    )
    filler.unlink()
    assert core.lifecycle.restore_pipes() == [tid] and piped()
    assert core.lifecycle.restore_pipes() == []  # an open pipe is left alone (pipe-pane would close it)
    log = core.logs.path(tid)
    size = log.stat().st_size
    core.send_input(tid, "more output after the disk had room")
    wait_until(lambda: log.stat().st_size > size, timeout=10, what="new output in the pane log")


def _try(fn) -> bool:
    try:
        return bool(fn())
    except AssertionError:
        return False


def test_housekeeping_reopens_a_closed_pane_log_pipe(make_core: Callable[..., Cao], settings):
    core = make_core(settings.with_(pipe_check_interval=0.1, log_cap_interval=0.05))
    tid = new_terminal(core)
    pane = _pane(core, tid)
    core.tmux.run("pipe-pane", "-t", pane)  # closes it (as a `cat` that died would)
    assert core.tmux.run("display-message", "-p", "-t", pane, "#{pane_pipe}").strip() == "0"
    wait_until(
        lambda: core.tmux.run("display-message", "-p", "-t", pane, "#{pane_pipe}").strip() == "1",
        timeout=5,
        what="the pipe reopened by housekeeping",
    )


def test_the_rewind_check_never_fires_on_sends_committed_during_it(tmp_path):
    """The housekeeping check raced concurrent sends (a CI run of 10,000 messages was stopped by it):
    the high-water mark must be read before the snapshot it is compared with."""
    import time as _time

    from cao.store import Store, Terminal

    store = Store(tmp_path / "cao.db")
    now = _time.time()
    store.add_terminal(
        Terminal(
            id="abcd1234",
            name="w",
            session_name="cao-s",
            provider="scripted",
            agent_profile="developer",
            working_directory=str(tmp_path),
            state="live",
            status="idle",
            created_at=now,
            last_active=now,
        )
    )
    stop = threading.Event()
    seen: list[BaseException] = []

    def verify() -> None:
        while not stop.is_set():
            try:
                store.verify()
            except BaseException as exc:
                seen.append(exc)
                return

    def send(k: int) -> None:
        for i in range(300):
            store.add_message(sender_id=f"s{k}", receiver_id="abcd1234", body=f"m{k}-{i}")

    checker = threading.Thread(target=verify)
    checker.start()
    senders = [threading.Thread(target=send, args=(k,)) for k in range(4)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop.set()
    checker.join()
    assert seen == [] and store.gone is None
    store.close()


@pytest.mark.sqlite_only("the database file rewound in place")
def test_36d_a_restore_that_only_rewinds_states_is_noticed_too(make_core: Callable[..., Cao], settings):
    """An older copy restored in place with no message sent since it was taken: the ids don't go
    back, but the write count does (a message cancelled after the copy came back 'pending')."""
    core = make_core(settings)
    tid = new_terminal(core)
    _enter_mode(core, tid, "copy-mode")  # holds the mail
    mid = core.send_message(tid, "held", sender_id="s").message.id or 0
    older = settings.home / "older.db"
    _backup(settings.db_path, older)
    core.cancel_message(mid)
    _restore(older, settings.db_path)
    with TestClient(create_app(core)) as client:
        r = client.post(f"/messages/{mid}/cancel")
        assert r.status_code == 503 and "older copy" in r.json()["detail"], r.text
    assert core.store.gone is not None


@pytest.mark.sqlite_only("the database file's write-ahead log deleted")
def test_36e_a_deleted_write_ahead_log_stops_writes_before_a_crash_could_lose_them(
    make_core: Callable[..., Cao], settings
):
    core = make_core(settings)
    tid = new_terminal(core)
    wal = settings.db_path.with_name(settings.db_path.name + "-wal")
    assert wal.exists()
    wal.unlink()
    with TestClient(create_app(core)) as client:
        r = _pending_receipt(client, tid, "after the log went")
        assert r.status_code == 503 and "write-ahead log" in r.json()["detail"], r.text
        assert client.get("/health").status_code == 503


def _backup(live, copy) -> None:
    import sqlite3

    with sqlite3.connect(live) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)


def test_34c_typed_input_never_joins_a_persons_text_that_runs_past_the_box(
    make_core: Callable[..., Cao], settings
):
    """A person's line longer than the pane is wide: the box can't be read (the wrapped tail is
    the last line), and typed input used to treat "no box" as "empty box"."""
    core = make_core(settings.with_(input_wait_timeout=0.5, pane_width=60))
    tid = new_terminal(core)
    core.tmux.send_keys(_pane(core, tid), "PERSON-" + "x" * 90 + "-END", literal=True)
    term = core.store.get_terminal(tid)
    wait_until(lambda: "-END" in core.panes.screen(term))
    with pytest.raises(BoxOccupied, match="can't be proven empty"):
        core.send_input(tid, "from the api")
    assert read_records(core.settings.home, tid) == []


@pytest.mark.parametrize("leaves", [True, False], ids=["mode-ends", "mode-stays"])
def test_33e_a_mode_between_typed_inputs_paste_and_its_enter(
    make_core: Callable[..., Cao], settings, monkeypatch: pytest.MonkeyPatch, leaves: bool
):
    """Every real CLI's provider presses Enter a moment after the paste: a person who starts
    scrolling in between holds that Enter back. Typed input presses it once the mode ends (within
    its wait), else says the text sits unsubmitted in the box (it said 'confirmed: false')."""
    from providers.scripted import ScriptedProvider

    monkeypatch.setattr(ScriptedProvider, "paste_enter_delay", 0.6)
    core = make_core(settings.with_(input_wait_timeout=2.0))
    tid = new_terminal(core)
    term = core.store.get_terminal(tid)

    def person() -> None:
        wait_until(
            lambda: (
                "typed then scrolled" in (core.panes.provider(term).input_text(core.panes.screen(term)) or "")
            ),
            timeout=5,
        )
        _enter_mode(core, tid, "copy-mode")
        if leaves:
            threading.Timer(0.8, _leave_mode, (core, tid)).start()

    watcher = threading.Thread(target=person)
    watcher.start()
    if leaves:
        assert core.send_input(tid, "typed then scrolled") is True
        watcher.join()
        settle(core, tid)
        assert [r["text"] for r in read_records(core.settings.home, tid)] == ["typed then scrolled"]
    else:
        with pytest.raises(PaneInMode, match="not submitted") as held:
            core.send_input(tid, "typed then scrolled")
        watcher.join()
        assert held.value.typed and read_records(core.settings.home, tid) == []
        _leave_mode(core, tid)


def test_33f_input_turned_off_holds_the_mail_instead_of_failing_it(core: Cao):
    """`select-pane -d`: the pane ignores input, so every submit went unconfirmed and the message
    failed after its attempts; now it waits with the reason until input is back on."""
    tid = new_terminal(core)
    core.tmux.run("select-pane", "-d", "-t", _pane(core, tid))
    mid = core.send_message(tid, "while input is off", sender_id="s").message.id or 0
    wait_until(
        lambda: (
            core.store.get_message(mid).waiting_reason == "input to this pane is turned off "
            "(tmux select-pane -d)"
        ),
        what="the reason shown",
    )
    assert core.store.get_message(mid).attempts == 0
    with pytest.raises(PaneInMode, match="select-pane -e"):
        core.send_key(tid, "Enter")
    core.tmux.run("select-pane", "-e", "-t", _pane(core, tid))
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10)


def test_33g_synchronize_panes_never_mirrors_caos_keys_into_a_persons_pane(core: Cao, tmp_path):
    """A person splits the agent's window, half-types a command in their own pane and turns on
    synchronize-panes: the delivery's Enter used to run their command too."""
    tid = new_terminal(core)
    pane = _pane(core, tid)
    witness = tmp_path / "ran"
    theirs = core.tmux.run("split-window", "-d", "-P", "-F", "#{pane_id}", "-t", pane, "sh").strip()
    core.tmux.run("send-keys", "-t", theirs, "-l", f"touch {witness}")
    core.tmux.run("set-option", "-w", "-t", pane, "synchronize-panes", "on")
    mid = core.send_message(tid, "while synchronized", sender_id="s").message.id or 0
    wait_until(lambda: "synchronize-panes" in (core.store.get_message(mid).waiting_reason or ""))
    assert not witness.exists() and read_records(core.settings.home, tid) == []
    core.tmux.run("set-option", "-w", "-t", pane, "synchronize-panes", "off")
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10)
    assert not witness.exists()  # their half-typed command never got an Enter
    core.tmux.run("kill-pane", "-t", theirs)


def test_a_pane_log_deleted_under_a_running_agent_is_opened_anew(make_core: Callable[..., Cao], settings):
    """`rm logs/terminal/<id>.log`: the pipe goes on writing into the unlinked file (the watchdog
    trigger and the live view went dead, and the log cap couldn't reach it)."""
    core = make_core(settings.with_(pipe_check_interval=0.1, log_cap_interval=0.05))
    tid = new_terminal(core)
    log = core.logs.path(tid)
    log.unlink()
    wait_until(log.exists, timeout=5, what="a new pane log")
    core.send_input(tid, "output after the log was deleted")
    wait_until(lambda: "output after" in log.read_text(errors="replace"), timeout=5, what="it is written")


# -- operator mistakes on the files under CAO_HOME --------------------------------------------------
def test_a_deleted_server_lock_does_not_let_a_second_server_onto_the_home(make_server, tmp_path):
    import subprocess
    import sys

    from tests.helpers import server_env

    first = make_server()
    (first.home / "server.lock").unlink()
    env = server_env(first.home, first.socket_name, 0)
    second = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert second.returncode != 0 and "already using" in second.stderr, second.stderr
    assert f"pid {first.proc.pid}" in second.stderr or "pid ?" in second.stderr
    assert json.loads((first.home / "server.json").read_text())["pid"] == first.proc.pid


@pytest.mark.parametrize("name", ["hook-secret", "server.json", "api-token"])
def test_a_file_under_cao_home_that_is_a_directory_is_a_clear_message(tmp_path, name: str):
    import subprocess
    import sys

    from tests.helpers import free_port, server_env

    home = tmp_path / "cao"
    (home / name).mkdir(parents=True)
    env = server_env(home, "cao-test-dirs-unused", free_port(), CAO_API_TOKEN="t" * 32)
    done = subprocess.run(
        [sys.executable, "-m", "cao.server"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "is a directory" in done.stderr and name in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_empty_or_short_hook_secret_is_made_anew(tmp_path):
    from cao.hookstate import load_secret

    home = tmp_path / "cao"
    home.mkdir()
    (home / "hook-secret").write_bytes(b"")
    first = load_secret(home)
    assert len(first) >= 32 and (home / "hook-secret").read_bytes().strip() == first
    (home / "hook-secret").write_bytes(b"abc")
    second = load_secret(home)
    assert len(second) >= 32 and second != b"abc"
    (home / "hook-secret").chmod(0o644)
    assert load_secret(home) == second and (home / "hook-secret").stat().st_mode & 0o777 == 0o600


def test_a_removed_tmux_socket_loses_no_agent(core: Cao):
    """A /tmp cleaner (systemd-tmpfiles, tmpreaper) or an `rm` removes the tmux server's socket
    while the server and its agents run on: tmux then answers "no server running", and every
    agent was taken for gone for good, its mail failed, while it went on running untracked. The
    server is asked to recreate its socket (SIGUSR1, as tmux(1) says) and nothing is lost. On the
    control client nothing forks, so no command fails: housekeeping looks for the file."""
    import os

    tid = new_terminal(core)
    socket = core.tmux.run("display-message", "-p", "#{socket_path}").strip()
    os.unlink(socket)
    mid = core.send_message(tid, "after the socket went", sender_id="s").message.id or 0
    wait_until(lambda: status_of(core, mid) == "delivered", timeout=10, what="the message delivered")
    wait_until(lambda: os.path.exists(socket), timeout=10, what="the socket file recreated")
    assert core.store.get_terminal(tid).state == "live"
    settle(core, tid)
    assert [m["body"] for r in read_records(core.settings.home, tid) for m in r["messages"]] == [
        "after the socket went"
    ]


def test_an_api_token_or_hook_secret_deleted_or_changed_under_the_server_is_written_again(
    make_server, tmp_path
):
    """The agents (their MCP servers, the scripted agent) and `cao` read the token from
    $CAO_HOME/api-token: deleted or overwritten under a running server, every agent's call to cao
    was a 401 (no message between agents, no handoff) until a restart; a deleted hook-secret made
    the next start refuse every running agent's hook reports."""
    from tests.helpers import write_rules

    home = tmp_path / "cao"
    relay = {"match": r"^relay (?P<to>[0-9a-f]{8}) (?P<m>.+)$", "reply": "relayed"}
    write_rules(
        home, "relay", {"record": True, "rules": [{**relay, "send": [{"to": "{to}", "message": "{m}"}]}]}
    )
    token = "t" * 32
    srv = make_server(CAO_API_TOKEN=token, CAO_SCRIPTED_RECORD="1", CAO_PIPE_CHECK_INTERVAL="0.2")
    auth = {"Authorization": f"Bearer {token}"}
    with srv.client() as c:
        a = c.post("/sessions", json={"provider": "scripted", "agent_profile": "relay"}, headers=auth).json()
        b = c.post("/sessions", json={"provider": "scripted"}, headers=auth).json()
        for t in (a, b):
            wait_until(
                lambda t=t: c.get(f"/terminals/{t['id']}", headers=auth).json()["status"] == "idle",
                timeout=20,
            )
        secret = (home / "hook-secret").read_bytes()
        for damage in ("deleted", "changed"):
            if damage == "deleted":
                (home / "api-token").unlink()
                (home / "hook-secret").unlink()
            else:
                (home / "api-token").write_text("x" * 32 + "\n")
                (home / "hook-secret").write_bytes(b"y" * 64)
            wait_until(
                lambda: (home / "api-token").exists() and (home / "api-token").read_text().strip() == token,
                timeout=5,
                what="the token written again",
            )
            assert (home / "api-token").stat().st_mode & 0o777 == 0o600
            assert (home / "hook-secret").read_bytes() == secret
            body = f"relay {b['id']} after the token was {damage}"
            sent = c.post(
                f"/terminals/{a['id']}/inbox/messages",
                json={"sender_id": "op", "message": body},
                headers=auth,
            )
            assert sent.status_code == 201
            wait_until(
                lambda damage=damage: f"after the token was {damage}" in str(read_records(home, b["id"])),
                timeout=10,
                what="the agent's own send reached the other agent",
            )


def test_a_read_only_home_is_a_clear_503_not_a_500(make_core: Callable[..., Cao], settings, tmp_path):
    """`CAO_HOME` remounted read-only (or, for a user, `chmod -w`) under a running server: a create
    crashed with a 500 "internal error"; now it names the file, and nothing is half-made."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    core = make_core(settings)
    tid = new_terminal(core)
    home = str(settings.home)
    if subprocess.run(["mount", "--bind", home, home], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", home], check=True, capture_output=True)
        with TestClient(create_app(core)) as client:
            r = client.post("/sessions", json={"provider": "scripted"})
            assert r.status_code == 503 and "Read-only file system" in r.json()["detail"], r.text
            assert "nothing was written" in r.json()["detail"]
        assert [t.id for t in core.store.list_terminals()] == [tid]
    finally:
        # a file still open under it (the server's) makes a plain umount fail: detach it lazily
        # then, so no read-only mount outlives the test (it broke pytest's cleanup of old temp dirs)
        if subprocess.run(["umount", home], check=False, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", home], check=False, capture_output=True)


def test_one_new_session_created_by_many_at_once_is_made_once(core: Cao):
    """Six creates of the same new session at once (six `cao launch --session x`, six POST
    /sessions): each saw it missing, and four or five 'succeeded' into one session while the
    rest failed with tmux's raw "duplicate session". One is made; the others are told it exists."""
    from cao.errors import InvalidInput

    made: list[str] = []
    refused: list[BaseException] = []
    start = threading.Barrier(6)

    def create() -> None:
        start.wait(5)
        try:
            made.append(core.lifecycle.create(provider="scripted", session_name="race").id)
        except Exception as exc:  # every other outcome is reported below
            refused.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 1, (made, refused)
    assert len(refused) == 5 and all(isinstance(e, InvalidInput) for e in refused), refused
    assert all("already exists" in str(e) for e in refused)
    assert [t.id for t in core.store.list_terminals(session_name="cao-race")] == made
