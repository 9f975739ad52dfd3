"""An urgent ``if_busy=interrupt`` message reaching a busy real Claude Code (docs/attention.md).

Both tests start a real Claude Code through cao-server in the loopback-only bed (conftest.py), give
it a turn that runs shell tools, and send the urgent message while the CLI runs the first tool.
The fake model's request log (``bed.fake_requests(bodies=True)``) tells what reached the model,
and where.

- The hook channel (Claude Code 2.1 with cao's hooks, the default): cao's ``PostToolUse`` hook
  hands the message to the running turn. It reaches the model once, in the turn's next request,
  as the hook's additional context after the first tool's result; no key is sent, the turn goes
  on to its own answer, and the message is never pasted.
- No hook channel (``CAO_HOOKS=false``, or Claude Code 1.0): cao presses Claude's interrupt key
  (Escape) once; the turn stops ("Interrupted"), the prompt comes back, and the message is pasted
  first, as a new turn's prompt, once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from cao.tmux import descendants
from tests.realcli.bed import Bed
from tests.realcli.conftest import LOCK_WAIT, CaoServer, knob, wait_for
from tests.realcli.test_providers_e2e import CLI, Agent, cmdline, launch, older_release, token

# The first test also waits for the bed lock (another run may hold it), hence the longer timeout.
pytestmark = [pytest.mark.realcli, pytest.mark.timeout(LOCK_WAIT + 240)]

CLAUDE = CLI("claude_code", queues_while_busy=True, start_timeout=60)
BOSS = "boss"
HOOK_CONTEXT = "<system-reminder>\nPostToolUse:Bash hook additional context: "


def urgent(agent: Agent, text: str) -> int:
    """An urgent message from ``BOSS`` that may interrupt the receiver's turn; returns its id."""
    receipt = agent.server.call(
        "POST",
        f"/terminals/{agent.id}/inbox/messages",
        json={"message": text, "sender_id": BOSS, "priority": "urgent", "if_busy": "interrupt"},
    )
    return int(receipt["message_id"])


def running(agent: Agent, command: str) -> bool:
    """Whether the CLI's shell tool runs ``command`` now (a process under the pane)."""
    pane_pid = int(agent.bed.tmux("display-message", "-p", "-t", agent.pane, "#{pane_pid}").strip())
    return any(command in cmdline(p) for p in descendants(pane_pid))


def main_requests(bed: Bed, needle: str) -> list[dict[str, Any]]:
    """Claude's main model requests whose body carries ``needle`` anywhere, in order."""
    return [
        r
        for r in bed.fake_requests(bodies=True)
        if r.get("api") == "anthropic" and r.get("kind") == "main" and needle in json.dumps(r.get("body"))
    ]


def the_turn(bed: Bed, tok: str) -> list[dict[str, Any]]:
    """The main requests of the turn whose typed prompt carries ``tok`` (its tool-loop steps too:
    their prompt is still the typed one, the hook's ``<system-reminder>`` text doesn't count)."""
    return [r for r in main_requests(bed, tok) if tok in (r.get("prompt") or "")]


def blocks_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def text_of(block: dict[str, Any]) -> str:
    content = block.get("text", block.get("content"))
    if isinstance(content, list):
        return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content or "")


def timeline(agent: Agent, message_id: int) -> list[str]:
    attention = agent.server.call("GET", f"/terminals/{agent.id}/attention")
    return [str(e["event"]) for e in attention["timeline"] if e.get("message_id") == message_id]


def until(agent: Agent, message_id: int, pred: Callable[[], Any], timeout: float, what: str) -> None:
    """``wait_for`` that, on timeout, shows the message, its timeline, the screen and the log then."""
    try:
        wait_for(pred, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{explain(agent, message_id)}") from None


def explain(agent: Agent, message_id: int) -> str:
    """What to show when an assertion fails: the message, its timeline, the screen, the log tail."""
    return (
        f"message: {agent.message(message_id)}\ntimeline: {timeline(agent, message_id)}\n"
        f"screen:\n{agent.screen()}\ncao-server log tail:\n{agent.server.log()[-3000:]}"
    )


# -- scenario 3: the hook channel ---------------------------------------------------------------------
def test_an_urgent_interrupt_reaches_a_busy_claude_inside_its_turn_through_its_posttooluse_hook(
    bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    agent = launch(make_server(CLAUDE.provider), bed, CLAUDE)
    tok, news = token("turn"), token("urgent")
    answer = f"Both steps done {tok}."
    agent.type(
        f"Run two steps {tok} [[shell:sleep 4; echo one-{tok}]][[shell:sleep 2; echo two-{tok}]]"
        f"[[reply:{answer}]]",
        tok,
    )
    # the fake answered the turn's first request with the first tool call and Claude runs it now:
    # the message is queued before that tool's PostToolUse hook runs
    wait_for(lambda: running(agent, f"echo one-{tok}"), 20, f"Claude running `sleep 4; echo one-{tok}`")
    started = time.monotonic()
    message_id = urgent(agent, f"Stop and read this: {news}")

    until(
        agent,
        message_id,
        lambda: agent.message(message_id)["status"] == "delivered",
        20,
        f"message {message_id} handed to the running turn",
    )
    delivered_after = time.monotonic() - started
    until(
        agent,
        message_id,
        lambda: agent.last() == answer and agent.status() == "completed",
        30,
        f"the turn's own answer {answer!r} after the hand-over",
    )
    print(f"claude hook hand-over: delivered {delivered_after:.1f} s after the send")

    message = agent.message(message_id)
    assert (message["status"], message["channel"], message["interrupt_at"]) == ("delivered", "hook", None), (
        explain(agent, message_id)
    )
    events = timeline(agent, message_id)
    assert "interrupted" not in events and events.count("handed") == 1, explain(agent, message_id)
    assert events[-1] == "delivered", explain(agent, message_id)
    assert "Interrupted" not in agent.screen()  # no key: the turn was never stopped

    turn = the_turn(bed, tok)
    assert [r["tool_results"] for r in turn] == [0, 1, 2], [(r["seq"], r["action"]) for r in turn]
    first, second, third = turn
    # the token reached the model in the turn's second request: the one with the first tool's result
    carrying = main_requests(bed, news)
    assert carrying and carrying[0]["seq"] == second["seq"], [(r["seq"], r["prompt"]) for r in carrying]
    assert news not in json.dumps(first["body"])
    # there, once: one text block after that tool result, in the same user message, the hook's
    # additional context (Claude's wrapper), headed like a paste
    last_user = second["body"]["messages"][-1]
    assert last_user["role"] == "user"
    blocks = blocks_of(last_user)
    kinds = [b.get("type") for b in blocks]
    with_news = [i for i, b in enumerate(blocks) if news in text_of(b)]
    assert len(with_news) == 1 and json.dumps(second["body"]).count(news) == 1, blocks
    [at] = with_news
    assert kinds[at] == "text" and "tool_result" in kinds[:at], blocks
    assert f"one-{tok}" in text_of(blocks[kinds.index("tool_result")])
    context = text_of(blocks[at])
    assert context.startswith(HOOK_CONTEXT), context
    assert f"[cao message #{message_id} from {BOSS}]" in context
    # later requests keep it where it was (the conversation's history), never added a second time
    for later in carrying[1:]:
        assert json.dumps(later["body"]).count(news) == 1, later["seq"]
        kept = later["body"]["messages"][len(second["body"]["messages"]) - 1]  # cache marks may differ
        assert [text_of(b) for b in blocks_of(kept)] == [text_of(b) for b in blocks], later["seq"]
    assert third["seq"] in [r["seq"] for r in carrying]
    # never the user's own words: no request has it as its prompt, no turn started for it
    assert not [r["seq"] for r in carrying if news in (r.get("prompt") or "")]
    assert news not in agent.screen()  # not typed into the pane either (the hook's text isn't drawn)


# -- scenario 4: no hook channel, the interrupt key ---------------------------------------------------
# Two launches that wire no turn channel: Claude Code 2.1 with cao's hooks off (the screen alone tells
# its status), and the oldest supported release, 1.0 (hooks wired, but no PostToolUse hand-over: the
# key). On 1.0 the message is sent within a second of the turn's start, so the turn-start report is
# still fresh when the prompt comes back (an interrupted turn reports no end): cao must look again
# when that report stops counting, or the message waits for the sweep (found here: 57 s).
NO_CHANNEL: dict[str, dict[str, str]] = {"hooks-off": {"CAO_HOOKS": "false"}, "claude-1.0.128": {}}


@pytest.mark.parametrize("launch_as", list(NO_CHANNEL))
def test_an_urgent_interrupt_without_a_hook_channel_presses_escape_once_then_is_pasted_first(
    launch_as: str, bed: Bed, make_server: Callable[..., CaoServer]
) -> None:
    knobs = dict(NO_CHANNEL[launch_as])
    if launch_as.startswith("claude-"):
        knobs[knob(CLAUDE.provider, "BIN")] = older_release(CLAUDE.provider, launch_as.split("-", 1)[1])
    agent = launch(make_server(CLAUDE.provider, **knobs), bed, CLAUDE)
    tok, news = token("turn"), token("urgent")
    agent.type(
        f"Run a long step {tok} [[shell:sleep 30; echo long-{tok}]][[reply:Long step done {tok}.]]", tok
    )
    wait_for(lambda: running(agent, f"echo long-{tok}"), 20, f"Claude running `sleep 30; echo long-{tok}`")
    assert agent.status() == "processing"
    started = time.monotonic()
    reply = f"Urgent {news} handled."
    message_id = urgent(agent, f"Stop and read this: {news} [[reply:{reply}]]")

    until(
        agent,
        message_id,
        lambda: agent.message(message_id)["interrupt_at"] is not None,
        10,
        f"the interrupt key for message {message_id}",
    )
    keyed_after = time.monotonic() - started
    until(
        agent,
        message_id,
        lambda: agent.message(message_id)["status"] == "delivered",
        15,  # the sweep would deliver it after 30-60 s: this is the prompt's return, or a finding
        f"message {message_id} pasted once the prompt was back",
    )
    delivered_after = time.monotonic() - started
    until(
        agent,
        message_id,
        lambda: agent.last() == reply and agent.status() == "completed",
        30,
        f"the answer {reply!r} to the urgent message",
    )
    print(f"{launch_as} key {keyed_after:.1f} s, delivered {delivered_after:.1f} s after sending")

    message = agent.message(message_id)
    assert (message["status"], message["channel"]) == ("delivered", "paste"), explain(agent, message_id)
    assert message["attempts"] == 1, explain(agent, message_id)
    events = timeline(agent, message_id)
    assert events.count("interrupted") == 1, explain(agent, message_id)
    assert events.index("interrupted") < events.index("delivered"), events
    screen = agent.screen()
    assert "Interrupted" in screen, screen  # Claude's own marker of a stopped turn
    assert f"Long step done {tok}." not in screen.replace(f"[[reply:Long step done {tok}.]]", "")
    assert not running(agent, f"echo long-{tok}")  # the tool was stopped, not left to finish

    turn = the_turn(bed, tok)
    assert [r["tool_results"] for r in turn] == [0], [(r["seq"], r["action"]) for r in turn]
    # pasted first, as the prompt of a new turn, once: one request started a turn with it
    carrying = main_requests(bed, news)
    starts = [r for r in carrying if news in (r.get("prompt") or "") and not r.get("tool_results")]
    assert len(starts) == 1, [(r["seq"], r["prompt"]) for r in carrying]
    [start] = starts
    assert start["seq"] > turn[0]["seq"]
    assert f"[cao message #{message_id} from {BOSS}]" in start["prompt"]
    assert json.dumps(start["body"]).count(f"Stop and read this: {news}") == 1, start["body"]["messages"][-1]
