"""Provider for Kimi CLI (``kimi``, PyPI ``kimi-cli``; tested with 1.51.0).

Launch: a throwaway HOME per terminal with ``~/.kimi/config.toml`` (one provider and one model,
named ``cao``, as ``default_model``; telemetry off) and ``~/.kimi/mcp.json`` (the cao MCP server,
passed with ``--mcp-config-file``); auto-update checks and telemetry off by environment. Knobs (read
from the server's ``CAO_*`` environment): ``CAO_KIMI_BIN``, ``CAO_KIMI_MODEL``, ``CAO_KIMI_BYPASS``
(default true, ``--yolo``), ``CAO_MODEL_BASE_URL`` (a local OpenAI-compatible server),
``CAO_KIMI_API_KEY`` with ``CAO_KIMI_BASE_URL`` (Moonshot's API by default). The agent profile:
its prompt as the ``ROLE_ADDITIONAL`` of an agent file extending Kimi's default agent
(``--agent-file``), its model and its extra MCP servers. See docs/providers.md.

PyPI's kimi-cli 1.52.0 is not the CLI: it downloads and runs its vendor's installer for a
successor program. Use 1.51.0 (``pip install kimi-cli==1.51.0``).

Screen (``capture-pane -p``, inline: the transcript stays in tmux's scrollback)::

    ✨ echoed user turn
    • Used Shell (echo hi)                 (a tool call; "⠹ Using Shell (…)" while it runs)
    • answer text
    LLM provider error: Error code: 400 …  (a failed turn: a plain line, no bullet)
    🌓                                      (busy: the live area above the box)
    ── input ──────────────────────         ("── input · 1 queued ──" with queued messages)
     text being typed
    ───────────────────────────────
    yolo  agent (fake-model ○)  …/work  tips
                                      context: 0.0% (20/131.1k)

Traps: the box stays on screen while busy (the live area decides: a moon phase, or a braille
spinner with ``Composing``/``Using``/``Thinking``/``Connecting to MCP servers``); a stale
``⠸ MCP Servers: 0/1 connected`` line is printed at start and stays in the transcript; tool calls
and answers share the ``•`` bullet; an approval replaces the box with an ``approval`` panel.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI, bullet_blocks

MOONSHOT_URL = "https://api.moonshot.ai/v1"
BIN, MODEL, BYPASS = cli.cli_knobs(
    "KIMI", "kimi", "Kimi CLI", "`--yolo`", fake_model=True, vendor_key="CAO_KIMI_API_KEY", venv="kimi-cli"
)
API_KEY, BASE_URL = cli.vendor_knobs("KIMI", "a Moonshot (or compatible) API key", MOONSHOT_URL)
CONTEXT_SIZE = 131072  # tokens; Kimi needs one per model (it decides when to compact)
PASTE_FOLD_NEVER = "100000000"

INPUT_RE = rule(
    "input", r"^ ?[─╌]{1,2} input(?: · [^─╌]*)? [─╌]+$"
)  # the rule over the box ("╌" in plan mode)
QUEUED_RE = rule("queued", r" input(?: · plan)? · \d+ queued ")
SEPARATOR_RE = rule("separator", r"^─{20,}$")  # the toolbar's rule under the box
ECHO_RE = rule("echo", r"✨ ")
BULLET = "• "
TOOL_RE = rule("tool", r"^• (?:Used|Using) [A-Za-z_][\w.-]*(?: \(|$)")
# The live area while a turn runs: a moon phase (waiting for the model), or a braille spinner on the
# answer being streamed ("Composing... 2s · 11 tokens"), a tool call, thinking, MCP servers
# connecting or context compaction.
MOONS = ("🌑", "🌒", "🌓", "🌔", "🌕", "🌖", "🌗", "🌘")
BUSY_RE = rule(
    "busy",
    rf"^(?:[{''.join(MOONS)}]|[⠀-⣿] "
    r"(?:Composing|Using|Thinking|Connecting to MCP servers|Compacting|Side question))",
)
ERROR_RE = rule(
    "error",
    r"^(?:LLM provider error:|Server: |Authorization failed\.|Membership expired|Network connection failed:|"
    r"Request timed out:|The server returned an empty response\.|Unexpected error:|LLM not set)",
)
LOADING_RE = rule("loading", r"^[⠀-⣿] Loading ")  # start-up, before the box
APPROVAL_RE = rule("approval", r"^╭─ (?:approval|question)\b|^│ +(?:→ )?\[\d\] |↵ (?:confirm|submit)")


# Lifecycle hooks ([[hooks]] in ~/.kimi/config.toml; Claude-style payloads on stdin). Kimi asks for
# approvals on screen only (its Notification hook is for background tasks).
HOOK_PHASES = cli.CLAUDE_HOOK_PHASES


def _toml(value: object) -> str:
    """A TOML value for a string, bool or int (JSON's string escapes are valid TOML)."""
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _config(base_url: str, key: str, kind: str, model: str) -> str:
    rows = [
        ('default_model = "cao"', "default_thinking = false", "telemetry = false"),
        (
            "[providers.cao]",
            f"type = {_toml(kind)}",
            f"base_url = {_toml(base_url)}",
            f"api_key = {_toml(key)}",
        ),
        ("[models.cao]", 'provider = "cao"', f"model = {_toml(model)}", f"max_context_size = {CONTEXT_SIZE}"),
    ]
    return "\n\n".join("\n".join(table) for table in rows) + "\n"


class KimiCliProvider(BoxedTUI):
    name = "kimi_cli"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "Kimi CLI, `kimi`"
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, API_KEY, BASE_URL)
    hook_phases = HOOK_PHASES
    prompt_width = 1
    indent = 0
    echo = ECHO_RE
    asking = APPROVAL_RE  # an approval or a question replaces the box
    no_box = (
        "no input box (a '── input ──' rule over the toolbar's rule), approval or start-up spinner on "
        "screen: a screen of a Kimi CLI release this provider does not know"
    )
    resume_hint = True
    exit_reason = "Kimi CLI has exited (its resume hint or a dead pane shows)"

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its wire files' ``StatusUpdate.token_usage`` (providers/usage_files.py)."""
        return usage_files.kimi(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        bypass = ctx.knob(BYPASS)
        env = cli.pane_env(
            ctx,
            KIMI_CLI_NO_AUTO_UPDATE="1",
            KIMI_DISABLE_TELEMETRY="1",
            # A long paste would show as "[Pasted text #1 +40 lines]" in the box and the echo: keep
            # the text itself, so delivery can find a message's header on screen.
            KIMI_CLI_PASTE_CHAR_THRESHOLD=PASTE_FOLD_NEVER,
            KIMI_CLI_PASTE_LINE_THRESHOLD=PASTE_FOLD_NEVER,
        )
        api = cli.vendor_or_local(
            ctx,
            API_KEY,
            BASE_URL,
            MOONSHOT_URL,
            MODEL,
            needs_model="kimi_cli needs a model for CAO_KIMI_API_KEY: set CAO_KIMI_MODEL (e.g. the one your "
            "Moonshot account offers) or the agent profile's model, for cao-server",
            no_credentials="kimi_cli has no credentials: set CAO_KIMI_API_KEY (with CAO_KIMI_MODEL, and "
            "CAO_KIMI_BASE_URL for a non-Moonshot endpoint), or CAO_MODEL_BASE_URL for a local model "
            "server, for cao-server",
        )
        share = ctx.terminal_home / ".kimi"
        config = _config(api.base_url, api.key, "openai_legacy" if api.local else "kimi", api.model)
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hookstate.py): [[hooks]] tables
            config += "".join(
                f"\n[[hooks]]\nevent = {_toml(event)}\n"
                f"command = {_toml(shlex.join(ctx.hook_command('kimi', event)))}\ntimeout = 10\n"
                for event in HOOK_PHASES
            )
        files = {
            share / "config.toml": config,
            share / "mcp.json": json.dumps({"mcpServers": cli.mcp_servers(ctx)}, indent=2),
        }
        command = [
            cli.find_venv_cli(
                ctx, BIN, "kimi-cli", "1.51.0", note="1.52.0 is an installer stub, not the CLI"
            ),
            "--mcp-config-file",
            str(share / "mcp.json"),
        ]
        if prompt := cli.system_prompt(ctx):  # added to Kimi's own system prompt, not replacing it
            agent = {
                "version": 1,
                "agent": {"extend": "default", "system_prompt_args": {"ROLE_ADDITIONAL": prompt}},
            }
            files[share / "cao-agent.yaml"] = json.dumps(agent, indent=2)  # YAML reads JSON
            command += ["--agent-file", str(share / "cao-agent.yaml")]
        if bypass:
            command.append("--yolo")
        return LaunchSpec(command=command, env=env, files=files)

    def find_box(self, lines: list[str]) -> Box | None:
        """The rows between the last ``── input ──`` rule and the toolbar's full-width rule under it
        (or the bottom: the toolbar can be a frame late)."""
        for i in range(len(lines) - 1, -1, -1):
            if INPUT_RE.match(lines[i]):
                end = next((j for j in range(i + 1, len(lines)) if SEPARATOR_RE.match(lines[j])), len(lines))
                return Box(i, i + 1, end)
        return None

    def continues(self, line: str) -> bool:
        return (
            bool(line.strip())
            and not line.startswith((BULLET, *MOONS))
            and not BUSY_RE.match(line)
            and not ERROR_RE.match(line)
        )

    def queued(self, lines: list[str], box: Box | None, transcript: list[str]) -> int:
        queued = QUEUED_RE.search(lines[box.top]) if box else None  # "── input · 2 queued ──"
        return int(queued.group(0).split("·")[-1].split()[0]) if queued else 0

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        """The last ``•`` answer of the last turn (tool calls left out); for a failed turn, its error
        and the hint under it."""
        turn = self.turn(lines[: box.top] if box else lines)
        if turn is None:
            return ""
        for i in range(len(turn) - 1, -1, -1):
            if turn[i].startswith(BULLET):
                break
            if ERROR_RE.match(turn[i]):
                return "\n".join(line for line in turn[i:] if line.strip()).strip()
        answers = [line if not TOOL_RE.match(line) else "" for line in turn]
        blocks = bullet_blocks(answers, (BULLET,))
        return blocks[-1] if blocks else ""

    def starting(self, lines: list[str]) -> bool:
        return not lines or any(LOADING_RE.match(line) for line in lines[-3:])

    def with_box(self, lines: list[str], box: Box) -> Reading:
        live = self.turn(lines[: box.top])
        if QUEUED_RE.search(lines[box.top]) or any(
            BUSY_RE.match(line) for line in live or lines[: box.top][-4:]
        ):
            return Reading(TerminalStatus.PROCESSING)
        if live is None:
            return Reading(TerminalStatus.IDLE)
        for line in reversed(live):
            if ERROR_RE.match(line):
                return Reading(TerminalStatus.ERROR)
            if line.startswith(BULLET):
                break
        return Reading(TerminalStatus.COMPLETED)
