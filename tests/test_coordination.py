"""Coordination (docs/orchestration.md; ATTENTION.md scenarios 10, 12, 13, 14): acknowledgements,
structured results, notices that follow a worker's work, the operator's webhook, durable
wake-ups. Real tmux, real SQLite, the scripted agent in its pane; what a supervisor got is counted
from its own record of what it received, never from cao's database alone."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from cao.settings import Settings
from cao.timefmt import iso
from tests.helpers import (
    ServerProcess,
    new_terminal,
    received_bodies,
    status_of,
    wait_until,
    write_rules,
)

WORKER = {
    "record": True,
    "rules": [
        {"match": r"^work (?P<s>[\d.]+)$", "delay": 1.0, "reply": "worked"},
        {"match": r"^deploy$", "ask": "Allow tool deploy?", "delay": 0.5, "reply": "deployed"},
    ],
}
BOSS = {"record": True}


@pytest.fixture
def team_core(make_core: Callable[..., Cao], settings: Settings) -> Cao:
    write_rules(settings.home, "developer", WORKER)
    write_rules(settings.home, "boss", BOSS)
    return make_core(settings)


@pytest.fixture
def api(team_core: Cao) -> Iterator[TestClient]:
    with TestClient(create_app(team_core)) as c:
        yield c


def worker_of(core: Cao, boss: str, task: str | None = "work 1", **kw: Any) -> str:
    view = core.create_terminal(
        provider="scripted", agent_profile="developer", supervisor_id=boss, initial_message=task, **kw
    )
    return str(view["id"])


def notices(core: Cao, boss: str, worker: str) -> list[str]:
    """The notices about ``worker`` its supervisor's agent received (its own record)."""
    return [b for b in received_bodies(core.settings.home, boss) if b.startswith(f"Worker {worker} ")]


# -- 10. acknowledgements -----------------------------------------------------------------------------
def test_acks_move_a_forward_only_cursor_and_reads_never_do(team_core: Cao, api: TestClient):
    core = team_core
    tid = new_terminal(core, "boss")
    ids = [core.send_message(tid, f"note {i}", sender_id="s").message.id or 0 for i in range(3)]
    wait_until(lambda: all(status_of(core, m) == "delivered" for m in ids), timeout=15)
    deferred = core.send_message(tid, "later", sender_id="s", deliver_at=iso(time.time() + 3600)).message.id
    view = api.get(f"/terminals/{tid}/inbox").json()
    assert view["ack_cursor"] == 0 and [m["id"] for m in view["unacked"]] == ids
    assert [m["id"] for m in view["waiting"]] == [deferred]
    assert api.post(f"/messages/{ids[0]}/read", json={"by": tid}).status_code == 200  # reading ...
    assert api.get(f"/terminals/{tid}/inbox").json()["ack_cursor"] == 0  # ... moves nothing

    stale = api.post(f"/terminals/{tid}/ack", json={"by": tid, "through_message_id": ids[1], "expected": 9})
    assert stale.status_code == 409 and stale.json()["current"] == 0, stale.text
    early = api.post(f"/terminals/{tid}/ack", json={"by": tid, "message_ids": [deferred]})
    assert early.status_code == 409 and "not delivered" in early.json()["detail"], early.text
    forged = api.post(
        f"/terminals/{tid}/ack", json={"by": new_terminal(core, "boss"), "through_message_id": ids[2]}
    )
    assert forged.status_code == 403, forged.text
    ok = api.post(f"/terminals/{tid}/ack", json={"by": tid, "through_message_id": ids[1], "expected": 0})
    assert ok.status_code == 200 and ok.json()["acked"] == ids[:2], ok.text
    replay = api.post(f"/terminals/{tid}/ack", json={"by": tid, "through_message_id": ids[1], "expected": 0})
    assert replay.status_code == 200 and replay.json()["replay"] and replay.json()["ack_cursor"] == ids[1]
    view = api.get(f"/terminals/{tid}/attention").json()
    assert [m["id"] for m in view["unacked"]] == [ids[2]] and view["ack_cursor"] == ids[1]
    assert api.get(f"/messages/{ids[0]}").json()["acked_at"] is not None
    assert "acked" in [e["event"] for e in view["timeline"]]
    # nothing is pasted again because an ack is missing: each note arrived exactly once
    assert [b for b in received_bodies(core.settings.home, tid) if b.startswith("note")] == [
        f"note {i}" for i in range(3)
    ]


# -- 12. structured results ---------------------------------------------------------------------------
def test_a_result_is_stored_once_per_attempt_and_reaches_the_supervisor_once(team_core: Cao, api: TestClient):
    core = team_core
    boss = new_terminal(core, "boss")
    worker = worker_of(core, boss)
    wait_until(lambda: core.store.get_terminal(worker).task_id is not None, timeout=15, what="task delivered")
    report = {
        "by": worker,
        "status": "done",
        "summary": "built it",
        "details": {"branch": "feat/x", "files": ["a.py"]},
    }
    first = api.post(f"/terminals/{worker}/result", json=report)
    assert first.status_code == 201, first.text
    again = api.post(f"/terminals/{worker}/result", json=report)
    assert again.status_code == 200 and again.json()["duplicate"]
    assert again.json()["result_id"] == first.json()["result_id"]
    other = api.post(f"/terminals/{worker}/result", json={**report, "summary": "something else"})
    assert other.status_code == 409 and other.json()["result_id"] == first.json()["result_id"]
    wait_until(
        lambda: any(
            b.startswith(f"Result from worker {worker}") for b in received_bodies(core.settings.home, boss)
        ),
        timeout=15,
        what="the result in the supervisor's pane",
    )
    got = [b for b in received_bodies(core.settings.home, boss) if b.startswith("Result from worker")]
    assert got == [f"Result from worker {worker} (developer): done\n\nbuilt it\nbranch: feat/x\nfiles: a.py"]
    message = core.store.get_message(first.json()["message_id"])
    assert (message.kind, message.sender_id, message.receiver_id) == ("result", worker, boss)
    assert api.get(f"/terminals/{worker}/results").json()[0]["details"] == {
        "branch": "feat/x",
        "files": ["a.py"],
    }


@pytest.mark.parametrize(
    "who, body, code, words",
    [
        ("boss", {"status": "done", "summary": "forged"}, 403, "a worker reports its own"),
        ("worker", {"status": "great", "summary": "x"}, 422, "status 'great' is not one of"),
        ("worker", {"status": "done", "summary": ""}, 422, "summary is required"),
        ("worker", {"status": "done", "summary": "x" * 4001}, 422, "summary must be 1-4000"),
        (
            "worker",
            {"status": "done", "summary": "x", "details": {"token": "s3cret"}},
            422,
            "details.token is not",
        ),
        ("worker", {"status": "done", "summary": "x", "details": "free text"}, 422, "must be an object"),
        ("loner", {"status": "done", "summary": "x"}, 409, "has no supervisor"),
    ],
    ids=[
        "forged-by-its-supervisor",
        "bad-status",
        "no-summary",
        "long-summary",
        "unknown-field",
        "details-text",
        "no-supervisor",
    ],
)
def test_a_bad_or_forged_result_is_refused_with_the_reason_and_nothing_stored(
    team_core: Cao, api: TestClient, who: str, body: dict[str, Any], code: int, words: str
):
    core = team_core
    boss = new_terminal(core, "boss")
    worker = worker_of(core, boss, task="hello")
    loner = new_terminal(core, "boss")
    core.send_message(loner, "a task from a person", sender_id="cli", kind="task")  # a task, no supervisor
    wait_until(lambda: core.store.get_terminal(worker).task_id is not None, timeout=15)
    wait_until(lambda: core.store.get_terminal(loner).task_id is not None, timeout=15)
    by = {"boss": boss, "worker": worker, "loner": loner}[who]
    target = loner if who == "loner" else worker
    r = api.post(f"/terminals/{target}/result", json={"by": by, **body})
    assert r.status_code == code, r.text
    assert words in r.json()["detail"]
    assert core.store.results(terminal_id=target) == []


def test_a_plain_send_cannot_pass_for_a_result_or_a_wake_up(team_core: Cao, api: TestClient):
    tid = new_terminal(team_core, "boss")
    for kind in ("result", "wakeup"):
        r = api.post(
            f"/terminals/{tid}/inbox/messages", json={"message": "trust me", "sender_id": "x", "kind": kind}
        )
        assert r.status_code == 422 and "cao's own" in r.json()["detail"], r.text


# -- 13. supervisors hear about their workers, once per event -----------------------------------------
class Receiver:
    """A webhook receiver on loopback: records each POST; answers ``code`` (or hangs ``hang`` s)."""

    def __init__(self, code: int = 200, hang: float = 0.0) -> None:
        self.got: list[dict[str, Any]] = []
        self.code, self.hang = code, hang
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.got.append(json.loads(body))
                if outer.hang:
                    threading.Event().wait(outer.hang)
                self.send_response(outer.code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_a_worker_finishing_blocking_and_exiting_gives_one_notice_and_one_webhook_call_each(
    make_core: Callable[..., Cao], settings: Settings, receiver: Receiver
):
    write_rules(settings.home, "developer", WORKER)
    write_rules(settings.home, "boss", BOSS)
    core = make_core(settings.with_(notify_url=receiver.url))
    boss = new_terminal(core, "boss")
    worker = worker_of(core, boss, task="work 1")
    wait_until(lambda: len(notices(core, boss, worker)) == 1, timeout=20, what="the finished notice")
    assert "ended its turn on its task" in notices(core, boss, worker)[0]

    core.send_message(worker, "deploy", sender_id=boss)  # its supervisor's message: work again
    wait_until(lambda: len(notices(core, boss, worker)) == 2, timeout=20, what="the blocked notice")
    assert "waiting at a permission or question prompt" in notices(core, boss, worker)[1]
    core.typist.send_input(core.store.get_terminal(worker), "y")  # a person answers
    wait_until(lambda: len(notices(core, boss, worker)) == 3, timeout=20, what="finished after the answer")

    core.tmux.send_keys_checked(core.panes.ref(core.store.get_terminal(worker)), "/exit", literal=True)
    core.tmux.send_keys_checked(core.panes.ref(core.store.get_terminal(worker)), "Enter")
    wait_until(lambda: len(notices(core, boss, worker)) == 4, timeout=30, what="the exited notice")
    assert "exited" in notices(core, boss, worker)[3]

    events = [n["event"] for n in core.notifications(terminal_id=worker)]
    assert events == ["finished", "blocked", "finished", "exited"]
    wait_until(lambda: len(receiver.got) == 4, timeout=15, what="four webhook calls")
    assert [(g["event"], g["terminal_id"], g["supervisor_id"]) for g in receiver.got] == [
        (e, worker, boss) for e in events
    ]
    wait_until(lambda: all(n["webhook"] == "sent" for n in core.notifications(terminal_id=worker)))
    settle_checks = [n["message_id"] for n in core.notifications(terminal_id=worker)]
    assert all(settle_checks)  # each with its notice to the supervisor


def test_a_worker_that_reported_its_result_sends_no_finished_notice_and_opt_out_sends_none(team_core: Cao):
    core = team_core
    boss = new_terminal(core, "boss")
    quiet = worker_of(core, boss, task="work 1", notify=False)
    wait_until(
        lambda: [n["event"] for n in core.notifications(terminal_id=quiet)] == ["finished"], timeout=20
    )
    assert core.notifications(terminal_id=quiet)[0]["message_id"] is None  # the operator hears; not the boss
    assert notices(core, boss, quiet) == []


@pytest.mark.parametrize("code, hang", [(500, 0.0), (200, 3.0)], ids=["answers-500", "hangs"])
def test_a_webhook_that_fails_is_retried_a_bounded_number_of_times_then_recorded(
    make_core: Callable[..., Cao], settings: Settings, code: int, hang: float
):
    bad = Receiver(code=code, hang=hang)
    try:
        write_rules(settings.home, "developer", WORKER)
        write_rules(settings.home, "boss", BOSS)
        core = make_core(settings.with_(notify_url=bad.url, notify_retries=2, notify_timeout=1.0))
        boss = new_terminal(core, "boss")
        worker = worker_of(core, boss, task="hello")
        wait_until(
            lambda: [n["webhook"] for n in core.notifications(terminal_id=worker)] == ["failed"],
            timeout=30,
            what="the webhook given up",
        )
        [note] = core.notifications(terminal_id=worker)
        assert note["webhook_attempts"] == 3 and note["webhook_error"]
        assert len(bad.got) == 3  # the first try and two retries, no more
        # the operator's webhook failing changes nothing for the supervisor: its notice arrived
        wait_until(lambda: len(notices(core, boss, worker)) == 1, timeout=15, what="the notice")
    finally:
        bad.close()


# -- 12 through handoff, 14 across restarts (a real cao-server: the agents reach its API) -------------
REPORTER = {
    "record": True,
    "rules": [
        {"match": r"^build (?P<what>\w+)$", "delay": 0.5, "reply": "built {what}",
         "result": {"status": "done", "summary": "built {what}", "details": {"files": ["out/widget"]}}},
    ],
    "default": {"reply": "just an answer on the screen"},
}  # fmt: skip


def test_handoff_returns_the_reported_result_and_the_screen_only_when_none_came(
    make_server: Callable[..., ServerProcess], tmp_path: Path
):
    home = tmp_path / "cao"
    write_rules(home, "reporter", REPORTER)
    srv = make_server(home)
    with srv.client() as c:
        step = {"agent": "reporter", "provider": "scripted", "timeout": 60}
        r = c.post("/terminals/run-step", json={**step, "prompt": "build widget"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["answer_source"] == "result", out
        assert out["result"]["summary"] == "built widget"
        assert (
            out["last_message"].startswith("Result from worker")
            and "files: out/widget" in out["last_message"]
        )
        job = "a" * 32
        r = c.post("/terminals/run-step", json={**step, "prompt": "say something", "job_id": job})
        assert r.status_code == 200, r.text
        assert r.json()["answer_source"] == "screen" and r.json()["result"] is None
        assert "just an answer on the screen" in r.json()["last_message"]
        kept = c.get(f"/handoff-results/{job}").json()
        assert kept["answer_source"] == "screen" and kept["state"] == "completed"


SLOT_RE = re.compile(r"^tick\n\n\(cao\) wake-up (?P<id>\d+), slot (?P<slot>\d+)")


def slots_received(home: Path, tid: str) -> list[int]:
    return [int(m.group("slot")) for b in received_bodies(home, tid) if (m := SLOT_RE.match(b))]


@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_a_repeating_wake_up_delivers_once_per_slot_across_a_server_restart(
    make_server: Callable[..., ServerProcess], tmp_path: Path, how: str
):
    home = tmp_path / "cao"
    write_rules(home, "developer", {"record": True})
    knobs = {"CAO_SCHEDULE_MIN_EVERY": "1", "CAO_LOG_CAP_INTERVAL": "0.2"}
    srv = make_server(home, **knobs)
    with srv.client() as c:
        tid = c.post("/sessions", json={"provider": "scripted"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] in ("idle", "completed"), timeout=20)
        s = c.post(
            f"/terminals/{tid}/schedules", json={"message": "tick", "in_seconds": 0, "every_seconds": 2}
        )
        assert s.status_code == 201, s.text
        sid = s.json()["id"]
    wait_until(lambda: len(slots_received(home, tid)) >= 2, timeout=20, what="two slots before the restart")
    if how == "restart":
        srv.stop()
    else:
        srv.kill()
    srv2 = make_server(home, **knobs)
    wait_until(lambda: len(slots_received(home, tid)) >= 5, timeout=30, what="slots after the restart")
    with srv2.client() as c:
        assert c.post(f"/schedules/{sid}/cancel", json={}).json()["state"] == "cancelled"
        got = slots_received(home, tid)
        assert got == list(range(len(got))), got  # every slot once, in order, none lost, none doubled
        listed = c.get(f"/schedules/{sid}").json()
        assert listed["skipped"] == 0 and listed["state"] == "cancelled"
        timeline = [e["event"] for e in c.get(f"/terminals/{tid}/attention").json()["timeline"]]
        assert "scheduled" in timeline and "unscheduled" in timeline
        # cancelled: its waiting slot was cancelled with it, and no slot is waiting any more
        assert "pending" not in [m["status"] for m in listed["slots"]]
        with httpx.Client(base_url=srv2.url) as raw:
            assert raw.get("/schedules", params={"active": "true"}).json() == []
