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

from cao.delivery import Delivery, DeliveryEngine
from cao.errors import InvalidInput
from cao.settings import Settings
from cao.store import Message, Store
from cao.terminals import Terminals, validate_terminal_id
from cao.tmux import Tmux

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
        self.terminals = Terminals(
            settings, self.store, self.tmux, environ=environ or os.environ, clock=clock
        )
        self.delivery = Delivery(settings, self.store, self.terminals, clock=clock)
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
        if sender_id == receiver_id:
            raise InvalidInput(
                f"terminal {receiver_id} can't send a message to itself; pick another receiver"
            )
        message, duplicate = self.store.add_message(
            sender_id=sender_id,
            receiver_id=receiver_id,
            body=body,
            idempotency_key=idempotency_key,
            before_commit=lambda: self.delivery.faults.hit("before_commit"),
        )
        self.delivery.faults.hit("after_commit")
        if not duplicate and self.started:
            self.engine.immediate(receiver_id)
        return Receipt(message, duplicate)

    def message_view(self, message: Message) -> dict[str, object]:
        waiting = self.delivery.waiting.get(message.receiver_id) if message.status == "pending" else None
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
            "waiting_reason": waiting[0] if waiting else None,
        }
