"""Knobs: the ``CAO_*`` variables cao reads, each declared once with its kind, default and meaning.

One boolean parser and one number parser serve every knob, cao-server's own (cao/settings.py) and
the providers' (``Provider.knobs``, read at launch with ``LaunchContext.knob``), so a typo such as
``CAO_HOOKS=ture`` or ``CAO_CLAUDE_BYPASS=ture`` is refused alike, with the variable and the fix
named, instead of silently reading as "off". ``providers.all_knobs()`` lists the providers' ones
(docs/providers.md's table is generated from them: ``cao.docgen.render_knobs``).

Nothing here imports the rest of cao but its errors, so anything may declare a knob.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Generic, Literal, TypeVar, cast, overload

from cao.errors import InvalidInput

Kind = Literal["flag", "number", "text", "path"]
T = TypeVar("T")
D = TypeVar("D")

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def parse_flag(name: str, raw: str) -> bool:
    """``raw`` as a boolean: true/false, 1/0, yes/no, on/off (any case, spaces around ignored; an
    empty string is false). Anything else is refused, naming ``name`` and the fix."""
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise InvalidInput(f"{name}={raw!r} is not a boolean; use true or false")


def parse_number(name: str, raw: str, *, example: float, minimum: float = 0.0) -> float:
    """``raw`` as a number of at least ``minimum``; refused otherwise, naming ``name`` and the fix
    (``example`` is shown as a value that works: the knob's default)."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):  # nan passes every minimum check; inf crashes int()
        raise InvalidInput(f"{name}={raw!r} is not a number; use e.g. {name}={example}") from None
    if value < minimum:
        raise InvalidInput(f"{name}={raw!r} must be at least {minimum}")
    return value


class _Unset(Enum):
    TOKEN = 0


_UNSET = _Unset.TOKEN


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One ``CAO_*`` variable: its ``kind`` says how it is parsed, ``default`` is its value when it is
    unset or blank, ``doc`` is one line for the docs. ``shown`` is how the docs state the default
    when it is worked out at launch (e.g. "the profile's model, else the CLI's own")."""

    name: str
    kind: Kind
    default: T
    doc: str
    shown: str = ""
    minimum: float = 0.0  # numbers only

    @overload
    def read(self, environ: Mapping[str, str]) -> T: ...

    @overload
    def read(self, environ: Mapping[str, str], default: D) -> T | D: ...

    def read(self, environ: Mapping[str, str], default: object = _UNSET) -> object:
        """The parsed value from ``environ``; unset or blank: ``default`` if given, else the
        declared one. A value the kind can't take raises ``InvalidInput`` naming the variable."""
        raw = environ.get(self.name, "")
        if not raw.strip():
            return self.default if default is _UNSET else default
        if self.kind == "flag":
            return parse_flag(self.name, raw)
        if self.kind == "number":
            return parse_number(self.name, raw, example=cast(float, self.default), minimum=self.minimum)
        if self.kind == "path":
            return Path(raw).expanduser()
        return raw

    @property
    def default_text(self) -> str:
        """The default as the docs show it."""
        if self.shown:
            return self.shown
        if self.kind == "flag":
            return "true" if self.default else "false"
        if self.default is None or self.default == "":
            return "unset"
        return f"`{self.default:g}`" if self.kind == "number" else f"`{self.default}`"


def flag(name: str, default: bool, doc: str, *, shown: str = "") -> Knob[bool]:
    return Knob(name, "flag", default, doc, shown)


def number(name: str, default: float, doc: str, *, minimum: float = 0.0, shown: str = "") -> Knob[float]:
    return Knob(name, "number", default, doc, shown, minimum)


def text(name: str, doc: str, *, default: str = "", shown: str = "") -> Knob[str]:
    return Knob(name, "text", default, doc, shown)


def path(name: str, doc: str, *, shown: str = "") -> Knob[Path | None]:
    return Knob(name, "path", None, doc, shown)
