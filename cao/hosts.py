"""Hosts: several cao-servers sharing one store (PostgreSQL), each driving only its own tmux.

A host registers under its name (``CAO_HOST_NAME``, default the machine's hostname) with a lease it
renews every ``CAO_HOST_HEARTBEAT`` seconds. A terminal belongs to the host whose tmux runs it:
only that host's engine claims its mail, and only that host reads, types into or kills its pane
(cao/panes.py refuses a foreign terminal). Any host answers for every terminal: the store is
shared, and pane operations on another host's terminal are forwarded to that host's API with the
shared token (:class:`Peers`). A host whose lease lapsed is *unreachable*: its terminals read
``host_unreachable``, their mail waits (never failed by itself), nobody else delivers for them.

Time: every host's clock is corrected by the database server's (:class:`StoreClock`), so leases,
deadlines and timestamps written by different hosts agree however far off a host's own clock is.

Fencing: a host renews its lease only while its row still names its own ``instance`` (a random
token per process). A process that lost its name (an operator failed the host, or the name was
taken on the same machine by a restart) stops: it can't renew, and its claims are refused inside
the claim's own transaction (cao/store/base.py ``_holds_receiver``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cao import peerauth
from cao.clock import Clock
from cao.errors import CaoError, Conflict, HostUnreachable, InvalidInput, NotFound
from cao.names import quote_segment
from cao.settings import Settings
from cao.states import ENDED, HostState, Status, WaitReason
from cao.store import Host, Store, Terminal
from cao.store.hosts import NameHeld
from cao.store.schema import SCHEMA_VERSION

logger = logging.getLogger(__name__)

FORWARD_TIMEOUT = 75.0  # typed input waits up to a minute there for a starting agent
READ_TIMEOUT = 10.0  # a view, an output, a listing: answered at once by a host that is well
CONNECT_TIMEOUT = 3.0
QUIET_AFTER_FAILURE = 3.0  # a host that did not answer is not asked again for this long
PER_HOST_REQUESTS = 8  # requests waiting on one other host at once (a hung one holds no more threads)
# how hosts talk to each other: 2 = requests signed for the host they are meant for
# (cao/peerauth.py) and every write fenced; a host refuses to join hosts that speak another one
PEER_PROTOCOL = 2
OWN_ADDRESS_WAIT = 30.0  # seconds a starting host waits for its own API to answer at its address
CLOCK_SAMPLES = 8  # the clock's anchor is the one of the fastest of the last samples
CLOCK_TOLERANCE = 0.05  # seconds two samples may disagree beyond their round trips (drift, jitter)


class StoreClock(Clock):
    """The database server's clock, as this host follows it: after the first sample, the server's
    time at that sample plus this host's *monotonic* time since (``anchor``: the server's time
    minus the monotonic clock). A step of this host's wall clock (NTP correcting an hour, a VM
    resumed) never moves the time it writes; a monotonic clock that stood still while the machine
    slept is set right by the first sample after (``Hosts.measure_clock``); before any sample, it
    is the wall clock."""

    def __init__(self, base: Clock) -> None:
        self.base = base
        self.anchor: float | None = None

    def now(self) -> float:
        anchor = self.anchor
        return self.base.now() if anchor is None else self.base.monotonic() + anchor

    def monotonic(self) -> float:
        return self.base.monotonic()

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)


def machine_id(home_tag: str) -> str:
    """Where a host runs: the machine's id and the ``CAO_HOME`` it serves (its tag)."""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path) as f:
                ident = f.read().strip()
        except OSError:
            continue
        if ident:
            return f"{ident[:16]}:{home_tag}"
    import socket

    return f"{socket.gethostname()}:{home_tag}"


def alive(host: Host, now: float) -> bool:
    return host.state == HostState.UP and host.lease_until > now


def host_view(host: Host, now: float, *, me: str | None, agents: int) -> dict[str, Any]:
    # the host answering is alive whatever its row says (a SQLite file's one host renews nothing)
    up = alive(host, now) or (host.name == me and host.state == HostState.UP)
    return {
        "name": host.name,
        "url": host.url,
        "version": host.version,
        "schema_version": host.schema_version,
        "state": host.state if not (host.state == HostState.UP and not up) else "lapsed",
        "alive": up,
        "this_host": host.name == me,
        "pid": host.pid,
        "started_at": host.started_at,
        "heartbeat_age": round(max(0.0, now - host.heartbeat_at), 3),
        "lease_left": round(host.lease_until - now, 3),
        "agents": agents,
        "note": host.note,
    }


def peer_address(url: str) -> str | None:
    """``url`` as the base other hosts' requests are appended to — ``scheme://name[:port]``,
    lowercased — or None when it is anything more: a path, a query, a fragment or credentials in
    it would let whoever wrote it choose what a forwarded request does (``…/input?x=`` swallows
    the path that follows)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "?" in url
        or "#" in url
        or any(ch.isspace() or ord(ch) < 32 for ch in url)
    ):
        return None
    name = parts.hostname.lower()
    name = f"[{name}]" if ":" in name else name
    return f"{parts.scheme.lower()}://{name}" + (f":{port}" if port is not None else "")


def _detail(body: bytes) -> str:
    """The ``detail`` of a JSON error answer, short; else its first bytes."""
    try:
        return str(json.loads(body).get("detail"))[:300]
    except (ValueError, AttributeError):
        return repr(body[:200])


class Peers:
    """HTTP to the other hosts' APIs (a peer's URL comes from its own row). Each request is signed
    with the shared token (cao/peerauth.py): the token itself is never sent to a URL read from the
    database."""

    def __init__(self, settings: Settings, now: Callable[[], float]) -> None:
        import httpx

        self.token = settings.api_token
        self.now = now  # the database-corrected clock: the peer checks the signature's time by it
        headers = {"X-Cao-Forwarded": "1"}
        self._quiet: dict[str, tuple[float, str]] = {}  # host -> (not asked again until, why)
        self._slots: dict[str, threading.BoundedSemaphore] = {}  # host -> requests it may have at once
        self._guard = threading.Lock()
        self.client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(FORWARD_TIMEOUT, connect=CONNECT_TIMEOUT),
            trust_env=False,  # a peer is reached directly, never through an HTTP proxy
            follow_redirects=False,
        )

    def request(
        self,
        host: Host,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes, str]:
        """One request to ``host``: (status, body, content type). :class:`HostUnreachable` when it
        does not answer — and for the next few seconds without asking again: a host that hangs
        costs one wait, not one per request (every thread of ours would wait on it otherwise)."""

        quiet = self._quiet.get(host.name)
        if quiet is not None and time.monotonic() < quiet[0]:
            raise HostUnreachable(quiet[1])
        with self._guard:
            slots = self._slots.setdefault(host.name, threading.BoundedSemaphore(PER_HOST_REQUESTS))
        if not slots.acquire(blocking=False):  # that many already wait on it: a host that hangs
            raise HostUnreachable(
                f"host {host.name} ({host.url}) has {PER_HOST_REQUESTS} requests of this host waiting for "
                "it already; nothing was sent. Retry in a moment (`cao hosts` shows whether it is up)"
            )
        try:
            return self._send(host, method, path, params, body, content_type, timeout)
        finally:
            slots.release()

    def _send(
        self,
        host: Host,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        timeout: float | None,
    ) -> tuple[int, bytes, str]:
        import httpx

        headers = {"Content-Type": content_type} if content_type else {}
        if timeout is None:  # a read answers at once; typed input may wait for a starting agent
            timeout = READ_TIMEOUT if method == "GET" else FORWARD_TIMEOUT
        base = peer_address(host.url)
        if base is None:  # a row written by hand (or by someone else): never a base to append to
            raise HostUnreachable(
                f"host {host.name}'s address in the store, {host.url[:200]!r}, is not a plain "
                "http(s)://name:port address; nothing was sent. That host writes its own row from "
                "CAO_SERVER_URL at start"
            )
        try:
            request = self.client.build_request(
                method, base + path, params=params, content=body, headers=headers, timeout=timeout
            )
            if self.token is not None:
                request.headers[peerauth.HEADER] = peerauth.sign(
                    self.token,
                    method,
                    request.headers["host"],
                    request.url.raw_path,
                    body or b"",
                    self.now(),
                    to=host.name,
                )
            r = self.client.send(request)
        except httpx.HTTPError as exc:
            why = (
                f"host {host.name} ({host.url}) did not answer: {type(exc).__name__}: "
                f"{str(exc)[:200] or 'no answer'}; nothing was done there that cao knows of. Retry once it "
                "is back (`cao hosts` shows it)"
            )
            self._quiet[host.name] = (time.monotonic() + QUIET_AFTER_FAILURE, why)
            raise HostUnreachable(why) from None
        self._quiet.pop(host.name, None)
        if r.status_code == 401:
            raise HostUnreachable(
                f"host {host.name} ({host.url}) refused this host's signed request: {_detail(r.content)}"
            )
        return r.status_code, r.content, r.headers.get("content-type", "application/json")

    def get_json(self, host: Host, path: str, *, params: Mapping[str, str] | None = None) -> Any:
        import json

        status, body, _ = self.request(host, "GET", path, params=params, timeout=5.0)  # a listing waits
        if status != 200:
            raise HostUnreachable(f"host {host.name} answered {status} to GET {path}: {body[:200]!r}")
        return json.loads(body)

    def close(self) -> None:
        self.client.close()


@dataclass
class Hosts:
    settings: Settings
    store: Store
    clock: Clock  # a StoreClock on a shared store: corrected at every heartbeat
    home_tag: str
    version: str
    on_wake: Callable[[list[str]], None] = lambda _ids: None
    on_fenced: Callable[[str], None] = lambda _why: None

    def __post_init__(self) -> None:
        self.name = self.settings.host_name
        self.instance = secrets.token_hex(8)
        self.machine = machine_id(self.home_tag)
        self.fenced: str | None = None  # why this process may no longer act for its name
        self._losing = False  # a write found the name lost: a fence is on its way
        self._guard = threading.Lock()
        self.peers = Peers(self.settings, self.clock.now)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._owners: dict[str, str | None] = {}  # terminal id -> host (never changes)
        self.shared = self.store.path is None  # PostgreSQL: other hosts may share the store
        self._samples: list[tuple[float, float]] = []  # (round trip, anchor) of the last clock samples
        self._rows: dict[str, Host] = {}  # host rows, as down_reason last read them
        self._rows_read = float("-inf")

    # -- time --------------------------------------------------------------------------------------
    def measure_clock(self) -> None:
        """Correct this host's clock by the database server's (half the round trip as the error)."""
        if not isinstance(self.clock, StoreClock):
            return
        sample = self.store.server_time(self.clock.base.monotonic)
        if sample is None:
            return
        before, server, after = sample
        # the fastest recent round trip says the most about the time (its error is half of it).
        # Samples are taken against the monotonic clock, so a step of the wall clock between them
        # changes none of them; the oldest go, so the monotonic clock's drift never adds up. An
        # older sample the newest contradicts (the two error bars apart) goes at once: the
        # monotonic clock stood still while the machine slept, or the database's clock was set.
        rtt, anchor = after - before, server - (before + after) / 2
        self._samples = [
            (r, a) for r, a in self._samples if abs(a - anchor) <= (r + rtt) / 2 + CLOCK_TOLERANCE
        ]
        self._samples.append((rtt, anchor))
        del self._samples[:-CLOCK_SAMPLES]
        self.clock.anchor = min(self._samples)[1]

    # -- life --------------------------------------------------------------------------------------
    def register(self) -> Host | None:
        """Take this host's name in the store (409 when another process holds it, see
        store/hosts.py); from now on the store's engine queries see only this host's terminals."""
        url = self.settings.server_url
        if self.shared:
            address = peer_address(url)
            if address is None:
                raise InvalidInput(
                    f"CAO_SERVER_URL={url[:200]!r} is not a plain http(s)://name:port address (no path, "
                    "query or credentials); the other hosts sharing the store send their requests to it"
                )
            url = address
        self.measure_clock()
        me = self._row(url, self.clock.now())
        prev = self._take_name(me)
        if self.shared:  # a SQLite file has one host: nothing to scope, nothing to fence
            self.store.host = self.name
            self.store.host_instance = self.instance
            self.store.on_host_lost = self._lost
        logger.info(
            "host registered",
            extra={
                "host": self.name,
                "url": me.url,
                "took_over": prev is not None and prev.instance != me.instance,
            },
        )
        return prev

    def _row(self, url: str, now: float) -> Host:
        """This process's host row, as it registers at ``now``."""
        return Host(
            name=self.name,
            instance=self.instance,
            machine=self.machine,
            url=url,
            version=self.version,
            schema_version=SCHEMA_VERSION,
            pid=os.getpid(),
            started_at=now,
            heartbeat_at=now,
            lease_until=now + self.settings.host_lease,
            state=HostState.UP.value,
            note=None,
            protocol=PEER_PROTOCOL,
        )

    def _take_name(self, me: Host) -> Host | None:
        """Register; while the name's lease is live, wait for it to lapse if its holder's heartbeat
        has stopped (a restart after a crash), refuse at once if it goes on (another process)."""
        first: Host | None = None
        while True:
            try:
                return self.store.register_host(me)
            except NameHeld as exc:
                held = exc.holder
                if first is None:
                    first = held
                    logger.warning(
                        "host name held by another process; waiting for its lease to lapse",
                        extra={
                            "host": self.name,
                            "pid": held.pid,
                            "lease_left": held.lease_until - self.clock.now(),
                        },
                    )
                elif held.instance != first.instance or held.heartbeat_at > first.heartbeat_at:
                    raise Conflict(exc.message) from None  # its heartbeat goes on: a live holder
                self.clock.sleep(
                    min(self.settings.host_heartbeat, max(0.05, held.lease_until - self.clock.now()))
                )
                me.started_at = me.heartbeat_at = self.clock.now()
                me.lease_until = me.started_at + self.settings.host_lease

    def start(self) -> None:
        if not self.shared:
            return  # one host on a SQLite file: nothing to renew, nobody to hear from
        for target, name in (
            (self._heartbeat_loop, "cao-heartbeat"),
            (self._listen, "cao-wakes"),
            (self._check_own_address, "cao-own-address"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _check_own_address(self) -> None:
        """Ask this host's own CAO_SERVER_URL who answers there, once the API listens: another
        cao-server (two hosts given one address, spelled differently: ``localhost`` and
        ``127.0.0.1``) means the others would send this host's requests to it, so this one stops,
        saying why. An address this host can't reach itself is only warned about."""
        import json

        url = peer_address(self.settings.server_url) or self.settings.server_url
        me = self._row(url, 0.0)
        deadline = time.monotonic() + OWN_ADDRESS_WAIT
        last = ""
        while not self._stop.wait(0.25) and time.monotonic() < deadline:
            try:
                status, body, _ = self.peers.request(me, "GET", "/info", timeout=5.0)
            except HostUnreachable as exc:
                refused_by = re.search(r"not signed for host (\S+) with", exc.message)
                if refused_by is not None and refused_by[1] != self.name:  # another host answers
                    self.fence(
                        f"CAO_SERVER_URL {url} reaches host {refused_by[1]}, not this one: every host needs "
                        "its own address (the others would send this host's requests there)"
                    )
                    return
                if refused_by is not None:  # this host, through something that changed the request
                    logger.warning(
                        "this host refused its own signed request at its CAO_SERVER_URL: a proxy in front "
                        "of it changes the request (keep its Host header: nginx `proxy_set_header Host "
                        "$host`); the other hosts' requests will be refused the same way",
                        extra={"url": url},
                    )
                    return
                last = exc.message
                continue
            if status != 200:  # not an answer about who this is (starting, busy): ask again
                last = f"HTTP {status}: {body[:200]!r}"
                continue
            try:
                info = json.loads(body)
            except ValueError:
                info = {}
            if isinstance(info, dict) and info.get("host_instance") == self.instance:
                return
            info = info if isinstance(info, dict) else {}
            self.fence(
                f"CAO_SERVER_URL {url} reaches another cao-server (host {info.get('host')!r}, HTTP "
                f"{status}), not this one: every host needs its own address (the others would send this "
                "host's requests there)"
            )
            return
        if not self._stop.is_set():
            logger.warning(
                "this host can't reach its own CAO_SERVER_URL; the other hosts may not reach it either",
                extra={"url": url, "error": last[:300]},
            )

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.fenced is None and self.store.host is not None:
            try:
                self.store.stop_host(self.name, self.instance)
            except CaoError:
                logger.warning("host not marked stopped (the store did not answer); its lease lapses")
        self.peers.close()

    def heartbeat(self) -> bool:
        """One renewal (the loop's step): False once this process lost its name."""
        if self.fenced is not None:
            return False
        try:
            self.measure_clock()
            version = self.store.schema_version()
            if version > SCHEMA_VERSION:  # a newer cao moved the store on while this one was away
                self.fence(
                    f"the store was moved to schema {version} by a newer cao; this cao understands up to "
                    f"{SCHEMA_VERSION}: upgrade it, then start it again"
                )
                return False
            if self.store.renew_host(self.name, self.instance, self.settings.host_lease):
                return True
        except CaoError as exc:
            logger.warning("host lease not renewed (the store did not answer)", extra={"error": exc.message})
            return True  # nobody can take the name while the store is away; the claim fences anyway
        try:
            row = self.store.get_host(self.name)
            why = (
                f"host {self.name} was failed by an operator ({row.note})"
                if row.state == HostState.FAILED
                else f"host name {self.name} was taken by another cao-server (pid {row.pid}, {row.url})"
            )
        except CaoError:
            why = f"host {self.name}'s row is gone from the store"
        self.fence(why)
        return False

    def _lost(self) -> None:
        """A write found the row no longer names this process: find out why and fence, on a thread
        of its own (the writer holds a transaction, and fencing stops the engine it may run in)."""
        with self._guard:
            if self._losing or self.fenced is not None:
                return
            self._losing = True
        threading.Thread(target=self.heartbeat, name="cao-fence", daemon=True).start()

    def fence(self, why: str) -> None:
        with self._guard:
            first, self.fenced = self.fenced is None, self.fenced or why
        if first:
            logger.error("this cao-server lost its host name; it stops acting for it", extra={"reason": why})
            self.on_fenced(why)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.host_heartbeat):
            if not self.heartbeat():
                return

    def _listen(self) -> None:
        self.store.listen_wakes(self._heard, self._stop)

    def _heard(self, receiver_ids: list[str]) -> None:
        mine = [rid for rid in receiver_ids if self.owner(rid) == self.name]
        if mine or not receiver_ids:
            self.on_wake(mine)

    # -- who owns what -----------------------------------------------------------------------------
    def owner(self, terminal_id: str) -> str | None:
        """The host a terminal belongs to (cached: it never changes); None when unknown."""
        if terminal_id in self._owners:
            return self._owners[terminal_id]
        try:
            host = self.store.host_of(terminal_id)
        except CaoError:
            return None
        if host is not None:
            self._owners[terminal_id] = host
        return host

    def is_foreign(self, terminal: Terminal | str) -> bool:
        if not self.shared:
            return False  # a SQLite file has one host: no read on the hot path
        host = terminal.host if isinstance(terminal, Terminal) else self.owner(terminal)
        return host is not None and host != self.name

    def needs_owner(self, terminal_id: str, view: bool = False) -> bool:
        """A request about another host's terminal that only that host can answer (cao/forward.py);
        ``view``: the terminal's view, which an ended terminal's row answers here."""
        if not self.is_foreign(terminal_id):
            return False
        try:
            terminal = self.store.get_terminal(terminal_id, include_deleted=True)
        except CaoError:
            return False
        return not (view and terminal.state in ENDED) and self.owner_serves(terminal)

    def owner_serves(self, terminal: Terminal) -> bool:
        """Another host's terminal whose host serves it: a pane operation on it goes there. Also
        once it ended: its worktree, logs and CLI records are on that host's disk, so deleting it
        (its unsaved work committed), its diff, merge, explain and usage are that host's to answer —
        unless an operator failed the host (nothing of it is reachable: the row is answered, and
        deleted, here)."""
        if not self.is_foreign(terminal):
            return False
        if terminal.state not in ENDED:
            return True
        try:
            return terminal.host is not None and self.store.get_host(terminal.host).state != HostState.FAILED
        except CaoError:
            return False

    def peer(self, name: str) -> Host:
        """Another host's row, to reach it: :class:`HostUnreachable` when its lease lapsed."""
        try:
            host = self.store.get_host(name)
        except NotFound:
            raise InvalidInput(self.unknown_host(name)) from None
        if not alive(host, self.clock.now()):
            raise HostUnreachable(self.down_message(host))
        return host

    def unknown_host(self, name: str) -> str:
        known = ", ".join(h.name for h in self.store.list_hosts()) or "none"
        return f"host {name!r} is not one of this store's hosts ({known}); see `cao hosts`"

    def down_message(self, host: Host) -> str:
        now = self.clock.now()
        if host.state == HostState.FAILED:
            return f"host {host.name} was failed by an operator ({host.note}); its terminals are gone"
        since = f"its heartbeat stopped {max(0.0, now - host.heartbeat_at):.0f} s ago"
        if host.state == HostState.STOPPED:
            since = "its cao-server was stopped"
        return (
            f"host {host.name} ({host.url}) is unreachable: {since}. Its terminals' mail waits for it "
            "(nothing is failed); start its cao-server again, or give up on it with "
            f"`cao hosts fail {host.name}`"
        )

    def down_reason(self, terminal_id: str) -> str | None:
        """Why another host's terminal can't be reached now (its lease lapsed, it stopped or was
        failed), else None. Host rows are read at most once a second for a listing's many rows."""
        if not self.shared:
            return None
        host = self.owner(terminal_id)
        if host is None or host == self.name:
            return None
        now, read_at = self.clock.now(), self.clock.monotonic()
        if read_at - self._rows_read > 1.0:
            self._rows = {h.name: h for h in self.store.list_hosts()}
            self._rows_read = read_at
        row = self._rows.get(host)
        if row is None or alive(row, now):
            return None
        return f"{WaitReason.HOST_UNREACHABLE.value}: {self.down_message(row)}"

    # -- asking another host ----------------------------------------------------------------------
    def ask(self, name: str, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """One JSON request to host ``name``; its error answer raised as it came (status, words)."""
        host = self.peer(name)
        body = None if payload is None else json.dumps(payload).encode()
        status, content, _ = self.peers.request(
            host, method, path, body=body, content_type="application/json" if body else None
        )
        try:
            data = json.loads(content) if content else {}
        except ValueError:
            data = {"detail": content[:200].decode("utf-8", "replace")}
        if status >= 400:
            detail = data.get("detail") if isinstance(data, dict) else None
            err = CaoError(f"host {name}: {detail if isinstance(detail, str) else data}")
            err.status_code = status
            raise err
        return data

    def create_on(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        """A terminal created by host ``name`` (its tmux runs it): a new session, or one more
        terminal in ``params['session_name']`` when ``new_session`` is false."""
        params = {k: v for k, v in params.items() if v is not None}
        new_session = params.pop("new_session", True)
        if new_session:
            return dict(self.ask(name, "POST", "/sessions", params))
        session = str(params.pop("session_name"))
        return dict(self.ask(name, "POST", f"/sessions/{quote_segment(session)}/terminals", params))

    def not_a_loop(self, name: str, forwarded: bool) -> None:
        """A request another host forwarded here for host ``name`` must be for this one: else that
        host's URL leads here (a misconfigured ``CAO_SERVER_URL``) and forwarding it on would loop."""
        if forwarded and name != self.name:
            raise Conflict(
                f"a request for host {name} reached host {self.name}: {name}'s URL leads here. Every host "
                "needs its own CAO_SERVER_URL (the address the others reach it at); see `cao hosts`"
            )

    def delete_session_on(self, name: str, session: str) -> list[str]:
        """Host ``name`` deletes its terminals of ``session`` (only its own): their ids."""
        done = self.ask(name, "DELETE", f"/sessions/{quote_segment(session)}?host={name}")
        return [str(t) for t in done.get("deleted_terminals", [])]

    # -- statuses of other hosts' terminals --------------------------------------------------------
    def remote_statuses(self, terminals: Sequence[Terminal]) -> dict[str, str]:
        """Live statuses of other hosts' terminals: one request per host (its own batched look);
        ``host_unreachable`` for a host that is down or does not answer."""
        by_host: dict[str, list[Terminal]] = {}
        for t in terminals:
            by_host.setdefault(str(t.host), []).append(t)

        def ask(name: str) -> dict[str, str]:
            try:
                listing = self.peers.get_json(self.peer(name), "/terminals", params={"host": name})
            except CaoError as exc:
                logger.debug("remote statuses not read", extra={"host": name, "error": exc.message})
                return {}
            return {str(v.get("id")): str(v.get("status")) for v in listing if isinstance(v, dict)}

        if len(by_host) == 1:
            answers = {name: ask(name) for name in by_host}
        else:  # every host at once: one that is slow to answer delays the listing once, not per host
            with ThreadPoolExecutor(max_workers=min(8, len(by_host))) as pool:
                answers = dict(zip(by_host, pool.map(ask, by_host), strict=True))
        out: dict[str, str] = {}
        for name, rows in by_host.items():
            for t in rows:
                out[t.id] = answers[name].get(t.id) or Status.HOST_UNREACHABLE.value
        return out

    def listing(self) -> list[dict[str, Any]]:
        now = self.clock.now()
        counts = self.store.host_terminal_counts()
        return [
            host_view(h, now, me=self.name, agents=counts.get(h.name, 0)) for h in self.store.list_hosts()
        ]
