"""Where each agent CLI records the tokens it spent, and how to read it (``Provider.usage``).

Found on the real programs in the loopback bed (tests/realcli/test_usage_realcli.py compares each
with what the fake model reported, reply by reply):

- Claude Code: ``~/.claude/projects/<project>/<session>.jsonl``, each ``assistant`` line's
  ``message.usage`` (``input_tokens`` without cache, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``, ``output_tokens``) and ``message.id``; one response written as
  several lines (a line per content block) shares its id.
- Codex: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``, ``event_msg`` lines of type
  ``token_count``: ``info.last_token_usage`` is one response (its ``input_tokens`` include
  ``cached_input_tokens``), ``info.total_token_usage`` the running sum (the same sum twice is the
  same response reported again); the model from the latest ``turn_context``.
- Gemini CLI: ``~/.gemini/tmp/<project>/chats/session-*.jsonl`` (0.61: the first line the
  session, then records and ``{"$set": …}`` updates; a message may be written again with its final
  counts: the last one counts), or ``…/chats/*.json`` (one object with ``messages``, the shape of
  earlier releases' saved chats: read when present): each ``gemini`` message's ``tokens``
  (``input`` includes ``cached``; ``thoughts`` are output it was billed for, ``tool`` tool-use
  prompt tokens) and ``id``.

Requests a CLI makes for itself and doesn't record (Claude's and Gemini's title and routing
calls, Codex's) are not counted: no CLI says what they cost.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from providers.base import UsageEntry

MAX_FILE = 64 * 1024 * 1024  # a transcript larger than this is read up to here
MAX_FILES = 10_000  # files read per terminal


def _lines(path: Path) -> Iterator[Any]:
    """The JSON values of a JSON-lines file; a line being written (or not JSON) is skipped."""
    data = read_bounded(path)
    if data is None:
        return
    for raw in data.splitlines():
        try:
            yield json.loads(raw)
        except (ValueError, RecursionError):
            continue


def read_bounded(path: Path) -> bytes | None:
    """A regular file's first ``MAX_FILE`` bytes; None for anything else (a FIFO would block the
    reader forever, a device never ends) or when it can't be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(MAX_FILE)
    except OSError:
        return None
    finally:
        os.close(fd)


LATEST = 4102444800.0  # 2100-01-01: a later (or negative, or infinite) time is not a record's
MAX_COUNT = 10**12  # tokens in one response: more (1e400, Infinity) is a broken record, counted at this


def when(stamp: Any) -> float | None:
    """A record's time as Unix seconds: a number or an ISO 8601 string; None when it isn't one
    (a record without a time can't be given to a task)."""
    if isinstance(stamp, bool):
        return None
    if isinstance(stamp, (int, float)):
        try:
            at = float(stamp)
        except OverflowError:  # an integer of 400 digits is valid JSON
            return None
        return at if 0 <= at <= LATEST else None
    if not isinstance(stamp, str):
        return None
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError):
        return None
    return at if 0 <= at <= LATEST else None


def count(value: Any) -> int:
    """A token count: a positive number, at most ``MAX_COUNT`` (a larger or infinite one is
    counted at that, so a broken or hostile line can't hide spending); anything else is 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return 0  # NaN, negatives, strings
    return MAX_COUNT if value >= MAX_COUNT else int(value)


def _files(root: Path, name: str, *, depth: int = 8, under: str | None = None) -> list[Path]:
    """Regular files named like ``name`` below ``root`` (``under``: only in folders of that name),
    at most ``depth`` folders down and ``MAX_FILES`` of them; symlinks are not followed (an agent's
    HOME is its own: a link to / must not make every read walk the machine)."""
    out: list[Path] = []
    base = len(root.parts)
    for folder, dirs, files in os.walk(root, followlinks=False):
        here = Path(folder)
        if len(here.parts) - base >= depth:
            dirs[:] = []
        if under is None or here.name == under:
            out.extend(here / f for f in files if fnmatch.fnmatchcase(f, name))
        if len(out) >= MAX_FILES:
            break
    return sorted(p for p in out[:MAX_FILES] if not p.is_symlink())


# -- Claude Code -----------------------------------------------------------------------------------
def claude(home: Path) -> list[UsageEntry] | None:
    root = home / ".claude" / "projects"
    if not root.is_dir():
        return None if not (home / ".claude").is_dir() else []
    out: dict[str, UsageEntry] = {}
    for path in _files(root, "*.jsonl"):
        for r in _lines(path):
            if not isinstance(r, dict) or r.get("type") != "assistant":
                continue
            m = r.get("message")
            if not isinstance(m, dict) or not isinstance(m.get("usage"), dict):
                continue
            u, key = m["usage"], str(m.get("id") or r.get("requestId") or r.get("uuid") or "")
            at = when(r.get("timestamp"))
            if at is None or not key:
                continue
            # the last line of a response carries its final output count
            out[key] = UsageEntry(
                at=out[key].at if key in out else at,
                model=str(m.get("model") or ""),
                input_tokens=count(u.get("input_tokens")),
                output_tokens=count(u.get("output_tokens")),
                cache_read_tokens=count(u.get("cache_read_input_tokens")),
                cache_write_tokens=count(u.get("cache_creation_input_tokens")),
                key=key,
            )
    return sorted(out.values(), key=lambda e: e.at)


# -- Codex -----------------------------------------------------------------------------------------
def codex(codex_home: Path) -> list[UsageEntry] | None:
    root = codex_home / "sessions"
    if not root.is_dir():
        return None if not codex_home.is_dir() else []
    out: list[UsageEntry] = []
    for path in _files(root, "rollout-*.jsonl"):
        model, seen = "", set()
        for r in _lines(path):
            if not isinstance(r, dict):
                continue
            p = r.get("payload")
            if not isinstance(p, dict):
                continue
            if r.get("type") == "turn_context" and p.get("model"):
                model = str(p["model"])
                continue
            if r.get("type") != "event_msg" or p.get("type") != "token_count":
                continue
            info = p.get("info")
            if not isinstance(info, dict):
                continue
            last, total = info.get("last_token_usage"), info.get("total_token_usage")
            if not isinstance(last, dict) or not isinstance(total, dict):
                continue
            stamp = f"{count(total.get('total_tokens'))}/{count(total.get('input_tokens'))}"
            if stamp in seen:  # the same running sum again: no new response
                continue
            seen.add(stamp)
            at = when(r.get("timestamp"))
            if at is None:
                continue
            cached = count(last.get("cached_input_tokens"))
            out.append(
                UsageEntry(
                    at=at,
                    model=model,
                    input_tokens=max(0, count(last.get("input_tokens")) - cached),
                    output_tokens=count(last.get("output_tokens")),
                    cache_read_tokens=cached,
                    cache_write_tokens=count(last.get("cache_write_input_tokens")),
                    key=f"{path.name}:{stamp}",
                )
            )
    return sorted(out, key=lambda e: e.at)


# -- Gemini CLI, Qwen Code ---------------------------------------------------------------------------
def _gemini_messages(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for v in value:
            yield from _gemini_messages(v)
    elif isinstance(value, dict):
        if isinstance(value.get("tokens"), dict) and value.get("id"):
            yield value
        for k in ("messages", "$set", "message"):
            if k in value:
                yield from _gemini_messages(value[k])


def gemini(home: Path, folder: str = ".gemini") -> list[UsageEntry] | None:
    base = home / folder
    if not base.is_dir():
        return None
    out: dict[str, UsageEntry] = {}
    for path in _files(base / "tmp", "*", depth=3, under="chats"):
        if path.suffix == ".jsonl":
            values: Iterator[Any] = _lines(path)
        elif path.suffix == ".json":
            data = read_bounded(path)
            try:
                values = iter([json.loads(data)] if data is not None else [])
            except (ValueError, RecursionError):
                continue
        else:
            continue
        for value in values:
            for m in _gemini_messages(value):
                t, key = m["tokens"], str(m["id"])
                at = when(m.get("timestamp"))
                if at is None:
                    continue
                cached = count(t.get("cached"))
                out[key] = UsageEntry(  # a message rewritten later: its last version
                    at=at,
                    model=str(m.get("model") or ""),
                    input_tokens=max(0, count(t.get("input")) - cached) + count(t.get("tool")),
                    output_tokens=count(t.get("output")) + count(t.get("thoughts")),
                    cache_read_tokens=cached,
                    key=key,
                )
    return sorted(out.values(), key=lambda e: e.at)
