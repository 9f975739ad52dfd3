"""cao/knobs.py: the one boolean parser and the one number parser, for cao-server's settings and the
providers' knobs alike, and what a declared knob reads."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from cao import knobs
from cao.errors import InvalidInput
from cao.settings import Settings


class Word(NamedTuple):
    raw: str
    value: bool


WORDS = [
    *(Word(raw, True) for raw in ("1", "true", "TRUE", " yes ", "on", "On")),
    *(Word(raw, False) for raw in ("0", "false", "False", "no", " off", "")),
]


@pytest.mark.parametrize("word", WORDS, ids=[repr(w.raw) for w in WORDS])
def test_booleans_read_alike_everywhere(word: Word) -> None:
    assert knobs.parse_flag("CAO_X", word.raw) is word.value
    assert Settings.from_env({"CAO_HOOKS": word.raw}).hooks is word.value
    bypass = knobs.flag("CAO_CLAUDE_BYPASS", True, "skip prompts")
    assert bypass.read({"CAO_CLAUDE_BYPASS": word.raw}) is (word.value if word.raw.strip() else True)


@pytest.mark.parametrize("raw", ["ture", "2", "enabled", "y"])
def test_a_typo_is_refused_with_the_variable_and_the_fix(raw: str) -> None:
    fix = "is not a boolean; use true or false"
    with pytest.raises(InvalidInput, match=rf"^CAO_HOOKS={raw!r} {fix}$"):
        Settings.from_env({"CAO_HOOKS": raw})
    bypass = knobs.flag("CAO_CLAUDE_BYPASS", True, "skip prompts")
    with pytest.raises(InvalidInput, match=rf"^CAO_CLAUDE_BYPASS={raw!r} {fix}$"):
        bypass.read({"CAO_CLAUDE_BYPASS": raw})


def test_numbers_are_parsed_with_a_floor() -> None:
    assert Settings.from_env({"CAO_HOOK_SETTLE": "2.5"}).hook_settle == 2.5
    assert Settings.from_env({"CAO_HOOK_SETTLE": " "}).hook_settle == 5.0
    with pytest.raises(
        InvalidInput, match=r"^CAO_HOOK_SETTLE='soon' is not a number; use e\.g\. CAO_HOOK_SETTLE=5\.0$"
    ):
        Settings.from_env({"CAO_HOOK_SETTLE": "soon"})
    with pytest.raises(InvalidInput, match=r"^CAO_DELIVERY_WORKERS='0' must be at least 1$"):
        Settings.from_env({"CAO_DELIVERY_WORKERS": "0"})
    wait = knobs.number("CAO_X_WAIT", 1.5, "how long", minimum=0.5)
    assert wait.read({}) == 1.5 and wait.read({"CAO_X_WAIT": "3"}) == 3.0
    with pytest.raises(InvalidInput, match=r"^CAO_X_WAIT='0.1' must be at least 0.5$"):
        wait.read({"CAO_X_WAIT": "0.1"})


def test_text_and_paths_unset_or_blank_read_as_the_default() -> None:
    model = knobs.text("CAO_X_MODEL", "the model")
    assert [model.read(env) for env in ({}, {"CAO_X_MODEL": ""}, {"CAO_X_MODEL": "m-1"})] == ["", "", "m-1"]
    cache = knobs.path("CAO_X_CACHE", "a cache")
    assert cache.read({}) is None
    assert cache.read({"CAO_X_CACHE": "~/c"}) == Path("~/c").expanduser()
    # a launch-time default instead of the declared one (e.g. Claude's bypass with a tool allow-list)
    assert knobs.flag("CAO_X_BYPASS", True, "b").read({}, False) is False
    assert knobs.flag("CAO_X_BYPASS", True, "b").read({"CAO_X_BYPASS": "on"}, False) is True


def test_defaults_as_the_docs_show_them() -> None:
    assert knobs.flag("CAO_A", True, "a").default_text == "true"
    assert knobs.number("CAO_B", 0.25, "b").default_text == "`0.25`"
    assert knobs.text("CAO_C", "c").default_text == "unset"
    assert knobs.text("CAO_D", "d", default="claude").default_text == "`claude`"
    assert knobs.path("CAO_E", "e", shown="`~/.cache/cao`").default_text == "`~/.cache/cao`"


def test_the_server_refuses_a_bad_provider_knob_at_start_and_warns_about_unknown_names():
    from cao.settings import check_environment

    with pytest.raises(InvalidInput, match="CAO_CLAUDE_BYPASS"):
        check_environment({"CAO_CLAUDE_BYPASS": "ture"})  # only a launch used to notice
    warnings = check_environment({"CAO_HOOK": "false", "CAO_NOTHING_LIKE_IT": "1", "CAO_HOOKS": "false"})
    assert warnings == [
        "CAO_HOOK is not a cao setting, so it changes nothing; did you mean CAO_HOOKS?",
        "CAO_NOTHING_LIKE_IT is not a cao setting, so it changes nothing; docs/configuration.md lists them",
    ]
    assert check_environment({"CAO_TERMINAL_ID": "1a2b3c4d", "CAO_CLAUDE_BYPASS": "false"}) == []


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "Infinity", "1e400"])
@pytest.mark.parametrize("name", ["CAO_WATCH_INTERVAL", "CAO_DELIVERY_MAX_ATTEMPTS", "CAO_API_PORT"])
def test_a_number_that_is_no_finite_number_is_refused_naming_the_variable(name: str, raw: str) -> None:
    """nan passed every minimum check (and inf or nan crashed int() with a traceback)."""
    with pytest.raises(InvalidInput, match=rf"^{name}={raw!r} is not a number"):
        Settings.from_env({name: raw})
