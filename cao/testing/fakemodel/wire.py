"""HTTP plumbing shared by the API modules: the request log, JSON bodies, SSE framing, ids."""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from typing import Any

from starlette.requests import Request

from cao.testing.fakemodel.script import JSON

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_ids = itertools.count(1)


def next_id() -> int:
    """A process-wide serial for reply ids (``msg_fake_000001``, ``resp_fake_000002`` ...)."""
    return next(_ids)


def usage_of(n: int) -> dict[str, int]:
    """Reply ``n``'s token counts: distinct per reply and deterministic, so a count a CLI records
    can be traced to the reply that reported it. In cao's terms (``providers.base.UsageEntry``):
    ``input`` excludes cache reads and writes; each API module reports them in its own dialect and
    logs these under ``usage`` with ``reply_id``."""
    return {
        "input": 100 + 7 * n,
        "output": 20 + 3 * n,
        "cache_read": 1000 + 11 * n,
        "cache_write": 50 + 5 * n,
    }


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[JSON] = []

    def add(self, entry: JSON) -> JSON:
        with self._lock:
            entry["seq"] = len(self._items) + 1
            self._items.append(entry)
        return entry

    def items(self, bodies: bool = True) -> list[JSON]:
        with self._lock:
            items = list(self._items)
        if bodies:
            return items
        return [{k: v for k, v in item.items() if k != "body"} for item in items]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def log_entry(request: Request, api: str, body: Any) -> JSON:
    return {
        "time": time.time(),
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "api": api,
        "body": body,
    }


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw.decode("utf-8", "replace")}


def sse(event: str | None, data: JSON) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def chunks(text: str, chunked: bool) -> list[str]:
    if not chunked:
        return [text]
    words = re.findall(r"\s*\S+\s*", text) or [text]
    return ["".join(words[i : i + 3]) for i in range(0, len(words), 3)]
