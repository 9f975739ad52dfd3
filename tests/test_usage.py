"""What each agent costs (cao/usage.py): tokens read from what the CLI records, per task attempt
and model, priced from an editable table, budgets that warn and then hold new tasks (never kill).

On memory panes (the bundled scripted agent's own code, a fake clock): its ``"usage"`` rules
write one JSON line per model response, the way a real CLI's transcript does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cao.cli import cli
from cao.core import Cao
from cao.delivery import Outcome
from cao.settings import Settings
from cao.states import Kind, MessageStatus, WaitReason
from cao.usage import BUDGETS_FILE, PRICES_FILE, UsageConfigError, attribute, load_config
from providers.base import UsageEntry
from tests.test_fast_delivery import World

pytestmark = pytest.mark.fast

SPEND = {"model": "claude-sonnet-4-5", "input_tokens": 1000, "output_tokens": 200, "cache_read_tokens": 5000}
# 1000 × 3 + 200 × 15 + 5000 × 0.3 per million: $0.0075 a response
COST = (1000 * 3.0 + 200 * 15.0 + 5000 * 0.3) / 1e6


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


def spender(world: World, profile: str = "developer", **spend: Any) -> str:
    return world.agent(profile, rules=[{"match": "^task", "reply": "done", "usage": {**SPEND, **spend}}])


def task(world: World, tid: str, body: str) -> int:
    return world.core.send_message(tid, body, sender_id="operator", kind=Kind.TASK.value).message.id or 0


def test_tokens_are_counted_per_task_and_priced(world: World):
    tid = spender(world)
    assert world.core.terminal_usage(tid)["known"] is False  # its script has spent nothing yet
    first = task(world, tid, "task one")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.clock.advance(1)
    second = task(world, tid, "task two")
    world.send(tid, "task three, from a peer: not a new task", sender="operator")  # a chat
    assert world.deliver(tid) == Outcome.DELIVERED
    u = world.core.terminal_usage(tid)
    assert u["known"] is True and u["responses"] == 3
    assert (u["input_tokens"], u["output_tokens"], u["cache_read_tokens"]) == (3000, 600, 15000)
    assert u["tokens"] == 3 * (1000 + 200 + 5000)
    assert u["cost_usd"] == pytest.approx(3 * COST)
    by_task = {t["task_id"]: t["responses"] for t in u["by_task"]}
    assert by_task == {f"m{first}": 1, f"m{second}": 2}  # the chat's response is the second task's
    assert [m["model"] for m in u["by_model"]] == ["claude-sonnet-4-5"]
    # the terminal view (cao status) carries the sum
    view = world.core.terminal_view(tid)["usage"]
    assert view["tokens"] == u["tokens"] and view["cost_usd"] == pytest.approx(3 * COST)


def test_a_cli_that_records_nothing_reads_unknown_never_zero(world: World):
    tid = world.agent()  # the default script spends nothing: no records at all
    world.send(tid, "hello")
    assert world.deliver(tid) == Outcome.DELIVERED
    u = world.core.terminal_usage(tid)
    assert u["known"] is False and "records no token usage" in u["why"]
    assert world.core.terminal_view(tid)["usage"]["tokens"] is None
    overview = world.core.usage_overview()
    assert overview["terminals_unknown"] == 1 and overview["total"]["tokens"] == 0


def test_a_model_without_a_price_has_tokens_and_an_unknown_cost(world: World):
    tid = spender(world, model="house-model-7")
    task(world, tid, "task")
    world.deliver(tid)
    u = world.core.terminal_usage(tid)
    assert u["tokens"] == 6200 and u["cost_usd"] is None and u["unpriced_models"] == ["house-model-7"]


def test_the_users_price_table_comes_first(tmp_path: Path):
    home = tmp_path / "cao"
    home.mkdir()
    (home / PRICES_FILE).write_text(
        '[models."claude-sonnet-4-5"]\ninput = 1.0\noutput = 2.0\n'
        '[models."house-*"]\ninput = 0.5\noutput = 0.5\n'
    )
    w = World(tmp_path)
    try:
        tid = spender(w)
        task(w, tid, "task")
        w.deliver(tid)
        assert w.core.terminal_usage(tid)["cost_usd"] == pytest.approx((1000 * 1.0 + 200 * 2.0) / 1e6)
    finally:
        w.core.stop()
    assert load_config(home).price("house-model-7") == {
        "input": 0.5,
        "output": 0.5,
        "cache_read": 0.0,
        "cache_write": 0.0,
    }


def test_a_response_recorded_twice_counts_once_and_belongs_to_the_task_it_followed():
    entries = [
        UsageEntry(10.0, "m", 5, 1, key="a"),
        UsageEntry(10.5, "m", 5, 1, key="a"),  # the same response on a second transcript line
        UsageEntry(20.0, "m", 7, 2, key="b"),
        UsageEntry(5.0, "m", 1, 1, key="c"),  # before any task
    ]
    rows = attribute("t1", entries, [("m1", 9.0), ("m2", 15.0)])
    got = {(r.task_id, r.input_tokens, r.responses) for r in rows}
    assert got == {("", 1, 1), ("m1", 5, 1), ("m2", 7, 1)}


def test_a_budget_reached_holds_new_tasks_with_the_reason_and_lets_other_mail_through(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 10000\nwarn_at = 0.5\n")
    seen: list[dict[str, Any]] = []
    sub = world.core.events.subscribe(lambda: None)
    tid = spender(world)
    task(world, tid, "task one")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 6,200 of 10,000: past the warning line, not the limit
    assert world.core.store.get_terminal(tid).budget_hold is None
    task(world, tid, "task two")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 12,400: reached
    hold = world.core.store.get_terminal(tid).budget_hold
    assert hold and "profile developer budget" in hold and "12,400 of 10,000 tokens" in hold
    held = task(world, tid, "task three")
    assert world.deliver(tid) == Outcome.WAITING
    m = world.message(held)
    assert m.status == MessageStatus.PENDING and m.waiting_reason == hold
    chat = world.send(tid, "a question, not a task")  # other mail still goes: the agent isn't stopped
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.message(chat).status == MessageStatus.DELIVERED
    assert world.message(held).status == MessageStatus.PENDING
    assert world.core.store.get_terminal(tid).state == "live"
    seen.extend(sub.take())
    kinds = [e.get("type") for e in seen]
    assert kinds.count("budget.warning") == 1 and kinds.count("budget.reached") == 1
    overview = world.core.usage_overview()
    assert [b["state"] for b in overview["budgets"]] == ["reached"]
    # raised (the file read again when it changes): the hold lifts and the task goes
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 100000\n")
    world.core.usage.refresh()
    assert world.core.store.get_terminal(tid).budget_hold is None
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.message(held).status == MessageStatus.DELIVERED


def test_a_session_budget_counts_every_agent_of_the_session_deleted_ones_too(world: World):
    a = spender(world)
    session = world.core.store.get_terminal(a).session_name
    name = session.removeprefix("cao-")
    (world.settings.home / BUDGETS_FILE).write_text(f'[session."{name}"]\nusd = 0.01\n')
    task(world, a, "task")
    world.deliver(a)
    world.core.usage.refresh()  # $0.0075 of $0.01
    assert world.core.store.get_terminal(a).budget_hold is None
    b = world.core.lifecycle.create(
        provider="scripted", agent_profile="developer", session_name=session, new_session=False
    ).id
    task(world, b, "task")
    world.deliver(b)
    world.core.delete_terminal(b)  # its spending stays counted (read one last time before its HOME goes)
    world.core.usage.refresh()  # $0.015 of $0.01 for the session: a's new tasks wait
    hold = world.core.store.get_terminal(a).budget_hold
    assert hold and f"session {name}" in hold and "$0.01 of $0.01" in hold


@pytest.mark.parametrize(
    "file,text,words",
    [
        (BUDGETS_FILE, "[profile.dev]\nwarn_at = 0.5\n", "give a limit"),
        (BUDGETS_FILE, "[profile.dev]\nusd = -1\n", "profile.dev.usd must be a number ≥ 0"),
        (BUDGETS_FILE, "[profile.dev]\ntokens = 1.5\n", "whole number of tokens"),
        (BUDGETS_FILE, "[profile.dev]\nusd = 1\nwarn_at = 2\n", "0 < warn_at ≤ 1"),
        (BUDGETS_FILE, "[team.x]\nusd = 1\n", "unknown key 'team'"),
        (BUDGETS_FILE, "[profile.dev]\ndollars = 1\n", "unknown key 'dollars'"),
        (PRICES_FILE, '[models."m"]\ninput = 1\n', "give at least input and output"),
        (PRICES_FILE, '[models."m"]\ninput = 1\noutput = "two"\n', "models.'m'.output must be a number"),
        (PRICES_FILE, '[models."m"]\ninput = 1\noutput = 1\ncache = 1\n', "unknown price 'cache'"),
        (PRICES_FILE, "models = [", "not TOML"),
    ],
)
def test_a_broken_prices_or_budgets_file_stops_the_server_naming_the_key(
    tmp_path: Path, file: str, text: str, words: str
):
    home = tmp_path / "cao"
    home.mkdir()
    (home / file).write_text(text)
    with pytest.raises(UsageConfigError) as err:
        Cao(Settings(home=home, server_url="http://127.0.0.1:9"), environ={"PATH": "/usr/bin:/bin"})
    assert str(home / file) in err.value.message and words in err.value.message
    result = CliRunner().invoke(cli, ["usage", "--check"], env={"CAO_HOME": str(home)})
    assert result.exit_code != 0 and words in result.output


def test_a_broken_edit_while_running_keeps_the_budgets_in_effect(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 100\n")
    tid = spender(world)
    task(world, tid, "task")
    world.deliver(tid)
    world.core.usage.refresh()
    assert world.core.store.get_terminal(tid).budget_hold
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = -5\n")
    world.core.usage.refresh()  # refused (logged, on the event stream): the old limit stays
    assert world.core.store.get_terminal(tid).budget_hold


def test_records_that_lie_are_bounded_and_a_half_written_line_is_skipped(world: World):
    tid = spender(world)
    task(world, tid, "task")
    world.deliver(tid)
    path = world.settings.home / "terminals" / tid / "scripted-usage.jsonl"
    with path.open("a") as fh:
        fh.write('{"id": "x1", "at": 1, "input_tokens": -50, "output_tokens": 99999999999999999999999}\n')
        fh.write('{"id": "x2", "at": "soon", "input_tokens": 5}\n')  # not a time: skipped
        fh.write('{"id": "x3", "at": 2, "input_tok')  # being written
    u = world.core.terminal_usage(tid)
    assert u["responses"] == 2
    assert u["input_tokens"] == 1000 and u["output_tokens"] == 200 + 10**12


def test_a_held_task_keeps_its_budget_reason_while_the_agent_is_busy(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 1000\n")
    tid = world.agent(
        rules=[
            {"match": "^task", "reply": "done", "usage": SPEND},
            {"match": "^work", "delay": 5.0, "reply": "worked"},
        ]
    )
    task(world, tid, "task one")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 6,200 of 1,000: reached
    hold = world.core.store.get_terminal(tid).budget_hold
    held = task(world, tid, "task two")
    assert world.deliver(tid) == Outcome.WAITING and world.message(held).waiting_reason == hold
    world.type_task(tid, "work hard")  # a person's turn: the agent is busy
    chat = world.send(tid, "a question")
    assert world.deliver(tid) == Outcome.WAITING
    assert world.message(chat).waiting_reason == WaitReason.BUSY
    # the task waits for the budget, not for the turn: the turn ending won't send it
    assert world.message(held).waiting_reason == hold
    world.clock.advance(6)
    assert world.deliver(tid) == Outcome.DELIVERED
    assert world.message(chat).status == MessageStatus.DELIVERED
    assert world.message(held).status == MessageStatus.PENDING and world.message(held).waiting_reason == hold


def test_a_host_whose_clock_is_off_counts_each_response_to_its_own_task(tmp_path: Path):
    """Hosts sharing a store write task windows in the store's (the database's) time, while the
    CLIs stamp their records with the machine's wall clock: an hour apart here. Each response
    still belongs to the task it was made for."""
    import json as _json

    from cao.store import Store
    from cao.store.base import open_task_window
    from cao.usage import UsageBook
    from tests.helpers import add_terminal_row

    store = Store(tmp_path / "cao.db")
    try:
        add_terminal_row(store, "0000beef")
        wall = 1_800_000_000.0
        ahead = 3600.0  # the store's time minus this machine's wall clock
        with store._write() as conn:
            open_task_window(conn, "0000beef", "m1", wall + ahead + 0)
            open_task_window(conn, "0000beef", "m2", wall + ahead + 10)
        records = tmp_path / "home" / "terminals" / "0000beef"
        records.mkdir(parents=True)
        lines = [
            {"at": wall + 1, "id": "r1", "model": "m", "input_tokens": 10, "output_tokens": 1},
            {"at": wall + 11, "id": "r2", "model": "m", "input_tokens": 20, "output_tokens": 2},
        ]
        (records / "scripted-usage.jsonl").write_text("".join(_json.dumps(x) + "\n" for x in lines))
        skew = [ahead]
        book = UsageBook(tmp_path / "home", store, clock=lambda: wall + ahead + 20, skew=lambda: skew[0])
        book.read(store.get_terminal("0000beef"))
        by_task = {r.task_id: r.input_tokens for r in store.usage_rows(["0000beef"])}
        assert by_task == {"m1": 10, "m2": 20}, by_task
        skew[0] = -ahead  # then the wall clock steps: what was counted stays where it was
        book.read(store.get_terminal("0000beef"))
        assert {r.task_id: r.input_tokens for r in store.usage_rows(["0000beef"])} == by_task
    finally:
        store.close()
