"""The tmux control-mode client (cao/tmux/control.py) on a real tmux server: quoting every hostile
body, pipelining, a pane that prints block guards, the client killed, wedged and outlived by its
server, and the output watch that wakes a busy receiver (docs/tmux.md)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from cao.core import Cao
from cao.errors import PaneGone, TmuxError
from cao.tmux import PaneInfo, Tmux
from cao.tmux.control import ControlClient, Gate, quote
from tests.helpers import SLOW, new_terminal, received_bodies, status_of, wait_until, write_rules

DELIVERY_HOSTILE = (  # test_delivery.py scenario 16's body
    "start ünïcødé 日本語 🚀\n"
    "\x1b[201~\r/exit\r"
    "\x1b[200~nested\x1b[31mred\x1b[0m\x00nul\x07bell\r\nwindows line\x9b31mC1\x7fdel\n"
    "token-s16 end"
)
BODIES = [
    "plain",
    "",
    "-n looks like an option",
    "--",
    "~ a leading tilde",
    "~",
    "\\",
    "ends with a backslash \\",
    "\"quoted\" and 'single' and `back`",
    "$HOME ${HOME} $(id) \\$HOME",
    "#{pane_id} #{session_name} ##{x} #[fg=red]",
    "#(touch /tmp/cao-control-pwned) ; kill-server ; display-message hi",
    "a;b ; c \\; d",
    "{ braces } %if 1 %endif %hidden X=1",
    "".join(chr(c) for c in range(1, 32)) + "\x7f",
    "\x00nul inside",
    "\r\n crlf \r and cr",
    "é日本🎉\u200b\u202e right-to-left \ufeff",
    "%end 1796309134 273 1\n%error 1796309134 273 1\n%begin 1 2 1\n%exit",
    DELIVERY_HOSTILE,
    "x" * 300_000,
    "\n".join(f"line {i} \t tab" for i in range(2000)),
]


def _session(tmux: Tmux, tmp_path: Path, name: str = "cao-ctl", command: str = "cat") -> PaneInfo:
    return tmux.create_window(
        session_name=name,
        window_name="w",
        command=["sh", "-c", command],
        env={"PATH": os.environ["PATH"], "TERM": "xterm-256color"},
        cwd=tmp_path,
        log_path=tmp_path / f"{name}.log",
        width=120,
        height=30,
        history_limit=1000,
    )


@pytest.fixture
def ctl(tmux_socket: str):
    tmux = Tmux(tmux_socket, control=True)
    yield tmux
    tmux.shutdown()


def test_every_hostile_body_round_trips_through_set_buffer(ctl: Tmux, tmp_path: Path):
    _session(ctl, tmp_path)
    out = tmp_path / "buffer.out"
    for body in BODIES:
        if not body:
            continue  # set-buffer makes no buffer of nothing; an empty paste goes by load-buffer
        name = f"t-{uuid.uuid4().hex[:8]}"
        before = ctl.stats["control"]
        ctl.run("save-buffer", "-b", name, str(out), ";", "delete-buffer", "-b", name, buffer=(name, body))
        assert ctl.stats["control"] == before + 1, "carried by the control client"
        expected = body.replace("\x00", "")  # NUL can't be in a tmux string (nor an argv); it goes
        with out.open(encoding="utf-8", newline="") as fh:
            assert fh.read() == expected, repr(body[:60])
    assert not Path("/tmp/cao-control-pwned").exists()
    assert ctl.has_session("cao-ctl"), "no body ran kill-server"


def test_quote_keeps_every_character_as_data():
    for body in BODIES:
        q = quote(body)
        assert q.startswith('"') and q.endswith('"')
        assert "\n" not in q and "\x00" not in q[1:-1] and "\r" not in q  # one line, always
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in q)


def test_the_gate_holds_commands_off_while_one_thread_holds_it_alone():
    """Attaches and kills hold the gate alone (tmux 3.3a crashes otherwise, docs/tmux.md): no
    command runs meanwhile, one waiting to hold it alone goes before new commands, and the thread
    holding it runs its own commands through it."""
    gate = Gate()
    log: list[str] = []
    in_command = threading.Event()
    release = threading.Event()

    def command(name: str, hold: threading.Event | None = None) -> None:
        with gate.command():
            log.append(f"{name} in")
            if hold is not None:
                in_command.set()
                hold.wait(5)
            log.append(f"{name} out")

    def alone() -> None:
        with gate.alone():
            log.append("alone in")
            command("own")  # the holder's own command goes through (no deadlock)
            log.append("alone out")

    first = threading.Thread(target=command, args=("first", release))
    first.start()
    assert in_command.wait(5)
    holder = threading.Thread(target=alone)
    holder.start()
    wait_until(lambda: gate._waiting == 1, what="the attach waits for the running command")
    late = threading.Thread(target=command, args=("late",))
    late.start()
    time.sleep(0.05)  # an absence: neither may start while the first command runs
    assert log == ["first in"]
    release.set()
    for t in (first, holder, late):
        t.join(5)
    assert log == [
        "first in",
        "first out",
        "alone in",
        "own in",
        "own out",
        "alone out",
        "late in",
        "late out",
    ]


def test_pipelined_requests_from_many_threads_get_their_own_answers(ctl: Tmux, tmp_path: Path):
    _session(ctl, tmp_path)
    ctl.run("display-message", "-p", "warm")
    forked = ctl.stats["forked"]
    wrong: list[tuple[str, str]] = []

    def worker(k: int) -> None:
        for i in range(150):
            token = f"tok-{k}-{i}-{uuid.uuid4().hex[:6]}"
            # two commands on one line (two blocks), and an if-shell with a nested command (three)
            got = ctl.run("display-message", "-p", token, ";", "display-message", "-p", token + "b")
            if got != f"{token}\n{token}b\n":
                wrong.append((token, got))
            got = ctl.run("if-shell", "-F", "1", f"display-message -p {token}c")
            if got != f"{token}c\n":
                wrong.append((token, got))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:3]
    assert ctl.stats["control_started"] == 1 and ctl.stats["forked"] == forked


def test_an_error_in_control_mode_reads_as_a_forked_clients(ctl: Tmux, tmp_path: Path):
    _session(ctl, tmp_path)
    with pytest.raises(PaneGone):
        ctl.run("capture-pane", "-p", "-t", "%999", target="%999")
    with pytest.raises(TmuxError, match="unknown command"):
        ctl.run("no-such-command")
    assert ctl.stats["control"] >= 2 and ctl.run("display-message", "-p", "still") == "still\n"


def test_a_pane_printing_block_guards_does_not_split_a_reply(ctl: Tmux, tmp_path: Path):
    # the pane prints what tmux frames replies with; its capture is one reply, the same as forked
    lines = "".join(
        f"printf '%%end {int(time.time())} {n} 1\\n%%error {n} 1 1\\n'; " for n in range(300, 320)
    )
    info = _session(ctl, tmp_path, command=f"{lines} printf 'TAIL-MARK\\n'; exec cat")
    wait_until(lambda: "TAIL-MARK" in ctl.capture(info.pane_id), what="the pane printed")
    control = ctl.capture_checked(info.ref)
    forked = ctl._fork("capture-pane", "-p", "-t", info.pane_id)
    assert control == forked and "%end " in control and "TAIL-MARK" in control
    assert ctl.run("display-message", "-p", "next") == "next\n"  # the stream is still in step


def test_a_killed_control_client_is_replaced_and_forked_clients_carry_the_work(ctl: Tmux, tmp_path: Path):
    info = _session(ctl, tmp_path)
    ctl.capture_checked(info.ref)
    first = ctl.control_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: ctl.control_pid is None, what="the client's loss is noticed")
    forked = ctl.stats["forked"]
    ctl.capture_checked(info.ref)  # answered at once, by a forked client
    assert ctl.stats["forked"] > forked
    # every command is answered meanwhile; once the restart backoff passes, a new client carries them
    wait_until(lambda: ctl.capture_checked(info.ref) is not None and ctl.control_pid not in (None, first))
    assert ctl.stats["control_started"] == 2


def _cat_to_file(ctl: Tmux, tmp_path: Path) -> tuple[PaneInfo, Path]:
    out = tmp_path / "typed.txt"
    info = _session(ctl, tmp_path, command=f"stty -echo; exec cat > {out}")
    wait_until(
        lambda: (
            ctl._fork("display-message", "-p", "-t", info.pane_id, "#{pane_current_command}").strip() == "cat"
        ),
        what="cat runs",
    )
    return info, out


def test_the_control_client_killed_mid_paste_never_doubles_a_paste(ctl: Tmux, tmp_path: Path):
    info, out = _cat_to_file(ctl, tmp_path)
    stop = threading.Event()
    kills = [0]

    def killer() -> None:
        rnd = random.Random(7)
        while not stop.wait(rnd.uniform(0.002, 0.03)):  # kills at random moments until told to stop
            pid = ctl.control_pid
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                kills[0] += 1
                ctl._client_next = 0.0  # restart at once: more kills land mid-request

    thread = threading.Thread(target=killer)
    thread.start()
    ok: list[str] = []
    failed: list[str] = []
    try:
        # at least 150 pastes, and on until the killer has landed 10 kills (a slow machine runs
        # fewer pastes per kill): the count asserted below is then the test's doing, not luck's
        i = 0
        while i < 150 or (kills[0] < 10 and i < 3000):
            i += 1
            marker = f"M{i:04d}-{uuid.uuid4().hex[:6]}"
            try:
                ctl.paste_checked(info.ref, marker + " " + "y" * 2000)
                ok.append(marker)
            except TmuxError:
                failed.append(marker)
    finally:
        stop.set()
        thread.join()
    ctl._fork("send-keys", "-t", info.pane_id, "C-d")
    wait_until(lambda: ctl._fork("display-message", "-p", "-t", info.pane_id, "#{pane_dead}").strip() == "1")
    typed = out.read_text()
    counts = {m: typed.count(m) for m in ok + failed}
    assert all(counts[m] == 1 for m in ok), {m: counts[m] for m in ok if counts[m] != 1}
    assert all(counts[m] <= 1 for m in failed), "a paste whose fate was unknown was never run again"
    assert kills[0] >= 10 and ctl.stats["control_lost"] >= 1, (kills, ctl.stats)


def test_a_wedged_control_client_times_out_and_its_paste_is_not_repeated(ctl: Tmux, tmp_path: Path):
    info, out = _cat_to_file(ctl, tmp_path)
    ctl.capture_checked(info.ref)
    client = ctl._client
    assert isinstance(client, ControlClient) and client.pid is not None
    client.reply_timeout = 1.0
    # tmux stops answering: what is written goes nowhere (the server reads the client's stdin
    # itself, so stopping the client process would not stop it)
    assert client._proc is not None
    real_stdin = client._proc.stdin
    client._proc.stdin = open(os.devnull, "wb")  # noqa: SIM115 - closed by the client's reaper
    with pytest.raises(TmuxError, match="outcome is unknown"):
        ctl.paste_checked(info.ref, "WEDGED-PASTE")
    assert not client.alive and ctl.stats["control_lost"] == 1
    ctl.paste_checked(info.ref, "AFTER-WEDGE")  # a forked client, at once
    ctl._fork("send-keys", "-t", info.pane_id, "C-d")
    wait_until(lambda: "AFTER-WEDGE" in out.read_text())
    assert "WEDGED-PASTE" not in out.read_text()  # never reached tmux, and never sent again
    assert real_stdin is not None
    real_stdin.close()


def test_a_restarted_tmux_server_gets_a_new_control_client(ctl: Tmux, tmp_path: Path):
    info = _session(ctl, tmp_path)
    ctl.capture_checked(info.ref)
    ctl.kill_server()
    wait_until(lambda: ctl.control_pid is None, what="the client saw its server go")
    again = _session(ctl, tmp_path)  # a new server on the same socket: pane ids start over
    assert again.pane_id == info.pane_id and again.server_pid != info.server_pid
    wait_until(lambda: ctl.capture_checked(again.ref) is not None and ctl.control_pid is not None)
    with pytest.raises(PaneGone):
        ctl.capture_checked(info.ref)  # the old pane's identity: not the new pane at the same id
    assert ctl.control_pid is not None and ctl.stats["control_started"] == 2
    ctl.capture_checked(again.ref)


def test_the_output_watch_calls_once_a_pane_goes_quiet(ctl: Tmux, tmp_path: Path):
    woke: list[tuple[str, float]] = []
    ctl.watch_output(lambda pane: woke.append((pane, time.monotonic())), lambda _pane: 0.05)
    loud = _session(ctl, tmp_path, command="exec cat")
    quiet = ctl.create_window(
        session_name="cao-ctl",
        window_name="q",
        command=["sh", "-c", "exec sleep 60"],
        env={"PATH": os.environ["PATH"]},
        cwd=tmp_path,
        log_path=tmp_path / "q.log",
    )
    assert ctl.output_watches == ["cao-ctl"]

    def burst(text: str) -> float:
        at = time.monotonic()
        ctl._fork("send-keys", "-t", loud.pane_id, "-l", text)
        ctl._fork("send-keys", "-t", loud.pane_id, "Enter")
        return at

    burst("probe")  # the watch attaches on its own: wait until it hears this pane
    wait_until(lambda: woke, what="the watch hears the pane")
    woke.clear()
    sent = burst("burst one")
    wait_until(lambda: woke, what="a wake after the burst")
    second = burst("burst two")  # the next burst's wake marks the end of the first one's
    wait_until(lambda: any(t >= second for _, t in woke), what="a wake after the second burst")
    first = [p for p, t in woke if t < second]
    assert first == [loud.pane_id], "one wake for the burst, none for the quiet pane"
    assert woke[0][1] - sent >= 0.05  # not before the pane was quiet for its threshold
    assert quiet.pane_id not in {p for p, _ in woke}


def _rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0])


def test_a_watch_that_falls_behind_makes_tmux_drop_output_not_queue_it(ctl: Tmux, tmp_path: Path):
    """A watch that stops reading (cao-server stopped with ^Z, swamped) made tmux queue a flooding
    pane's output for it without bound (+3.7 MB of server memory a second, measured). With
    pause-after tmux drops what the watch is over a second behind on (``%pause``) or holds the
    pane back; the watch continues the pane and still hears it afterwards."""
    stall = threading.Event()
    stalled = threading.Event()
    woke: list[str] = []

    def on_quiet(pane: str) -> None:
        woke.append(pane)
        if len(woke) == 1:
            stalled.set()
            stall.wait(10)  # the watch's thread stops reading while the pane floods

    ctl.watch_output(on_quiet, lambda _pane: 0.01)
    src = Path(__file__).resolve()
    flood = _session(
        ctl,
        tmp_path,
        name="cao-flood",
        command=f"sleep 0.3; echo ready; sleep 0.3; timeout 8 sh -c 'while :; do cat {src}; done'; cat",
    )
    server_pid = int(ctl.run("display-message", "-p", "#{pid}"))
    assert stalled.wait(10)
    log = tmp_path / "cao-flood.log"
    wait_until(lambda: log.stat().st_size > 1 << 20, what="the flood under way while the watch stalls")
    before = _rss_kb(server_pid)
    time.sleep(4.0)  # unbounded, this is ~15 MB more
    grown = _rss_kb(server_pid) - before
    stall.set()
    assert grown < 4096, f"the tmux server grew {grown} kB while the watch did not read"
    wait_until(lambda: len(woke) >= 2, timeout=20, what="a wake after the stall")
    woke.clear()
    ctl.run("send-keys", "-t", flood.pane_id, "-l", "after the flood\n")
    wait_until(lambda: flood.pane_id in woke, what="the pane heard after it was continued")


def test_a_session_killed_under_its_watch_is_dropped_and_a_new_one_watched(ctl: Tmux, tmp_path: Path):
    ctl.watch_output(lambda _pane: None, lambda _pane: 0.01)
    _session(ctl, tmp_path, name="cao-one")
    _session(ctl, tmp_path, name="cao-two")
    assert ctl.output_watches == ["cao-one", "cao-two"]
    ctl.kill_session("cao-one")
    wait_until(lambda: ctl.output_watches == ["cao-two"], what="the watch of the killed session ends")
    assert ctl.refresh_output_watch() == 1


def test_sessions_created_while_clients_attach_leave_tmux_running(ctl: Tmux, tmp_path: Path):
    """tmux 3.3a's server could crash (SIGSEGV, every pane gone) when a session was created while a
    control client was still attaching; each new session starts a watch, and two threads create
    sessions at once, so without the attach gate some new-session lands in an attach (4-11% each)."""
    ctl.watch_output(lambda _pane: None, lambda _pane: 0.01)
    errors: list[BaseException] = []

    def make(prefix: str) -> None:
        try:
            for i in range(15):
                _session(ctl, tmp_path, name=f"cao-{prefix}{i}")
        except BaseException as exc:  # the server died under a create: the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=make, args=(p,)) for p in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    names = sorted(f"cao-{p}{i}" for p in "ab" for i in range(15))
    assert sorted(n for n in ctl.list_sessions() if n.startswith("cao-")) == names
    assert ctl.output_watches == names


def test_the_panes_of_a_session_killed_from_many_threads_leave_tmux_running(ctl: Tmux, tmp_path: Path):
    """With a control client attached, tmux 3.3a crashes when two windows of a session close in
    one read of its (a deferred session-window-changed finds the session gone): cao's kills hold
    the gate alone, so each is its own line and answer. Six panes, six threads, ten times."""
    for _round in range(10):
        _session(ctl, tmp_path, name="cao-keep")
        panes = [_session(ctl, tmp_path, name="cao-x", command="sleep 600") for _ in range(6)]
        wait_until(  # the last round's kill-session took the client's session: a new one starts
            lambda: ctl.run("display-message", "-p", "warm") and ctl.control_pid, what="a control client"
        )
        start = threading.Barrier(len(panes))

        def kill(pane: PaneInfo, start: threading.Barrier = start) -> None:
            start.wait(5)
            ctl.kill_pane(pane.pane_id, pane.pane_pid, grace=0)

        threads = [threading.Thread(target=kill, args=(p,)) for p in panes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert ctl.has_session("cao-keep"), "the tmux server crashed"
        assert not ctl.has_session("cao-x")
        ctl.kill_session("cao-keep")


# -- end to end: a busy receiver is woken by its pane's output, not by a log poll or the sweep ------
def test_a_busy_receiver_is_served_when_its_pane_goes_quiet_without_the_log_poll(make_core, settings):
    # the watchdog polls once a minute and the sweep waits a minute: only %output can wake it in time
    core: Cao = make_core(
        settings.with_(tmux_control=True, watch_interval=60.0, sweep_interval=60.0, sweep_grace=60.0)
    )
    write_rules(settings.home, "slow", SLOW)
    tid = new_terminal(core, profile="slow")
    core.typist.send_input(core.store.get_terminal(tid), "work 1.5")
    wait_until(lambda: core.status.status(core.store.get_terminal(tid)) == "processing", what="busy")
    receipt = core.send_message(tid, "token-output-wake", sender_id="s")
    wait_until(lambda: status_of(core, receipt.message.id or 0) == "delivered", timeout=10)
    assert received_bodies(settings.home, tid)[-1] == "token-output-wake"
    assert core.engine.stats.get("delivered_by_output", 0) >= 1, core.engine.stats
    assert core.tmux.describe()["client"] == "control"
