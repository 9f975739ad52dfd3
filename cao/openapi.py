"""cao-server's OpenAPI schema, made honest: what FastAPI can't see from the route signatures.

Routes read their parameters from the query string *or* a JSON body, through the ``Params``
each declares (cao/params.py), answer errors in one shape (``{"detail", "error"}``), and the guard
in front of them (cao/security.py) can refuse any request. FastAPI's generated schema knows none
of that, so this module adds it after generation: each route's parameters and request body from
its declaration, every error status a route can answer, and the bearer scheme when a token is
required. schemathesis fuzzes the server against the result (tests/test_fuzz.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from cao.hook import TEXT_LIMIT as HOOK_TEXT_LIMIT
from cao.params import Params

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["detail", "error"],
    "properties": {
        "detail": {"type": "string", "description": "what is wrong and what to do about it"},
        "error": {"type": "string", "description": "the error's name, e.g. InvalidInput, NotFound"},
    },
}
ERRORS = {
    "400": "Host header is not one of this server's names (DNS rebinding guard)",
    "404": "unknown terminal, session, message or route",
    "410": "the terminal's tmux pane is gone",
    "413": "request body over 1 MiB, a message over 256 KiB, or a board value over 64 KiB",
    "414": "URL over 64 KiB",
    "415": "a request body that is not application/json",
    "422": "a malformed value (the detail names the field and the fix)",
    "502": "tmux failed",
    "503": "SQLite stayed locked, or the tmux server is down: nothing was written, retry",
}
STATE_CHANGING_ERRORS = {
    "403": "cross-origin request from an origin not in CAO_ALLOWED_ORIGINS, or an agent acting for "
    "another (another's queue, another session's board)",
    "409": "idempotency key reused with another intent, a state change that isn't possible now, or a "
    "board write with a stale expected_version (current_version is the one to retry with)",
}
UNAUTHORIZED = {"401": "missing or wrong bearer token (CAO_API_TOKEN)"}

# Routes that read only a JSON object body (no query form): the schema of that body.
_hook_text = {"type": "string", "maxLength": HOOK_TEXT_LIMIT}  # what python -m cao.hook sends at most
JSON_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/terminals/{terminal_id}/hooks"): {
        "type": "object",
        "required": ["event"],
        "properties": {
            "event": {"type": "string", "minLength": 1, "maxLength": 100},
            "prompts": {"type": "array", "maxItems": 16, "items": _hook_text},
            "last_message": _hook_text,
            "message": _hook_text,
            "notification_type": _hook_text,
            "title": _hook_text,
            "reason": _hook_text,
            "source": _hook_text,
        },
        "additionalProperties": True,
    },
}
# routes that answer more than the common errors
EXTRA_ERRORS = {
    ("post", "/terminals/run-step"): {
        "502": "the worker stopped with an error or exited (kind: error; terminal_id names it)",
        "504": "the worker did not become ready or finish in time (kind: timeout; terminal_id names it)",
    },
    ("post", "/terminals/{terminal_id}/merge"): {
        "409": "the merge would conflict (conflicts lists the files; nothing changed), or it can't start",
    },
}
EXTRA_SUCCESS = {("post", "/terminals/{receiver_id}/inbox/messages"): "200"}  # a duplicate's receipt
TEXT_OUTPUT = ("get", "/terminals/{terminal_id}/output")  # format=text answers text/plain


def declarations(app: FastAPI) -> dict[tuple[str, str], Params]:
    """Each route's declared parameters (the ``Params`` it depends on), by (method, path)."""
    found: dict[tuple[str, str], Params] = {}
    for route in app.routes:
        if isinstance(route, APIRoute):
            for dependency in route.dependant.dependencies:
                if isinstance(dependency.call, Params):
                    for method in route.methods or ():
                        found[method.lower(), route.path_format] = dependency.call
    return found


def complete(
    schema: dict[str, Any], *, token: bool, declared: Mapping[tuple[str, str], Params]
) -> dict[str, Any]:
    """Add parameters, bodies, error responses and security to FastAPI's generated ``schema`` (in
    place); ``declared``: what each route takes (``declarations``)."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ERROR_SCHEMA
    for path, ops in schema.get("paths", {}).items():
        for method, op in ops.items():
            _complete_operation(method, path, op, token=token, params=declared.get((method, path)))
    if token:
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        schema["security"] = [{"bearer": []}]
        schema["paths"]["/health"]["get"]["security"] = []
    return schema


def _complete_operation(
    method: str, path: str, op: dict[str, Any], *, token: bool, params: Params | None
) -> None:
    responses = op.setdefault("responses", {})
    for param in op.get("parameters", []):
        param["schema"] = _not_null(param["schema"])
    errors = dict(ERRORS)
    if method in ("post", "put", "patch", "delete"):
        errors |= STATE_CHANGING_ERRORS
    if token and (method, path) != ("get", "/health"):
        errors |= UNAUTHORIZED
    errors |= EXTRA_ERRORS.get((method, path), {})
    for code, why in errors.items():
        responses[code] = {"description": why, "content": {"application/json": {"schema": ERROR_REF}}}
    if params is not None and params.params:
        fields = {p.name: p.schema() for p in params.params}
        op["requestBody"] = {
            "required": False,
            "description": "the same parameters as the query string (each one way: a name in both is a 422)",
            "content": {
                "application/json": {
                    "schema": {"type": "object", "properties": fields, "additionalProperties": True}
                }
            },
        }
        in_path = {p["name"] for p in op.get("parameters", [])}
        op.setdefault("parameters", []).extend(
            {"name": name, "in": "query", "required": False, "schema": spec}
            for name, spec in fields.items()
            if name not in in_path
        )
    if (method, path) in JSON_BODIES:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": JSON_BODIES[method, path]}},
        }
    if (method, path) in EXTRA_SUCCESS:
        created = next(code for code in ("201", "200") if code in responses)
        responses[EXTRA_SUCCESS[method, path]] = {
            **responses[created],
            "description": "the receipt of an earlier send with the same idempotency key",
        }
    if (method, path) == TEXT_OUTPUT:
        responses["200"].setdefault("content", {})["text/plain"] = {"schema": {"type": "string"}}


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI writes an optional parameter as ``anyOf: [T, null]``; a URL can't carry a null."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return schema
    [kept] = [option for option in options if option != {"type": "null"}]
    return {**kept, **{key: value for key, value in schema.items() if key != "anyOf"}}


def install(app: FastAPI, *, token: bool) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(generate(), token=token, declared=declarations(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
