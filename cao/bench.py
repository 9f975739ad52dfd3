"""Inbox benchmark: a real cao-server with scripted agents on a private tmux socket.

    python -m cao.bench [--quick] [--client both|control|forked] [--out bench-results/inbox.json]

Prints a table and writes JSON. Measures (each latency as p50 / p95 / max):

- send request time (HTTP round trip of POST /terminals/{id}/inbox/messages);
- send -> visible in an idle receiver (the agent took the paste's submit);
- urgent interrupt -> visible in a busy agent (its interrupt key, the prompt back, the paste);
- receiver turns idle -> pending message visible (message sent during a 3 s turn);
- burst: 50 receivers turning idle at the same moment, each with a message waiting;
- throughput end to end for 500 and 10,000 messages across 10 and 50 receivers from 10 concurrent
  senders, with lost / duplicated / pasted-into-busy counts (every message carries a unique token,
  counted in what the agents recorded as received);
- server and tmux CPU seconds, server RSS, threads and fds with 50 and with 200 idle terminals;
- create -> ready (one terminal at a time), and 200 receivers turning idle at the same moment.

By default it runs twice: with forked tmux clients (``CAO_TMUX_CONTROL=false``, the default) and
over the control-mode client (``CAO_TMUX_CONTROL=true``, opt-in), and prints both and a side-by-side
table (``--client`` picks one).

"Visible" is the scripted agent's own record of the submitted input (its clock and ours are the
same machine clock). The benchmark never sends traffic beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from cao.states import Status
from cao.tmux import Tmux
from providers.scripted_agent import TURN_DONE

WORK_RULES = {
    "record": True,
    "rules": [
        {"match": r"^work (?P<secs>[\d.]+)$", "delay": 3.0, "reply": "worked"},
        {"match": r"^long work$", "delay": 60.0, "reply": "worked long"},
        {"match": r"^slow work$", "delay": 45.0, "reply": "worked slowly"},
    ],
    "default": {"reply": "ok"},
}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "max_ms": round(max(ms), 2) if ms else float("nan"),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _proc_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


class Bench:
    def __init__(self, home: Path, extra_env: dict[str, str] | None = None) -> None:
        self.home = home
        self.socket = f"cao-bench-{os.getpid()}-{home.name}"
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmux = Tmux(self.socket)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CAO_", "TMUX"))}
        env.update(
            CAO_HOME=str(home),
            CAO_TMUX_SOCKET=self.socket,
            CAO_API_PORT=str(self.port),
            CAO_SCRIPTED_RECORD="1",
            **(extra_env or {}),
        )
        (home / "scripted").mkdir(parents=True, exist_ok=True)
        (home / "scripted" / "worker.json").write_text(json.dumps(WORK_RULES))
        self.stderr = (home / "server.stderr").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cao.server", "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        self.http = httpx.Client(base_url=self.url, timeout=60)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.http.get("/health").raise_for_status()
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"cao-server did not start: {(home / 'server.stderr').read_text()}"
                    ) from None
                time.sleep(0.05)
        self.terminals: list[str] = []

    def close(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.http.delete("/sessions/bench")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.tmux.kill_server()
        self.stderr.close()
        self.http.close()

    # -- helpers --------------------------------------------------------------------------------
    def spawn(self, n: int) -> list[str]:
        ids: list[str] = []
        for _ in range(n):
            if not self.terminals and not ids:
                t = self.http.post("/sessions", json={"session_name": "bench", "agent_profile": "worker"})
            else:
                t = self.http.post("/sessions/bench/terminals", json={"agent_profile": "worker"})
            t.raise_for_status()
            ids.append(t.json()["id"])
        self.terminals += ids
        self.wait_status(ids, {"idle", "completed"})
        return ids

    def wait_status(self, ids: list[str], want: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        left = set(ids)
        while left:
            left = {t for t in left if self.http.get(f"/terminals/{t}").json()["status"] not in want}
            if left and time.monotonic() > deadline:
                raise RuntimeError(f"terminals {sorted(left)} never reached {want}")
            if left:
                time.sleep(0.05)

    def records(self, tid: str) -> list[dict[str, Any]]:
        path = self.home / "scripted" / "received" / f"{tid}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line being written right now
        return out

    def received_tokens(self, ids: list[str]) -> tuple[Counter[str], dict[str, float], int]:
        counts: Counter[str] = Counter()
        when: dict[str, float] = {}
        busy = 0
        for tid in ids:
            for rec in self.records(tid):
                if rec["kind"] != "received":
                    continue
                busy += bool(rec["arrived_busy"])
                for m in rec["messages"]:
                    counts[m["body"]] += 1
                    when.setdefault(m["body"], rec["t"])
        return counts, when, busy

    def send(self, tid: str, body: str, client: httpx.Client | None = None) -> float:
        t0 = time.perf_counter()
        r = (client or self.http).post(
            f"/terminals/{tid}/inbox/messages", json={"sender_id": "bench", "message": body}
        )
        r.raise_for_status()
        return time.perf_counter() - t0

    def wait_tokens(self, ids: list[str], tokens: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            counts, _, _ = self.received_tokens(ids)
            if tokens <= set(counts):
                return
            time.sleep(0.1)

    # -- scenarios ------------------------------------------------------------------------------
    def send_and_visible(self, tid: str, n: int, via: httpx.Client | None = None) -> dict[str, Any]:
        """``via``: another host's API (the multi-host run): the send crosses hosts."""
        req, vis = [], []
        for i in range(n):
            token = f"tok-sv-{i}-{time.time_ns()}"
            start = time.time()
            req.append(self.send(tid, token, via))
            self.wait_tokens([tid], {token}, 10)
            _, when, _ = self.received_tokens([tid])
            vis.append(when[token] - start)
            self.wait_status([tid], {"idle", "completed"})
        return {"send_request": summary(req), "send_to_visible_idle": summary(vis)}

    def idle_to_visible(self, ids: list[str], rounds: int, work: str = "work 3") -> dict[str, Any]:
        """Each receiver starts a turn (3 s; ``slow work``: 45 s, for 200 receivers to all be in
        it at once: typing 200 inputs with forked clients takes ~20 s); a message is sent during
        it; measure turn end -> visible."""
        lat: list[float] = []
        for r in range(rounds):
            for tid in ids:
                self.http.post(f"/terminals/{tid}/input", json={"message": work}).raise_for_status()
            self.wait_status(ids, {"processing"})
            tokens = {tid: f"tok-iv-{r}-{tid}-{time.time_ns()}" for tid in ids}
            for tid, tok in tokens.items():
                self.send(tid, tok)
            self.wait_tokens(ids, set(tokens.values()), 30 if work != "slow work" else 90)
            for tid, tok in tokens.items():
                recs = self.records(tid)
                got = next(
                    x["t"]
                    for x in recs
                    if x["kind"] == "received" and any(m["body"] == tok for m in x["messages"])
                )
                turn_start = max(
                    x["t"] for x in recs if x["kind"] == "received" and x["text"] == work and x["t"] < got
                )
                done = min(x["t"] for x in recs if x["kind"] == TURN_DONE and x["t"] > turn_start)
                lat.append(got - done)
            self.wait_status(ids, {"idle", "completed"})
        return summary(lat)

    def urgent_interrupt(self, tid: str, rounds: int) -> dict[str, Any]:
        """The receiver is in a 60 s turn; an urgent message with if_busy=interrupt is sent: measure
        send -> the message visible in the agent (its interrupt key, the prompt back, the paste)."""
        lat: list[float] = []
        for r in range(rounds):
            self.wait_status([tid], {"idle", "completed"})
            self.http.post(f"/terminals/{tid}/input", json={"message": "long work"}).raise_for_status()
            self.wait_status([tid], {"processing"})
            token = f"tok-ui-{r}-{time.time_ns()}"
            start = time.time()
            self.http.post(
                f"/terminals/{tid}/inbox/messages",
                json={"sender_id": "bench", "message": token, "priority": "urgent", "if_busy": "interrupt"},
            ).raise_for_status()
            self.wait_tokens([tid], {token}, 30)
            _, when, _ = self.received_tokens([tid])
            lat.append(when[token] - start)
        self.wait_status([tid], {"idle", "completed"})
        return summary(lat)

    def notice_latency(self, rounds: int) -> dict[str, Any]:
        """A supervisor hears about its worker without polling: the supervisor sends its worker a 3 s
        task; measure the worker's turn end -> the supervisor's agent has its "finished" notice."""
        sup = self.spawn(1)[0]
        t = self.http.post(
            "/sessions/bench/terminals", json={"agent_profile": "worker", "supervisor_id": sup}
        )
        t.raise_for_status()
        wid = t.json()["id"]
        self.wait_status([wid], {"idle", "completed"})
        lat: list[float] = []
        seen = 0
        for _ in range(rounds):
            self.http.post(
                f"/terminals/{wid}/inbox/messages", json={"sender_id": sup, "message": "work 3"}
            ).raise_for_status()
            deadline = time.monotonic() + 30
            while True:
                got = [
                    x["t"]
                    for x in self.records(sup)
                    if x["kind"] == "received"
                    and any(m["body"].startswith(f"Worker {wid} ") for m in x["messages"])
                ]
                if len(got) > seen or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            if len(got) <= seen:
                raise RuntimeError(f"supervisor {sup} never got worker {wid}'s notice")
            seen = len(got)
            done = max(x["t"] for x in self.records(wid) if x["kind"] == TURN_DONE and x["t"] < got[-1])
            lat.append(got[-1] - done)
            self.wait_status([sup, wid], {"idle", "completed"})
        for tid in (wid, sup):  # the later rows count their own terminals only
            self.http.delete(f"/terminals/{tid}").raise_for_status()
        self.terminals.remove(sup)
        return summary(lat)

    def throughput(
        self, ids: list[str], total: int, senders: int = 10, via_url: str | None = None
    ) -> dict[str, Any]:
        """``via_url``: senders post to another host's API (the multi-host run)."""
        tag = f"tp{total}x{len(ids)}-{time.time_ns()}"
        tokens = [f"{tag}-{i}" for i in range(total)]
        req: list[float] = []
        lock = threading.Lock()
        errors: list[str] = []

        def sender(k: int) -> None:
            local: list[float] = []
            with httpx.Client(base_url=via_url or self.url, timeout=60) as client:
                for i in range(k, total, senders):
                    try:
                        local.append(self.send(ids[i % len(ids)], tokens[i], client))
                    except httpx.HTTPError as exc:
                        errors.append(str(exc))
            with lock:
                req.extend(local)

        start = time.time()
        threads = [threading.Thread(target=sender, args=(k,)) for k in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sent_done = time.time()
        self.wait_tokens(ids, set(tokens), timeout=max(60, total / 20))
        counts, when, busy = self.received_tokens(ids)
        ours = {t: c for t, c in counts.items() if t.startswith(tag)}
        lost = sum(1 for t in tokens if t not in ours)
        dup = sum(c - 1 for c in ours.values() if c > 1)
        end = max(when[t] for t in ours) if ours else time.time()
        return {
            "messages": total,
            "receivers": len(ids),
            "senders": senders,
            "lost": lost,
            "duplicated": dup,
            "send_errors": len(errors),
            "arrived_busy_total": busy,
            "seconds": round(end - start, 2),
            "send_phase_seconds": round(sent_done - start, 2),
            "messages_per_s": round(total / (end - start), 1),
            "send_request": summary(req),
        }

    def create_to_ready(self, n: int) -> dict[str, Any]:
        """One terminal at a time: POST → its status first reads idle."""
        lat: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = self.http.post("/sessions/bench/terminals", json={"agent_profile": "worker"})
            r.raise_for_status()
            tid = r.json()["id"]
            while self.http.get(f"/terminals/{tid}").json()["status"] not in (Status.IDLE, Status.COMPLETED):
                time.sleep(0.005)
            lat.append(time.perf_counter() - t0)
            self.terminals.append(tid)
        return summary(lat)

    def idle_cpu(self, seconds: float) -> dict[str, Any]:
        tmux_pid = int(self.tmux.run("display-message", "-p", "#{pid}").strip())
        s0, t0, w0 = _proc_cpu(self.proc.pid), _proc_cpu(tmux_pid), time.monotonic()
        time.sleep(seconds)
        s1, t1, w1 = _proc_cpu(self.proc.pid), _proc_cpu(tmux_pid), time.monotonic()
        wall = w1 - w0
        return {
            "terminals": len(self.terminals),
            "seconds": round(wall, 1),
            "server_cpu_s": round(s1 - s0, 3),
            "tmux_cpu_s": round(t1 - t0, 3),
            "server_plus_tmux_core_pct": round(100 * ((s1 - s0) + (t1 - t0)) / wall, 2),
            "server_rss_mb": round(_proc_rss_mb(self.proc.pid), 1),
            "server_threads": _proc_threads(self.proc.pid),
            "server_fds": len(os.listdir(f"/proc/{self.proc.pid}/fd")),
        }


def run(quick: bool, client: str = "control", database_url: str | None = None) -> dict[str, Any]:
    """One run on one tmux client: ``control`` (``CAO_TMUX_CONTROL=true``) or ``forked`` (the
    default); on the SQLite file, or on the PostgreSQL database ``database_url`` (it should be
    empty: the run leaves its rows there)."""
    results: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "quick": quick,
        "client": client,
        "store": "postgresql" if database_url else "sqlite",
    }
    home = Path(tempfile.mkdtemp(prefix="cao-bench-"))
    env = {"CAO_TMUX_CONTROL": "true" if client == "control" else "false"}
    if database_url:
        env["CAO_DATABASE_URL"] = database_url
    bench = Bench(home, env)
    try:
        results["config"] = bench.http.get("/info").json()
        one = bench.spawn(1)
        results["create_to_ready"] = bench.create_to_ready(3 if quick else 10)
        results.update(bench.send_and_visible(one[0], 30 if quick else 100))
        results["urgent_interrupt_key"] = bench.urgent_interrupt(one[0], 5 if quick else 20)
        results["notice_latency"] = bench.notice_latency(3 if quick else 10)
        ten = one + bench.spawn(9)
        results["idle_to_visible"] = bench.idle_to_visible(ten, 1 if quick else 3)
        results["throughput_500_10"] = bench.throughput(ten, 500)
        if not quick:
            results["throughput_10000_10"] = bench.throughput(ten, 10000)
        fifty = ten + bench.spawn(40)
        results["burst_50_idle_together"] = bench.idle_to_visible(fifty, 1)
        results["throughput_500_50"] = bench.throughput(fifty, 500)
        if not quick:
            results["throughput_10000_50"] = bench.throughput(fifty, 10000)
        bench.wait_status(fifty, {"idle", "completed"})
        time.sleep(2)
        results["idle_50"] = bench.idle_cpu(10 if quick else 60)
        two_hundred = fifty + bench.spawn(150)
        bench.wait_status(two_hundred, {"idle", "completed"})
        time.sleep(2)
        results["idle_200"] = bench.idle_cpu(10 if quick else 30)
        results["burst_200_idle_together"] = bench.idle_to_visible(two_hundred, 1, "slow work")
        results["tmux"] = bench.http.get("/info").json().get("tmux")
    finally:
        bench.close()
        shutil.rmtree(home, ignore_errors=True)
    return results


def multi_host(quick: bool, client: str) -> dict[str, Any]:
    """Two cao-servers ("hosts" a and b) on one PostgreSQL server this run starts (Debian's package,
    cao/testing/pgserver.py), each with its own home and tmux server; the receivers run on b. The
    same measures sent through b (same host) and through a (cross host), and the same-host figures
    of a SQLite store beside them."""
    from cao.testing.pgserver import PgServer, missing_reason

    why = missing_reason()
    if why is not None:
        raise SystemExit(f"the multi-host run needs a PostgreSQL server: {why}")
    root = Path(tempfile.mkdtemp(prefix="cao-bench-hosts-"))
    pg_root = Path(tempfile.mkdtemp(prefix="cao-bench-pg-"))  # its own: the postgres user enters it
    pg = PgServer.start(pg_root)
    results: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "quick": quick,
        "client": client,
        "mode": "multi-host",
    }
    n, total = (20, 500) if quick else (100, 5000)
    control = {"CAO_TMUX_CONTROL": "true" if client == "control" else "false"}
    benches: list[Bench] = []
    try:
        for store in ("sqlite", "postgresql"):
            env = dict(control)
            if store == "postgresql":
                env["CAO_DATABASE_URL"] = pg.new_database()
            b = Bench(root / f"{store}-b", {**env, "CAO_HOST_NAME": "b"})
            benches.append(b)
            ids = b.spawn(10)
            same = b.send_and_visible(ids[0], n)
            out: dict[str, Any] = {
                "same_host_send_to_visible": same["send_to_visible_idle"],
                "same_host_send_request": same["send_request"],
                "same_host_throughput": b.throughput(ids, total),
            }
            if store == "postgresql":
                a = Bench(root / "postgresql-a", {**env, "CAO_HOST_NAME": "a"})
                benches.append(a)
                cross = b.send_and_visible(ids[0], n, via=a.http)
                out["cross_host_send_to_visible"] = cross["send_to_visible_idle"]
                out["cross_host_send_request"] = cross["send_request"]
                out["cross_host_throughput"] = b.throughput(ids, total, via_url=a.url)
            results[store] = out
    finally:
        for b in benches:
            b.close()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(pg_root, ignore_errors=True)
    return results


def render_multi_host(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cao multi-host benchmark — tmux client: {results['client']}")
    for col in ("store", "measure", "n", "p50 ms", "p95 ms", "max ms", "throughput"):
        table.add_column(col)
    for store in ("sqlite", "postgresql"):
        r = results[store]
        for where in ("same_host", "cross_host"):
            if f"{where}_send_to_visible" not in r:
                continue
            label = where.replace("_", " ")
            for measure, key in (("send request", "send_request"), ("send -> agent read", "send_to_visible")):
                s = r[f"{where}_{key}"]
                table.add_row(
                    store,
                    f"{label}: {measure}",
                    str(s["n"]),
                    str(s["p50_ms"]),
                    str(s["p95_ms"]),
                    str(s["max_ms"]),
                    "",
                )
            tp = r[f"{where}_throughput"]
            table.add_row(
                store,
                f"{label}: {tp['messages']} msgs / {tp['receivers']} receivers",
                "-",
                str(tp["send_request"]["p50_ms"]),
                str(tp["send_request"]["p95_ms"]),
                str(tp["send_request"]["max_ms"]),
                f"{tp['messages_per_s']} msg/s, lost {tp['lost']}, dup {tp['duplicated']}",
            )
    Console().print(table)


def render(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"cao inbox benchmark — tmux client: {results.get('client', 'control')}, "
        f"store: {results.get('store', 'sqlite')}"
    )
    for col in ("measure", "n", "p50 ms", "p95 ms", "max ms", "notes"):
        table.add_column(col)

    def lat(name: str, s: dict[str, Any], note: str = "") -> None:
        table.add_row(name, str(s["n"]), str(s["p50_ms"]), str(s["p95_ms"]), str(s["max_ms"]), note)

    lat("send request (idle receiver)", results["send_request"])
    lat("send -> visible, idle receiver", results["send_to_visible_idle"])
    if "urgent_interrupt_key" in results:
        lat("urgent interrupt -> in the agent (key)", results["urgent_interrupt_key"], "busy in a 60 s turn")
    if "notice_latency" in results:
        lat("worker turn end -> supervisor's notice", results["notice_latency"], "no polling")
    lat("receiver idle -> visible (10 rcv)", results["idle_to_visible"])
    lat("burst: 50 turn idle together", results["burst_50_idle_together"])
    for key in ("throughput_500_10", "throughput_10000_10", "throughput_500_50", "throughput_10000_50"):
        if key in results:
            r = results[key]
            lat(
                f"send request under load ({r['messages']}/{r['receivers']})",
                r["send_request"],
                f"{r['messages_per_s']} msg/s, lost {r['lost']}, dup {r['duplicated']}, "
                f"busy-pastes {r['arrived_busy_total']}",
            )
    if "create_to_ready" in results:
        lat("create -> ready (one at a time)", results["create_to_ready"])
    if "burst_200_idle_together" in results:
        lat("burst: 200 turn idle together", results["burst_200_idle_together"])
    for key in ("idle_50", "idle_200"):
        if key not in results:
            continue
        idle = results[key]
        table.add_row(
            f"idle: {idle['terminals']} terminals",
            "-",
            "-",
            "-",
            "-",
            f"server+tmux {idle['server_plus_tmux_core_pct']}% of a core over {idle['seconds']}s, "
            f"RSS {idle['server_rss_mb']} MB, {idle.get('server_threads', '?')} threads, "
            f"{idle.get('server_fds', '?')} fds",
        )
    Console().print(table)


def render_compare(runs: dict[str, dict[str, Any]]) -> None:
    """The headline numbers of each run side by side (forked = before, control = after)."""
    from rich.console import Console
    from rich.table import Table

    names = list(runs)
    table = Table(title="before (forked tmux clients) / after (control-mode client)")
    table.add_column("measure")
    for name in names:
        table.add_column(name)

    def row(label: str, get: Any) -> None:
        cells = []
        for name in names:
            try:
                cells.append(str(get(runs[name])))
            except (KeyError, TypeError):
                cells.append("-")
        table.add_row(label, *cells)

    def p(key: str) -> Any:
        return lambda r: f"{r[key]['p50_ms']} / {r[key]['p95_ms']} ms"

    for key in ("throughput_10000_10", "throughput_500_10", "throughput_10000_50", "throughput_500_50"):
        row(
            f"throughput {key.split('_')[1]} msg, {key.split('_')[2]} receivers",
            lambda r, k=key: (
                f"{r[k]['messages_per_s']} msg/s (lost {r[k]['lost']}, dup {r[k]['duplicated']}, "
                f"busy {r[k]['arrived_busy_total']})"
            ),
        )
    row("send -> agent read p50/p95", p("send_to_visible_idle"))
    row("busy -> idle -> agent read p50/p95", p("idle_to_visible"))
    row("50 turn idle together p50/p95", p("burst_50_idle_together"))
    row("200 turn idle together p50/p95", p("burst_200_idle_together"))
    row("create -> ready p50/p95", p("create_to_ready"))
    for key in ("idle_50", "idle_200"):
        row(
            f"{key.split('_')[1]} idle agents: CPU, RSS",
            lambda r, k=key: (
                f"{r[k]['server_plus_tmux_core_pct']}% core, {r[k]['server_rss_mb']} MB, "
                f"{r[k]['server_threads']} threads"
            ),
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cao.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about a minute)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/inbox.json"))
    parser.add_argument(
        "--client",
        choices=("both", "control", "forked"),
        default="both",
        help="which tmux client cao-server uses: both = forked (before) then control mode (after)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="run on this (empty) PostgreSQL database instead of a SQLite file (docs/multi-host.md)",
    )
    parser.add_argument(
        "--multi-host",
        action="store_true",
        help="two cao-servers on one PostgreSQL server it starts: same-host and cross-host sends side "
        "by side, and SQLite's same-host figures (docs/multi-host.md); one --client (default control)",
    )
    args = parser.parse_args(argv)
    if args.multi_host:
        result = multi_host(args.quick, "control" if args.client == "both" else args.client)
        render_multi_host(result)
        out = (
            args.out.with_name("multi-host.json")
            if args.out == Path("bench-results/inbox.json")
            else args.out
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"JSON written to {out}")
        return 0
    if args.database_url and args.client == "both":
        parser.error("with --database-url, pick one --client per run (each run needs an empty database)")
    names = ("forked", "control") if args.client == "both" else (args.client,)
    runs: dict[str, dict[str, Any]] = {}
    for name in names:
        runs[name] = run(args.quick, name, args.database_url)
        render(runs[name])
    if len(runs) > 1:
        render_compare(runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs if len(runs) > 1 else runs[names[0]], indent=2))
    print(f"JSON written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
