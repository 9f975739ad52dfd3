"""Host rows: the cao-servers sharing one store, their leases, and which terminals each one owns
(cao/hosts.py runs them; docs/multi-host.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cao.errors import Conflict, NotFound
from cao.states import RECEIVER_GONE, HostState
from cao.store.base import _row
from cao.store.schema import Host
from cao.store.terminals import TerminalRows


class NameHeld(Conflict):
    """The name's lease is live: its holder may still run (the caller may wait for it to lapse)."""

    def __init__(self, message: str, *, holder: Host) -> None:
        super().__init__(message)
        self.holder = holder


class HostRows(TerminalRows):
    # -- time ------------------------------------------------------------------------------------
    def server_time(self, local: Callable[[], float]) -> tuple[float, float, float] | None:
        """The database server's clock (PostgreSQL) between two readings of ``local``, taken around
        the query alone (not the wait for a connection); None for a SQLite file (its clock is ours)."""
        if self.path is not None:
            return None
        with self._read() as conn:
            before = local()
            server = float(conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0])
            return before, server, local()

    # -- registration and the lease --------------------------------------------------------------
    def register_host(self, me: Host) -> Host | None:
        """Take ``me.name`` for this process (``me.instance``), with a lease from now; the row it
        replaced, if any. Refused (409, nothing written) while another process holds the name and
        may still act for it: its lease is live, or it ran on another machine and was not failed by
        an operator (its terminals are still its own)."""
        lease = me.lease_until - me.heartbeat_at
        with self._write() as conn:
            now = self._now(conn)  # the lease runs on the database's clock, whatever this host's says
            me.heartbeat_at, me.lease_until = now, now + lease
            row = conn.execute("SELECT * FROM host WHERE name = ?", (me.name,)).fetchone()
            prev = None if row is None else _row(Host, row)
            if (
                self.path is None  # a SQLite file has one host: the lock on its home makes it so
                and prev is not None
                and prev.instance != me.instance
                and prev.state != HostState.FAILED
            ):
                if prev.machine != me.machine:
                    raise Conflict(_other_machine(prev, me, now))
                if prev.state == HostState.UP and prev.lease_until > now:
                    # the same machine id and home path, but maybe not the same machine (a cloned
                    # image, another container): only a lease that lapsed proves that process gone
                    raise NameHeld(_other_machine(prev, me, now), holder=prev)
            if self.path is None:
                others = conn.execute(
                    "SELECT name, version, protocol FROM host WHERE name != ? AND state = 'up' AND "
                    "lease_until > ? AND protocol != ? ORDER BY name",
                    (me.name, now, me.protocol),
                ).fetchall()
                if others:
                    names = ", ".join(f"{r[0]} (cao {r[1]}, peer protocol {r[2]})" for r in others)
                    raise Conflict(
                        "hosts sharing this store speak another peer protocol than this cao's "
                        f"({me.protocol}): {names}; nothing was changed. Run one cao version on every "
                        "host: stop or upgrade those first"
                    )
                same = conn.execute(
                    "SELECT name FROM host WHERE url = ? AND name != ? AND state = 'up' AND lease_until > ?",
                    (me.url, me.name, now),
                ).fetchone()
                if same is not None:
                    raise Conflict(
                        f"{me.url} is where host {same[0]} is reached; nothing was changed. Every host needs "
                        "its own CAO_SERVER_URL (the address the others reach it at)"
                    )
            values = me.model_dump()
            cols = ", ".join(values)
            marks = ", ".join(f":{k}" for k in values)
            updates = ", ".join(f"{k} = excluded.{k}" for k in values if k != "name")
            conn.execute(
                f"INSERT INTO host ({cols}) VALUES ({marks}) ON CONFLICT (name) DO UPDATE SET {updates}",
                values,
            )
            if self.path is None:
                # PostgreSQL: terminals from before hosts (schema 13) are the first host's to start.
                # (A SQLite file has one host: its terminals keep no host, so a renamed machine
                # still owns them.)
                conn.execute("UPDATE terminal SET host = ? WHERE host IS NULL", (me.name,))
        return prev

    def renew_host(self, name: str, instance: str, lease: float) -> bool:
        """Extend this process's lease; False when the row no longer names it (it lost its name:
        it must stop acting for it at once)."""
        with self._write(fence=False) as conn:
            now = self._now(conn)
            cur = conn.execute(
                "UPDATE host SET heartbeat_at = ?, lease_until = ? WHERE name = ? AND instance = ? "
                "AND state = 'up'",
                (now, now + lease, name, instance),
            )
            return bool(cur.rowcount == 1)

    def stop_host(self, name: str, instance: str) -> None:
        """A clean stop: the lease ends now (peers see it down at once); its terminals wait for it."""
        with self._write(fence=False) as conn:
            now = self._now(conn)
            conn.execute(
                "UPDATE host SET state = 'stopped_cleanly', lease_until = ?, note = 'stopped cleanly' "
                "WHERE name = ? AND instance = ? AND state = 'up'",
                (now, name, instance),
            )

    def _now(self, conn: Any) -> float:
        """The store's time: the database server's own clock inside a PostgreSQL transaction (a
        decision about another host's lease never rests on this host's clock)."""
        if self.path is not None:
            return self.clock()
        return float(conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0])

    def list_hosts(self) -> list[Host]:
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM host ORDER BY name").fetchall()
        return [_row(Host, r) for r in rows]

    def get_host(self, name: str) -> Host:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM host WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"host {name} is not known to this store; list hosts with `cao hosts`")
        return _row(Host, row)

    def host_of(self, terminal_id: str) -> str | None:
        """The host a terminal belongs to (None: not found, or a row from before hosts)."""
        with self._read() as conn:
            row = conn.execute("SELECT host FROM terminal WHERE id = ?", (terminal_id,)).fetchone()
        return None if row is None else row[0]

    def session_elsewhere(self, session_name: str) -> bool:
        """Does another host run a terminal of this session (a shared store)?"""
        if self.host is None:
            return False
        with self._read() as conn:
            row = conn.execute(
                "SELECT 1 FROM terminal WHERE session_name = ? AND host != ? "
                "AND state IN ('starting', 'live') LIMIT 1",
                (session_name, self.host),
            ).fetchone()
        return row is not None

    def host_terminal_counts(self) -> dict[str, int]:
        """Terminals not ended, per host."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT host, COUNT(*) FROM terminal WHERE state IN ('starting', 'live') GROUP BY host"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows if r[0] is not None}

    def fail_host(self, name: str, *, reason: str) -> dict[str, Any]:
        """An operator gives up on a host that is down: its terminals are gone for good, their
        undelivered mail fails (``receiver_gone``), and its name is free for another machine. A
        host whose lease is live is refused (409): stop it, or wait for its lease to lapse."""
        with self._write() as conn:
            now = self._now(conn)
            row = conn.execute("SELECT * FROM host WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"host {name} is not known to this store; list hosts with `cao hosts`")
            host = _row(Host, row)
            if host.state == HostState.UP and host.lease_until > now:
                raise Conflict(
                    f"host {name} is up (its lease runs {host.lease_until - now:.0f} s more, heartbeat "
                    f"{max(0.0, now - host.heartbeat_at):.1f} s ago); nothing was changed. Stop its "
                    "cao-server, or wait until `cao hosts` shows it down, then fail it"
                )
            ids = [
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM terminal WHERE host = ? AND state IN ('starting', 'live')", (name,)
                ).fetchall()
            ]
            failed = 0
            why = f"its host {name} was failed by an operator: {reason}"
            for tid in ids:
                conn.execute(
                    "UPDATE terminal SET state = 'gone', status = 'gone', gone_reason = ?, last_active = ? "
                    "WHERE id = ?",
                    (why, now, tid),
                )
                failed += self._fail_mail(conn, tid, f"{RECEIVER_GONE}: {why}")
            conn.execute(
                "UPDATE host SET state = 'failed', lease_until = ?, note = ? WHERE name = ?",
                (min(host.lease_until, now), reason, name),
            )
        return {"host": name, "terminals_gone": ids, "messages_failed": failed}


def _other_machine(prev: Host, me: Host, now: float) -> str:
    if prev.state == HostState.UP and prev.lease_until > now:
        ago = now - prev.heartbeat_at
        held = f"is held by a running cao-server (pid {prev.pid}, {prev.url}, heartbeat {ago:.0f} s ago)"
    else:
        held = (
            f"belongs to a cao-server on another machine or CAO_HOME ({prev.url}, {prev.state}), whose "
            "terminals are still its own"
        )
    return (
        f"host name {me.name} {held}; nothing was changed. Give this server its own name "
        f"(CAO_HOST_NAME), or, if that host is gone for good, fail it first: `cao hosts fail {me.name}` "
        "(its terminals become gone and their mail fails)"
    )
