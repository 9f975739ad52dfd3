"""One vocabulary (cao/states.py): no state word is compared as a string literal anywhere else.

The status a terminal shows, its lifecycle state, a message's status, a handoff job's state, a
worktree's state, what woke a delivery, why a message waits or failed: each is an enum there. A
comparison with a bare string (``status == "idle"``) drifts silently the day a word changes; an
enum member can't. Docstrings, JSON keys and log text are not comparisons and don't count."""

from __future__ import annotations

import ast
from enum import Enum
from pathlib import Path

from cao import states

ROOT = Path(__file__).resolve().parents[1]
WORDS = {
    member.value
    for name in dir(states)
    if isinstance(obj := getattr(states, name), type) and issubclass(obj, Enum)
    for member in obj  # type: ignore[attr-defined]
    if isinstance(member.value, str)
}
STATE_KEYWORDS = {"status", "state", "phase", "trigger", "kind", "reason"}


def literals_compared(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def words(node: ast.AST) -> list[ast.Constant]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return []

    for node in ast.walk(tree):
        sides: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            # ``"busy" in text`` looks for a word in a text: only ``x in (...)`` tests a state
            containment = all(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            sides = node.comparators if containment else [node.left, *node.comparators]
        elif isinstance(node, ast.Call):
            sides = [kw.value for kw in node.keywords if kw.arg in STATE_KEYWORDS]
        elif isinstance(node, ast.Dict):
            sides = [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in STATE_KEYWORDS
            ]
        for side in sides:
            found += [(c.lineno, c.value) for c in words(side) if c.value in WORDS]
    return found


def test_no_state_word_is_compared_as_a_string_literal_outside_the_vocabulary():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {word!r}"
        for path in sorted([*(ROOT / "cao").rglob("*.py"), *(ROOT / "providers").rglob("*.py")])
        if path.name != "states.py" and "fakemodel" not in path.parts
        for line, word in literals_compared(ast.parse(path.read_text()))
    ]
    assert offenders == [], "use the enums of cao/states.py:\n" + "\n".join(offenders)


def test_the_check_finds_what_it_looks_for():
    tree = ast.parse('if status == "idle" or s in ("gone", "x"): f(status="pending")\nd = {"state": "live"}')
    assert sorted(w for _, w in literals_compared(tree)) == ["gone", "idle", "live", "pending"]
