"""Why a terminal reads the status it does: ``cao explain``, ``GET /terminals/{id}/explain`` and
the dashboard's explain panel.

One explanation is made the way a status read is made (the provider reads the screen, then
:func:`cao.hookstate.combine` weighs the CLI's latest hook report), with the provider's named
rules traced while it reads (providers/rules.py): what decided (pane, screen or hook), the rules
that matched and on which lines, the input box as read, the hook's event and age, what the other
signal said, and, for ``unknown``, the rules that came closest. The same function reads a saved
screen offline (``cao explain --screen FILE --provider NAME``), exactly as the contract test does.

A bug report (:func:`bug_report`) is the explanation as text plus the screen with what looks
private taken out (:func:`redact`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cao
from cao.files import read_small_file
from cao.hookstate import HookState, combine
from cao.states import ENDED, Status, TerminalState
from cao.timefmt import iso
from providers import rules
from providers.base import Provider, Reading, TerminalStatus
from providers.tui import PANE_DEAD_RE, BoxedTUI

CLOSEST_SHOWN = 5
LINES_SHOWN = 6  # lines listed per matched rule


@dataclass(frozen=True)
class Pane:
    """What tmux says of the pane, next to its screen (None: not looked at, e.g. a saved screen)."""

    pane_id: str | None = None
    mode: str = ""  # a tmux mode the pane is in ("copy-mode"): no paste goes in then
    state: str = ""  # the terminal's row state (live, starting, gone…)
    gone_reason: str | None = None


def _line_numbers(lines: list[str], text: str) -> list[int]:
    """Where ``text`` (a string a rule was tried on) sits in the screen's lines (1-based)."""
    want = text.rstrip(" ")
    return [i + 1 for i, line in enumerate(lines) if line.rstrip(" ") == want] if "\n" not in text else []


def _rule_id(rule: rules.Rule) -> str:
    return f"{rule.owner}.{rule.name}"


def _matched(trace: rules.Trace, lines: list[str]) -> list[dict[str, Any]]:
    """Each rule that matched, in the order it first did, with the lines it matched."""
    out: dict[int, dict[str, Any]] = {}
    for hit in trace.hits():
        entry = out.setdefault(
            id(hit.rule),
            {
                "rule": _rule_id(hit.rule),
                "pattern": hit.rule.pattern,
                "override": hit.rule.origin or None,
                "lines": [],
            },
        )
        numbers: list[int | None] = [*_line_numbers(lines, hit.text)] or [None]
        for number in numbers:
            shown = {"line": number, "text": hit.text.rstrip(" ")[:300]}
            if shown not in entry["lines"] and len(entry["lines"]) < LINES_SHOWN:
                entry["lines"].append(shown)
    return list(out.values())


def _closest(trace: rules.Trace, lines: list[str]) -> list[dict[str, Any]]:
    """The rules tried that matched nothing, each with the line most like what it wants."""
    found: list[dict[str, Any]] = []
    for rule in trace.missed():
        text, score = trace.closest(rule)
        if not text:
            continue
        numbers = _line_numbers(lines, text)
        found.append(
            {
                "rule": _rule_id(rule),
                "pattern": rule.pattern,
                "override": rule.origin or None,
                "nearest_line": numbers[0] if numbers else None,
                "nearest_text": text.rstrip()[:300],
                "likeness": round(score, 2),
            }
        )
    found.sort(key=lambda c: -float(c["likeness"]))
    return found[:CLOSEST_SHOWN]


def _box(provider: Provider, screen: str) -> dict[str, Any]:
    """The input box as the provider reads it: where (BoxedTUI), and its text."""
    text = provider.input_text(screen)
    box: dict[str, Any] = {"found": text is not None, "text": text}
    if isinstance(provider, BoxedTUI):
        found = provider.input_box(provider.lines(screen))
        if found is not None:
            box.update(top_line=found.top + 1, first_line=found.first + 1, end_line=found.end + 1)
    return box


def explain_screen(
    provider: Provider,
    screen: str,
    *,
    hook: HookState | None = None,
    now: float = 0.0,
    settle: float = 5.0,
    pane: Pane | None = None,
    never_ready: bool = False,
) -> dict[str, Any]:
    """Explain one reading of ``screen`` by ``provider`` (with the CLI's latest ``hook`` report, as
    of ``now``). ``never_ready``: the terminal never looked ready yet (processing reads starting)."""
    lines = screen.split("\n")
    with rules.tracing() as trace:
        reading = provider.detect(screen)
    combined, by_hooks = combine(reading, hook, now, settle=settle)
    status = combined.status.value
    decided_by = "hook" if by_hooks and combined.status != reading.status else "screen"
    why = combined.reason
    if pane is not None and (pane.state in ENDED or pane.gone_reason):
        status, decided_by, why = Status.GONE.value, "pane", pane.gone_reason or "the pane is gone"
    elif pane is not None and pane.state == TerminalState.STARTING:
        status, decided_by, why = Status.STARTING.value, "pane", "cao is still starting the CLI in its pane"
    elif reading.final:
        decided_by = "pane" if any(PANE_DEAD_RE.match(line) for line in lines[-3:]) else "screen"
    if status == TerminalStatus.PROCESSING and never_ready:
        status, why = Status.STARTING.value, f"{why} (the CLI has never looked ready yet: starting)".strip()
    matched = _matched(trace, lines)
    hits = trace.hits()
    decisive = _rule_id(hits[-1].rule) if hits else None
    out: dict[str, Any] = {
        "status": status,
        "decided_by": decided_by,
        "reason": why or None,
        "provider": provider.name,
        "screen": {
            "status": reading.status.value,
            "reason": reading.reason or None,
            "final": reading.final,
            "last_rule": decisive,  # the rule that matched last before the reading was made
            "matched": matched,
        },
        "input_box": _box(provider, screen),
        "hook": _hook(hook, now, reading, combined),
        "overrides": [
            {"rule": _rule_id(r), "pattern": r.pattern, "from": r.origin}
            for r in rules.rules_of(rules.owner_of(provider)).values()
            if r.origin
        ],
    }
    if pane is not None:
        out["pane"] = {"pane_id": pane.pane_id, "mode": pane.mode or None, "state": pane.state}
    if reading.status == TerminalStatus.UNKNOWN or status == TerminalStatus.UNKNOWN:
        out["closest"] = _closest(trace, lines)
    return out


def _hook(hook: HookState | None, now: float, reading: Reading, combined: Reading) -> dict[str, Any] | None:
    if hook is None or hook.phase is None:
        return None
    return {
        "event": hook.event,
        "phase": hook.phase.value,
        "at": iso(hook.at),
        "age_s": round(max(0.0, now - hook.at), 1),
        "detail": hook.detail or None,
        "events": hook.count,
        "reports_turn_starts": hook.starts,
        "changed_status": combined.status != reading.status,
    }


# -- reading it -----------------------------------------------------------------------------------
def render(ex: dict[str, Any]) -> str:
    """An explanation as text (``cao explain``; the bug report's first part)."""
    out = [f"status: {ex['status']}  (decided by the {ex['decided_by']})"]
    if ex.get("reason"):
        out.append(f"why: {ex['reason']}")
    if ex.get("terminal"):
        t = ex["terminal"]
        out.append(f"terminal: {t['id']} {t.get('name') or ''} · provider {ex['provider']}")
    else:
        out.append(f"provider: {ex['provider']}")
    sc = ex["screen"]
    out.append(f"screen reads: {sc['status']}" + (f" — {sc['reason']}" if sc.get("reason") else ""))
    if sc.get("last_rule"):
        out.append(f"  last rule matched: {sc['last_rule']}")
    for m in sc["matched"]:
        where = ", ".join(f"{ln['line']}" for ln in m["lines"] if ln["line"]) or "-"
        note = f"  [override {m['override']}]" if m.get("override") else ""
        out.append(f"  {m['rule']:<26} /{m['pattern']}/  lines {where}{note}")
        for ln in m["lines"][:2]:
            out.append(f"      {ln['line'] or '?':>3}| {ln['text'][:100]}")
    box = ex["input_box"]
    if not box["found"]:
        out.append("input box: not found (no paste goes in; an emptied box or a header proves nothing)")
    else:
        where = f" (lines {box['first_line']}–{box['end_line'] - 1})" if "first_line" in box else ""
        out.append(f"input box{where}: {'empty' if not box['text'] else repr(box['text'][:120])}")
    hook = ex.get("hook")
    if hook is None:
        out.append("hook: none reported")
    else:
        changed = " — it decided the status" if hook["changed_status"] else ""
        out.append(
            f"hook: {hook['event']} ({hook['phase']}) {hook['age_s']} s ago, {hook['events']} events{changed}"
        )
    if pane := ex.get("pane"):
        out.append(
            f"pane: {pane['pane_id']} state {pane['state']}"
            + (f", in {pane['mode']}" if pane["mode"] else "")
        )
    for o in ex.get("overrides", []):
        out.append(f"override in effect: {o['rule']} = /{o['pattern']}/ ({o['from']})")
    if ex.get("closest"):
        out.append("closest rules (matched nothing):")
        for c in ex["closest"]:
            out.append(
                f"  {c['rule']:<26} /{c['pattern']}/  nearest line {c['nearest_line'] or '?'} "
                f"({c['likeness']:.0%}): {c['nearest_text'][:90]!r}"
            )
    return "\n".join(out)


SECRET_RES = (
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}"),  # API keys (sk-ant-…, sk-proj-…)
    re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{16,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{20,}"),
    re.compile(r"\b[0-9a-f]{32,}\b"),  # long hex (tokens, hook keys)
    re.compile(r"\b[A-Za-z0-9+/_-]{40,}={0,2}"),  # long base64-ish runs
    re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.-]+\b"),  # e-mail addresses
)


def redact(text: str, *, homes: tuple[str, ...] = ()) -> str:
    """``text`` with what looks private replaced: the given home paths, keys and tokens, e-mail
    addresses."""
    for home in sorted((h for h in homes if h and len(h) > 1), key=len, reverse=True):
        text = text.replace(home, "<home>")
    for pattern in SECRET_RES:
        text = pattern.sub("<redacted>", text)
    return text


def bug_report(ex: dict[str, Any], screen: str, *, homes: tuple[str, ...] = ()) -> str:
    """The explanation and the (redacted) screen, ready to paste into an issue."""
    meta = {"cao": cao.__version__, "provider": ex["provider"], "status": ex["status"]}
    body = screen.rstrip("\n")
    return redact(
        "### cao status misread report\n\n"
        f"{json.dumps(meta)}\n\n```\n{render(ex)}\n```\n\n"
        f"Screen (capture-pane -p, {len(body.splitlines())} lines):\n\n```\n{body}\n```\n",
        homes=homes,
    )


def read_screen_file(path: Path) -> str:
    return read_small_file(path, 4 * 1024 * 1024, "screen file").decode("utf-8", "replace")  # capture-pane -p
