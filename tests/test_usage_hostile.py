"""Hostile inputs to the tokens/cost/budgets feature and to ``cao explain --screen`` (review h2).

Each test here fails on the code as reviewed: it states what docs/usage.md and docs/providers.md
promise (a broken file is refused naming the file and the key; a line that isn't a record is
skipped; a budget holds new tasks once reached) against an input that breaks the promise."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import providers
from cao.cli import cli
from cao.core import Cao
from cao.delivery import Outcome
from cao.settings import Settings
from cao.states import MessageStatus
from cao.usage import BUDGETS_FILE, PRICES_FILE, UsageConfigError, load_config
from tests.test_fast_delivery import World
from tests.test_usage import SPEND, task

pytestmark = pytest.mark.fast

HUGE = "9" * 400  # a TOML integer tomllib reads (it has no 64-bit bound) and float() can't hold


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


# -- 1: a huge integer in prices.toml / budgets.toml --------------------------------------------
@pytest.mark.parametrize(
    "file,text,key",
    [
        (BUDGETS_FILE, f"[profile.dev]\ntokens = {HUGE}\n", "profile.dev.tokens"),
        (BUDGETS_FILE, f"[profile.dev]\nusd = {HUGE}\n", "profile.dev.usd"),
        (PRICES_FILE, f'[models."m"]\ninput = {HUGE}\noutput = 1\n', "input"),
    ],
)
def test_a_huge_integer_in_a_usage_file_is_refused_naming_the_key(
    tmp_path: Path, file: str, text: str, key: str
):
    home = tmp_path / "cao"
    home.mkdir()
    (home / file).write_text(text)
    # today: OverflowError ("int too large to convert to float") from math.isfinite, a traceback
    with pytest.raises(UsageConfigError) as err:
        load_config(home)
    assert str(home / file) in err.value.message and key in err.value.message
    result = CliRunner().invoke(cli, ["usage", "--check"], env={"CAO_HOME": str(home)})
    assert result.exit_code == 1 and key in result.output, result.output  # not an uncaught exception


def test_a_huge_integer_edited_in_while_running_keeps_the_budgets_and_usage_working(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 100\n")
    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": SPEND}])
    task(world, tid, "task")
    world.deliver(tid)
    world.core.usage.refresh()
    assert world.core.store.get_terminal(tid).budget_hold
    (world.settings.home / BUDGETS_FILE).write_text(f"[profile.developer]\ntokens = {HUGE}\n")
    # documented: a broken edit is refused (logged, usage.config_error) and the old budgets stay;
    # today every refresh raises OverflowError: GET /usage and /terminals/{id}/usage answer 500
    # and housekeeping logs a traceback every tick until the file is fixed
    world.core.usage.refresh()
    overview = world.core.usage_overview()
    assert [b["state"] for b in overview["budgets"]] == ["reached"]


# -- 2: a transcript line with a number too big for an int -------------------------------------
CLAUDE_OK = {
    "type": "assistant",
    "timestamp": "2026-12-02T10:00:01Z",
    "message": {
        "id": "msg_1",
        "model": "claude-sonnet-4-5",
        "usage": {"input_tokens": 5, "output_tokens": 1},
    },
}


@pytest.mark.parametrize(
    "line",
    [
        # 1e400 is a valid JSON number (RFC 8259 grammar); json.loads reads it as float('inf')
        '{"type":"assistant","timestamp":"2026-12-02T10:00:02Z",'
        '"message":{"id":"msg_2","usage":{"input_tokens":1e400,"output_tokens":1}}}',
        '{"type":"assistant","timestamp":"2026-12-02T10:00:02Z",'
        '"message":{"id":"msg_2","usage":{"output_tokens":Infinity}}}',
        '{"type":"assistant","timestamp":' + HUGE + ',"message":{"id":"msg_2","usage":{"input_tokens":1}}}',
    ],
    ids=["1e400-count", "Infinity-count", "huge-int-timestamp"],
)
def test_one_transcript_line_with_an_overflowing_number_does_not_lose_the_whole_transcript(
    tmp_path: Path, line: str
):
    path = tmp_path / ".claude/projects/-w/s1.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(CLAUDE_OK) + "\n" + line + "\n")
    # today: OverflowError out of the reader; UsageBook.read logs it and the terminal reads
    # unknown (or keeps its old totals forever): every later response goes uncounted
    got = providers.get("claude_code").usage(tmp_path)
    assert got is not None and "msg_1" in [e.key for e in got]


def test_an_agent_cannot_stop_its_spending_being_counted_with_one_line(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 10000\n")
    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": SPEND}])
    task(world, tid, "task one")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 6,200 of 10,000
    record = world.settings.home / "terminals" / tid / "scripted-usage.jsonl"
    with record.open("a") as fh:  # what the agent (it owns its HOME) or a broken CLI can write
        fh.write('{"id": "evil", "at": 1, "input_tokens": 1e400}\n')
    task(world, tid, "task two")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 12,400 spent: reached
    u = world.core.terminal_usage(tid)
    assert u["responses"] >= 2, u  # today: frozen at the first reading (1 response, 6,200 tokens)
    assert world.core.store.get_terminal(tid).budget_hold  # today: None, new tasks keep going


# -- 3: an unpriced response lifts a usd budget already reached ----------------------------------
def test_a_reached_usd_budget_stays_reached_when_an_unpriced_model_answers(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\nusd = 0.01\n")
    tid = world.agent(
        rules=[
            {"match": "^task", "reply": "done", "usage": SPEND},  # $0.0075 a response
            {"match": "^chat", "reply": "ok", "usage": {**SPEND, "model": "house-model-7"}},  # no price
        ]
    )
    task(world, tid, "task one")
    world.deliver(tid)
    task(world, tid, "task two")
    world.deliver(tid)
    world.core.usage.refresh()  # $0.015 of $0.01 known: reached
    assert world.core.store.get_terminal(tid).budget_hold
    held = task(world, tid, "task three")
    assert world.deliver(tid) == Outcome.WAITING
    world.send(tid, "chat: a question (not a task: it still goes)")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()
    assert "house-model-7" in world.core.terminal_usage(tid)["unpriced_models"]  # the chat's answer
    # at least $0.015 is known to be spent, more than the $0.01 limit; today the unknown cost of
    # the chat's response makes the whole sum unknown, the budget reads "ok", the hold lifts and
    # the held task goes
    assert world.core.store.get_terminal(tid).budget_hold
    world.deliver(tid)
    assert world.message(held).status == MessageStatus.PENDING


# -- 4: a budget for a session or profile name cao can never have --------------------------------
@pytest.mark.parametrize("name", ["my team", "a.b", "", "tëam/x"])
def test_a_budget_for_a_name_no_session_can_have_is_refused(tmp_path: Path, name: str):
    home = tmp_path / "cao"
    home.mkdir()
    (home / BUDGETS_FILE).write_text(f'[session."{name}"]\nusd = 1.0\n')
    # today: accepted; it can never match a session (names: 1-63 letters, digits, '_' or '-'),
    # and `cao usage` doesn't show it at all, so the typo goes unnoticed and nothing is capped
    with pytest.raises(UsageConfigError) as err:
        Cao(Settings(home=home, server_url="http://127.0.0.1:9"), environ={"PATH": "/usr/bin:/bin"})
    assert str(home / BUDGETS_FILE) in err.value.message


# -- 5: files read without a bound: a FIFO blocks forever --------------------------------------
def _finishes(fn, fifo: Path, seconds: float = 5.0) -> bool:
    done = threading.Event()

    def run() -> None:
        with contextlib.suppress(Exception):
            fn()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    ok = done.wait(seconds)
    if not ok:  # unblock the reader so the thread ends
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        done.wait(5)
    return ok


def test_explain_screen_on_a_fifo_says_so_instead_of_hanging(tmp_path: Path):
    from cao import explain as ex

    fifo = tmp_path / "screen.txt"
    os.mkfifo(fifo)
    # `cao explain --screen FIFO --provider claude_code` (or /dev/zero: reads until memory runs
    # out, the 4 MiB check comes after the whole read); same in screenrules.read_file (--rules,
    # `cao rules X --check FILE`). providers/usage_files.read_bounded shows the safe way.
    assert _finishes(lambda: ex.read_screen_file(fifo), fifo)


def test_a_fifo_as_prices_toml_does_not_stall_usage_forever(world: World):
    fifo = world.settings.home / PRICES_FILE
    os.mkfifo(fifo)
    # today: the reload blocks opening the FIFO while holding the book's lock, on the
    # housekeeping thread: every GET /usage and the whole housekeeping tick stall
    assert _finishes(world.core.usage.refresh, fifo)


# -- 6: `cao usage` arguments -------------------------------------------------------------------
@pytest.fixture
def invoke(world: World):
    from fastapi.testclient import TestClient

    from cao.api import create_app
    from cao.client import Client

    http = TestClient(create_app(world.core), base_url="http://127.0.0.1:9889")
    client = Client("http://127.0.0.1:9889", http=http)
    return lambda *args: CliRunner().invoke(cli, list(args), obj={"client": client})


@pytest.mark.parametrize("args", [["usage", "?x=1"], ["explain", "?x=1"]])
def test_a_terminal_id_with_url_characters_is_a_clear_error_not_a_traceback(invoke, args: list[str]):
    # the id goes into the URL unquoted: "/terminals/?x=1/usage" is GET /terminals (a list), and
    # the CLI dies with AttributeError: 'list' object has no attribute 'get'
    result = invoke(*args)
    assert result.exit_code == 1 and "8 hex digits" in result.output, (result.output, result.exception)


def test_usage_with_a_terminal_and_a_session_is_refused_not_half_ignored(world: World, invoke):
    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": SPEND}])
    # today: --session is silently ignored and the terminal's usage printed (exit 0)
    result = invoke("usage", tid, "--session", "nope")
    assert result.exit_code == 2, result.output


# -- after the fixes: the same check everywhere a terminal id or a session goes into a URL -------
@pytest.mark.parametrize(
    "args",
    [
        ["output", "../usage"],
        ["inbox", "list", "?x=1"],
        ["results", "1a2b3c4d/../x"],
        ["usage", "--session", "a/../b"],
    ],
)
def test_every_command_checks_the_id_or_name_it_puts_in_a_url_path(invoke, args: list[str]):
    result = invoke(*args)
    said = "is not allowed" in result.output or "8 hex digits" in result.output
    assert result.exit_code == 1 and said, (result.output, result.exception)


def test_a_usd_budget_with_only_unpriced_spending_warns_that_it_cannot_be_enforced(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\nusd = 5.0\n")
    sub = world.core.events.subscribe(lambda: None)
    unpriced = {**SPEND, "model": "house-model-7"}
    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": unpriced}])
    task(world, tid, "task one")
    world.deliver(tid)
    world.core.usage.refresh()
    [budget] = world.core.usage_overview()["budgets"]
    assert budget["state"] == "warning" and budget["spent_usd"] is None and budget["spent_usd_known"] == 0
    assert world.core.store.get_terminal(tid).budget_hold is None  # not known to be reached: tasks go
    [warning] = [e for e in sub.take() if e.get("type") == "budget.warning"]
    assert "at least $0.00 of $5.00 (no price for house-model-7)" in warning["reason"], warning


def test_two_budgets_for_the_same_session_are_refused(tmp_path: Path):
    home = tmp_path / "cao"
    home.mkdir()
    (home / BUDGETS_FILE).write_text("[session.team]\nusd = 1.0\n[session.cao-team]\nusd = 5.0\n")
    with pytest.raises(UsageConfigError) as err:
        load_config(home)
    assert "are the same session" in err.value.message and "cao-team" in err.value.message
