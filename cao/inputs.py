"""Request inputs, checked so that odd input is a 4xx JSON error and never reaches tmux or SQLite.

Every error cao-server answers has the shape ``{"detail": "<what is wrong and what to do>",
"error": "<name>"}``, FastAPI's own (validation, unknown route, wrong method) included.

Text parameters (query string or JSON body) must be valid Unicode without NUL; names, ids and
paths are at most 4096 characters without control characters; ``working_directory`` must be a
path the OS can look up; a ``message`` that is empty once whitespace and invisible characters
(zero-width spaces, joiners, BOMs: Unicode category Cf) are taken away is refused.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import unicodedata
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from cao.errors import DiskFull, InvalidInput, Unwritable
from cao.paste import is_blank as blank

logger = logging.getLogger(__name__)

MAX_FIELD_CHARS = 4096  # everything but the message itself (which the store limits to 256 KiB)
MAX_JSON_DEPTH = 64  # a JSON value a route takes as it is (a board fact's)
PATH_MAX, NAME_MAX = 4095, 255
HTTP_ERROR_NAMES = {
    404: "NotFound",
    405: "MethodNotAllowed",
    413: "PayloadTooLarge",
    415: "UnsupportedMediaType",
}
TextKind = Literal["name", "path", "message", "free_text"]
BODY: TextKind = "message"  # a message body: any text that is not blank
# how a parameter no route declares is checked (the reference's clients send some: description,
# model…): as the routes that take that name check it, else as a name
KIND_BY_NAME: dict[str, TextKind] = {
    "message": "message",
    "working_directory": "path",
    "initial_message": "free_text",
    "prompt": "free_text",
}


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError as exc:  # also bad UTF-8 and numbers too long to convert
        raise InvalidInput(f"request body is not valid JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise InvalidInput("request body is nested too deeply; send a flat JSON object") from None
    if not isinstance(data, dict):
        raise InvalidInput('request body must be a JSON object, e.g. {"message": "hi"}')
    return data


def check_text(name: str, value: str, kind: TextKind | None = None) -> str:
    """A text parameter: a ``name`` (id, path: at most 4096 characters, no control characters),
    a ``path`` (a name the OS can also look up), a ``message`` (any text that isn't blank) or
    ``free_text``. Without ``kind`` the parameter's name decides (``KIND_BY_NAME``)."""
    kind = kind or KIND_BY_NAME.get(name, "name")
    if kind == "free_text":
        return check_free_text(name, value)
    field = name if name.isidentifier() and len(name) <= 64 else "a parameter"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{field} is not valid text (it has a lone UTF-16 surrogate); fix its encoding"
        ) from None
    if kind == BODY:  # any text: control characters are neutralised before it is pasted
        if value and blank(value):
            raise InvalidInput(f"{field} is blank (only whitespace or invisible characters); send some text")
        return value
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character; remove it")
    if len(value) > MAX_FIELD_CHARS:
        raise InvalidInput(f"{field} is {len(value)} characters long; the limit is {MAX_FIELD_CHARS}")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidInput(f"{field} contains a control character; remove it")
    if kind == "path":
        check_path(field, value)
    return value


def check_free_text(name: str, value: str) -> str:
    """Free text (a first task, a prompt): anything printable, newlines and tabs included; only a
    lone surrogate (not text at all) and NUL (which no terminal can take) are refused."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{name} is not valid text (it has a lone UTF-16 surrogate)") from None
    if "\x00" in value:
        raise InvalidInput(f"{name} contains a NUL character; remove it")
    return value


def check_json(name: str, value: Any) -> Any:
    """A JSON value taken as it is (a board fact's): every text in it, object keys too, is free
    text (no NUL, no lone surrogate), every number finite, nested at most ``MAX_JSON_DEPTH`` deep.
    Walked without recursion: a deep value is refused by its depth, never by a crash."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)) and depth >= MAX_JSON_DEPTH:  # levels of lists and objects
            raise InvalidInput(f"{name} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it")
        if isinstance(item, str):
            check_free_text(name, item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput(f"{name} holds NaN or Infinity, which JSON can't carry; send a finite number")
        elif isinstance(item, dict):
            for key, inner in item.items():
                check_free_text(name, str(key))
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, depth + 1) for inner in item)
    return value


def check_path(field: str, value: str) -> None:
    """What the OS would refuse before looking (too long, ~user that doesn't exist) is a 422 here."""
    if value.startswith("~") and os.path.expanduser(value) == value:
        raise InvalidInput(f"{field} {value[:80]!r} names an unknown user's home; pass an absolute path")
    encoded = os.fsencode(os.path.expanduser(value))
    if len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        raise InvalidInput(f"{field} is longer than the OS allows ({PATH_MAX} bytes, {NAME_MAX} per name)")


def install_error_handlers(app: FastAPI) -> None:
    """FastAPI's own errors in cao's shape: ``{"detail": str, "error": name}``."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("query", "path", "body"))
            parts.append(f"{where or 'request'}: {err.get('msg', 'invalid')}")
        return JSONResponse({"detail": "; ".join(parts), "error": "InvalidInput"}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 404 and detail == "Not Found":
            detail = "no such route; the routes are listed at /docs and in docs/api.md"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "?")
            detail = f"method not allowed here; this route takes {allowed}"
        return JSONResponse(
            {"detail": str(detail), "error": HTTP_ERROR_NAMES.get(exc.status_code, "HTTPError")},
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # a full disk under a file write (a create's config files, a pane log): not a crash
            logger.error("disk full", extra={"method": request.method, "path": request.url.path[:200]})
            return JSONResponse(
                {
                    "detail": "the disk is full; nothing was written (what was half-made is undone). Free "
                    "some space, then retry the same request",
                    "error": "DiskFull",
                },
                status_code=507,
            )
        logger.error(
            "request crashed",
            exc_info=exc,
            extra={"method": request.method, "path": request.url.path[:200], "reason": type(exc).__name__},
        )
        return JSONResponse(
            {
                "detail": "internal error in cao-server; the server log has the details",
                "error": "InternalError",
            },
            status_code=500,
        )


def file_error(exc: OSError) -> Exception:
    """A file write that failed for a reason an operator fixes (a full disk, a read-only mount,
    permissions) as the error the API answers with (507 / 503, saying nothing was written);
    anything else as it is (a 500)."""
    where = exc.filename or "a file under CAO_HOME"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(
            f"the disk is full ({where}); nothing was written (what was half-made is undone). Free some "
            "space, then retry the same request"
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return Unwritable(
            f"cannot write {where}: {exc.strerror}; nothing was written (what was half-made is undone). "
            "Make it writable again (a read-only mount, permissions), then retry the same request"
        )
    return exc
