"""The coordination board: versioned facts per session (ATTENTION.md guarantee 12).

A fact is (session, key) → value at a version, with who wrote it and when. A write names the
version it expects to replace (compare-and-swap: 0 for a key that must not exist yet) and is one
``BEGIN IMMEDIATE`` transaction: read the key's newest version, compare, insert the next one,
prune the key's oldest versions. Two writers with the same expected version: one wins, the other
gets :class:`VersionConflict` with the version it has to read and retry from. A delete writes a
*tombstone* (a version whose value is NULL), so the history stays and the versions go on.

Nothing here pastes anything or wakes delivery: a board is read when an agent asks for it.

Limits (a board must survive an agent writing in a loop; the constants below), each checked before
anything is written:

    key             1-200 characters from [A-Za-z0-9._:/-]; '/' separates names (none empty, none
                    '.' or '..': URLs would rewrite them)
    value           any JSON value but null, at most 64 KiB as compact UTF-8 JSON (413)
    keys            at most 1,000 live keys per session (409 BoardFull: delete some)
    history         a key keeps its newest 100 versions and at most 256 KiB of them (its newest
                    always); older ones are pruned in the write's own transaction
    deleted keys    at most 1,000 per session keep their history; past that, the one deleted
                    longest ago is forgotten whole (its versions start again from 0)
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any

from cao.errors import (
    BoardFull,
    FactMissing,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    VersionConflict,
)
from cao.store.base import Database, _row
from cao.store.schema import BoardFact
from cao.timefmt import iso

MAX_KEY_CHARS = 200
KEY_CHARS = "A-Za-z0-9._:/-"
KEY_RE = re.compile(rf"[{KEY_CHARS}]{{1,{MAX_KEY_CHARS}}}")
PREFIX_RE = re.compile(rf"[{KEY_CHARS}]{{0,{MAX_KEY_CHARS}}}")
# what check_key lets through, as one regular expression (no lookaround: schema fuzzers generate
# from it), for the API's schema: names between slashes, none empty, none "." or ".."
_NAME = r"(?:[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.[A-Za-z0-9_:-][A-Za-z0-9._:-]*|\.\.[A-Za-z0-9._:-]+)"
KEY_PATTERN = rf"^{_NAME}(?:/{_NAME})*$"
MAX_VALUE_BYTES = 64 * 1024  # one value, as compact JSON in UTF-8
MAX_KEYS = 1000  # live keys per session
MAX_DELETED_KEYS = 1000  # deleted keys whose history is kept per session (the oldest go first)
MAX_VERSIONS = 100  # versions kept per key (the newest)
MAX_HISTORY_BYTES = 256 * 1024  # of a key's kept versions together (its newest is always kept)
MAX_VERSION = 2**53  # expected_version's bound (JSON's exact integers; SQLite's INTEGER holds it)


HEAD = "SELECT * FROM board_fact WHERE session_name = ? AND key = ? AND head = 1"


def check_key(key: object) -> str:
    """A board key, or a 422 that says what a key may be."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        shown = key[:80] if isinstance(key, str) else key
        raise InvalidInput(
            f"key {shown!r} is not a board key; use 1-{MAX_KEY_CHARS} characters from A-Z a-z 0-9 "
            ". _ : / - (e.g. build/status or task:42.owner)"
        )
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidInput(
            f"key {key[:80]!r} is not a board key: '/' separates names, so none may be empty and none "
            "may be '.' or '..' (URLs would rewrite them); e.g. build/status"
        )
    return key


def check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not PREFIX_RE.fullmatch(prefix):
        shown = prefix[:80] if isinstance(prefix, str) else prefix
        raise InvalidInput(
            f"prefix {shown!r} can't begin a board key; use at most {MAX_KEY_CHARS} characters from "
            "A-Z a-z 0-9 . _ : / - (or none, for every key)"
        )
    return prefix


def check_version(expected_version: object) -> int:
    """``expected_version``: a whole number from 0 (the key must not exist yet) up."""
    if isinstance(expected_version, bool) or not isinstance(expected_version, int):
        raise InvalidInput(
            "expected_version must be a whole number: 0 for a key that must not exist yet, else the "
            "version you read"
        )
    if not 0 <= expected_version <= MAX_VERSION:
        raise InvalidInput(
            f"expected_version {expected_version} is out of range; use 0 (a new key) up to {MAX_VERSION}"
        )
    return expected_version


def encode_value(value: object) -> str:
    """The value as compact JSON text (what is stored), or a 422/413 naming what is wrong."""
    if value is None:
        raise InvalidInput(
            "value is null; a fact's value is any JSON value but null. To remove a key, delete it "
            "(DELETE /sessions/{name}/board/{key}, `cao board rm`): its history stays"
        )
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        raise InvalidInput("value is nested too deeply; flatten it") from None
    except (TypeError, ValueError) as exc:  # NaN or Infinity, a type JSON doesn't have
        raise InvalidInput(
            f"value is not plain JSON ({exc}); send strings, numbers, booleans, lists and objects"
        ) from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("value has text with a lone UTF-16 surrogate; fix its encoding") from None
    if size > MAX_VALUE_BYTES:
        raise PayloadTooLarge(
            f"value is {size} bytes as JSON, over the {MAX_VALUE_BYTES}-byte ({MAX_VALUE_BYTES // 1024} KiB) "
            "limit of a board fact; nothing was written. Put the data in a file and write its path, or "
            "split it over several keys"
        )
    return text


def decoded(fact: BoardFact) -> Any:
    """A fact's value as JSON data (None for a tombstone)."""
    return None if fact.value is None else json.loads(fact.value)


class BoardRows(Database):
    # -- writes ----------------------------------------------------------------------------------
    def board_set(
        self, session_name: str, key: str, value: object, *, expected_version: int, writer: str
    ) -> BoardFact:
        """Write ``value`` as the version after ``expected_version`` (0: the key must not exist
        yet, never written or deleted). Returns the new version's row."""
        check_key(key)
        check_version(expected_version)
        return self._board_write(session_name, key, encode_value(value), expected_version, writer)

    def board_delete(self, session_name: str, key: str, *, expected_version: int, writer: str) -> BoardFact:
        """Delete a live key whose current version is ``expected_version``: a tombstone version."""
        check_key(key)
        check_version(expected_version)
        return self._board_write(session_name, key, None, expected_version, writer)

    def _board_write(self, session: str, key: str, text: str | None, expected: int, writer: str) -> BoardFact:
        now = self.clock()
        with self._write() as conn:
            self._known_session(conn, session)
            head = conn.execute(HEAD, (session, key)).fetchone()
            current = 0 if head is None else int(head["version"])
            live = head is not None and head["value"] is not None
            if text is None and not live:
                raise FactMissing(_missing(session, key, head, "nothing to delete"), current_version=current)
            if expected != current and not (expected == 0 and not live):
                raise VersionConflict(
                    _conflict(session, key, head, expected), current=_current(head, current)
                )
            if text is not None and not live:  # a new key (or one deleted before)
                (count,) = conn.execute(
                    "SELECT COUNT(*) FROM board_fact WHERE session_name = ? AND head = 1 "
                    "AND value IS NOT NULL",
                    (session,),
                ).fetchone()
                if count >= MAX_KEYS:
                    raise BoardFull(
                        f"session {session}'s board holds {count} keys, its limit ({MAX_KEYS}); nothing was "
                        f"written. Delete keys it no longer needs (`cao board rm {session} KEY "
                        "--expected-version N`), or reuse one",
                        limit=MAX_KEYS,
                    )
            if head is not None:
                conn.execute(
                    "UPDATE board_fact SET head = 0 WHERE session_name = ? AND key = ? AND version = ?",
                    (session, key, current),
                )
            # a key nobody remembers (never written, or its history forgotten) starts above every
            # version a forgotten key reached: a stale expected version can't match it again (ABA)
            version = current + 1 if head is not None else _floor(conn, session) + 1
            fact = BoardFact(
                session_name=session, key=key, version=version, value=text, writer=writer, at=now
            )
            conn.execute(
                "INSERT INTO board_fact (session_name, key, version, value, writer, at, head) "
                "VALUES (?, ?, ?, ?, ?, ?, 1)",
                (session, key, fact.version, text, writer, now),
            )
            _prune_versions(conn, session, key)
            if text is None:
                _forget_deleted(conn, session)
        return fact

    # -- reads -----------------------------------------------------------------------------------
    def board_get(self, session_name: str, key: str) -> BoardFact:
        """The key's current version (404 when it was never written or is deleted)."""
        check_key(key)
        with self._read() as conn:
            self._known_session(conn, session_name)
            head = conn.execute(HEAD, (session_name, key)).fetchone()
        if head is None or head["value"] is None:
            version = 0 if head is None else int(head["version"])
            raise FactMissing(_missing(session_name, key, head, "nothing to read"), current_version=version)
        return _row(BoardFact, head)

    def board_list(self, session_name: str, prefix: str = "") -> list[BoardFact]:
        """Every live key's current version (those starting with ``prefix``), sorted by key."""
        check_prefix(prefix)
        with self._read() as conn:
            self._known_session(conn, session_name)
            rows = conn.execute(
                "SELECT * FROM board_fact WHERE session_name = ? AND head = 1 AND value IS NOT NULL "
                "AND substr(key, 1, ?) = ? ORDER BY key",
                (session_name, len(prefix), prefix),
            ).fetchall()
        return [_row(BoardFact, r) for r in rows]

    def board_history(self, session_name: str, key: str, *, limit: int = MAX_VERSIONS) -> list[BoardFact]:
        """The key's kept versions, newest first, tombstones included (404 when it has none)."""
        check_key(key)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_VERSIONS:
            raise InvalidInput(f"limit must be between 1 and {MAX_VERSIONS} (the versions a key keeps)")
        with self._read() as conn:
            self._known_session(conn, session_name)
            rows = conn.execute(
                "SELECT * FROM board_fact WHERE session_name = ? AND key = ? ORDER BY version DESC LIMIT ?",
                (session_name, key, limit),
            ).fetchall()
        if not rows:
            raise FactMissing(_missing(session_name, key, None, "no history"), current_version=0)
        return [_row(BoardFact, r) for r in rows]

    @staticmethod
    def _known_session(conn: sqlite3.Connection, session: str) -> None:
        """A board belongs to a session some terminal of this server ran in (rows stay when
        terminals are deleted, so a finished session's board can still be read)."""
        known = conn.execute("SELECT 1 FROM terminal WHERE session_name = ? LIMIT 1", (session,)).fetchone()
        if known is None:
            raise NotFound(
                f"session {session} not found: no terminal of this cao-server ever ran in it, so it has no "
                "board; list sessions with `cao status`"
            )


def _prune_versions(conn: sqlite3.Connection, session: str, key: str) -> None:
    """Keep the newest ``MAX_VERSIONS`` versions and at most ``MAX_HISTORY_BYTES`` of them (the
    newest always): delete every version older than the first one that doesn't fit."""
    rows = conn.execute(
        "SELECT version, length(CAST(value AS BLOB)) FROM board_fact WHERE session_name = ? AND key = ? "
        "ORDER BY version DESC",
        (session, key),
    ).fetchall()
    total = 0
    for i, (version, size) in enumerate(rows):
        size = size or 0
        if i > 0 and (i >= MAX_VERSIONS or total + size > MAX_HISTORY_BYTES):
            conn.execute(
                "DELETE FROM board_fact WHERE session_name = ? AND key = ? AND version <= ?",
                (session, key, version),
            )
            return
        total += size


def _forget_deleted(conn: sqlite3.Connection, session: str) -> None:
    """Past ``MAX_DELETED_KEYS`` deleted keys, forget the ones deleted longest ago, whole."""
    (count,) = conn.execute(
        "SELECT COUNT(*) FROM board_fact WHERE session_name = ? AND head = 1 AND value IS NULL", (session,)
    ).fetchone()
    if count <= MAX_DELETED_KEYS:
        return
    oldest = conn.execute(
        "SELECT key FROM board_fact WHERE session_name = ? AND head = 1 AND value IS NULL "
        "ORDER BY at, key LIMIT ?",
        (session, count - MAX_DELETED_KEYS),
    ).fetchall()
    top = conn.execute(
        f"SELECT max(version) FROM board_fact WHERE session_name = ? AND head = 1 "
        f"AND key IN ({','.join('?' * len(oldest))})",
        (session, *[r[0] for r in oldest]),
    ).fetchone()[0]
    conn.executemany(
        "DELETE FROM board_fact WHERE session_name = ? AND key = ?", [(session, r[0]) for r in oldest]
    )
    floor = max(_floor(conn, session), int(top or 0))
    conn.execute("DELETE FROM board_fact WHERE session_name = ? AND key = ?", (session, FLOOR_KEY))
    conn.execute(
        "INSERT INTO board_fact (session_name, key, version, value, writer, at, head) "
        "VALUES (?, ?, ?, NULL, 'cao', 0, 0)",
        (session, FLOOR_KEY, floor),
    )


FLOOR_KEY = ""  # no key can be empty: this row keeps the highest version a forgotten key reached


def _floor(conn: sqlite3.Connection, session: str) -> int:
    row = conn.execute(
        "SELECT version FROM board_fact WHERE session_name = ? AND key = ?", (session, FLOOR_KEY)
    ).fetchone()
    return int(row[0]) if row else 0


def _current(head: sqlite3.Row | None, version: int) -> dict[str, object]:
    """What a conflict tells of the key as it is: ``current_version``, ``current_value``, …"""
    if head is None:
        return {"version": 0, "value": None, "writer": None, "at": None, "deleted": False}
    value = None if head["value"] is None else json.loads(head["value"])
    return {
        "version": version,
        "value": value,
        "writer": head["writer"],
        "at": iso(head["at"]),
        "deleted": head["value"] is None,
    }


def _conflict(session: str, key: str, head: sqlite3.Row | None, expected: int) -> str:
    where = f"key {key!r} of session {session}'s board"
    if head is None:
        return (
            f"{where} was never written, so it is not at version {expected}; nothing was written. "
            "Create it with expected_version 0"
        )
    version, by, at = int(head["version"]), head["writer"], iso(head["at"])
    if head["value"] is None:
        return (
            f"{where} was deleted at version {version} (by {by} at {at}), not at {expected}; nothing was "
            "written. Write it again with expected_version 0"
        )
    if expected == 0:
        return (
            f"{where} already exists at version {version} (written by {by} at {at}); nothing was written. "
            f"expected_version 0 means it must not exist yet: read it (current_value), then retry with "
            f"expected_version {version}"
        )
    return (
        f"{where} is at version {version} (written by {by} at {at}), not {expected}; nothing was written. "
        f"It changed since you read it: look at current_value, then retry with expected_version {version}"
    )


def _missing(session: str, key: str, head: sqlite3.Row | None, what: str) -> str:
    where = f"key {key!r} is not on session {session}'s board"
    if head is None:
        return f"{where} ({what}: it was never written); create it with expected_version 0"
    return (
        f"{where} ({what}: it was deleted at version {head['version']} by {head['writer']} at "
        f"{iso(head['at'])}); write it again with expected_version 0"
    )
