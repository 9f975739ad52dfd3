"""The orchestrator as a library: one object that owns the store, tmux, terminals and delivery.

``cao-server`` wraps it in HTTP; tests use it directly. Construction has no side effects beyond
opening the database; ``start()`` adopts surviving panes, resolves interrupted deliveries and
starts the triggers; ``stop()`` stops them (terminals keep running: they belong to tmux).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import providers
from cao.delivery import Delivery, Faults
from cao.engine import DeliveryEngine
from cao.errors import InvalidInput, NotFound
from cao.settings import Settings
from cao.states import MessageStatus
from cao.store import MESSAGE_STATUSES, Message, Store
from cao.terminals import Terminals, is_blank, validate_terminal_id
from cao.tmux import Tmux, session_name_for

logger = logging.getLogger(__name__)

SENDER_RE_HINT = "a terminal id (8 hex digits) or a name like 'cli' or 'operator'"


@dataclass(frozen=True)
class Receipt:
    message: Message
    duplicate: bool

    def as_dict(self) -> dict[str, object]:
        m = self.message
        return {
            "message_id": m.id,
            "sender_id": m.sender_id,
            "receiver_id": m.receiver_id,
            "status": m.status,
            "created_at": m.created_at,
            "duplicate": self.duplicate,
        }


def validate_sender(sender_id: str) -> str:
    if not sender_id or len(sender_id) > 64 or not all(c.isalnum() or c in "-_." for c in sender_id):
        raise InvalidInput(f"sender_id {sender_id!r} is not valid; use {SENDER_RE_HINT}")
    return sender_id


class Cao:
    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        settings.ensure_dirs()
        self.settings = settings
        self.clock = clock
        self.store = Store(settings.db_path, busy_timeout=settings.busy_timeout, clock=clock)
        self.tmux = Tmux(settings.tmux_socket)
        self.faults = Faults(settings.fault_point)
        self.terminals = Terminals(
            settings, self.store, self.tmux, environ=environ or os.environ, clock=clock, fault=self.faults.hit
        )
        self.delivery = Delivery(settings, self.store, self.terminals, clock=clock, faults=self.faults)
        self.engine = DeliveryEngine(self.delivery, clock=clock)
        self.started = False

    def start(self) -> dict[str, list[str]]:
        adopted = self.terminals.adopt()
        self.engine.start()
        self.started = True
        logger.info("cao started", extra={"adopted": len(adopted["adopted"]), "gone": len(adopted["gone"])})
        return adopted

    def stop(self) -> None:
        if self.started:
            self.engine.stop()
            self.started = False
        self.store.close()

    # -- the inbox ------------------------------------------------------------------------------
    def send_message(
        self, receiver_id: str, body: str, *, sender_id: str = "cli", idempotency_key: str | None = None
    ) -> Receipt:
        """Commit a message, then wake delivery (the caller never waits for tmux)."""
        validate_terminal_id(receiver_id)
        validate_sender(sender_id)
        if idempotency_key is not None and not (1 <= len(idempotency_key) <= 200):
            raise InvalidInput("idempotency_key must be 1-200 characters")
        if is_blank(body):
            raise InvalidInput("message is empty (only whitespace or invisible characters); send some text")
        if sender_id == receiver_id:
            raise InvalidInput(
                f"terminal {receiver_id} can't send a message to itself; pick another receiver"
            )
        message, duplicate = self.store.add_message(
            sender_id=sender_id,
            receiver_id=receiver_id,
            body=body,
            idempotency_key=idempotency_key,
            before_commit=lambda: self.faults.hit("before_commit"),
        )
        self.faults.hit("after_commit")
        if not duplicate and self.started:
            self.engine.immediate(receiver_id)
        return Receipt(message, duplicate)

    def message_view(self, message: Message) -> dict[str, object]:
        waiting = message.waiting_reason if message.status == MessageStatus.PENDING else None
        return {
            "id": message.id,
            "message_id": message.id,
            "sender_id": message.sender_id,
            "receiver_id": message.receiver_id,
            "status": message.status,
            "message": message.body,
            "idempotency_key": message.idempotency_key,
            "created_at": message.created_at,
            "claimed_at": message.claimed_at,
            "delivered_at": message.delivered_at,
            "attempts": message.attempts,
            "last_error": message.last_error,
            "waiting_reason": waiting,
        }

    def list_inbox(
        self, terminal_id: str, *, status: str | None = None, limit: int = 50
    ) -> list[dict[str, object]]:
        validate_terminal_id(terminal_id)
        _check_listing(status, limit)
        self.store.get_terminal(terminal_id, include_deleted=True)
        rows = self.store.list_messages(receiver_id=terminal_id, status=status, limit=limit)
        return [self.message_view(m) for m in rows]

    def list_messages(self, *, status: str | None = None, limit: int = 50) -> list[dict[str, object]]:
        _check_listing(status, limit)
        return [self.message_view(m) for m in self.store.list_messages(status=status, limit=limit)]

    def get_message(self, message_id: int) -> dict[str, object]:
        return self.message_view(self.store.get_message(message_id))

    def cancel_message(self, message_id: int) -> dict[str, object]:
        return self.message_view(self.store.cancel(message_id))

    # -- terminals and sessions (what the HTTP routes call) ---------------------------------------
    def create_terminal(self, **kwargs: Any) -> dict[str, object]:
        terminal = self.terminals.create(**kwargs)
        return self.terminals.view(terminal).as_dict()

    def terminal_view(self, terminal_id: str) -> dict[str, object]:
        return self.terminals.view(self.terminals.get(terminal_id)).as_dict()

    def list_terminals(self, session_name: str | None = None) -> list[dict[str, object]]:
        session = session_name_for(session_name) if session_name else None
        return [self.terminals.view(t).as_dict() for t in self.store.list_terminals(session_name=session)]

    def send_input(self, terminal_id: str, text: str) -> bool:
        return self.terminals.send_input(self.terminals.get(terminal_id), text)

    def send_key(self, terminal_id: str, key: str) -> None:
        self.terminals.send_key(self.terminals.get(terminal_id), key)

    def output(self, terminal_id: str, mode: str = "full") -> str:
        return self.terminals.output(self.terminals.get(terminal_id), mode)

    def exit_terminal(self, terminal_id: str) -> bool:
        return self.terminals.exit(self.terminals.get(terminal_id))

    def delete_terminal(self, terminal_id: str) -> int:
        return self.terminals.delete(self.terminals.get(terminal_id))

    def mcp_ready(self, terminal_id: str) -> None:
        self.terminals.note_mcp_ready(self.terminals.get(terminal_id))
        self.engine.kick(terminal_id, "mcp_ready")

    def session_view(self, name: str) -> dict[str, object]:
        session = session_name_for(name)
        rows = self.store.list_terminals(session_name=session)
        alive = self.tmux.has_session(session)
        if not rows and not alive:
            raise NotFound(f"session {session} not found; list sessions with `cao status`")
        return {
            "id": session,
            "name": session,
            "status": "active" if alive else "gone",
            "terminals": [self.terminals.view(t).as_dict() for t in rows],
        }

    def list_sessions(self) -> list[dict[str, object]]:
        live = set(self.tmux.list_sessions())
        counts: dict[str, int] = {}
        for t in self.store.list_terminals():
            counts[t.session_name] = counts.get(t.session_name, 0) + 1
        return [
            {"id": n, "name": n, "status": "active" if n in live else "gone", "terminal_count": counts[n]}
            for n in sorted(counts)
        ]

    def delete_session(self, name: str) -> list[str]:
        return self.terminals.delete_session(name)

    def info(self) -> dict[str, object]:
        s = self.settings
        return {
            "version": _version(),
            "home": str(s.home),
            "database": str(s.db_path),
            "tmux_socket": s.tmux_socket,
            "tmux_running": self.tmux.is_alive(),
            "eager_delivery": s.eager_delivery,
            "watch_interval": s.watch_interval,
            "sweep_interval": s.sweep_interval,
            "sweep_grace": s.sweep_grace,
            "providers": providers.names(),
            "messages": self.store.counts_by_status(),
            "engine": dict(self.engine.stats),
        }


def _version() -> str:
    import cao

    return cao.__version__


def _check_listing(status: str | None, limit: int) -> None:
    if status is not None and status not in MESSAGE_STATUSES:
        raise InvalidInput(f"status {status!r} is unknown; use one of {', '.join(MESSAGE_STATUSES)}")
    if not 1 <= limit <= 10000:
        raise InvalidInput("limit must be between 1 and 10000")
