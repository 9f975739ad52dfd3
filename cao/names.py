"""The names and ids people and clients pass: what each may look like, checked once here."""

from __future__ import annotations

import re
from urllib.parse import quote

from cao.errors import InvalidInput

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
TERMINAL_ID_RE = re.compile(r"^[0-9a-f]{8}$")


def validate_terminal_id(value: str) -> str:
    if not TERMINAL_ID_RE.fullmatch(value or ""):
        raise InvalidInput(f"terminal id {value!r} is malformed; ids are 8 hex digits, e.g. 1a2b3c4d")
    return value


def validate_message_id(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise InvalidInput(
            f"message id {value!r} is malformed (not a number); message ids are positive integers, e.g. 42"
        )
    return int(value)


def validate_name(value: str, what: str) -> str:
    if not NAME_RE.fullmatch(value or ""):
        raise InvalidInput(
            f"{what} {value!r} is not allowed; use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def validate_session_name(value: str) -> str:
    if "." in value:  # tmux turns '.' in a session name into '_'
        raise InvalidInput(
            f"session_name {value!r} is not allowed: tmux rewrites '.' in session names; "
            "use letters, digits, '_' or '-'"
        )
    return validate_name(value, "session_name")


def quote_segment(value: str) -> str:
    """One URL path segment, quoted so no client rewrites it ('.' escaped too: see board_path)."""
    return quote(value, safe="").replace(".", "%2E")


def board_path(session: str, key: str | None = None) -> str:
    """The URL path of a session's board, or of one key on it, quoted so that no client rewrites
    it: '.' is escaped too (an HTTP client resolves a "." or ".." between slashes away, so a bad
    key would reach another route instead of its 422)."""
    validate_session_name(session.removeprefix("cao-"))  # a '/' in it would reach another route
    base = f"/sessions/{quote(session, safe='')}/board"
    if key is None:
        return base
    return f"{base}/{quote(key, safe='/').replace('.', '%2E')}"


def validate_host_name(name: str) -> str:
    """A host's name (``CAO_HOST_NAME``'s rule), or a 422 naming the rule."""
    from cao.settings import HOST_NAME_RE

    if not isinstance(name, str) or not HOST_NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"host {str(name)[:80]!r} is not a host name: 1-63 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit; `cao hosts` lists them"
        )
    return name
