"""Several "machines" on this one: network namespaces joined by a bridge, for the multi-host tests.

    hub namespace:  bridge cao0  169.254.77.1/24   PostgreSQL listens here (and on its unix socket)
      ├── veth h1 ── namespace of host 1: eth0 169.254.77.11/24, its cao-server, its tmux server
      ├── veth h2 ── namespace of host 2: eth0 169.254.77.12/24, …
      └── veth h3 ── …

Every namespace is made by the test (``unshare -n`` holders, as in the real-CLI bed) and removed
with it: its processes are killed and its holder ends, so its interfaces go too. Nothing is added
to the machine's own namespace; the link-local addresses live only inside these namespaces, and
traffic goes only between them. ``cut(i)`` takes host i's end of its cable down at the bridge
(``ip link set hN down`` in the hub): the host loses the others and the database, while its own
agents still reach its own cao-server.

The test process stays in the machine's namespace: it reaches PostgreSQL over the unix socket and
each host's API through a small proxy process running inside that host's namespace
(``tests/netproxy.py``: one JSON request a line).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from tests.helpers import REPO
from tests.prepare import netns_problem

SUBNET = "169.254.77"  # link-local; only ever inside the lab's namespaces
HUB_ADDR = f"{SUBNET}.1"
BRIDGE = "cao0"


def lab_problem() -> str | None:
    """Why the lab can't be built here, or None."""
    if os.geteuid() != 0:
        return "the multi-host lab needs root (bridges and veth pairs between network namespaces)"
    return netns_problem()


def _holder() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep infinity"], start_new_session=True
    )
    deadline = time.monotonic() + 10
    mine = os.readlink("/proc/self/ns/net")
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{proc.pid}/ns/net") != mine:
                return proc
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("a network namespace holder did not start")


class Lab:
    def __init__(self, hosts: int) -> None:
        self.n = hosts
        self.hub: subprocess.Popen[bytes] | None = None
        self.holders: list[subprocess.Popen[bytes]] = []
        self.procs: list[subprocess.Popen[Any]] = []

    # -- building it ------------------------------------------------------------------------------
    def start(self) -> Lab:
        self.hub = _holder()
        self._sh(
            self.hub.pid,
            f"ip link add {BRIDGE} type bridge && ip addr add {HUB_ADDR}/24 dev {BRIDGE} "
            f"&& ip link set {BRIDGE} up",
        )
        for i in range(1, self.n + 1):
            holder = _holder()
            self.holders.append(holder)
            self._sh(
                self.hub.pid,
                f"ip link add h{i} type veth peer name eth0 netns {holder.pid} && ip link set h{i} master "
                f"{BRIDGE} && ip link set h{i} up",
            )
            self._sh(holder.pid, f"ip addr add {self.addr(i)}/24 dev eth0 && ip link set eth0 up")
        return self

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def pid(self, i: int) -> int:
        """The holder of host ``i``'s namespace (0: the hub)."""
        if i == 0:
            assert self.hub is not None
            return self.hub.pid
        return self.holders[i - 1].pid

    def argv(self, i: int, argv: Sequence[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid(i)), "-n", *argv]

    def _sh(self, pid: int, script: str) -> None:
        done = subprocess.run(
            ["nsenter", "-t", str(pid), "-n", "sh", "-c", script], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"lab setup failed: {script}: {done.stderr.strip()}")

    def popen(self, i: int, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(self.argv(i, argv), **kwargs)
        self.procs.append(proc)
        return proc

    # -- failures ---------------------------------------------------------------------------------
    def cut(self, i: int) -> None:
        """Host ``i`` loses the others and the database (its cable pulled at the bridge)."""
        self._sh(self.pid(0), f"ip link set h{i} down")

    def heal(self, i: int) -> None:
        self._sh(self.pid(0), f"ip link set h{i} up")

    # -- taking it down -----------------------------------------------------------------------------
    def members(self, pid: int) -> list[int]:
        """Every process (but the holder) in that holder's namespace."""
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == ns:
                    found.append(int(entry))
        return found

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        holders = [h for h in [self.hub, *self.holders] if h is not None]
        for holder in holders:
            for pid in self.members(holder.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if holder.poll() is None:
                holder.kill()
            holder.wait(timeout=5)


class Proxy:
    """HTTP from inside host ``i``'s namespace (tests/netproxy.py), one request at a time."""

    def __init__(self, lab: Lab, i: int, token: str) -> None:
        self.proc = lab.popen(
            i,
            [sys.executable, "-u", str(REPO / "tests" / "netproxy.py"), token],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def request(self, method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(
            json.dumps({"method": method, "url": url, "json": body, "timeout": timeout}) + "\n"
        )
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the lab's HTTP proxy exited")
        out = json.loads(line)
        return int(out["status"]), out["body"]
