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
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from cao import knobs
from cao.knobs import Knob
from cao.states import HookPhase
from providers._cli import (
    CLAUDE_HOOK_PHASES,
    MODEL_BASE_URL,
    REALCLI_CACHE,
    bullet_blocks,
    cli_knobs,
    exited,
    find_venv_cli,
    head,
    judge_submit,
    mcp_servers,
    pane_env,
    system_prompt,
    vendor_or_local,
)
from providers.base import LaunchContext, LaunchSpec, Provider, Reading, TerminalStatus

BIN, MODEL, BYPASS = cli_knobs(
    "KIMI",
    "kimi",
    cli="Kimi CLI",
    bypass="`--yolo`",
    model="the model; overrides the agent profile's, and one of them is required with `CAO_KIMI_API_KEY`",
    model_shown="the profile's `model` (`fake-model` against `CAO_MODEL_BASE_URL`)",
    where="venvs/kimi-cli/bin",
)
API_KEY = knobs.text("CAO_KIMI_API_KEY", "a Moonshot (or compatible) API key; needs a model")
BASE_URL = knobs.text(
    "CAO_KIMI_BASE_URL", "the endpoint for `CAO_KIMI_API_KEY`", shown="`https://api.moonshot.ai/v1`"
)
MOONSHOT_URL = "https://api.moonshot.ai/v1"
CONTEXT_SIZE = 131072  # tokens; Kimi needs one per model (it decides when to compact)
PASTE_FOLD_NEVER = "100000000"

INPUT_RE = re.compile(r"^ ?[─╌]{1,2} input(?: · [^─╌]*)? [─╌]+$")  # the rule over the box ("╌" in plan mode)
QUEUED_RE = re.compile(r" input(?: · plan)? · \d+ queued ")
SEPARATOR_RE = re.compile(r"^─{20,}$")  # the toolbar's rule under the box
ECHO = "✨ "
BULLET = "• "
TOOL_RE = re.compile(r"^• (?:Used|Using) [A-Za-z_][\w.-]*(?: \(|$)")
# The live area while a turn runs: a moon phase (waiting for the model), or a braille spinner on the
# answer being streamed ("Composing... 2s · 11 tokens"), a tool call, thinking, MCP servers
# connecting or context compaction.
MOONS = ("🌑", "🌒", "🌓", "🌔", "🌕", "🌖", "🌗", "🌘")
BUSY_RE = re.compile(
    rf"^(?:[{''.join(MOONS)}]|[⠀-⣿] "
    r"(?:Composing|Using|Thinking|Connecting to MCP servers|Compacting|Side question))"
)
ERROR_RE = re.compile(
    r"^(?:LLM provider error:|Server: |Authorization failed\.|Membership expired|Network connection failed:|"
    r"Request timed out:|The server returned an empty response\.|Unexpected error:|LLM not set)"
)
APPROVAL_RE = re.compile(r"^╭─ (?:approval|question)\b|^│ +(?:→ )?\[\d\] |↵ (?:confirm|submit)")


# Lifecycle hooks ([[hooks]] in ~/.kimi/config.toml; Claude-style payloads on stdin). Kimi asks for
# approvals on screen only (its Notification hook is for background tasks).
HOOK_PHASES = CLAUDE_HOOK_PHASES


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


class KimiCliProvider(Provider):
    name: ClassVar[str] = "kimi_cli"
    description: ClassVar[str] = "Kimi CLI, `kimi`"
    accepts_input_while_processing: ClassVar[bool] = False
    waits_for_mcp: ClassVar[bool] = True
    paste_enter_delay: ClassVar[float] = 0.2
    submit_timeout: ClassVar[float] = 4.0
    exit_command: ClassVar[str] = "/exit"
    knobs: ClassVar[tuple[Knob[Any], ...]] = (
        BIN,
        MODEL,
        BYPASS,
        MODEL_BASE_URL,
        REALCLI_CACHE,
        API_KEY,
        BASE_URL,
    )
    hook_phases: ClassVar[Mapping[str, HookPhase]] = HOOK_PHASES

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        bypass = ctx.knob(BYPASS)
        env = pane_env(
            ctx,
            KIMI_CLI_NO_AUTO_UPDATE="1",
            KIMI_DISABLE_TELEMETRY="1",
            # A long paste would show as "[Pasted text #1 +40 lines]" in the box and the echo: keep
            # the text itself, so delivery can find a message's header on screen.
            KIMI_CLI_PASTE_CHAR_THRESHOLD=PASTE_FOLD_NEVER,
            KIMI_CLI_PASTE_LINE_THRESHOLD=PASTE_FOLD_NEVER,
        )
        api = vendor_or_local(
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
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hooks.py): [[hooks]] tables
            config += "".join(
                f"\n[[hooks]]\nevent = {_toml(event)}\n"
                f"command = {_toml(shlex.join(ctx.hook_command('kimi', event)))}\ntimeout = 10\n"
                for event in HOOK_PHASES
            )
        files = {
            share / "config.toml": config,
            share / "mcp.json": json.dumps({"mcpServers": mcp_servers(ctx)}, indent=2),
        }
        command = [
            find_venv_cli(ctx, BIN, "kimi-cli", "1.51.0", note="1.52.0 is an installer stub, not the CLI"),
            "--mcp-config-file",
            str(share / "mcp.json"),
        ]
        if prompt := system_prompt(ctx):  # added to Kimi's own system prompt, not replacing it
            agent = {
                "version": 1,
                "agent": {"extend": "default", "system_prompt_args": {"ROLE_ADDITIONAL": prompt}},
            }
            files[share / "cao-agent.yaml"] = json.dumps(agent, indent=2)  # YAML reads JSON
            command += ["--agent-file", str(share / "cao-agent.yaml")]
        if bypass:
            command.append("--yolo")
        return LaunchSpec(command=command, env=env, files=files)

    def detect(self, screen: str) -> Reading:
        lines = _lines(screen)
        if exited(lines):
            return Reading(
                TerminalStatus.UNKNOWN,
                "Kimi CLI has exited (its resume hint or a dead pane shows)",
                final=True,
            )
        box = _box(lines)
        if box is None:  # an approval or a question replaces the box; start-up shows spinners only
            if any(APPROVAL_RE.search(line) for line in lines):
                return Reading(TerminalStatus.WAITING_USER_ANSWER)
            if not lines or any(re.match(r"^[⠀-⣿] Loading ", line) for line in lines[-3:]):
                return Reading(TerminalStatus.PROCESSING)  # starting up
            return Reading(
                TerminalStatus.UNKNOWN,
                "no input box (a '── input ──' rule over the toolbar's rule), approval or start-up "
                "spinner on screen: a screen of a Kimi CLI release this provider does not know",
            )
        live = _turn(lines[: box[0] - 1])
        if QUEUED_RE.search(lines[box[0] - 1]) or any(
            BUSY_RE.match(line) for line in live or lines[: box[0] - 1][-4:]
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

    def detect_status(self, screen: str) -> TerminalStatus:
        return self.detect(screen).status

    def extract_last_message(self, screen: str) -> str:
        lines = _lines(screen)
        box = _box(lines)
        turn = _turn(lines[: box[0] - 1] if box else lines)
        if turn is None:
            return ""
        for i in range(len(turn) - 1, -1, -1):  # a failed turn: the error and its hint
            if turn[i].startswith(BULLET):
                break
            if ERROR_RE.match(turn[i]):
                return "\n".join(line for line in turn[i:] if line.strip()).strip()
        answers = [line if not TOOL_RE.match(line) else "" for line in turn]
        blocks = bullet_blocks(answers, (BULLET,))
        return blocks[-1] if blocks else ""

    def transcript(self, screen: str) -> str:
        box = _box(_lines(screen))
        return screen if box is None else head(screen, box[0] - 1)

    def submit_confirmed(self, before: str, after: str) -> bool | None:
        return judge_submit(self, before, after, _marks)

    def input_text(self, screen: str) -> str | None:
        lines = _lines(screen)
        box = _box(lines)
        if box is None or exited(lines):
            return None
        first, end = box
        rows = [row[1:] if i == first else row for i, row in enumerate(lines[first:end], first)]
        return "\n".join(row.rstrip() for row in rows).strip()


def _lines(screen: str) -> list[str]:
    lines = [line.rstrip() for line in screen.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _box(lines: list[str]) -> tuple[int, int] | None:
    """``(first, end)`` of the input box: the rows between the last ``── input ──`` rule and the
    toolbar's full-width rule under it (or the bottom)."""
    for i in range(len(lines) - 1, -1, -1):
        if INPUT_RE.match(lines[i]):
            # the toolbar can be a frame late: then the box runs to the bottom
            end = next((j for j in range(i + 1, len(lines)) if SEPARATOR_RE.match(lines[j])), len(lines))
            return i + 1, end
    return None


def _turn(transcript: list[str]) -> list[str] | None:
    """Rows after the last echoed user turn (its continuation rows skipped); None if none shows."""
    for i in range(len(transcript) - 1, -1, -1):
        if transcript[i].startswith(ECHO):
            j = i + 1
            while (
                j < len(transcript)
                and transcript[j].strip()
                and not transcript[j].startswith((BULLET, *MOONS))
                and not BUSY_RE.match(transcript[j])
                and not ERROR_RE.match(transcript[j])
            ):
                j += 1
            return transcript[j:]
    return None


def _marks(screen: str) -> tuple[str | None, int]:
    lines = _lines(screen)
    box = _box(lines)
    transcript = lines[: box[0] - 1] if box else lines
    echoes = [line for line in transcript if line.startswith(ECHO)]
    queued = QUEUED_RE.search(lines[box[0] - 1]) if box else None
    return (echoes[-1] if echoes else None), int(queued.group(0).split("·")[-1].split()[0]) if queued else 0
