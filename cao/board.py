"""The coordination board as the library serves it (docs/orchestration.md#the-board): a session's
versioned facts, read by anyone, written by the session's own agents or an operator.

Who writes (``by``): a terminal id that names a terminal is an agent, which writes its own
session's board only (403 otherwise); any other name (``cli``, ``dashboard``, a person's) is the
operator; no name is ``operator``. A write is published on the event stream as ``board.set``
(session, key, version, writer, deleted; never the value) and does nothing else: no paste, no
delivery woken. The store (cao/store/board.py) holds the rules and the limits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cao.errors import Forbidden, InvalidInput
from cao.events import EventBus
from cao.names import NAME_RE
from cao.store import BoardFact, Store
from cao.store.board import MAX_VERSIONS, decoded
from cao.timefmt import iso
from cao.tmux import SESSION_PREFIX, session_name_for

Actor = Callable[[str | None], tuple[str, bool]]


def fact_view(f: BoardFact) -> dict[str, object]:
    """One version of a fact as the API shows it (``value``: the JSON value; null when deleted)."""
    return {
        "session_name": f.session_name,
        "key": f.key,
        "version": f.version,
        "value": decoded(f),
        "writer": f.writer,
        "at": iso(f.at),
        "deleted": f.value is None,
    }


def board_session(name: str) -> str:
    """The tmux session a board belongs to (``name`` with or without the ``cao-`` prefix)."""
    session = session_name_for(name or "")
    if not NAME_RE.fullmatch(session.removeprefix(SESSION_PREFIX)):
        raise InvalidInput(
            f"session {name[:80]!r} is not a session name; use the name `cao status` shows (letters, "
            "digits, '_' or '-'), with or without the cao- prefix"
        )
    return session


class Board:
    def __init__(self, store: Store, events: EventBus, actor: Actor) -> None:
        self.store = store
        self.events = events
        self.actor = actor  # by → (who, is it an agent): cao/inbox.py Inbox.actor

    # -- reads: anyone ---------------------------------------------------------------------------
    def listing(self, session_name: str, *, prefix: str | None = None) -> list[dict[str, object]]:
        facts = self.store.board_list(board_session(session_name), prefix or "")
        return [fact_view(f) for f in facts]

    def get(self, session_name: str, key: str) -> dict[str, object]:
        return fact_view(self.store.board_get(board_session(session_name), key))

    def history(self, session_name: str, key: str, *, limit: int = MAX_VERSIONS) -> list[dict[str, object]]:
        facts = self.store.board_history(board_session(session_name), key, limit=limit)
        return [fact_view(f) for f in facts]

    # -- writes: the session's agents, or an operator ----------------------------------------------
    def write(
        self, session_name: str, key: str, value: Any, *, expected_version: int, by: str | None = None
    ) -> dict[str, object]:
        session = board_session(session_name)
        who = self._writer(session, by)
        return self._told(
            self.store.board_set(session, key, value, expected_version=expected_version, writer=who)
        )

    def delete(
        self, session_name: str, key: str, *, expected_version: int, by: str | None = None
    ) -> dict[str, object]:
        session = board_session(session_name)
        who = self._writer(session, by)
        return self._told(
            self.store.board_delete(session, key, expected_version=expected_version, writer=who)
        )

    def _writer(self, session: str, by: str | None) -> str:
        who, agent = self.actor(by)
        if agent:
            home = self.store.get_terminal(who, include_deleted=True).session_name
            if home != session:
                raise Forbidden(
                    f"terminal {who} is in session {home}, not {session}; an agent writes its own session's "
                    "board only (any board can be read)"
                )
        return who

    def _told(self, fact: BoardFact) -> dict[str, object]:
        """On the event stream (without the value: up to 64 KiB, and the ring keeps 10,000 events)."""
        self.events.publish(
            "board.set",
            session_name=fact.session_name,
            key=fact.key,
            version=fact.version,
            writer=fact.writer,
            deleted=fact.value is None,
        )
        return fact_view(fact)
