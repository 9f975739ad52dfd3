"""What each route takes, declared once: the route reads its parameters through the declaration
and cao/openapi.py writes the route's schema from it, so the two can't drift apart.

A route that takes parameters in the query string or a JSON object body declares them as a
``Params`` of ``Param`` s and has it as a FastAPI dependency::

    NEW_SESSION = Params(Param("provider"), Param("use_worktree", "flag"), ...)

    @app.post("/sessions")
    async def create_session(p: Annotated[Values, Depends(NEW_SESSION)]) -> ...:
        return core.create_terminal(**p)

Reading (``Params.parse``) keeps one set of rules for every such route: each parameter comes in
the query string or in the body, not both (a 422 names the ones given twice: one value would be
dropped unchecked); every text is checked before any is used (``cao.inputs``), undeclared ones
too, by their name (``inputs.KIND_BY_NAME``: they are accepted and dropped, the reference's
clients send some); then each declared parameter is read as its kind says, in declaration order.
The result holds the declared names only: reading another one is a KeyError, so a route can't
take a parameter its schema doesn't show.

    kind        a text value is checked as             read as
    name        a name, id or path: at most 4096      str (empty: not given)
                characters, no control characters
    path        a name the OS can also look up        str (empty: not given)
    message     any text that isn't blank             str (empty: not given)
    free_text   any text without NUL or a lone        str (empty: not given)
                surrogate (a task, a prompt)
    flag        a name                                bool: true/1/yes, false/0/no, JSON booleans
    seconds     a name                                float: a JSON number or its text
    count       a name                                int >= 0 (below 2**63): a JSON integer or its digits
    integer     a name                                int: a JSON whole number or its digits
    json        free_text, and so is every text in    the value as given (in a query string:
                it, object keys too; numbers finite;  a string); only null is "not given"
                nested at most 64 deep

What needs the library (a known provider, a terminal id's shape, a job id, a timeout's bounds) is
checked in core, with its words and in its order; a ``Param`` states it for the schema
(``constraints``) and tests/test_fuzz.py holds the server to it. Path parameters and the
query-only reads of ``GET`` routes stay with FastAPI (its signature is their one place); ``path``
and ``query`` add what core checks to their schema.
"""

from __future__ import annotations

import re
from collections.abc import KeysView, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Path, Query, Request

from cao import inputs
from cao.errors import InvalidInput

Kind = Literal["name", "path", "message", "free_text", "flag", "seconds", "count", "integer", "json"]

# what inputs.check_text lets through as a name: the schema of every name, id and path
NAME_SCHEMA: dict[str, Any] = {
    "type": "string",
    "maxLength": inputs.MAX_FIELD_CHARS,
    "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]*$",
}
SCHEMAS: dict[Kind, dict[str, Any]] = {
    "name": NAME_SCHEMA,
    "path": NAME_SCHEMA,
    "message": {"type": "string", "minLength": 1, "description": "at most 256 KiB; not only blanks"},
    "free_text": {"type": "string"},
    "flag": {"type": "boolean"},
    "seconds": {"type": "number"},
    "count": {"type": "integer", "minimum": 0},
    "integer": {"type": "integer"},
    "json": {"description": "any JSON value"},
}
TEXT_CHECKS: dict[Kind, inputs.TextKind] = {
    "path": "path",
    "message": "message",
    "free_text": "free_text",
    "json": "free_text",
}
TEXT_KINDS: frozenset[Kind] = frozenset({"name", "path", "message", "free_text"})  # "" is not given
WHOLE_NUMBER = re.compile(r"-?[0-9]{1,20}")
FLAG_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class Param:
    """One parameter of a route: how its value is checked and read, and what its schema says."""

    name: str
    kind: Kind = "name"
    required: bool = False  # missing, null or "" is a 422
    default: Any = None  # what a missing one reads as (flags: None = "the default decides")
    doc: str = ""
    # JSON-schema keywords for what core checks with its own words (a pattern, bounds)
    constraints: Mapping[str, Any] = field(default_factory=dict)
    ignored: bool = False  # checked, then left out: the reference's clients send it, it changes nothing
    missing: str | None = None  # the words for a missing or non-string value, where clients know others

    def check_text(self, value: str) -> None:
        """The check every text given for this parameter gets, before anything is read (a flag
        or a number given as text is checked as a name)."""
        inputs.check_text(self.name, value, kind=TEXT_CHECKS.get(self.kind, "name"))

    def read(self, value: object) -> Any:
        """The value as the route gets it (``value`` is None when the request didn't give one)."""
        if self.kind == "flag":
            if value is None:
                return self.default
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in FLAG_WORDS:
                return FLAG_WORDS[value.lower()]
            raise InvalidInput(f"{self.name} must be true or false")
        if self.kind == "seconds":
            if value is None or value == "":
                return self.default
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                try:
                    return float(value)
                except (ValueError, OverflowError):  # OverflowError: a JSON integer past 1e308
                    pass
            raise InvalidInput(f"{self.name} must be a number of seconds")
        if self.kind == "count":
            if value is None or value == "":
                return self.default
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
                return value
            if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
                return int(value)
            raise InvalidInput(f"{self.name} must be a whole number (0 or more)")
        if self.kind == "integer":
            return self._integer(value)
        if self.kind == "json":
            if value is None:
                if self.required:
                    raise InvalidInput(self.missing or f"{self.name} is required")
                return self.default
            return inputs.check_json(self.name, value)
        if value is None or value == "":
            if self.required:
                raise InvalidInput(self.missing or f"{self.name} is required")
            return self.default
        if not isinstance(value, str):
            raise InvalidInput(self.missing or f"{self.name} must be a string, got {type(value).__name__}")
        return value

    def _integer(self, value: object) -> Any:
        if value is None or value == "":
            if self.required:
                raise InvalidInput(self.missing or f"{self.name} is required")
            return self.default
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise InvalidInput(f"{self.name} must be a whole number")

    def schema(self) -> dict[str, Any]:
        """This parameter's JSON schema (the same in the query string and in the body)."""
        schema = dict(SCHEMAS[self.kind])
        if self.required and self.kind in TEXT_KINDS:  # "" counts as missing
            schema["minLength"] = 1
        if self.doc:
            schema["description"] = self.doc
        if self.default is not None:
            schema["default"] = self.default
        return schema | dict(self.constraints)


class Values:
    """A request's parameters as its route declared them, read; only declared names are here."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def keys(self) -> KeysView[str]:  # so that ``core.fn(**values)`` passes them all
        return self._values.keys()

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not a parameter this route reads ({', '.join(self._values) or 'none'}); "
                "declare it in the route's Params"
            ) from None

    def __repr__(self) -> str:
        return f"Values({self._values!r})"


class Params:
    """A route's parameters, each from the query string or a JSON object body; a FastAPI
    dependency (``Depends(params)``) that answers the request's ``Values``."""

    def __init__(self, *params: Param) -> None:
        self.params = params
        self.by_name = {p.name: p for p in params}
        if len(self.by_name) != len(params):
            raise ValueError(f"a parameter is declared twice: {[p.name for p in params]}")

    async def __call__(self, request: Request) -> Values:
        return self.parse(request.query_params, await request.body())

    def parse(self, query: Mapping[str, str], body: bytes) -> Values:
        given: dict[str, Any] = dict(query)
        if body.strip():
            fields = inputs.json_object(body)
            if twice := sorted(set(given) & set(fields)):
                # one of the two would be dropped unchecked: say so instead of guessing which is meant
                raise InvalidInput(
                    f"{', '.join(twice)} given both in the query string and in the JSON body; pass each once"
                )
            given.update(fields)
        for name, value in given.items():  # every text first, undeclared ones too
            if isinstance(value, str):
                param = self.by_name.get(name)
                if param is None:
                    inputs.check_text(name, value)  # accepted and dropped, checked by its name
                else:
                    param.check_text(value)
        values = {p.name: p.read(given.get(p.name)) for p in self.params}  # in declaration order
        return Values({p.name: values[p.name] for p in self.params if not p.ignored})


def path(**schema: Any) -> Any:
    """A path parameter FastAPI reads itself (it checks only the type: core checks the rest, in its
    words), with what core checks added to its schema: ``Annotated[str, path(pattern=...)]``."""
    return Path(json_schema_extra=schema)


def query(**schema: Any) -> Any:
    """The same for a query parameter FastAPI reads itself."""
    return Query(json_schema_extra=schema)
