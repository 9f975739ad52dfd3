"""Timestamps as the API and the CLI show them: ISO 8601 in UTC with the zone (one form everywhere).

The store keeps epoch seconds (cheap to compare and index); everything a person or a client reads
goes through :func:`iso`, and :func:`epoch` reads it back.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float | None) -> str | None:
    """``1796098830.2217`` → ``"2026-12-01T04:20:30.221700+00:00"``."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


def epoch(value: str | float | None) -> float | None:
    """Back to epoch seconds (accepts what :func:`iso` writes, a trailing ``Z``, or a number)."""
    if value is None or isinstance(value, int | float):
        return value
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
