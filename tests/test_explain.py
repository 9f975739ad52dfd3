"""Explain and user-fixable screen rules (cao/explain.py, providers/rules.py, cao/screenrules.py).

Explain is checked on every saved real screen (tests/screens, the contract test's set): its status
is the reading a status read makes, and what it names as evidence is real (each matched line is a
line of that screen the named rule's pattern matches; the box it reports is the provider's). The
override files: one changes a reading on a real screen, a broken one is refused naming its line,
and cao refuses to start with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import providers
from cao import screenrules
from cao.cli import cli
from cao.errors import InvalidInput
from cao.explain import bug_report, explain_screen, redact, render
from cao.hookstate import HookState
from cao.settings import Settings
from cao.states import HookPhase
from providers import rules
from providers.base import TerminalStatus
from tests.test_provider_screens import SCREENS, Case, saved_cases

CASES = saved_cases()
QWEN_012 = SCREENS / "qwen_code" / "0.12.0" / "processing.txt"


@pytest.fixture(autouse=True)
def built_in_rules() -> Iterator[None]:
    """Overrides are process-wide (as in cao-server): every test starts and ends with none."""
    rules.reset_overrides()
    yield
    rules.reset_overrides()


def _screen(case: Case) -> str:
    return (SCREENS / case.folder / f"{case.state}.txt").read_text()


def _rule(rule_id: str) -> rules.Rule:
    owner, _, name = rule_id.partition(".")
    return (rules.shared_rules() if owner == rules.SHARED else rules.rules_of(owner))[name]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_explain_says_what_decided_each_saved_screen(case: Case) -> None:
    provider = providers.get(case.provider)
    screen = _screen(case)
    ex = explain_screen(provider, screen)
    assert ex["status"] == case.status.value == provider.detect_status(screen)
    assert ex["decided_by"] in ("screen", "pane") and ex["screen"]["status"] == case.status.value
    lines = screen.split("\n")
    for matched in ex["screen"]["matched"]:
        r = _rule(matched["rule"])
        assert matched["pattern"] == r.pattern
        for shown in matched["lines"]:
            if shown["line"] is not None:  # the line it names is that screen's, and the rule matches it
                assert lines[shown["line"] - 1].rstrip(" ") == shown["text"]
                assert r.search(shown["text"]) is not None
    if ex["screen"]["last_rule"] is not None:
        assert ex["screen"]["last_rule"] in [m["rule"] for m in ex["screen"]["matched"]]
    box = ex["input_box"]
    assert box["found"] == (provider.input_text(screen) is not None)
    assert box["text"] == provider.input_text(screen)
    if case.status == TerminalStatus.UNKNOWN:
        assert "closest" in ex and ex["reason"]
    text = render(ex)
    assert f"status: {case.status.value}" in text


def test_a_hook_that_decides_is_named() -> None:
    """A screen nothing matches, and the CLI said its turn ended a second ago: the hook decided."""
    provider = providers.get("claude_code")
    hook = HookState(phase=HookPhase.TURN_END, event="Stop", at=100.0, count=3, starts=True)
    ex = explain_screen(provider, "something\nno box here\n", hook=hook, now=101.0)
    assert (ex["status"], ex["decided_by"], ex["screen"]["status"]) == ("completed", "hook", "unknown")
    assert ex["hook"]["event"] == "Stop" and ex["hook"]["age_s"] == 1.0 and ex["hook"]["changed_status"]
    assert ex["closest"], "an unknown screen lists the rules that came closest"
    assert "decided by the hook" in render(ex)


def test_closest_rules_point_at_the_near_miss() -> None:
    """A Claude screen whose box row lost its NO-BREAK SPACE: the box rule comes closest on that row."""
    screen = (SCREENS / "claude_code" / "idle.txt").read_text().replace("❯\u00a0", "❯|")
    ex = explain_screen(providers.get("claude_code"), screen)
    assert ex["status"] == "unknown"
    near = {c["rule"]: c for c in ex["closest"]}
    assert "claude_code.box" in near and near["claude_code.box"]["nearest_text"].startswith("❯|")


def test_tracing_records_nothing_outside_explain() -> None:
    r = rules.rules_of("claude_code")["busy_footer"]
    with rules.tracing() as trace:
        assert r.search("· esc to interrupt")
    assert [hit.rule for hit in trace.hits()] == [r]
    r.search("esc to interrupt")
    assert len(trace.tries) == 1


def test_stacked_rules_after_a_resize_still_find_the_box() -> None:
    """tmux reflows full-width rules into stacked rule lines for a moment after a narrowing resize:
    the box between the last two rules with rows between them is still found."""
    lines = (SCREENS / "claude_code" / "2.0.77" / "idle.txt").read_text().rstrip("\n").split("\n")
    rule_line = next(i for i, line in enumerate(lines) if re.fullmatch(r"─{10,}", line))
    stacked = [*lines[: rule_line + 3], "─" * 40, "─" * 40, *lines[rule_line + 3 :]]
    screen = "\n".join(stacked)
    assert providers.get("claude_code").detect_status(screen) == TerminalStatus.IDLE
    assert providers.get("claude_code").input_text(screen) == ""


# -- override files --------------------------------------------------------------------------------
def _home(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "providers").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (tmp_path / "providers" / name).write_text(text)
    return tmp_path


def test_an_override_file_changes_a_reading(tmp_path: Path) -> None:
    """Qwen Code 0.12.0's real busy screen, read with the busy rule as it was before 0.12 support
    (0.15's timer only): completed, the misread users saw. The user's file adds 0.12's timer as an
    alternative and the same screen reads processing, with the override named as evidence."""
    screen = QWEN_012.read_text()
    provider = providers.get("qwen_code")
    old = r"\((?:\d+[hms] ?)+ · esc to cancel\)|esc to cancel\)"
    screenrules.install(_home(tmp_path / "a", {"qwen_code.rules": f"busy = {old}\n"}))
    assert provider.detect_status(screen) == TerminalStatus.COMPLETED
    home = _home(
        tmp_path / "b",
        {"qwen_code.rules": f"# 0.12: timer after\nbusy = {old}\nbusy += \\(esc to cancel, \\d+s\\)\n"},
    )
    found = screenrules.install(home)
    assert [o.origin for o in found["qwen_code"]] == [f"{home}/providers/qwen_code.rules:3"]
    assert provider.detect_status(screen) == TerminalStatus.PROCESSING
    ex = explain_screen(provider, screen)
    busy = next(m for m in ex["screen"]["matched"] if m["rule"] == "qwen_code.busy")
    assert busy["override"].endswith("qwen_code.rules:3") and ex["overrides"][0]["rule"] == "qwen_code.busy"
    rules.reset_overrides()
    assert provider.detect_status(screen) == TerminalStatus.PROCESSING  # the built-in reads it too now


def test_the_ignore_rule_blanks_a_notice(tmp_path: Path) -> None:
    """A footer notice that reads like Claude's busy footer ("esc to interrupt") makes its idle
    screen read processing; an ``ignore`` rule for that notice blanks it and the screen reads idle."""
    screen = (SCREENS / "claude_code" / "idle.txt").read_text().rstrip("\n")
    screen += "\n  Tip: press esc to interrupt a long turn · /help for more\n"
    provider = providers.get("claude_code")
    assert provider.detect_status(screen) == TerminalStatus.PROCESSING
    screenrules.install(_home(tmp_path, {"claude_code.rules": "ignore = ^  Tip: \n"}))
    assert provider.detect_status(screen) == TerminalStatus.IDLE
    assert provider.input_text(screen) == ""


BROKEN = [
    ("busy = (oops\n", 1, "not a valid regular expression"),
    ("# ok\n\nnosuch = x\n", 3, "has no rule 'nosuch'"),
    ("busy: x\n", 1, "can't read"),
    ("busy = x\nresume = y\n", 2, "every provider shares"),
    ("busy =   \n", 1, "empty pattern"),
    ("busy += (?i)x\n", 1, "can't be added"),
]


@pytest.mark.parametrize(("text", "line", "says"), BROKEN, ids=[b[2] for b in BROKEN])
def test_a_broken_override_file_is_refused_with_its_line(
    tmp_path: Path, text: str, line: int, says: str
) -> None:
    home = _home(tmp_path, {"qwen_code.rules": text})
    with pytest.raises(InvalidInput) as err:
        screenrules.install(home)
    assert f"qwen_code.rules:{line}:" in err.value.message and says in err.value.message
    assert all(not r.origin for r in rules.rules_of("qwen_code").values())  # nothing of it applied


def test_unknown_file_and_bad_bytes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="name the file after one of"):
        screenrules.install(_home(tmp_path / "a", {"claude.rules": "busy = x\n"}))
    home = _home(tmp_path / "b", {})
    (home / "providers" / "codex.rules").write_bytes(b"# fine\nworking = \xff\n")
    with pytest.raises(InvalidInput, match=r"codex.rules:2: not UTF-8"):
        screenrules.install(home)


def test_cao_refuses_to_start_with_a_broken_file(tmp_path: Path, clean_env: dict[str, str]) -> None:
    from cao.core import Cao
    from cao.testing.clock import Clock
    from cao.testing.panes import MemoryPanes

    home = _home(tmp_path / "home", {"qwen_code.rules": "busy = [\n"})
    settings = Settings.from_env({"CAO_HOME": str(home)})
    clock = Clock()
    with pytest.raises(InvalidInput, match=r"qwen_code.rules:1: the pattern for 'busy'"):
        Cao(settings, environ={"PATH": "/usr/bin:/bin"}, clock=clock, pane_io=MemoryPanes(clock))


def test_cli_explains_a_saved_screen_offline(tmp_path: Path, clean_env: dict[str, str]) -> None:
    runner = CliRunner()
    env = {"CAO_HOME": str(tmp_path)}
    out = runner.invoke(
        cli, ["explain", "--screen", str(QWEN_012), "--provider", "qwen_code", "--json"], env=env
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["status"] == "processing"
    draft = tmp_path / "draft.rules"
    draft.write_text("busy = ^never$\n")
    out = runner.invoke(
        cli, ["explain", "--screen", str(QWEN_012), "--provider", "qwen_code", "--rules", str(draft)], env=env
    )
    assert out.exit_code == 0 and "status: completed" in out.output and "draft.rules:1" in out.output
    out = runner.invoke(cli, ["explain", "--screen", str(QWEN_012)], env=env)
    assert out.exit_code == 2 and "--provider" in out.output
    draft.write_text("busy = (\n")
    out = runner.invoke(cli, ["rules", "qwen_code", "--check", str(draft)], env=env)
    assert out.exit_code == 1 and "draft.rules:1" in out.output
    out = runner.invoke(cli, ["rules", "qwen_code", "--json"], env=env)
    assert out.exit_code == 0 and "busy" in [r["rule"] for r in json.loads(out.output)["rules"]]


def test_bug_report_redacts(tmp_path: Path) -> None:
    secret = "sk-ant-api03-" + "a" * 40
    screen = f"{tmp_path}/work\nkey {secret}\nhook 0123456789abcdef0123456789abcdef\nmail me@example.com\n"
    ex = explain_screen(providers.get("claude_code"), screen)
    report = bug_report(ex, screen, homes=(str(tmp_path),))
    for private in (secret, str(tmp_path), "0123456789abcdef0123456789abcdef", "me@example.com"):
        assert private not in report
    assert "<home>/work" in report and "status: unknown" in report
    assert redact("plain words stay") == "plain words stay"
