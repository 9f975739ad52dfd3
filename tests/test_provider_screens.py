"""The provider contract, checked for every registered provider against real screens.

Screens: ``tests/screens/<provider>/<state>.txt`` (the current release) and
``tests/screens/<provider>/<version>/<state>.txt`` (each older supported release) with the expected
status in that folder's ``meta.json`` (captured from the real CLIs by ``python -m
tests.realcli.capture [--cli-version V]``); ``exited`` screens must read ``unknown`` with a reason,
also without tmux's "Pane is dead" line; the bundled
scripted agent's screens are captured live here, from the real program in a private tmux server,
so they can't drift from it. For each screen: ``detect_status`` gives the expected status,
``input_text`` is ``""`` where an idle box shows, falsy while busy, ``None`` under a prompt or a
start-up dialog (``dialog_*``: cao must never type into one) and the pasted text on ``typed``, and
``extract_last_message`` returns the model's answer without chrome (nothing under a dialog).
``transcript`` is the screen above the input box: it holds the echoed user turns and answers and
never the text still sitting in the box.

``TRAPS`` adds screens of the traps found while building the providers (text typed into the box,
collapsed pastes, an echo scrolled off the top, a queued message, Gemini's box that reads like an
echo). They come from real captures, trimmed: banner lines dropped, blank runs and wide padding
collapsed, full-width rules written as ``---``/``▄▄▄``/``▀▀▀``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

import providers
from cao.tmux import Tmux
from providers.base import LaunchContext, TerminalStatus

SCREENS = Path(__file__).parent / "screens"
SCRIPTED = ("scripted", "scripted_eager")  # one program, two declarations: same screens
# What the fake model answered in the saved captures (and the scripted agent's rules below).
ANSWERS = {
    "completed": "The fake model says hello.",
    "completed_tools": "Both tools ran.",
    "typed": "Hello from the fake model.",
}
BUSY_STATES = ("processing", "queued", "retrying")
# Pasted into the box without Enter for the saved "typed" screens (tests/realcli/capture.py TYPED).
TYPED = "[cao message #7 from abcd1234]\nPlease reply typed-but-not-sent"
# The start of the user turn each saved screen echoes (the last one the CLI took).
ECHOES = {
    "processing": "Say hello slowly",
    "completed": "Say hello slowly",
    "completed_tools": "Run the tools",
    "queued": "Second task, sent while busy",
    "error": "Please fail",
    "typed": "Say hello [[reply:",
    "retrying": "Please fail and retry",
}


class Case(NamedTuple):
    provider: str
    state: str
    status: TerminalStatus
    folder: str = ""  # under tests/screens: "<provider>" (current release) or "<provider>/<version>"

    @property
    def id(self) -> str:
        return f"{self.folder.replace('/', '-') or self.provider}-{self.state}"


def saved_cases() -> list[Case]:
    """Every saved screen: the current release's in ``<provider>/``, older ones' in
    ``<provider>/<version>/``."""
    cases = []
    for meta_path in sorted([*SCREENS.glob("*/meta.json"), *SCREENS.glob("*/*/meta.json")]):
        meta = json.loads(meta_path.read_text())
        folder = meta_path.parent.relative_to(SCREENS).as_posix()
        for state, status in sorted(meta["states"].items()):
            cases.append(Case(meta["provider"], state, TerminalStatus(status), folder))
    return cases


SCRIPTED_STATES = {
    "idle": TerminalStatus.IDLE,
    "completed": TerminalStatus.COMPLETED,
    "error": TerminalStatus.ERROR,
    "waiting_user_answer": TerminalStatus.WAITING_USER_ANSWER,
    "processing": TerminalStatus.PROCESSING,
    "queued": TerminalStatus.PROCESSING,
}
CASES = saved_cases() + [Case(p, s, status) for p in SCRIPTED for s, status in SCRIPTED_STATES.items()]
# the scripted agent's screens come from the real program in tmux: those cases are integration tests
PARAMS = [
    pytest.param(c, id=c.id, marks=[pytest.mark.integration] if c.provider in SCRIPTED else []) for c in CASES
]


@pytest.fixture(scope="module")
def scripted_screens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The scripted agent's screen in each state, captured from the real program in tmux."""
    tmp = tmp_path_factory.mktemp("scripted")
    rules = {
        "rules": [
            {"match": "^Say hello", "reply": ANSWERS["completed"]},
            {"match": "^fail", "error": "API Error: 400 bad request"},
            {"match": "^ask", "ask": "Allow tool deploy?", "reply": "deployed"},
            {"match": "^slow", "delay": 60, "reply": "slowly done"},
        ]
    }
    (tmp / "rules.json").write_text(json.dumps(rules))
    ctx = LaunchContext(
        terminal_id="5c0a1e00",
        agent_profile="developer",
        working_directory=tmp,
        cao_home=tmp,
        server_url="http://127.0.0.1:9",
        terminal_home=tmp,
        base_env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
        },
        settings_env={"CAO_SCRIPTED_RULES": str(tmp / "rules.json")},
    )
    spec = providers.get("scripted").launch(ctx)
    socket_name = f"cao-test-{secrets.token_hex(4)}"
    tmux = Tmux(socket_name)
    pane = tmux.create_window(
        session_name="cao-screens",
        window_name="scripted",
        command=spec.command,
        env=spec.env,
        cwd=tmp,
        log_path=tmp / "pane.log",
    ).pane_id
    screens: dict[str, str] = {}

    def reach(state: str, ready: Callable[[str], bool]) -> None:
        deadline = time.monotonic() + 10
        while not ready(screen := tmux.capture(pane)):
            assert time.monotonic() < deadline, f"scripted agent never reached {state}:\n{screen}"
            time.sleep(0.02)
        screens[state] = screen

    def shows(needle: str, last: str) -> Callable[[str], bool]:
        """``needle`` on screen and the last line matching ``last``."""
        return lambda s: needle in s and bool(re.search(last, s.rstrip().rsplit("\n", 1)[-1]))

    try:
        reach("idle", shows("cao scripted agent", r"^❯ ?$"))
        for state, text, ready in (
            ("completed", "Say hello slowly", shows(f"● {ANSWERS['completed']}", r"^❯ ?$")),
            ("error", "fail now", shows("✗ API Error: 400", r"^❯ ?$")),
            ("waiting_user_answer", "ask to deploy", shows("› ask to deploy", r"^\? Allow tool deploy")),
            ("after_answer", "y", shows("● deployed", r"^❯ ?$")),
            ("processing", "slow work", shows("› slow work", r"thinking… \(\d+s · esc")),
            ("queued", "second task", shows("", r"· 1 queued")),
        ):
            tmux.paste(pane, text, enter_delay=0.05)
            reach(state, ready)
        yield screens
    finally:
        tmux.kill_server()
        Path(f"/tmp/tmux-{os.getuid()}/{socket_name}").unlink(missing_ok=True)


def screen_of(case: Case, scripted: Callable[[], dict[str, str]]) -> str:
    if case.provider in SCRIPTED:
        return scripted()[case.state]
    return (SCREENS / case.folder / f"{case.state}.txt").read_text()


@pytest.mark.parametrize("case", PARAMS)
def test_provider_reads_its_screens(case: Case, request: pytest.FixtureRequest) -> None:
    provider = providers.get(case.provider)
    screen = screen_of(case, lambda: request.getfixturevalue("scripted_screens"))

    assert provider.detect_status(screen) == case.status
    reading = provider.detect(screen)
    assert reading.status == case.status
    if case.status == TerminalStatus.UNKNOWN:
        assert reading.reason  # shown to the operator: never an unexplained unknown
    if case.status in (TerminalStatus.IDLE, TerminalStatus.COMPLETED, TerminalStatus.ERROR):
        # the watchdog's cheap pre-check must let a ready screen through to the full look
        assert provider.tail_looks_idle(screen[-2048:])
    if case.state == "exited":  # also without tmux's "Pane is dead" line (remain-on-exit off)
        alive = "\n".join(line for line in screen.split("\n") if not line.startswith("Pane is dead ("))
        assert provider.detect(alive).status == TerminalStatus.UNKNOWN
    box = provider.input_text(screen)
    if case.status in (TerminalStatus.WAITING_USER_ANSWER, TerminalStatus.UNKNOWN):
        assert box is None  # a prompt, a start-up dialog or an exited CLI: nothing to type into
    elif case.state in BUSY_STATES:
        assert not box  # the box may stay visible (empty) while busy, or be gone
    elif case.state == "typed":
        assert box == TYPED
    else:
        assert box == ""
    last = provider.extract_last_message(screen)
    if case.state in ANSWERS:
        assert last == ANSWERS[case.state]
    if case.status == TerminalStatus.ERROR:
        assert "400" in last
    if case.state == "idle" or case.state.startswith("dialog_"):
        assert last == ""


SAVED = saved_cases()


@pytest.mark.parametrize("case", PARAMS)
def test_transcript_is_the_screen_above_the_box(case: Case, request: pytest.FixtureRequest) -> None:
    provider = providers.get(case.provider)
    screen = screen_of(case, lambda: request.getfixturevalue("scripted_screens"))
    transcript = provider.transcript(screen)

    assert screen.startswith(transcript)
    box = provider.input_text(screen)
    if box is None:
        assert transcript.rstrip() == screen.rstrip()  # no box: nothing to leave out
    for line in filter(str.strip, (box or "").split("\n")):
        assert line not in transcript  # pasted but not submitted
    if case.state in ECHOES and case.provider not in SCRIPTED:  # the fake model's prompts
        assert ECHOES[case.state] in transcript
    if last := provider.extract_last_message(screen):
        assert last.split("\n")[0] in transcript
    # A whole-scrollback capture: the history scrolled off the top comes first and stays.
    history = "earlier history\n" * 3
    assert provider.transcript(history + screen) == history + transcript


def test_every_registered_provider_has_screens() -> None:
    assert set(providers.names()) <= {c.provider for c in CASES}


# -- traps ----------------------------------------------------------------------------------------
def expand(compact: str) -> str:
    rules = {"---": "─" * 200, "▄▄▄": "▄" * 200, "▀▀▀": "▀" * 200}
    return "\n".join(rules.get(line, line) for line in compact.split("\n")) + "\n" * 8


class Trap(NamedTuple):
    name: str
    provider: str
    screen: str
    status: TerminalStatus
    box: str | None
    last: str = ""


CLAUDE_FOOTER = "---\n  ⏵⏵ bypass permissions on (shift+tab to cycle) · ← for agents"
CODEX_FOOTER = "\n  fake-model default · /work\n  ← for agents · ? for shortcuts  ⚠ 1 warning · f2 to view"
GEMINI_FOOTER = "▀▀▀\n workspace (/directory)  sandbox  /model\n /work  no sandbox  Auto"
HERMES_FOOTER = " ⚕ fake-model │ 10/256K │ [░░░░░░░░░░] 0% │ 20s │ ⏲ 0s │ ✓ 0s │ ⚠ YOLO\n---\n❯\n---"
LONG_ECHO_TAIL = (
    "  line 38 of a long inbox message\n  line 39 of a long inbox message\n  [[reply:Long done.]]\n"
)

TRAPS = [
    Trap(
        "claude-text-typed-in-the-box",
        "claude_code",
        "\n---\n❯\u00a0hello there [[reply:Hi back.]]\n" + CLAUDE_FOOTER,
        TerminalStatus.IDLE,
        "hello there [[reply:Hi back.]]",
    ),
    Trap(
        "claude-long-paste-collapsed-in-the-box",
        "claude_code",
        "❯ hello there\n\n● Hi back.\n\n✻ Sautéed for 0s\n\n---\n❯\u00a0[Pasted text #1 +41 lines]\n"
        "---\n  paste again to expand  ● high · /effort",
        TerminalStatus.COMPLETED,
        "[Pasted text #1 +41 lines]",
        "Hi back.",
    ),
    Trap(
        "claude-echo-scrolled-off-the-top",
        "claude_code",
        LONG_ECHO_TAIL + "\n● Long done.\n\n✻ Crunched for 0s\n\n---\n❯\u00a0\n" + CLAUDE_FOOTER,
        TerminalStatus.COMPLETED,
        "",
        "Long done.",
    ),
    Trap(
        "codex-inline-mode-idle",
        "codex",
        "\n  >_ OpenAI Codex (v0.171.0)\n     /work\n  permissions: YOLO mode\n\n› Ask Codex to do anything\n"
        + CODEX_FOOTER,
        TerminalStatus.IDLE,
        "",
    ),
    Trap(
        "codex-text-typed-in-the-box",
        "codex",
        "\n  >_ OpenAI Codex (v0.171.0)\n\n› hello there [[reply:Hi back.]]\n" + CODEX_FOOTER,
        TerminalStatus.IDLE,
        "hello there [[reply:Hi back.]]",
    ),
    Trap(
        "codex-long-paste-collapsed-in-the-box",
        "codex",
        "• Multi done.\n\n  Worked for <1s • 08:11\n\n› [Pasted Content 2922 chars]\n" + CODEX_FOOTER,
        TerminalStatus.COMPLETED,
        "[Pasted Content 2922 chars]",
        "Multi done.",
    ),
    Trap(
        "codex-working-after-an-earlier-turn",
        "codex",
        LONG_ECHO_TAIL + "\n• Long done.\n\n  Worked for <1s • 08:11\n\n› First long task [[delay:6]]\n\n"
        "◦ Working (0s • esc to interrupt)\n\n› Ask Codex to do anything\n" + CODEX_FOOTER,
        TerminalStatus.PROCESSING,
        "",
    ),
    Trap(
        "codex-answer-shown-but-turn-not-closed",  # "Worked for" follows ~0.1 s later
        "codex",
        "› Say hello\n\n• The fake model says hello.\n\n› Ask Codex to do anything\n" + CODEX_FOOTER,
        TerminalStatus.PROCESSING,
        "",
        "The fake model says hello.",
    ),
    Trap(
        "gemini-text-typed-reads-like-an-echo",
        "gemini_cli",
        "\nℹ MCP issues detected. Run /mcp list for status.\n\n---\n Shift+Tab to accept edits\n"
        "▄▄▄\n > hello there [[reply:Hi back.]]\n" + GEMINI_FOOTER,
        TerminalStatus.IDLE,
        "hello there [[reply:Hi back.]]",
    ),
    Trap(
        "gemini-enter-kept-as-a-newline",
        "gemini_cli",
        "▄▄▄\n > hello there\n▀▀▀\n✦ Hi back.\n\n---\n YOLO Ctrl+Y  1 MCP server\n▄▄▄\n"
        " * [cao message #12 from abcd1234]\n   line two of the message\n\n" + GEMINI_FOOTER,
        TerminalStatus.COMPLETED,
        "[cao message #12 from abcd1234]\nline two of the message",
        "Hi back.",
    ),
    Trap(
        "gemini-long-paste-collapsed-in-the-box",
        "gemini_cli",
        "▄▄▄\n > hello there\n▀▀▀\n✦ Hi back.\n\n Press Ctrl+O to expand pasted text\n\n---\n YOLO Ctrl+Y\n"
        "▄▄▄\n * [cao message #12 from abcd1234]\n   [Pasted Text: 42 lines]\n" + GEMINI_FOOTER,
        TerminalStatus.COMPLETED,
        "[cao message #12 from abcd1234]\n[Pasted Text: 42 lines]",
        "Hi back.",
    ),
    Trap(
        "gemini-echo-band-cut-by-the-top",
        "gemini_cli",
        " " + LONG_ECHO_TAIL + "▀▀▀\n✦ Long done.\n\n Press Ctrl+O to expand pasted text\n  ? for shortcuts\n"
        "---\n YOLO Ctrl+Y  1 MCP server\n▄▄▄\n *   Type your message or @path/to/file\n" + GEMINI_FOOTER,
        TerminalStatus.COMPLETED,
        "",
        "Long done.",
    ),
    Trap(
        "gemini-message-queued-while-busy",
        "gemini_cli",
        "✦ Long done.\n▄▄▄\n > First long task [[delay:6]]\n▀▀▀\n\n  Queued (press ↑ to edit):\n"
        "    Second task tok-second\n ⠧ Thinking... (esc to cancel, 1s)  ? for shortcuts\n---\n YOLO Ctrl+Y\n"
        "▄▄▄\n *   Type your message or @path/to/file\n" + GEMINI_FOOTER,
        TerminalStatus.PROCESSING,
        "",
    ),
    Trap(
        "kimi-answer-streaming-under-a-spinner",  # no moon once tokens arrive: "Composing" says busy
        "kimi_cli",
        "⠇ MCP Servers: 0/1 connected, 0 tools\n✨ Stream it <<chunk_delay:1>>\n\n"
        "⠴ Composing... 1s · 7 tokens\n\n"
        "── input ──────────────────────\n\n\n---\nyolo  agent (fake-model ○)  …/work  ctrl-x: toggle mode",
        TerminalStatus.PROCESSING,
        "",
    ),
    Trap(
        "kimi-stale-mcp-spinner-is-not-busy",  # printed once at start, its spinner frame never moves
        "kimi_cli",
        "╰────────╯\n⠸ MCP Servers: 0/1 connected, 0 tools\n\n── input ──────────────────────\n\n\n---\n"
        "yolo  agent (fake-model ○)  …/work  ctrl-x: toggle mode",
        TerminalStatus.IDLE,
        "",
    ),
    Trap(
        "hermes-answer-printed-whole",  # not streamed: a panel of two rules instead of the box
        "hermes",
        "\n"
        + "─" * 40
        + "\n● hello there\n"
        + "─" * 40
        + "\n ─  ⚕ Hermes  "
        + "─" * 40
        + "\n\n     Hi back.\n\n "
        + "─" * 40
        + "\n"
        + HERMES_FOOTER,
        TerminalStatus.COMPLETED,
        "",
        "Hi back.",
    ),
    Trap(
        "hermes-echo-scrolled-off-the-top",  # many tool rows pushed it up: the answer box is the turn's
        "hermes",
        "  ┊ 💻 $         echo 38  0.0s\n  ┊ 💻 $         echo 39  0.0s\n\n╭─ ⚕ Hermes "
        + "─" * 40
        + "╮\n    Long done.\n╰"
        + "─" * 40
        + "╯\n"
        + HERMES_FOOTER,
        TerminalStatus.COMPLETED,
        "",
        "Long done.",
    ),
    Trap(
        "hermes-text-typed-while-busy",  # Enter would interrupt the turn: cao never delivers now
        "hermes",
        "\n" + "─" * 40 + "\n● First long task\n" + "─" * 40 + "\n  (¬_¬) synthesizing...\n\n"
        " ⚕ fake-model │ 10/256K │ [░░░░░░░░░░] 0% │ 37s │ ⏱ 1s\n---\n⚕ ❯ hello there\n---",
        TerminalStatus.PROCESSING,
        "hello there",
    ),
    Trap(
        "hermes-menu-rows-are-no-input-box",  # "│ ❯ 1. Allow once" inside the approval panel
        "hermes",
        "\n" + "─" * 40 + "\n● hello there\n" + "─" * 40 + "\n╭" + "─" * 40 + "╮\n"
        "│ ⚠️  Dangerous Command   │\n│ ❯ 1. Allow once         │\n│   4. Deny               │\n"
        "╰" + "─" * 40 + "╯\n  ↑/↓ to select, Enter to confirm  (44s)\n"
        " ⚕ fake-model │ 10/256K │ [░░░░░░░░░░] 0% │ 27s │ ⏱ 15s\n---\n⚠ ❯\n---",
        TerminalStatus.WAITING_USER_ANSWER,
        None,
    ),
]


@pytest.mark.parametrize("trap", TRAPS, ids=[t.name for t in TRAPS])
def test_provider_handles_trap(trap: Trap) -> None:
    provider = providers.get(trap.provider)
    screen = expand(trap.screen)
    assert provider.detect_status(screen) == trap.status
    assert provider.input_text(screen) == trap.box
    assert provider.extract_last_message(screen) == trap.last
    transcript = provider.transcript(screen)
    assert screen.startswith(transcript)
    for line in filter(str.strip, (trap.box or "").split("\n")):
        assert line not in transcript  # typed into the box, never submitted
    if trap.last:
        assert trap.last in transcript
    for echo in ("hello there", "First long task"):
        if echo in screen and echo not in (trap.box or ""):
            assert echo in transcript  # an echoed user turn


# -- submit confirmation --------------------------------------------------------------------------
def saved(provider: str, state: str) -> str:
    return (SCREENS / provider / f"{state}.txt").read_text()


def tick(screen: str) -> str:
    """The same busy screen a moment later: the spinner and its timer moved on."""
    for old, new in (
        ("Tomfoolering…", "Honking…"),
        ("(1s •", "(2s •"),
        ("⠇ Thinking... (esc to cancel, 1s)", "⠏ Thinking... (esc to cancel, 2s)"),
    ):
        screen = screen.replace(old, new)
    return screen


def unqueued(screen: str) -> str:
    """``screen`` as it was before the queued input arrived."""
    lines = [line for line in screen.split("\n") if not line.startswith(("  ❯ ", "  Queued", "    "))]
    return "\n".join(lines).replace("\u00a0Press up to edit queued messages", "\u00a0")


def screen_ref(provider: str, ref: str) -> str:
    """``idle`` (a saved screen), ``trap:<name>``, ``tick:<ref>`` or ``unqueued:<ref>``."""
    kind, _, rest = ref.partition(":")
    if kind == "trap":
        return expand(next(t.screen for t in TRAPS if t.name == rest))
    if kind == "tick":
        return tick(screen_ref(provider, rest))
    if kind == "unqueued":
        return unqueued(screen_ref(provider, rest))
    return saved(provider, ref)


class Submit(NamedTuple):
    name: str
    before: str
    after: str
    verdict: bool | None


SUBMITS = {
    provider: [
        Submit("nothing-happened-yet", "idle", "idle", None),
        Submit("still-in-the-box", "idle", f"trap:{typed}", False),
        Submit("went-busy", "idle", "processing", True),
        Submit("spinner-tick-only", "processing", "tick:processing", None),
        Submit("new-turn-answered", "completed", "error", True),
    ]
    for provider, typed in (
        ("claude_code", "claude-text-typed-in-the-box"),
        ("codex", "codex-text-typed-in-the-box"),
        ("gemini_cli", "gemini-text-typed-reads-like-an-echo"),
    )
}
SUBMITS["claude_code"].append(Submit("queued-while-busy", "unqueued:queued", "queued", True))
SUBMITS["gemini_cli"].append(
    Submit(
        "queued-while-busy",
        "unqueued:trap:gemini-message-queued-while-busy",
        "trap:gemini-message-queued-while-busy",
        True,
    )
)
# Older releases (tests/screens/<provider>/<version>/), Kimi CLI and Hermes: the same judgements on
# their own screens.
for folder in sorted({c.folder for c in SAVED if "/" in c.folder or c.folder in ("kimi_cli", "hermes")}):
    states = {c.state for c in SAVED if c.folder == folder}
    SUBMITS[folder] = [
        Submit(name, before, after, verdict)
        for name, before, after, verdict in (
            ("nothing-happened-yet", "idle", "idle", None),
            ("went-busy", "idle", "processing", True),
            ("new-turn-answered", "completed", "error", True),
            ("still-in-the-box", "idle", "typed", False),
        )
        if {before, after} <= states
    ]
SUBMITS["kimi_cli"].append(Submit("queued-while-busy", "processing", "queued", True))
SUBMIT_CASES = [(folder, case) for folder, cases in SUBMITS.items() for case in cases]


@pytest.mark.parametrize(
    ("folder", "case"), SUBMIT_CASES, ids=[f"{f.replace('/', '-')}-{c.name}" for f, c in SUBMIT_CASES]
)
def test_submit_confirmed_needs_firm_evidence(folder: str, case: Submit) -> None:
    """``folder``: a provider's current screens (``codex``) or an older release's (``codex/0.77.0``)."""
    before, after = screen_ref(folder, case.before), screen_ref(folder, case.after)
    assert before != after or case.verdict is None
    assert providers.get(folder.split("/")[0]).submit_confirmed(before, after) is case.verdict


# -- Hermes: what a hostile review found, on real captures (tests/screens/hermes/traps/) --------------
HERMES_TRAPS = SCREENS / "hermes" / "traps"


def hermes_trap(name: str) -> str:
    return (HERMES_TRAPS / f"{name}.txt").read_text()


def test_hermes_box_quoting_a_hermes_screen_is_the_persons_text_not_an_empty_box() -> None:
    """A person pasted (no Enter) ten lines quoting another Hermes pane — rules, an echo, an answer
    box and an empty `❯` box — into the idle box. The box shows only its last 8 rows: the quoted
    `❯` under a quoted rule once passed for an empty box, and cao pasted onto the person's text and
    submitted both."""
    hermes = providers.get("hermes")
    screen = hermes_trap("person_quotes_a_screen")
    box = hermes.input_text(screen)
    assert box and "All 12 tests passed." in box
    assert hermes.detect(screen).status == TerminalStatus.UNKNOWN  # the state icon scrolled away
    assert "All 12 tests passed." not in hermes.transcript(screen)
    assert hermes.extract_last_message(screen) == ""  # no turn on screen: the quote is no answer


@pytest.mark.parametrize("name", ["paste_quoting_a_screen_unsent", "long_paste_unsent"])
def test_hermes_paste_still_in_the_box_is_no_submitted_turn(name: str) -> None:
    """cao's paste sits in the box, Enter not taken (a starved CLI can keep it as a newline): a
    `● ` line in it (a bullet, a quoted echo) right under the box's rule is no echoed turn, and the
    box is read as holding text, so delivery presses Enter again instead of acknowledging."""
    hermes = providers.get("hermes")
    after = hermes_trap(name)
    assert hermes.submit_confirmed(saved("hermes", "idle"), after) is False
    assert hermes.input_text(after)


def test_hermes_resume_command_typed_in_the_box_is_not_an_exit() -> None:
    """`hermes --resume <id>` typed into the box (the last lines of a Hermes screen are its box)."""
    hermes = providers.get("hermes")
    screen = hermes_trap("resume_command_typed")
    assert hermes.input_text(screen) == "to go on later run hermes --resume 20261201_092448_bb9622"
    assert hermes.detect(screen).status == TerminalStatus.IDLE
    assert not hermes.detect(screen).final


def test_hermes_after_clear_is_idle_and_its_session_boundary_is_no_exit() -> None:
    """/clear (and /new) fire Hermes's on_session_finalize, as quitting does; only the hook's
    reason tells them apart. A fresh session waiting for input must not read as an exited CLI."""
    from cao.hook import report
    from cao.hookstate import Hooks, combine
    from cao.states import HookPhase

    hermes = providers.get("hermes")
    screen = hermes_trap("after_clear")
    assert hermes.detect(screen).status == TerminalStatus.IDLE
    phases = {}
    for reason in ("session_boundary", "shutdown"):
        payload = {"hook_event_name": "on_session_finalize", "extra": {"platform": "cli", "reason": reason}}
        body = report("hermes", None, payload)
        assert body["reason"] == reason  # the hook program passes Hermes's extra.reason on
        phases[reason] = hermes.hook_phase("on_session_finalize", body)
    assert phases == {"session_boundary": HookPhase.SESSION_START, "shutdown": HookPhase.SESSION_END}
    hooks = Hooks(clock=lambda: 100.0)
    hooks.record("t1", phases["session_boundary"], "on_session_finalize")
    reading, _ = combine(hermes.detect(screen), hooks.state("t1"), 200.0, settle=5.0)
    assert reading.status == TerminalStatus.IDLE


RESUME_COMMANDS = {
    "claude_code": "claude --resume 400d7b98-6e7f-4d45-b4e0-d75ca8375dc3",
    "codex": "codex resume 01a22fd7-67a5-7e11-9e70-176f4422e37c",
    "gemini_cli": "gemini --resume 240bd3a0-e40b-4856-b809-193a7bebdebd",
    "kimi_cli": "kimi -r 4d4a8c68-d852-43f1-93c5-46bca556a12a",
    "hermes": "hermes --resume 20261201_092448_bb9622",
}


@pytest.mark.parametrize("provider", sorted(RESUME_COMMANDS))
def test_a_resume_command_typed_into_the_box_is_no_exit(provider: str) -> None:
    """The saved typed screen with its last typed line swapped for the CLI's own resume command (a
    person may type one, a message may end with one). Claude's box sits in the last three lines, where
    the parting hint is looked for; only the CLI's own lead-in ("Resume this session with:", "To
    resume this session:", …) makes it a hint."""
    cli = providers.get(provider)
    typed = saved(provider, "typed")
    line = f"then run {RESUME_COMMANDS[provider]}"
    screen = typed.replace("Please reply typed-but-not-sent", line)
    assert screen != typed
    reading = cli.detect(screen)
    assert not reading.final and reading.status == cli.detect(typed).status
    assert line in (cli.input_text(screen) or "")


def test_hermes_box_is_found_on_a_narrow_pane_and_under_an_echo_shaped_like_its_status_bar() -> None:
    """Real captures: under 76 columns the status bar separates its fields with ` · `; an echoed
    turn whose last line looks like a status bar (a person pasted one) sits over a 40-column rule,
    not a pane-wide one like the box's."""
    hermes = providers.get("hermes")
    narrow = hermes_trap("narrow_70_completed")
    assert hermes.detect(narrow).status == TerminalStatus.COMPLETED and hermes.input_text(narrow) == ""
    echo = hermes_trap("echo_ends_with_status_line")
    assert hermes.detect(echo).status == TerminalStatus.COMPLETED and hermes.input_text(echo) == ""
    assert hermes.extract_last_message(echo) == "It is the status bar."


@pytest.mark.parametrize("name", ["statusbar_hidden_idle", "statusbar_hidden_quote_unsent"])
def test_hermes_with_its_status_bar_hidden_holds_mail_and_says_why(name: str) -> None:
    """A person's /statusbar hides the bar the box is found by. Then a quoted status bar, rule and
    `❯` row in the box must not pass for the box (that pasted onto the person's text and submitted
    both): no box is read at all, and the reason names the way back."""
    hermes = providers.get("hermes")
    screen = hermes_trap(name)
    reading = hermes.detect(screen)
    assert reading.status == TerminalStatus.UNKNOWN and "/statusbar" in (reading.reason or "")
    assert hermes.input_text(screen) is None
