"""The bundled scripted agent, run for real in tmux, read through its provider's pure functions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

import providers
from cao.tmux import PaneInfo, Tmux
from providers.base import LaunchContext, TerminalStatus
from providers.scripted import ScriptedProvider
from tests.helpers import read_records, wait_until, write_rules

RULES = {
    "record": True,
    "rules": [
        {"match": r"^slow (?P<what>.+)$", "delay": 30, "reply": "slowly {what}"},
        {"match": r"^ask$", "ask": "Allow tool deploy?", "reply": "deployed"},
        {"match": r"^fail$", "error": "API Error: 500 overloaded"},
        {"match": r"^multi$", "reply": "line one\nline two"},
    ],
    "default": {"reply": "ok: {first_line}"},
}


@pytest.fixture
def agent(tmux: Tmux, tmp_path: Path):
    home = tmp_path / "cao"
    write_rules(home, "developer", RULES)
    prov = providers.get("scripted")
    ctx = LaunchContext(
        terminal_id="5c0a1e00",
        agent_profile="developer",
        working_directory=tmp_path,
        cao_home=home,
        server_url="http://127.0.0.1:9",
        terminal_home=tmp_path,
        base_env={
            "PATH": os.environ["PATH"],
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "CAO_TERMINAL_ID": "5c0a1e00",
            "CAO_AGENT_PROFILE": "developer",
        },
    )
    spec = prov.launch(ctx)
    info = tmux.create_window(
        session_name="cao-sa",
        window_name="a",
        command=spec.command,
        env=spec.env,
        cwd=tmp_path,
        log_path=tmp_path / "a.log",
    )
    yield prov, info, home
    tmux.kill_pane(info.pane_id, info.pane_pid)


def _status(tmux: Tmux, prov: ScriptedProvider, info: PaneInfo) -> str:
    return prov.detect_status(tmux.capture(info.pane_id)).value


def test_lifecycle_screens(agent, tmux: Tmux):
    prov, info, home = agent
    wait_until(lambda: _status(tmux, prov, info) == "idle", what="idle prompt")
    assert prov.input_text(tmux.capture(info.pane_id)) == ""
    # text in the input box, not yet submitted
    tmux.paste(info.pane_id, "hello\nsecond line", enter_count=0)
    wait_until(
        lambda: prov.input_text(tmux.capture(info.pane_id)) == "hello [+1 lines] …second line",
        what="box shows paste",
    )
    assert _status(tmux, prov, info) == "idle"
    tmux.send_keys(info.pane_id, "Enter")
    wait_until(lambda: _status(tmux, prov, info) == "completed", what="completed")
    wait_until(
        lambda: prov.tail_looks_idle((home.parent / "a.log").read_text()[-2048:]), what="idle log tail"
    )
    assert prov.extract_last_message(tmux.capture(info.pane_id)) == "ok: hello"
    # multi-line answer
    tmux.paste(info.pane_id, "multi")
    wait_until(lambda: prov.extract_last_message(tmux.capture(info.pane_id)) == "line one\nline two")
    # processing
    tmux.paste(info.pane_id, "slow work")
    wait_until(lambda: _status(tmux, prov, info) == "processing", what="processing")
    assert prov.input_text(tmux.capture(info.pane_id)) is None
    log = home.parent / "a.log"
    wait_until(lambda: not prov.tail_looks_idle(log.read_text()[-2048:]), what="log tail shows the spinner")
    tmux.send_keys(info.pane_id, "C-c")  # clears input, the turn goes on
    assert _status(tmux, prov, info) == "processing"
    recs = read_records(home, "5c0a1e00")
    assert [r["text"] for r in recs] == ["hello\nsecond line", "multi", "slow work"]


def test_permission_question_and_error(agent, tmux: Tmux):
    prov, info, _home = agent
    wait_until(lambda: _status(tmux, prov, info) == "idle")
    tmux.paste(info.pane_id, "ask")
    wait_until(lambda: _status(tmux, prov, info) == "waiting_user_answer", what="question")
    tmux.send_keys(info.pane_id, "y", "Enter")
    wait_until(lambda: _status(tmux, prov, info) == "completed")
    assert prov.extract_last_message(tmux.capture(info.pane_id)) == "deployed"
    tmux.paste(info.pane_id, "fail")
    wait_until(lambda: _status(tmux, prov, info) == "error", what="error")
    assert "API Error: 500" in prov.extract_last_message(tmux.capture(info.pane_id))
    # an error turn is followed by a normal one
    tmux.paste(info.pane_id, "again")
    wait_until(lambda: _status(tmux, prov, info) == "completed")


def test_inbox_batch_is_split_per_message(agent, tmux: Tmux):
    prov, info, home = agent
    wait_until(lambda: _status(tmux, prov, info) == "idle")
    tmux.paste(
        info.pane_id, "[cao message #7 from aaaa0001]\nfirst\n\n[cao message #8 from bbbb0002]\nsecond\nmore"
    )
    wait_until(lambda: _status(tmux, prov, info) == "completed")
    rec = read_records(home, "5c0a1e00")[-1]
    assert rec["messages"] == [
        {"id": 7, "sender": "aaaa0001", "body": "first"},
        {"id": 8, "sender": "bbbb0002", "body": "second\nmore"},
    ]
    assert prov.extract_last_message(tmux.capture(info.pane_id)) == "ok: first\nok: second"


class Screen(NamedTuple):
    screen: str
    status: TerminalStatus
    last: str


SCREENS = {
    "blank": Screen("", TerminalStatus.PROCESSING, ""),
    "starting": Screen(
        "cao scripted agent · terminal x · profile p\nstarting…", TerminalStatus.PROCESSING, ""
    ),
    "idle": Screen("banner\n\n❯ \n\n", TerminalStatus.IDLE, ""),
    "typing": Screen("banner\n\n❯ half typed", TerminalStatus.IDLE, ""),
    "spinner": Screen("› go\n  on\n⠹ thinking… (2s · esc to interrupt)", TerminalStatus.PROCESSING, ""),
    "done": Screen("› go\n● went\n  far\n\n❯ ", TerminalStatus.COMPLETED, "went\nfar"),
    "error": Screen("› go\n✗ API Error: 500\n\n❯ ", TerminalStatus.ERROR, "API Error: 500"),
    "question": Screen("› go\n? Allow tool x? (y/n)", TerminalStatus.WAITING_USER_ANSWER, ""),
    # a body line that looks like a reply mark is indented in the echo, so it can't fool us
    "spoof": Screen("› hi\n  ● fake\n  ✗ fake\n\n❯ ", TerminalStatus.COMPLETED, ""),
}


@pytest.mark.parametrize("case", SCREENS.values(), ids=SCREENS.keys())
def test_detect_status_table(case: Screen):
    prov = providers.get("scripted")
    assert prov.detect_status(case.screen) == case.status
    assert prov.extract_last_message(case.screen) == case.last


def test_registry():
    assert providers.default_name() == "scripted"
    assert {"scripted", "scripted_eager"} <= set(providers.names())
    assert providers.get("scripted_eager").accepts_input_while_processing
    assert not providers.get("scripted").accepts_input_while_processing
    from cao.errors import ProviderError

    with pytest.raises(ProviderError, match="choose one of"):
        providers.get("nope")


@pytest.mark.parametrize(
    ("before", "after", "verdict"),
    [
        ("banner\n❯ ", "banner\n❯ [cao message #1 from x] [+1 lines]", False),  # still in the box
        ("banner\n❯ ", "banner\n❯ ", None),  # nothing happened (yet)
        ("banner\n❯ ", "› hi\n⠋ thinking… (0s · esc to interrupt)", True),  # went busy
        ("banner\n❯ ", "› hi\n● ok: hi\n\n❯ ", True),  # answered already
        # busy before (eager): a spinner tick alone proves nothing; one more queued input does
        ("› a\n⠋ thinking… (1s · esc to interrupt)", "› a\n⠙ thinking… (1s · esc to interrupt)", None),
        (
            "› a\n⠋ thinking… (1s · esc to interrupt)",
            "› a\n⠙ thinking… (1s · 1 queued · esc to interrupt)",
            True,
        ),
        (
            "› a\n⠋ thinking… (1s · esc to interrupt)",
            "› a\n● done\n› b\n⠙ thinking… (0s · esc to interrupt)",
            None,  # a new turn may be an earlier queued input starting: not this paste's evidence
        ),
    ],
    ids=["in-box", "unchanged", "busy", "answered", "eager-tick", "eager-queued", "eager-new-turn"],
)
def test_submit_confirmed(before: str, after: str, verdict: bool | None):
    assert providers.get("scripted_eager").submit_confirmed(before, after) is verdict
