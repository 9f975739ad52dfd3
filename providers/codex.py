"""Provider for the OpenAI Codex CLI (``codex``, npm ``@openai/codex``; tested with 0.171.0).

Launch: ``CODEX_HOME`` in a throwaway HOME per terminal with a complete ``config.toml`` (Codex
rewrites the file, and a duplicated table in it is fatal), the folder marked trusted, updates,
analytics, plugins and the background daemon off (else a daemon outlives the pane), and the cao
MCP server under ``[mcp_servers.cao]``. Knobs (read from the server's ``CAO_*`` environment):
``CAO_CODEX_BIN``, ``CAO_CODEX_MODEL``, ``CAO_CODEX_BYPASS`` (default true), ``CAO_MODEL_BASE_URL``,
``CAO_OPENAI_API_KEY``. The agent profile: its prompt as ``$CODEX_HOME/AGENTS.md``, its model and
its extra MCP servers (Codex has no tool allow-list). See docs/providers.md.

Screen (``capture-pane -p``)::

    › echoed user turn
    • answer text                       (tool calls too: • Ran echo hi / • Called cao.send_message)
      Worked for 6s • 08:04             (turn closed, ~0.1 s after the answer)
    ■ {"error": …}                      (a failed turn)
    › Ask Codex to do anything          (the input box: the LAST line starting "› ")

Traps: "• Working (1s • esc to interrupt)" shows only until the first token, so a turn is busy
until its "Worked for" (or ■) line appears; approval menus put ``› 1. Yes`` lines below the
transcript (look for them before the box); a message pasted while busy cancels the running turn
(only the new text gets answered), so Codex must only get input when idle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import literal, rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, bullet_blocks

BIN, MODEL, BYPASS = cli.cli_knobs(
    "CODEX",
    "codex",
    "Codex",
    "`--dangerously-bypass-approvals-and-sandbox`; off: `on-request` approvals, `workspace-write` sandbox",
    fake_model=True,
)
PROMPT = "› "  # the box's prompt, and an echoed user turn's
ECHO_RE = rule("echo", PROMPT)
PLACEHOLDERS = ("Ask Codex to do anything", "Ask a follow-up question")
# Releases before 0.171 show one of these example prompts in the empty box instead.
EXAMPLES = (
    "Explain this codebase",
    "Summarize recent commits",
    "Implement {feature}",
    "Find and fix a bug in @filename",
    "Write tests for @filename",
    "Improve documentation in @filename",
    "Run /review on my current changes",
    "Use /skills to list available skills",
    "Check recently modified functions for compatibility",
    "How many files have been modified?",
    "Will this algorithm scale well?",
)
BANNER_RE = rule("banner", r">_ OpenAI Codex \(v(\d+)\.(\d+)\.")
OLD_FOOTER_RE = rule("old_footer", r"^\s+(?:\d+% context left|\d+ used) · ")  # 0.77's footer
# "• Working (3s • esc to interrupt)": 0.171 shows it until the first token, older ones all turn long.
WORKING_RE = rule("working", r"\(\d+[ms]?[^)]*esc to interrupt\)")
WAITING_RE = rule(
    "waiting",
    r"Would you like to (?:run|make|apply)|Allow the \S+ MCP server to run tool|"
    r"enter to (?:confirm|submit)\b.*esc to cancel",
    re.IGNORECASE,
)
# The last line of a start-up dialog (update available, trust this folder, sign in, hooks need
# review): "enter continue · esc skip", "enter continue · esc back", "enter confirm · esc skip",
# "Press enter to continue". Its options start "› 1." like the box.
DIALOG_HINT_RE = rule(
    "dialog_hint",
    r"^\s*(?:press enter to continue|enter (?:continue|confirm)(?: · esc \w+)?)$",
    re.IGNORECASE,
)
# "  Worked for 6s • 08:04" closes a turn (0.171); "─ Worked for 0s ───" (before 0.171) only
# separates a turn's tool calls from its final answer.
WORKED_RE = rule("worked", r"^\s*(?:─+ )?Worked for \S")
CLOSED_RE = rule("closed", r"^\s*Worked for \S")
# Lifecycle hooks: $CODEX_HOME/hooks.json (0.171), else `notify` (agent-turn-complete) only.
HOOK_PHASES = {
    "SessionStart": HookPhase.SESSION_START,
    "UserPromptSubmit": HookPhase.TURN_START,
    "Stop": HookPhase.TURN_END,
    "PermissionRequest": HookPhase.ASKING,
    "agent-turn-complete": HookPhase.TURN_END,  # notify
}
HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "Stop", "PermissionRequest", "PostToolUse")
FAILED = "■ "
INTERRUPTED = "■ Conversation interrupted"


def _waiting(lines: list[str]) -> bool:
    """An approval prompt near the bottom, or a start-up dialog (its key hint is the last line)."""
    if lines and DIALOG_HINT_RE.match(lines[-1]):
        return True
    return any(WAITING_RE.search(line) for line in lines[-15:])


def _streams_before_closing(lines: list[str], box: Box) -> bool:
    """0.171 streams the answer with nothing busy on screen and closes the turn with "Worked for"
    ~0.1 s later; older releases show the answer only when the turn is over and may print no
    "Worked for" at all. True unless the screen shows an older release (its banner, an example
    prompt in the empty box, its footer)."""
    for found in BANNER_RE.finditer("\n".join(lines)):
        return (int(found[1]), int(found[2])) >= (0, 171)
    if lines[box.first][len(PROMPT) :].strip() in EXAMPLES:
        return False
    return not any(OLD_FOOTER_RE.match(line) for line in lines[box.top + 1 :])


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _mcp_table(name: str, spec: dict[str, Any]) -> str:
    """One ``[mcp_servers.<name>]`` table (a stdio ``command`` or an HTTP ``url`` server)."""
    rows = [f"[mcp_servers.{_toml(name)}]"]
    rows += [f"{key} = {_toml(spec[key])}" for key in ("command", "url") if key in spec]
    if spec.get("args"):
        rows.append(f"args = [{', '.join(_toml(arg) for arg in spec['args'])}]")
    if spec.get("env"):
        rows.append(f"env = {{ {', '.join(f'{_toml(k)} = {_toml(v)}' for k, v in spec['env'].items())} }}")
    return "\n".join(rows)


def _config(ctx: LaunchContext, base_url: str, bypass: bool, notify: list[str] | None) -> str:
    """``$CODEX_HOME/config.toml``, whole: Codex rewrites it, and a table written twice is fatal."""
    # A real model slug against a local server brings a "model changed" dialog; an unknown one
    # only a warning in the status line.
    model = cli.model_name(ctx, MODEL, "fake-model" if base_url else "")
    approval, sandbox = ("never", "danger-full-access") if bypass else ("on-request", "workspace-write")
    model_line = f"model = {_toml(model)}\n" if model else ""
    url = f"{base_url}/v1" if base_url else "https://api.openai.com/v1"
    retries = "request_max_retries = 0\nstream_max_retries = 0\n" if base_url else ""
    mcp = "\n\n".join(_mcp_table(name, spec) for name, spec in cli.mcp_servers(ctx).items())
    notify_line = f"notify = [{', '.join(_toml(part) for part in notify)}]\n" if notify else ""
    return f"""\
{notify_line}{model_line}model_provider = "cao"
approval_policy = "{approval}"
sandbox_mode = "{sandbox}"
check_for_update_on_startup = false

[model_providers.cao]
name = "cao"
base_url = {_toml(url)}
env_key = "CAO_CODEX_API_KEY"
wire_api = "responses"
{retries}
[projects.{_toml(str(ctx.working_directory))}]
trust_level = "trusted"

[analytics]
enabled = false

[feedback]
enabled = false

[features]
daemon_auto_start = false
plugins = false
remote_plugin = false
apps = false
in_app_updates = false
tool_suggest = false

[tui]
screen_reader_detection_done = true
show_tooltips = false

{mcp}
"""


class CodexProvider(BoxedTUI):
    name = "codex"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "OpenAI Codex CLI, `codex` (input only when idle)"
    accepts_input_while_processing = False  # a paste mid-turn cancels the turn
    submit_timeout = 3.0
    exit_command = "/quit"
    idle_tail_pattern = rule("idle_tail", r"^(?!.*esc to interrupt)")
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, cli.OPENAI_API_KEY)
    hook_phases = HOOK_PHASES
    interrupt_key = "Escape"
    turn_channel = "PostToolUse"  # hooks.json (0.171): a developer message before the tool's output
    placeholder = literal("placeholder", *PLACEHOLDERS, *EXAMPLES)
    echo = ECHO_RE  # Codex has no queue: input only goes in when idle
    asking_reason = "an approval prompt or a start-up dialog"
    starting_reason = "starting: nothing drawn yet"
    no_box = (
        "no input box (a line starting ›), approval prompt or dialog on screen: still starting, or a "
        "screen of a Codex release this provider does not know"
    )
    resume_hint = True

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its rollout files' ``token_count`` events under ``$CODEX_HOME`` (providers/usage_files.py)."""
        return usage_files.codex(home / ".codex")

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        codex_home = ctx.terminal_home / ".codex"
        bypass = ctx.knob(BYPASS)
        base_url = ctx.knob(cli.MODEL_BASE_URL).rstrip("/")
        key = ctx.knob(cli.OPENAI_API_KEY) or (cli.LOCAL_KEY if base_url else "")
        if not key:
            raise ProviderError(
                "codex has no credentials: set CAO_OPENAI_API_KEY (or CAO_MODEL_BASE_URL for a local "
                "model server) for cao-server"
            )
        # Lifecycle hooks (cao/hookstate.py): 0.171 runs Claude-style hooks from $CODEX_HOME/hooks.json
        # (trusted with --dangerously-bypass-hook-trust: cao wrote them into the throwaway home);
        # before that, the `notify` program on each turn's end is all there is.
        binary = cli.find_cli(ctx, BIN, "@openai/codex")
        version = cli.npm_version(binary, "@openai/codex")
        hooks_json = ctx.hooks and (version is None or version >= (0, 171))
        notify = ctx.hook_command("codex") if ctx.hooks and not hooks_json else None
        files = {codex_home / "config.toml": _config(ctx, base_url, bypass, notify)}
        env = cli.pane_env(ctx, CODEX_HOME=str(codex_home), CAO_CODEX_API_KEY=key)
        # Inline mode keeps the transcript in tmux's scrollback (delivery recovery looks there).
        command = [binary]
        # Releases before the flag existed (0.77 here; 0.130 has it) draw inline anyway, and reject it.
        if version is None or version >= (0, 130):
            command.append("--no-alt-screen")
        if bypass:
            command.append("--dangerously-bypass-approvals-and-sandbox")
        if hooks_json:
            events = cli.command_hooks(ctx, "codex", HOOK_EVENTS, timeout=10)
            files[codex_home / "hooks.json"] = json.dumps({"hooks": events}, indent=2)
            command.append("--dangerously-bypass-hook-trust")
        if prompt := cli.system_prompt(ctx):  # Codex reads $CODEX_HOME/AGENTS.md as the user's guidance
            files[codex_home / "AGENTS.md"] = prompt
        channel = self.turn_channel if hooks_json else None  # PostToolUse: in hooks.json only
        return LaunchSpec(command=command, env=env, files=files, turn_channel=channel)

    def find_box(self, lines: list[str]) -> Box | None:
        """The last line starting "› " and the indented rows under it, unless an approval or a
        start-up dialog shows (their options start "› 1." as well)."""
        if _waiting(lines):
            return None
        for i in range(len(lines) - 1, -1, -1):
            if lines[i].startswith(PROMPT) or lines[i] == PROMPT.strip():
                end = i + 1
                while end < len(lines) and lines[end].startswith("  ") and lines[end].strip():
                    end += 1
                return Box(i, i, end)
        return None

    def asks(self, lines: list[str]) -> bool:
        return _waiting(lines)

    def blocks(self, lines: list[str]) -> list[str]:
        """The ``• …`` and ``■ …`` blocks, up to the line that closes the turn (the busy line
        ``• Working (…)`` is no block)."""
        blocks = bullet_blocks(
            [line for line in lines if not WORKED_RE.match(line)], ("• ", FAILED), stop=CLOSED_RE
        )
        return [block for block in blocks if not WORKING_RE.search(block.split("\n")[0])]

    def with_box(self, lines: list[str], box: Box) -> Reading:
        transcript = lines[: box.top]
        last = self.turn(transcript)
        turn = transcript if last is None else last
        if any(WORKING_RE.search(line) for line in turn):
            return Reading(TerminalStatus.PROCESSING, "• Working (… esc to interrupt)")
        # The last thing that closes or opens a turn decides: an echo opens one, "Worked for" or ■
        # closes it. With no echo on screen (scrolled away), answer bullets mean a turn is running.
        for line in reversed(turn):
            if CLOSED_RE.match(line) or line.startswith(INTERRUPTED):
                return Reading(TerminalStatus.COMPLETED, "Worked for … closed the last turn")
            if line.startswith(FAILED):
                return Reading(TerminalStatus.ERROR, "■ closed the last turn")
        answered = any(line.startswith("• ") for line in turn)
        if last is None and not answered:
            return Reading(TerminalStatus.IDLE, "the input box, no turn on screen")
        if answered and not _streams_before_closing(lines, box):
            return Reading(TerminalStatus.COMPLETED, "an answer and no Working line (a release before 0.171)")
        if answered:
            return Reading(TerminalStatus.PROCESSING, "an answer streaming: no Worked for yet")
        return Reading(TerminalStatus.PROCESSING, "a user turn not answered yet")
