"""Inbox under load against a real cao-server process (DELIVERY.md scenarios 7, 8 and 20)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO, ServerProcess, read_records, wait_until

SENDER = """
import sys, httpx
url, receiver, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with httpx.Client(base_url=url, timeout=60) as c:
    for i in range(n):
        r = c.post(f"/terminals/{receiver}/inbox/messages", json={"sender_id": tag, "message": f"{tag}:{i}"})
        r.raise_for_status()
"""

SAME_KEY = """
import sys, httpx
url, receiver = sys.argv[1], sys.argv[2]
r = httpx.post(f"{url}/terminals/{receiver}/inbox/messages", timeout=60,
               json={"sender_id": "twin", "message": "only once", "idempotency_key": "same"})
print(r.status_code, r.json()["message_id"], r.json()["duplicate"])
"""


def _spawn(c: httpx.Client, n: int, session: str = "load") -> list[str]:
    ids = [c.post("/sessions", json={"session_name": session}).json()["id"]]
    ids += [c.post(f"/sessions/{session}/terminals", json={}).json()["id"] for _ in range(n - 1)]
    for tid in ids:
        wait_until(lambda tid=tid: c.get(f"/terminals/{tid}").json()["status"] == "idle", timeout=30)
    return ids


def _received(home: Path, tid: str) -> list[tuple[int, str]]:
    return [(m["id"], m["body"]) for r in read_records(home, tid) for m in r["messages"]]


def test_7_same_key_from_two_processes_is_one_message(make_server):
    srv: ServerProcess = make_server(CAO_SCRIPTED_RECORD="1")
    with srv.client() as c:
        [tid] = _spawn(c, 1)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAME_KEY, srv.url, tid], stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        for _ in range(2)
    ]
    outs = sorted(p.communicate(timeout=60)[0].split() for p in procs)
    assert outs[0][0] == "200" and outs[1][0] == "201"  # one duplicate, one created
    assert outs[0][1] == outs[1][1]
    wait_until(lambda: len(_received(srv.home, tid)) == 1)
    with srv.client() as c:
        assert len(c.get(f"/terminals/{tid}/inbox/messages").json()) == 1


def test_8_processes_sending_to_one_receiver_all_arrive_once_in_commit_order(make_server):
    srv: ServerProcess = make_server(CAO_SCRIPTED_RECORD="1")
    with srv.client() as c:
        [tid] = _spawn(c, 1)
    procs = [
        subprocess.Popen([sys.executable, "-c", SENDER, srv.url, tid, "40", f"p{k}"], cwd=REPO)
        for k in range(4)
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    wait_until(lambda: len(_received(srv.home, tid)) >= 160, timeout=60)
    got = _received(srv.home, tid)
    ids = [i for i, _ in got]
    assert ids == sorted(ids)  # commit order
    assert len(set(ids)) == len(ids) == 160  # no duplicates, nothing lost
    for k in range(4):  # each sender's messages in the order it sent them
        mine = [int(body.split(":")[1]) for _, body in got if body.startswith(f"p{k}:")]
        assert mine == list(range(40))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_20_ten_thousand_messages_fifty_receivers_all_paths(make_server):
    # the sweep runs every second with a 1 s grace, so all three triggers are busy at once
    srv: ServerProcess = make_server(
        CAO_SCRIPTED_RECORD="1", CAO_INBOX_RECONCILE_INTERVAL="1", CAO_INBOX_RECONCILE_GRACE_SECONDS="1"
    )
    total, senders = 10_000, 10
    with srv.client() as c:
        ids = _spawn(c, 50)
    errors: list[str] = []

    def send(k: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            for i in range(k, total, senders):
                r = c.post(
                    f"/terminals/{ids[i % 50]}/inbox/messages",
                    json={"sender_id": f"s{k}", "message": f"tok20-{i}"},
                )
                if r.status_code != 201:
                    errors.append(r.text)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    def count() -> int:
        return sum(len(_received(srv.home, tid)) for tid in ids)

    wait_until(lambda: count() >= total, timeout=600, interval=1)
    bodies = [b for tid in ids for _, b in _received(srv.home, tid)]
    assert len(bodies) == total  # zero duplicated ...
    assert set(bodies) == {f"tok20-{i}" for i in range(total)}  # ... zero lost
    for tid in ids:  # and per receiver in commit order
        got = [i for i, _ in _received(srv.home, tid)]
        assert got == sorted(got)
    busy = sum(r["arrived_busy"] for tid in ids for r in read_records(srv.home, tid))
    assert busy == 0  # nothing pasted into a busy (non-eager) agent
    with srv.client() as c:
        assert c.get("/info").json()["messages"]["delivered"] == total
