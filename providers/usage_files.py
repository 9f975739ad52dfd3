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
import sqlite3
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from cao.files import read_regular
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
    """A regular file's first ``MAX_FILE`` bytes (``cao.files.read_regular``: no FIFO, no device,
    no symlink followed); None for anything else or when it can't be read."""
    try:
        return read_regular(path, MAX_FILE, follow=False)
    except OSError:
        return None


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


def when_ms(stamp: Any) -> float | None:
    """A time in milliseconds since the epoch (a number), as Unix seconds; None when it isn't one."""
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp <= LATEST * 1000:
        return None  # (NaN fails the comparison too)
    return when(stamp / 1000)


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


# -- Qwen Code -----------------------------------------------------------------------------------------
def qwen(home: Path) -> list[UsageEntry] | None:
    """``.qwen/projects/<project>/chats/<session>.jsonl`` (0.15): a ``ui_telemetry`` system record
    per API response (``qwen-code.api_response``), its subagents' too (they are billed):
    ``input_token_count`` includes ``cached_content_token_count``; ``thoughts`` are output."""
    base = home / ".qwen"
    if not base.is_dir():
        return None
    out: dict[str, UsageEntry] = {}
    for path in _files(base / "projects", "*.jsonl", depth=3, under="chats"):
        for r in _lines(path):
            if not isinstance(r, dict) or r.get("subtype") != "ui_telemetry":
                continue
            event = (
                (r.get("systemPayload") or {}).get("uiEvent")
                if isinstance(r.get("systemPayload"), dict)
                else None
            )
            if not isinstance(event, dict) or event.get("event.name") != "qwen-code.api_response":
                continue
            key, at = str(event.get("response_id") or r.get("uuid") or ""), when(r.get("timestamp"))
            if not key or at is None:
                continue
            cached = count(event.get("cached_content_token_count"))
            out[key] = UsageEntry(
                at=at,
                model=str(event.get("model") or ""),
                input_tokens=max(0, count(event.get("input_token_count")) - cached),
                output_tokens=count(event.get("output_token_count"))
                + count(event.get("thoughts_token_count")),
                cache_read_tokens=cached,
                key=key,
            )
    return sorted(out.values(), key=lambda e: e.at)


# -- Copilot CLI ---------------------------------------------------------------------------------------
def copilot(home: Path) -> list[UsageEntry] | None:
    """``.copilot/session-state/<session>/events.jsonl`` (1.0): a ``session.usage_record`` event
    per API call: ``inputTokens`` include ``cacheReadTokens``; the call's ``apiCallId``."""
    base = home / ".copilot"
    if not base.is_dir():
        return None
    out: dict[str, UsageEntry] = {}
    for path in _files(base / "session-state", "events.jsonl", depth=2):
        for r in _lines(path):
            if not isinstance(r, dict) or r.get("type") != "session.usage_record":
                continue
            data = r.get("data")
            u = data.get("usage") if isinstance(data, dict) else None
            if not isinstance(u, dict):
                continue
            key, at = str(u.get("apiCallId") or r.get("id") or ""), when(r.get("timestamp"))
            if not key or at is None:
                continue
            cached = count(u.get("cacheReadTokens"))
            out[key] = UsageEntry(
                at=at,
                model=str(u.get("model") or ""),
                input_tokens=max(0, count(u.get("inputTokens")) - cached),
                output_tokens=count(u.get("outputTokens")),
                cache_read_tokens=cached,
                cache_write_tokens=count(u.get("cacheWriteTokens")),
                key=key,
            )
    return sorted(out.values(), key=lambda e: e.at)


# -- Kimi CLI ------------------------------------------------------------------------------------------
def _kimi_model(base: Path) -> str:
    """The model behind ``default_model`` in ``config.toml`` (the records don't name it)."""
    data = read_bounded(base / "config.toml")
    try:
        config = tomllib.loads(data.decode("utf-8")) if data else {}
    except (ValueError, UnicodeDecodeError):
        return ""
    models, name = config.get("models"), config.get("default_model")
    entry = models.get(name) if isinstance(models, dict) and isinstance(name, str) else None
    return str(entry.get("model") or name) if isinstance(entry, dict) else ""


def kimi(home: Path) -> list[UsageEntry] | None:
    """``.kimi/sessions/<project>/<session>/wire.jsonl`` (1.4x): a ``StatusUpdate`` per step with
    ``token_usage`` (``input_other`` without cache, ``input_cache_read``, ``input_cache_creation``,
    ``output``) and the reply's ``message_id``."""
    base = home / ".kimi"
    if not base.is_dir():
        return None
    model = _kimi_model(base)
    out: dict[str, UsageEntry] = {}
    for path in _files(base / "sessions", "wire.jsonl", depth=3):
        for r in _lines(path):
            m = r.get("message") if isinstance(r, dict) else None
            if (
                not isinstance(m, dict)
                or m.get("type") != "StatusUpdate"
                or not isinstance(m.get("payload"), dict)
            ):
                continue
            p = m["payload"]
            u, key, at = p.get("token_usage"), str(p.get("message_id") or ""), when(r.get("timestamp"))
            if not isinstance(u, dict) or not key or at is None:
                continue
            out[key] = UsageEntry(
                at=at,
                model=model,
                input_tokens=count(u.get("input_other")),
                output_tokens=count(u.get("output")),
                cache_read_tokens=count(u.get("input_cache_read")),
                cache_write_tokens=count(u.get("input_cache_creation")),
                key=key,
            )
    return sorted(out.values(), key=lambda e: e.at)


# -- OpenCode ------------------------------------------------------------------------------------------
def opencode(home: Path) -> list[UsageEntry] | None:
    """``.local/share/opencode/opencode.db`` (1.18, SQLite): each assistant ``message`` row's
    ``data.tokens`` (``input`` without cache, ``output`` + ``reasoning``, ``cache.read``,
    ``cache.write``), ``modelID``, ``time.created`` (ms), once ``time.completed`` is there.
    Opened read-only, waiting at most a moment for OpenCode's own writes; a database that can't
    be read reads as nothing new."""
    path = home / ".local" / "share" / "opencode" / "opencode.db"
    if not (home / ".local" / "share" / "opencode").is_dir():
        return None
    try:
        if path.is_symlink() or not path.is_file():
            return []
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)
    except (OSError, sqlite3.Error):
        return None  # unreadable now (locked, broken): what was read before stays
    out: list[UsageEntry] = []
    try:
        # filtered here, not in SQL: one row that isn't JSON would fail json_extract for all
        rows = conn.execute("SELECT id, data FROM message ORDER BY time_created LIMIT 100000").fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    for key, raw in rows:
        try:
            d = json.loads(raw)
        except (TypeError, ValueError, RecursionError):
            continue
        if not isinstance(d, dict) or d.get("role") != "assistant":
            continue
        t, stamp = d.get("tokens"), d.get("time")
        done = isinstance(stamp, dict) and "completed" in stamp  # a reply being written: 0 tokens so far
        at = when_ms(stamp.get("created")) if isinstance(stamp, dict) else None
        if not isinstance(t, dict) or at is None or not done:
            continue
        cache: dict[str, Any] = t["cache"] if isinstance(t.get("cache"), dict) else {}
        out.append(
            UsageEntry(
                at=at,
                model=str(d.get("modelID") or ""),
                input_tokens=count(t.get("input")),
                output_tokens=count(t.get("output")) + count(t.get("reasoning")),
                cache_read_tokens=count(cache.get("read")),
                cache_write_tokens=count(cache.get("write")),
                key=str(key),
            )
        )
    return sorted(out, key=lambda e: e.at)
