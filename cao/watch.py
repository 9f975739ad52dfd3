"""``cao watch``: the fleet live in a terminal, fed by cao-server's event stream (GET /events).

A rich table of agents (status, for how long) and of the latest messages (state, why waiting),
redrawn as events arrive; ``--json`` prints the events themselves, one JSON object a line. Piped
into a file or another program (no terminal to redraw on), it prints one plain line per event
instead, and the tables once at the end. It reconnects with ``Last-Event-ID`` after a dropped
connection, so it misses nothing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click
import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from cao.states import MessageStatus, Status

if TYPE_CHECKING:
    from cao.client import Client

MESSAGE_ROWS = 12
NOTIFICATION = "notification"  # the event stream's type for a worker event (cao/coordination.py)
ATTENTION_STATUSES = (Status.WAITING_USER_ANSWER, Status.ERROR, Status.UNKNOWN)


class Watcher:
    def __init__(
        self,
        client: Client,
        *,
        as_json: bool,
        duration: float | None,
        console: Console,
        attention: bool = False,
    ) -> None:
        self.client = client
        self.attention = attention  # only what needs a person: notifications, agents waiting on one
        self.notes: list[dict[str, Any]] = []
        self.as_json = as_json
        self.deadline = None if duration is None else time.monotonic() + duration
        self.console = console
        self.terminals: dict[str, dict[str, Any]] = {}
        self.since: dict[str, float] = {}
        self.messages: dict[int, dict[str, Any]] = {}
        self.last_id: str | None = None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def load(self) -> None:
        self.terminals = {t["id"]: t for t in self.client.get("/terminals")}
        for tid in self.terminals:
            self.since.setdefault(tid, time.time())
        rows = self.client.get("/messages", params={"limit": MESSAGE_ROWS})
        self.messages = {m["id"]: m for m in rows}
        if self.attention:
            self.notes = self.client.get("/notifications", params={"limit": MESSAGE_ROWS})

    @property
    def lines(self) -> bool:
        """No terminal to redraw tables on: a plain line per event (and the tables at the end)."""
        return not self.as_json and not self.console.is_terminal

    def run(self) -> None:
        if not self.as_json:
            self.load()
        redraw = not self.as_json and not self.lines
        live = Live(self.render(), console=self.console, auto_refresh=False) if redraw else None
        if live is not None:
            live.start()
        try:
            while not self.expired():
                self.follow(live)
        except KeyboardInterrupt:
            pass
        finally:
            if live is not None:
                live.update(self.render(), refresh=True)
                live.stop()
            elif self.lines:
                self.console.print(self.render())

    def follow(self, live: Live | None) -> None:
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        try:
            with self.client.http.stream(
                "GET",
                "/events",
                params={"keepalive": 1},
                headers=headers,
                timeout=httpx.Timeout(10.0, read=5.0),
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise click.ClickException(
                        f"{resp.json().get('detail', resp.text)} (HTTP {resp.status_code})"
                    )
                data: list[str] = []
                for line in resp.iter_lines():
                    if line.startswith("data:"):
                        data.append(line[5:].strip())
                    elif line == "" and data:
                        self.handle(json.loads("".join(data)))
                        data = []
                    if live is not None:
                        live.update(self.render(), refresh=True)
                    if self.expired():
                        return
        except httpx.ReadTimeout:
            return  # reconnect (with Last-Event-ID)
        except httpx.TransportError:
            raise click.ClickException(
                f"cao-server is not reachable at {self.client.base_url}; start it with `cao-server`"
            ) from None

    def handle(self, event: dict[str, Any]) -> None:
        self.last_id = event["id"]
        kind = event["type"]
        if self.attention and kind != NOTIFICATION and not kind.startswith(("terminal.", "stream.")):
            return
        if self.as_json:
            if not self.attention or kind == NOTIFICATION:
                click.echo(json.dumps(event, ensure_ascii=False))
            return
        if self.lines and not kind.startswith("stream.") and (not self.attention or kind == NOTIFICATION):
            self.console.print(event_line(event), highlight=False, soft_wrap=True)
        if kind == NOTIFICATION:
            self.notes = [*self.notes, {**event, "id": event.get("notification_id")}][-MESSAGE_ROWS:]
            return
        if kind == "terminal.status" and event["terminal_id"] in self.terminals:
            self.terminals[event["terminal_id"]]["status"] = event["status"]
            self.since[event["terminal_id"]] = event["t"]
        elif kind.startswith(("terminal.", "message.", "stream.")):
            self.load()

    def render(self) -> Group:
        if self.attention:
            return self.render_attention()
        agents = Table(title="agents", expand=True)
        for col in ("terminal", "session", "provider", "profile", "status", "for"):
            agents.add_column(col)
        from cao.cli import _styled

        now = time.time()
        for t in self.terminals.values():
            agents.add_row(
                t["id"],
                t["session_name"],
                t["provider"],
                t["agent_profile"],
                _styled(t["status"]),
                f"{max(0, now - self.since.get(t['id'], now)):.0f}s",
            )
        mail = Table(title="latest messages", expand=True)
        for col in ("id", "sender → receiver", "state", "why / error", "attempts"):
            mail.add_column(col)
        for m in sorted(self.messages.values(), key=lambda m: -int(m["id"]))[:MESSAGE_ROWS]:
            why = (
                m.get("waiting_reason")
                or (m.get("last_error") if m["status"] != MessageStatus.DELIVERED else "")
                or ""
            )
            mail.add_row(
                f"#{m['id']}",
                f"{m['sender_id']} → {m['receiver_id']}",
                _styled(m["status"]),
                why,
                str(m["attempts"]),
            )
        return Group(agents, mail)

    def render_attention(self) -> Group:
        """Who waits for a person (a prompt, a failure) now, and the latest worker events."""
        from cao.cli import _styled
        from cao.clicoord import notifications_table

        now = time.time()
        waiting = Table(title="needs a person now", expand=True)
        for col in ("terminal", "session", "profile", "status", "for", "why"):
            waiting.add_column(col)
        for t in self.terminals.values():
            if t["status"] in ATTENTION_STATUSES:
                waiting.add_row(
                    t["id"],
                    t["session_name"],
                    t["agent_profile"],
                    _styled(t["status"]),
                    f"{max(0, now - self.since.get(t['id'], now)):.0f}s",
                    t.get("status_reason") or "",
                )
        return Group(waiting, notifications_table(list(reversed(self.notes)), title="latest worker events"))


def event_line(event: dict[str, Any]) -> str:
    """One event as a line a person reads in a log: ``12:00:01 message.delivered #7 → 1a2b3c4d``."""
    at = time.strftime("%H:%M:%S", time.localtime(float(event.get("t") or time.time())))
    who = event.get("terminal_id") or event.get("receiver_id") or ""
    ids = event.get("message_ids") or ([event["message_id"]] if event.get("message_id") else [])
    parts = [at, str(event["type"])]
    if ids:
        parts.append(" ".join(f"#{i}" for i in ids))
    if who:
        parts.append(f"→ {who}" if ids else str(who))
    if event.get("key"):  # board.set: which fact, which version, by whom
        gone = " (deleted)" if event.get("deleted") else ""
        version = f"v{event.get('version')}{gone}"
        parts.append(f"{event.get('session_name')} {event['key']} {version} by {event.get('writer')}")
    for key in ("status", "reason", "error"):
        if event.get(key):
            parts.append(f"{key}={event[key]}")
    return " ".join(parts)
