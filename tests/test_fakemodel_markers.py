"""The fake model's marker language: both spellings read the same (cao/testing/fakemodel/script.py)."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from cao.testing.fakemodel.script import Marker, Script


class Case(NamedTuple):
    name: str
    prompt: str


CASES = [
    Case(
        "brackets",
        'Go [[delay:2.5]][[mcp:send_message {"message": "hi"}]][[reply:Done, thanks.]][[error:429]]',
    ),
    Case(
        "angles", 'Go <<delay:2.5>><<mcp:send_message {"message": "hi"}>><<reply:Done, thanks.>><<error:429>>'
    ),
    Case(
        "mixed", 'Go <<delay:2.5>>[[mcp:send_message {"message": "hi"}]]<<reply:Done, thanks.>>[[error:429]]'
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_marker_spellings_read_the_same(case: Case) -> None:
    script = Script.parse(case.prompt)
    assert (script.delay, script.reply, script.error) == (2.5, "Done, thanks.", 429)
    assert script.tools == [Marker("mcp", 'send_message {"message": "hi"}')]
    assert script.plain_prompt == "Go"


def test_kimi_split_brackets_are_not_markers() -> None:
    """What Kimi CLI sends for a typed ``[[delay:3]]`` (three text parts, joined by newlines)."""
    assert Script.parse("Slowly [\n[delay:3]\n]").delay == 0.0
