"""Provider for Hermes (``hermes``, Nous Research's PyPI ``hermes-agent``; tested with 0.19.0).

Launch: a throwaway config home per terminal (``HERMES_HOME=<terminal home>/.hermes``, never the
user's ``~/.hermes``) holding a whole ``config.yaml``: the model endpoint (provider ``custom``, so
the first-run "isn't configured yet" question never shows), cao's MCP server and the profile's
under ``mcp_servers``, the profile's prompt as ``agent.system_prompt`` (Hermes adds it to its own),
and the things that would reach the internet or get in the way off (model catalog, curator, the
tirith scanner, long pastes folded into a placeholder). Knobs (read from the server's ``CAO_*``
environment): ``CAO_HERMES_BIN``, ``CAO_HERMES_MODEL``, ``CAO_HERMES_BYPASS`` (default true,
``--yolo``), ``CAO_MODEL_BASE_URL`` (a local OpenAI-compatible server), ``CAO_HERMES_API_KEY`` with
``CAO_HERMES_BASE_URL`` (OpenRouter by default). See docs/providers.md.

Hermes reaches for openrouter.ai, nousresearch.com and GitHub at start whatever the config says;
cao's tests run it only in the loopback-only bed. PyPI's 0.19.0 is the last release there; install
it with its ``mcp`` extra (``pip install 'hermes-agent[mcp]==0.19.0'``): without it Hermes lists MCP
servers as configured and never starts them.

Screen (``capture-pane -p``; the transcript scrolls above a prompt_toolkit box)::

    ────────────────────────────────────────   (a 40-column frame around each echoed user turn)
    ● echoed user turn
    ────────────────────────────────────────
      ┊ 💻 $ echo hi  0.0s                      (a tool call)
    ╭─ ⚕ Hermes ──────────────────────────╮    (the answer, indented in a box)
        answer text
    ╰─────────────────────────────────────╯
      (¬_¬) synthesizing...                     (busy: a kaomoji spinner over the status line)
     ⚕ fake-model │ 10/256K │ [░░░] 0% │ 37s │ ⏲ 0s
    ─────────────────────────────────────────── (full width)
    ❯ text being typed                         ("⚕ ❯ msg=interrupt · …" while a turn runs)
    ───────────────────────────────────────────

Traps: the box stays on screen while busy (its prompt symbol says which state: ``⚕ ❯`` a turn runs,
``⚠ ❯`` an approval, ``? ❯``/``✎ ❯`` a clarifying question, ``🔐``/``🔑`` a password); Enter while a
turn runs interrupts it (``display.busy_input_mode: interrupt``), so cao never delivers then.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from collections.abc import Mapping
from typing import Any

from cao.states import HookPhase
from providers import _cli as cli
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus
from providers.rules import rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, PANE_DEAD_RE, Box, BoxedTUI

OPENROUTER_URL = "https://openrouter.ai/api/v1"
BIN, MODEL, BYPASS = cli.cli_knobs(
    "HERMES",
    "hermes",
    "Hermes",
    "`--yolo` and `approvals.mode: off`; off: `manual`",
    fake_model=True,
    vendor_key="CAO_HERMES_API_KEY",
    venv="hermes-agent",
)
API_KEY, BASE_URL = cli.vendor_knobs("HERMES", "an OpenRouter (or OpenAI-compatible) API key", OPENROUTER_URL)
PASTE_FOLD_NEVER = 100_000_000

RULE_RE = rule("box_rule", r"^─{3,}$")
ECHO_RULE = "─" * 40  # Hermes frames each echoed user turn with exactly this (full-width rules: the box)
# The status bar right over the box's top rule: " ⚕ fake-model │ 10/256K │ … │ ⚠ YOLO" (under 76
# columns " ⚕ fake-model · 0% · 17s · ⚠ YOLO").
STATUS_RE = rule("status", r"^ ⚕ \S.* [│·] ")
BOX_ROWS = 8  # the box shows at most this many rows (the latest), the prompt row scrolling away
# The input line: an optional state icon, then the prompt symbol.
PROMPT_RE = rule("prompt", r"^(?:(\S+) )?❯(?: |$)")
RUNNING = "⚕"  # a turn runs
ASKING = ("⚠", "?", "✎", "🔐", "🔑")  # approval, clarifying question, password, secret
PLACEHOLDER = "msg=interrupt · "  # in the empty box while a turn runs
ECHO = "● "
# The answer: a box while it streams in ("╭─ ⚕ Hermes ─…╮" … "╰─…─╯"), or a panel of two rules
# when it is printed whole (" ─  ⚕ Hermes  ─…" … " ─…─"; a failed turn's message comes that way).
ANSWER_RE = rule("answer", r"^(?:╭─ | ─  )⚕ Hermes ")
ANSWER_END_RE = rule("answer_end", r"^(?:╰─+╯| ─+)$")
# The live line over the status bar while a turn runs: a kaomoji face and a verb ("(¬_¬) synthesizing...",
# "(°ロ°) analyzing...").
SPINNER_RE = rule("spinner", r"^ {2}\S.* [a-z]+\.\.\.$")
# A failed turn: "❌ Non-retryable error (HTTP 400): …" (a retried one shows "⚠️  API call failed
# (attempt 1/3)" and goes on, busy).
ERROR_RE = rule("error", r"^❌ ")
RESUME_RE = rule("resume", r"^ {2}hermes --resume \S")
# A question Hermes asks on the plain terminal before its box exists: "Allow this hook to run?
# [y/N]: " (a shell hook not accepted beforehand), "Run setup now? [Y/n]" (no provider configured).
EXITED = "Hermes has exited (its resume hint or a dead pane shows)"
YES_NO_RE = rule("yes_no", r"\? \[[yY]/[nN]\]:? ?$")


# Lifecycle hooks: shell hooks under ``hooks:`` in config.yaml (agent/shell_hooks.py; a JSON payload on
# stdin with the event's fields under "extra"), accepted without Hermes's consent prompt by
# ``hooks_auto_accept``. pre_llm_call runs once per turn, before the first request (its "user_message"
# is the prompt); post_llm_call after an answered turn (with "assistant_response"); on_session_end
# at the end of every turn, answered, failed or interrupted; pre_approval_request when a dangerous
# command waits for the user; on_session_finalize when a session ends: Hermes quits (its "reason"
# is "shutdown") or, still running, starts a fresh one on /new or /clear ("session_boundary").
HOOK_PHASES = {
    "pre_llm_call": HookPhase.TURN_START,
    "post_llm_call": HookPhase.TURN_END,
    "on_session_end": HookPhase.TURN_END,
    "pre_approval_request": HookPhase.ASKING,
    "on_session_finalize": HookPhase.SESSION_END,
}


def _config(
    base_url: str, key: str, model: str, servers: dict[str, Any], prompt: str, bypass: bool
) -> dict[str, Any]:
    return {
        "model": {"provider": "custom", "base_url": base_url, "default": model, "api_key": key},
        "mcp_servers": servers,
        "mcp_discovery_timeout": 15,  # cao's server starts in ~1 s: let the first turn see its tools
        "agent": {"system_prompt": prompt},
        "approvals": {"mode": "off" if bypass else "manual"},
        "model_catalog": {"enabled": False},
        "curator": {"enabled": False},
        "security": {"tirith_enabled": False},
        # The echo of a many-line message shows its first and last 2 lines by default: show it whole,
        # so every header of a combined delivery stays in the scrollback.
        "display": {"user_message_preview": {"first_lines": PASTE_FOLD_NEVER, "last_lines": 0}},
        # A long paste would show as a placeholder in the box and the echo: keep the text itself.
        "paste_collapse_threshold": PASTE_FOLD_NEVER,
        "paste_collapse_threshold_fallback": PASTE_FOLD_NEVER,
        "paste_collapse_char_threshold": PASTE_FOLD_NEVER,
    }


class HermesProvider(BoxedTUI):
    name = "hermes"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "Hermes (Nous Research), `hermes`"
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, API_KEY, BASE_URL)
    hook_phases = HOOK_PHASES
    no_box = (
        "no input box (two full-width '────' rules under the status bar, the lower one last) on "
        "screen: the status bar hidden (Hermes's /statusbar shows it again), a pane under 64 "
        "columns, or a screen of a Hermes release this provider does not know"
    )

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        bypass = ctx.knob(BYPASS)
        share = ctx.terminal_home / ".hermes"
        env = cli.pane_env(ctx, HERMES_HOME=str(share))
        api = cli.vendor_or_local(
            ctx,
            API_KEY,
            BASE_URL,
            OPENROUTER_URL,
            MODEL,
            needs_model="hermes needs a model for CAO_HERMES_API_KEY: set CAO_HERMES_MODEL or the agent "
            "profile's model, for cao-server",
            no_credentials="hermes has no credentials: set CAO_HERMES_API_KEY (with CAO_HERMES_MODEL, and "
            "CAO_HERMES_BASE_URL for an endpoint other than OpenRouter), or CAO_MODEL_BASE_URL for a local "
            "model server, for cao-server",
        )
        config = _config(
            api.base_url, api.key, api.model, cli.mcp_servers(ctx), cli.system_prompt(ctx), bypass
        )
        if ctx.hooks:  # the CLI reports its turns to cao-server (cao/hookstate.py)
            config["hooks"] = {
                event: [{"command": shlex.join(ctx.hook_command("hermes", event)), "timeout": 10}]
                for event in HOOK_PHASES
            }
            config["hooks_auto_accept"] = True
        files = {share / "config.yaml": json.dumps(config, indent=2) + "\n"}  # YAML reads JSON
        binary = cli.find_venv_cli(ctx, BIN, "hermes-agent", "0.19.0", "mcp")
        command = [binary, *(["--yolo"] if bypass else [])]
        return LaunchSpec(command=command, env=env, files=files)

    def hook_phase(self, event: str, payload: Mapping[str, object]) -> HookPhase | None:
        if event == "on_session_finalize" and payload.get("reason") != "shutdown":
            return HookPhase.SESSION_START  # /new or /clear: a fresh session, waiting for input
        return super().hook_phase(event, payload)

    def find_box(self, lines: list[str]) -> Box | None:
        """Between the input box's two full-width rules, found from the bottom of the screen (the
        last line is the lower rule; the status bar sits over the top rule, at most ``BOX_ROWS``
        rows higher), never by a prompt row: text in the box may quote a Hermes screen, rules and
        ``❯`` included, and a long text scrolls the real prompt row out of view."""
        bottom = len(lines) - 1
        if bottom < 2 or not RULE_RE.match(lines[bottom]):
            return None
        for i in range(max(0, bottom - BOX_ROWS - 2), bottom - 1):  # the topmost: quotes are lower
            if STATUS_RE.match(lines[i]) and lines[i + 1] == lines[bottom]:  # both rules pane-wide
                return Box(i + 1, i + 2, bottom)
        return None

    def quit_reason(self, lines: list[str]) -> str | None:
        """A dead pane, or Hermes's parting "Resume this session with: hermes --resume <id>" with its
        session summary (Session:, Title:, Duration:, Messages:) under it and no box after it. (Not
        the shared resume-hint search of the last lines: those are Hermes's input box, where a
        person may type such a command.)"""
        if any(PANE_DEAD_RE.match(line) for line in lines[-3:]):
            return EXITED
        hints = [i for i, line in enumerate(lines) if RESUME_RE.match(line)]
        if hints and not any(RULE_RE.match(line) for line in lines[hints[-1] :]):
            return EXITED
        return None

    def input_box(self, lines: list[str]) -> Box | None:
        """Not under an approval or a question (they have the keys: no typing there), and not a box
        scrolled to blank rows (its prompt row out of view)."""
        box = super().input_box(lines)
        rows = lines[box.first : box.end] if box else []
        if rows and PROMPT_RE.match(rows[0]):
            return box if _icon(rows[0]) in (None, RUNNING) else None
        return box if "\n".join(rows).strip() else None

    def box_text(self, lines: list[str], box: Box) -> str:
        rows = lines[box.first : box.end]
        if not rows or not PROMPT_RE.match(rows[0]):  # scrolled: more text above the rows shown
            return "\n".join(rows).strip()
        icon = _icon(rows[0])
        rows[0] = PROMPT_RE.sub("", rows[0], count=1)
        if icon == RUNNING and rows[0].startswith(PLACEHOLDER):  # drawn while a turn runs
            return ""
        return "\n".join(rows).strip()

    def is_echo(self, transcript: list[str], i: int) -> bool:
        return transcript[i].startswith(ECHO) and i > 0 and transcript[i - 1] == ECHO_RULE

    def turn(self, transcript: list[str]) -> list[str] | None:
        """Rows after the last echoed user turn (and its closing frame); with the echo scrolled off
        the top (a long answer), the whole transcript if an answer or error shows; else None."""
        for i in range(len(transcript) - 1, -1, -1):
            if self.is_echo(transcript, i):
                j = i + 1
                while j < len(transcript) and transcript[j] != ECHO_RULE:
                    j += 1
                return transcript[j + 1 :]
        if any(ANSWER_RE.match(line) or ERROR_RE.match(line) for line in transcript):
            return transcript
        return None

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        """The last answer box or panel of the last turn, dedented; with none, its last ❌ line."""
        turn = self.turn(lines[: box.top] if box else lines)
        if turn is None:
            return ""
        answers: list[list[str]] = []
        inside = False
        for line in turn:
            if ANSWER_RE.match(line):
                answers.append([])
                inside = True
            elif inside and ANSWER_END_RE.match(line):
                inside = False
            elif inside:
                answers[-1].append(line)
        if answers:
            return textwrap.dedent("\n".join(answers[-1])).strip()
        errors = [line for line in turn if ERROR_RE.match(line)]
        return errors[-1] if errors else ""

    def asks(self, lines: list[str]) -> bool:
        return bool(lines) and bool(YES_NO_RE.search(lines[-1]))

    def starting(self, lines: list[str]) -> bool:
        return not lines or not any(RULE_RE.match(line) for line in lines)  # the banner, no box yet

    def with_box(self, lines: list[str], box: Box) -> Reading:
        spinning = any(SPINNER_RE.match(line) for line in lines[max(0, box.top - 5) : box.top])
        if box.first == box.end or not PROMPT_RE.match(lines[box.first]):
            if spinning:
                return Reading(TerminalStatus.PROCESSING)
            return Reading(
                TerminalStatus.UNKNOWN,
                "the input box holds more rows than it shows: its prompt row, which carries the "
                "state icon, has scrolled out of view",
            )
        icon = _icon(lines[box.first])
        if icon in ASKING:
            return Reading(TerminalStatus.WAITING_USER_ANSWER)
        if icon == RUNNING or spinning:
            return Reading(TerminalStatus.PROCESSING)
        if icon is not None:
            return Reading(
                TerminalStatus.UNKNOWN, f"the input line shows {icon!r} before its '❯', a state not known"
            )
        turn = self.turn(lines[: box.top])
        if turn is None:
            return Reading(TerminalStatus.IDLE)
        for line in reversed(turn):  # an error after the last streamed answer
            if line.startswith("╭─ ⚕ Hermes "):
                break
            if ERROR_RE.match(line):
                return Reading(TerminalStatus.ERROR)
        return Reading(TerminalStatus.COMPLETED)


def _icon(line: str) -> str | None:
    found = PROMPT_RE.match(line)
    return found.group(1) if found else None
