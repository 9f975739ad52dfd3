"""Review h3: hostile and unlucky inputs to the OpenCode/Copilot hooks and to the usage/budgets
hardening (ac5ced5). Every test here fails on the code as reviewed, for the reason its comment
gives; each asserts what the docs promise or what an experienced user would expect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cao.cli import cli
from cao.delivery import Outcome
from cao.states import MessageStatus, TerminalState
from cao.usage import BUDGETS_FILE
from tests.test_fast_delivery import World
from tests.test_usage import SPEND, task

pytestmark = pytest.mark.fast


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.core.stop()


@pytest.fixture
def invoke(world: World):
    from fastapi.testclient import TestClient

    from cao.api import create_app
    from cao.client import Client

    http = TestClient(create_app(world.core), base_url="http://127.0.0.1:9889")
    client = Client("http://127.0.0.1:9889", http=http)
    return lambda *args: CliRunner().invoke(cli, list(args), obj={"client": client})


# -- usage: money spent stays spent -----------------------------------------------------------------
def test_an_agent_that_empties_its_own_usage_records_does_not_lift_its_budget_hold(world: World):
    (world.settings.home / BUDGETS_FILE).write_text("[profile.developer]\ntokens = 10000\n")
    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": SPEND}])
    for body in ("task one", "task two"):
        task(world, tid, body)
        assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()  # 12,400 of 10,000 tokens: reached
    assert world.core.store.get_terminal(tid).budget_hold
    held = task(world, tid, "task three")
    assert world.deliver(tid) == Outcome.WAITING
    # the agent owns its HOME: it (or a CLI pruning old transcripts) empties the records. The
    # 12,400 tokens were spent all the same ("money spent stays spent", docs/usage.md). Today
    # UsageBook.read replaces the stored totals with the new reading ([] is not None), the spend
    # drops to 0, the hold lifts and the held task goes
    (world.settings.home / "terminals" / tid / "scripted-usage.jsonl").write_text("")
    world.core.usage.refresh()
    assert world.core.terminal_usage(tid)["tokens"] >= 12_400
    assert world.core.store.get_terminal(tid).budget_hold
    world.deliver(tid)
    assert world.message(held).status == MessageStatus.PENDING


# -- CLI arguments that go into a URL path unchecked --------------------------------------------------
def test_shutdown_session_with_a_path_in_the_name_deletes_no_terminal(world: World, invoke):
    tid = world.agent()
    # `cao shutdown --session NAME` puts NAME into DELETE /sessions/{NAME} unchecked: httpx resolves
    # "/sessions/../terminals/ID" to DELETE /terminals/ID, which kills that agent (cli.py:shutdown)
    result = invoke("shutdown", "--session", f"../terminals/{tid}")
    assert world.core.store.get_terminal(tid, include_deleted=True).state == TerminalState.LIVE
    assert result.exit_code == 1 and "is not allowed" in result.output, (result.output, result.exception)


def test_send_to_a_receiver_with_a_path_in_it_cancels_no_message(world: World, invoke):
    tid = world.agent("slow", rules=[{"match": "^work", "delay": 5.0, "reply": "worked"}])
    world.type_task(tid, "work hard")
    mid = world.send(tid, "an important note")
    assert world.deliver(tid) == Outcome.WAITING
    # `cao send RECEIVER MESSAGE`: RECEIVER goes into POST /terminals/{RECEIVER}/inbox/messages
    # unchecked (cli.py:send has no checked_terminal_id); "x/../../messages/N/cancel?" is
    # POST /messages/N/cancel: another message is cancelled
    result = invoke("send", f"x/../../messages/{mid}/cancel?", "hello")
    assert world.message(mid).status == MessageStatus.PENDING
    assert result.exit_code == 1, (result.output, result.exception)


def test_status_session_with_url_characters_is_a_clear_error_not_a_traceback(world: World, invoke):
    world.agent()
    # `cao status --session "?x=1"` is GET /sessions/?x=1/terminals = GET /sessions (a list of
    # sessions, not terminals): KeyError 'session_name' out of cli.py:status
    result = invoke("status", "--session", "?x=1")
    assert result.exit_code == 1 and "is not allowed" in result.output, (result.output, result.exception)


def test_cancel_with_a_path_in_the_message_id_exits_no_agent(world: World, invoke):
    tid = world.agent()
    # `cao cancel MESSAGE_ID` puts the id into POST /messages/{ID}/cancel unchecked (cli.py:cancel):
    # "1/../../terminals/ID/exit?" is POST /terminals/ID/exit, which ends that agent (then a
    # KeyError 'id' traceback); a message id is a number
    result = invoke("cancel", f"1/../../terminals/{tid}/exit?")
    assert world.status(tid) == "idle"
    assert result.exit_code in (1, 2) and "not" in result.output, (result.output, result.exception)


# -- cao rules / cao explain --screen: a traceback or a hang -------------------------------------------
@pytest.mark.parametrize(
    "pattern",
    ["a{4294967296}", "(" * 1000 + "a" + ")" * 1000],
    ids=["repeat-count-too-large", "nested-groups"],
)
def test_a_rules_file_with_a_pattern_re_cannot_compile_is_refused_naming_the_line(
    tmp_path: Path, pattern: str
):
    draft = tmp_path / "draft.rules"
    draft.write_text(f"box = {pattern}\n")
    env = {"CAO_HOME": str(tmp_path / "cao")}
    # rules.parse_overrides catches only re.error; re.compile raises OverflowError ("the repetition
    # number is too large") or RecursionError for these: a traceback out of `cao rules --check`, and
    # the same file in $CAO_HOME/providers stops cao-server with a traceback (screenrules.install)
    result = CliRunner().invoke(cli, ["rules", "claude_code", "--check", str(draft)], env=env)
    assert result.exit_code == 1 and f"{draft}:1" in result.output, (result.output, result.exception)


def test_explain_screen_of_a_long_line_answers_in_reasonable_time(tmp_path: Path):
    import subprocess
    import sys

    screen = tmp_path / "screen.txt"
    screen.write_text("enter " * 20_000 + "\n")  # 120 KB, far under the 4 MiB a screen file may be
    # OpenCode's ASKING_RE (r"\b(?:enter|↵)\b.*\b(?:select|confirm)\b", searched per line) is
    # quadratic in a line's length: 60 KB takes ~13 s here, 120 KB ~1 min, a 4 MiB screen hours.
    # (Live panes are cut at the pane width; a saved `capture-pane -pJ` screen is not.)
    try:
        subprocess.run(
            [sys.executable, "-m", "cao", "explain", "--screen", str(screen), "--provider", "opencode"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CAO_HOME": str(tmp_path / "cao")},
            capture_output=True,
            timeout=10,  # subprocess.run kills it on timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail("cao explain --screen took over 10 s on a 120 KB screen")


# -- the hook program: the project's own `cao` package runs instead of cao's ---------------------------
def test_the_hook_program_is_cao_s_own_whatever_the_project_in_the_working_directory(tmp_path: Path):
    import json
    import shlex
    import subprocess

    from providers.copilot import hook_file
    from tests.realcli.test_launch_specs import context

    # a user's project whose top-level package happens to be called `cao` (or cao's own repository
    # at another commit, when cao works on cao): the agent CLI runs its hooks in that folder
    project = tmp_path / "project"
    (project / "cao").mkdir(parents=True)
    (project / "cao" / "__init__.py").write_text("")
    took_over = tmp_path / "took-over"
    (project / "cao" / "hook.py").write_text(f"open({str(took_over)!r}, 'w').write('project code ran')\n")
    from dataclasses import replace

    ctx = replace(
        context(tmp_path, {}), server_url="http://127.0.0.1:9"
    )  # nothing listens: never a real server
    bash = json.loads(hook_file(ctx))["hooks"]["sessionStart"][0]["bash"]
    # `python -m cao.hook` puts the working directory first on sys.path (BaseContext.hook_command;
    # the same for `-m cao.mcp`): the project's cao/hook.py runs, not cao's, and nothing is reported
    subprocess.run(
        ["bash", "-c", bash], cwd=project, input=b"{}", capture_output=True, timeout=30, check=False
    )
    assert not took_over.exists(), f"{shlex.split(bash)[:3]} ran the project's cao/hook.py"


# -- after the fixes -----------------------------------------------------------------------------------
def test_records_removed_while_cao_server_was_down_do_not_lower_the_stored_spend(world: World):
    from cao.usage import UsageBook

    tid = world.agent(rules=[{"match": "^task", "reply": "done", "usage": SPEND}])
    task(world, tid, "task one")
    assert world.deliver(tid) == Outcome.DELIVERED
    world.core.usage.refresh()
    assert world.core.terminal_usage(tid)["tokens"] == 6200
    (world.settings.home / "terminals" / tid / "scripted-usage.jsonl").write_text("")
    # a new cao-server on the same database: it has read none of these responses itself
    book = UsageBook(world.settings.home, world.core.store, clock=world.core.usage.clock)
    book.refresh()
    assert sum(r.responses for r in world.core.store.usage_rows([tid])) == 1
    task(world, tid, "task two")  # new spending after that is counted once there is more than before
    assert world.deliver(tid) == Outcome.DELIVERED
    task(world, tid, "task three")
    assert world.deliver(tid) == Outcome.DELIVERED
    book.refresh()
    assert sum(r.responses for r in world.core.store.usage_rows([tid])) == 2  # what the records show now


def test_the_mcp_server_argv_does_not_put_the_working_directory_first(tmp_path: Path):
    from providers._cli import cao_mcp_server
    from tests.realcli.test_launch_specs import context

    args = cao_mcp_server(context(tmp_path, {}))["args"]
    assert args[:1] == ["-P"] and args[1:] == ["-m", "cao.mcp"]
