"""Named screen rules: every pattern a provider reads a screen with has a name, so that

- ``cao explain`` can say which rules matched which lines (a :class:`Trace` records them while one
  reading is made), and which came closest when nothing did;
- a user can fix a misread of their CLI release without waiting for ours: an override file
  (``$CAO_HOME/providers/<provider>.rules``, see :func:`parse_overrides` and docs/providers.md)
  replaces a rule's pattern or adds alternatives to it, by name.

A :class:`Rule` behaves like the compiled pattern it wraps (``search``/``match``/``fullmatch``/
``sub``/``finditer``/``findall``/``split``). Recording costs one global read per call while no trace
is active (cao reads screens often: the hot path stays what it was).
"""

from __future__ import annotations

import difflib
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

SHARED = "shared"  # the owner of rules every provider's reading uses (providers/tui.py)

_TRACE: ContextVar[Trace | None] = ContextVar("cao_rule_trace", default=None)
_tracing = 0  # traces active in any thread: while 0, a rule call records nothing
_tracing_lock = threading.Lock()
_RULES: dict[str, dict[str, Rule]] = {}  # owner → name → rule


class Hit(NamedTuple):
    rule: Rule
    text: str  # the string the rule was tried on (a screen line, usually)
    span: tuple[int, int] | None  # where it matched; None: tried, no match


@dataclass
class Trace:
    """What the rules did while one reading was made: every try, in order."""

    tries: list[Hit] = field(default_factory=list)
    limit: int = 20_000

    def note(self, rule: Rule, text: str, found: re.Match[str] | None) -> None:
        if len(self.tries) < self.limit:
            self.tries.append(Hit(rule, text, found.span() if found else None))

    def hits(self) -> list[Hit]:
        return [hit for hit in self.tries if hit.span is not None]

    def missed(self) -> list[Rule]:
        """Rules that were tried and matched nothing, in the order first tried."""
        matched = {id(hit.rule) for hit in self.hits()}
        seen: dict[int, Rule] = {}
        for hit in self.tries:
            if id(hit.rule) not in matched:
                seen.setdefault(id(hit.rule), hit.rule)
        return list(seen.values())

    def closest(self, rule: Rule) -> tuple[str, float]:
        """The text this rule was tried on that looks most like what it wants (a rough measure:
        the pattern's literal characters against the text), with that likeness (0–1)."""
        want = literal_chars(rule.regex.pattern)
        best, score = "", 0.0
        for hit in self.tries:
            if hit.rule is rule and hit.text.strip():
                ratio = difflib.SequenceMatcher(None, want, hit.text.strip()[:300]).ratio()
                if ratio > score:
                    best, score = hit.text, ratio
        return best, score


def literal_chars(pattern: str) -> str:
    """The characters a pattern spells out (a class stands for its first member, escapes for the
    character they name, the rest of the syntax is left out): what a near-miss line looks like."""
    text = re.sub(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})", lambda m: chr(int(m[1] or m[2], 16)), pattern)
    text = re.sub(r"\[\^?\\?(.)[^\]]*\]", r"\1", text)
    text = re.sub(r"\\[dDsSwWbBAZ]|\(\?[:!=<]*|\{\d+(?:,\d*)?\}|[(){}|^$*+?]", "", text)
    return text.replace("\\", "")


@contextmanager
def tracing() -> Iterator[Trace]:
    """Record every rule call made in this context (this thread/task) into the trace yielded."""
    global _tracing
    trace = Trace()
    token = _TRACE.set(trace)
    with _tracing_lock:
        _tracing += 1
    try:
        yield trace
    finally:
        with _tracing_lock:
            _tracing -= 1
        _TRACE.reset(token)


class Rule:
    """One named pattern of a provider's screen reading (its owner: the provider's module name)."""

    __slots__ = ("default", "doc", "name", "origin", "owner", "regex")

    def __init__(self, owner: str, name: str, pattern: str, flags: int = 0, doc: str = "") -> None:
        self.owner, self.name, self.doc = owner, name, doc
        self.default = re.compile(pattern, flags)
        self.regex = self.default
        self.origin = ""  # "" built in; else "FILE:LINE" of the override in effect

    def __repr__(self) -> str:
        return f"Rule({self.owner}.{self.name}: {self.regex.pattern!r})"

    def _note(self, text: str, found: re.Match[str] | None) -> None:
        if _tracing and (trace := _TRACE.get()) is not None:
            trace.note(self, text, found)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        found = self.regex.search(string, pos, endpos)
        if _tracing:
            self._note(string, found)
        return found

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        found = self.regex.match(string, pos, endpos)
        if _tracing:
            self._note(string, found)
        return found

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        found = self.regex.fullmatch(string, pos, endpos)
        if _tracing:
            self._note(string, found)
        return found

    def finditer(self, string: str) -> Iterator[re.Match[str]]:
        for found in self.regex.finditer(string):
            if _tracing:
                self._note(string, found)
            yield found

    def findall(self, string: str) -> list[str]:
        return self.regex.findall(string)

    def sub(self, repl: str, string: str, count: int = 0) -> str:
        return self.regex.sub(repl, string, count)

    def split(self, string: str) -> list[str]:
        return self.regex.split(string)

    @property
    def pattern(self) -> str:
        return self.regex.pattern


def _caller_owner() -> str:
    """The owner of a rule declared by the provider module that called rule()/literal()."""
    frame = sys._getframe(1)
    while frame.f_globals.get("__name__") == __name__:  # out of this module's own functions
        frame = frame.f_back  # type: ignore[assignment]
    owner = str(frame.f_globals.get("__name__", "")).rsplit(".", 1)[-1]
    return SHARED if owner in ("tui", "base", "_cli") else owner


def rule(name: str, pattern: str, flags: int = 0, *, doc: str = "", owner: str | None = None) -> Rule:
    """Declare a named rule of the calling provider module (its owner: the module's name; the
    shared template's rules are ``shared``)."""
    owner = owner or _caller_owner()
    found = Rule(owner, name, pattern, flags, doc)
    declared = _RULES.setdefault(owner, {})
    if name in declared:
        raise ValueError(f"rule {owner}.{name} is declared twice")
    declared[name] = found
    return found


def literal(name: str, *texts: str, owner: str | None = None) -> Rule:
    """A rule that fully matches exactly one of ``texts`` (placeholders, example prompts)."""
    return rule(name, "|".join(map(re.escape, texts)), owner=owner)


def owner_of(provider: object) -> str:
    """Whose rules a provider reads with: its module's (``scripted_eager`` reads ``scripted``'s)."""
    return type(provider).__module__.rsplit(".", 1)[-1]


def rules_of(owner: str) -> dict[str, Rule]:
    """The rules ``owner`` declared (import its provider first: ``providers.get(name)``)."""
    return dict(_RULES.get(owner, {}))


def shared_rules() -> dict[str, Rule]:
    return dict(_RULES.get(SHARED, {}))


# -- user overrides ---------------------------------------------------------------------------------
class OverrideError(ValueError):
    """A line of an override file that can't be used (the message names the file and the line)."""


class Override(NamedTuple):
    name: str
    pattern: str  # the whole pattern now in effect for the rule
    origin: str  # FILE:LINE
    extends: bool  # "+=" (an alternative added) rather than "=" (replaced)


LINE_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)\s*(?P<op>\+?=)\s?(?P<pattern>.*)$")


def parse_overrides(text: str, owner: str, source: str) -> list[Override]:
    """Read an override file for ``owner``'s rules. Each non-blank line that isn't a ``#`` comment is

        NAME = PATTERN      the rule's pattern is replaced by PATTERN
        NAME += PATTERN     PATTERN is added as an alternative (either now matches)

    PATTERN is a Python regular expression, written as is to the end of the line (no quoting;
    ``(?i)`` at its start for case-insensitive). Lines apply in order; an error names ``source``
    and the line (an unknown rule lists the rule names; a bad pattern says what the regex engine
    said) and nothing of the file is used."""
    declared = _RULES.get(owner, {})
    current = {name: r.default.pattern for name, r in declared.items()}
    flags = {name: r.default.flags for name, r in declared.items()}
    changed: dict[str, Override] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r\n")
        where = f"{source}:{number}"
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = LINE_RE.match(line.strip())
        if m is None:
            raise OverrideError(
                f"{where}: can't read {line.strip()[:80]!r}; write `NAME = PATTERN` (replace) or "
                f"`NAME += PATTERN` (add an alternative), NAME one of `cao rules {owner}`"
            )
        name, op, pattern = m["name"], m["op"], m["pattern"]
        if name not in declared:
            shared = (
                " (a rule every provider shares: it can't be changed for one)"
                if name in shared_rules()
                else ""
            )
            known = ", ".join(sorted(declared)) or "none"
            raise OverrideError(f"{where}: {owner} has no rule {name!r}{shared}; its rules: {known}")
        if not pattern.strip():
            raise OverrideError(
                f"{where}: rule {name!r} is given an empty pattern (it would match every line)"
            )
        try:
            re.compile(pattern, flags[name])
        except (re.error, OverflowError, RecursionError) as exc:  # a{4294967296}; 1,000 nested groups
            raise OverrideError(
                f"{where}: the pattern for {name!r} is not a valid regular expression: {exc}"
            ) from None
        combined = f"(?:{current[name]})|(?:{pattern})" if op == "+=" else pattern
        try:
            re.compile(combined, flags[name])
        except (re.error, OverflowError, RecursionError) as exc:  # e.g. global inline flags in an addition
            raise OverrideError(
                f"{where}: the pattern for {name!r} can't be added to the rule's own ({exc}); "
                "write it whole with `=` instead"
            ) from None
        current[name] = combined
        changed[name] = Override(name, combined, where, op == "+=")
    return list(changed.values())


def apply_overrides(owner: str, overrides: list[Override]) -> None:
    """Put ``overrides`` in effect for ``owner`` (every rule not named goes back to its own)."""
    by_name = {o.name: o for o in overrides}
    for name, r in _RULES.get(owner, {}).items():
        o = by_name.get(name)
        r.regex = re.compile(o.pattern, r.default.flags) if o else r.default
        r.origin = o.origin if o else ""


def reset_overrides() -> None:
    """Every rule back to its built-in pattern."""
    for declared in _RULES.values():
        for r in declared.values():
            r.regex, r.origin = r.default, ""


def override_path(home: Path, owner: str) -> Path:
    return home / "providers" / f"{owner}.rules"
