"""Provider for OpenCode (``opencode``, npm ``opencode-ai``; tested with 1.18.33).

Launch: a throwaway HOME per terminal with ``~/.config/opencode/opencode.json`` (autoupdate and
sharing off, the model, permissions, and the cao MCP server under ``mcp.cao``) and the background
downloads OpenCode would try at start turned off by environment (models.dev catalogue, LSP
servers, default plugins). Knobs (read from the server's ``CAO_*`` environment):
``CAO_OPENCODE_BIN``, ``CAO_OPENCODE_MODEL`` (``provider/model``, e.g. ``anthropic/claude-sonnet-4-5``),
``CAO_OPENCODE_BYPASS`` (default true: every tool allowed without asking), ``CAO_MODEL_BASE_URL``
(an OpenAI-compatible local server, configured as provider ``cao``), ``CAO_ANTHROPIC_API_KEY``,
``CAO_OPENAI_API_KEY``. The agent profile: its prompt as the global rules file
``~/.config/opencode/AGENTS.md``, its model, its ``allowed_tools`` (allowed; every other
permission asks) and its extra MCP servers. See docs/providers.md.

Screen: a full-screen TUI (the alternate screen: no tmux scrollback), a sidebar on the right when
the window is wide; rows are cut at the input box's width before reading::

      ┃                                  (a user turn: a ┃-barred block)
      ┃  echoed user turn
      ┃
         answer text                     (indented 5)
         ▣  Build · Fake model · 2.1s    (turn closed; "▣  Build · Fake model" alone while it runs)
      ┃
      ┃  text being typed                 (the input box: ┃ rows, then the agent/model row)
      ┃  Build · Fake model cao
      ╹▀▀▀▀▀▀▀▀
       ⬝⬝■■■■■  esc interrupt            (the footer while busy)

Hooks: OpenCode has no hook commands but loads JavaScript plugins; cao writes one
(``~/.config/opencode/plugin/cao.js``, ``PLUGIN_JS``) that runs cao's hook program on
``chat.message`` (a prompt: turn start), ``session.idle`` (turn end), ``permission.asked`` and
``question.asked`` (asking) and ``session.created`` (session start), for the top-level session only
(a subagent's session is a child: its idle is no turn end). OpenCode installs
``@opencode-ai/plugin`` into a config folder with plugins (from the npm registry; offline it hangs
the start): the folder gets a ``package.json``, a lock naming it and an empty ``node_modules``,
which OpenCode takes as installed (the plugin imports nothing).

Traps: the box stays on screen while busy (the footer decides); a fresh session shows a logo and a
placeholder question in the box instead of a transcript.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cao.errors import ProviderError
from cao.states import HookPhase
from providers import _cli as cli
from providers import usage_files
from providers.base import LaunchContext, LaunchSpec, Reading, TerminalStatus, UsageEntry
from providers.rules import rule
from providers.tui import IGNORE_DOC, IGNORE_NOTHING, Box, BoxedTUI

BIN, MODEL, BYPASS = cli.cli_knobs(
    "OPENCODE",
    "opencode",
    "OpenCode",
    "`permission` `allow` for edit, bash and webfetch; off: `ask`",
    tools=True,
    model_form="`provider/model`, e.g. `anthropic/claude-sonnet-4-5`",
)
BOTTOM_RE = rule("bottom", r"^\s*╹▀{10,}")
BAR = "┃"
TURN_RE = rule("turn", r"^\s+▣  \S")  # the turn's agent/model line; " · 2.1s" once it closed
CLOSED_RE = rule("closed", r"▣  .* · \d+(?:\.\d+)?(?:ms|s|m)\b")
BUSY_RE = rule("busy_footer", r"esc interrupt")
PERMISSION_RE = rule("permission", r"(?:Permission required|Allow once|Allow always|△ )")
# With no box: a permission prompt, or a dialog's key hint.
# Searched per line. "A, later on the line B" as ``^(?>.*?A).*B``: the atomic group keeps the first
# A (no B after it: none after a later one either), so one pass, where ``A.*B`` rescans the rest of
# the line from every A (a line of 20,000 "enter"s took minutes).
ASKING_RE = rule(
    "asking",
    PERMISSION_RE.pattern
    + r"|(?i:^(?>.*?\b(?:enter|↵)\b).*\b(?:select|confirm)\b|^(?>.*?\besc\b).*\b(?:close|cancel)\b)",
)
TOOL_RE = rule("tool", r"^[⚙→←✱◇$] ")


def _bottom(lines: list[str]) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        if BOTTOM_RE.match(lines[i]):
            return i
    return None


def _main(lines: list[str], bottom: int) -> list[str]:
    """Every row cut at the box's right edge (the sidebar, if any, sits beyond it)."""
    width = len(lines[bottom])
    return [line[:width].rstrip() for line in lines]


HOOK_PHASES = {
    "session.created": HookPhase.SESSION_START,
    "chat.message": HookPhase.TURN_START,
    "session.idle": HookPhase.TURN_END,
    "permission.asked": HookPhase.ASKING,
    "question.asked": HookPhase.ASKING,
}
# The plugin (ES module, no imports beyond node's): one hook process at a time, in order, each fed
# its JSON on stdin, each killed after 10 s (cao/hook.py gives up after 3); events of child sessions
# (subagents) skipped. __CMD__: the hook argv (JSON).
PLUGIN_JS = """\
// cao: report this OpenCode's turns to cao-server (written by cao at launch; see providers/opencode.py)
import { spawn } from "node:child_process";
const CMD = __CMD__;
const LIMIT_MS = 10000; // a hook that hangs is killed: the reports after it still go
const children = new Set();
let queue = Promise.resolve();
function report(event, payload) {
  const run = () => new Promise((done) => {
    try {
      const p = spawn(CMD[0], [...CMD.slice(1), event], { stdio: ["pipe", "ignore", "ignore"] });
      const limit = setTimeout(() => { try { p.kill("SIGKILL"); } catch (e) {} done(); }, LIMIT_MS);
      p.on("error", () => { clearTimeout(limit); done(); });
      p.on("exit", () => { clearTimeout(limit); done(); });
      p.stdin.on("error", () => {});
      p.stdin.end(JSON.stringify({ hook_event_name: event, ...payload }));
    } catch (e) { done(); }
  });
  queue = queue.then(run, run);
}
export const CaoHooks = async () => ({
  event: async ({ event }) => {
    const props = (event && event.properties) || {};
    const info = props.info || {};
    const session = props.sessionID || info.id;
    if (event.type === "session.created" && info.parentID) { children.add(info.id); return; }
    if (session && children.has(session)) return;
    if (event.type === "session.created" || event.type === "session.idle") report(event.type, {});
    else if (event.type === "permission.asked" || event.type === "question.asked")
      report(event.type, { message: String(props.title || props.permission || event.type).slice(0, 500) });
  },
  "chat.message": async (input, output) => {
    if (input && children.has(input.sessionID)) return;
    const parts = (output && output.parts) || [];
    const prompt = parts.filter((p) => p && p.type === "text" && !p.synthetic).map((p) => p.text).join("\\n");
    report("chat.message", { prompt });
  },
});
"""


def plugin_files(ctx: LaunchContext, config_dir: Path) -> dict[Path, str]:
    """The hook plugin and what makes OpenCode take its dependency as installed (see the docstring)."""
    source = PLUGIN_JS.replace("__CMD__", json.dumps(ctx.hook_command("opencode")))
    return {
        config_dir / "plugin" / "cao.js": source,
        config_dir / "package.json": json.dumps({"dependencies": {"@opencode-ai/plugin": "*"}}),
        config_dir / "package-lock.json": json.dumps(
            {"lockfileVersion": 3, "packages": {"": {"dependencies": {"@opencode-ai/plugin": "*"}}}}
        ),
        config_dir / "node_modules" / ".cao": "",  # the folder exists: "installed"
    }


def _box(lines: list[str]) -> Box | None:
    """The input box's text rows: the ┃ rows above the agent/model row, which sits right over the
    ╹▀▀▀ edge (so that edge is at ``end + 1``)."""
    bottom = _bottom(lines)
    if bottom is None or bottom < 2:
        return None
    main = _main(lines, bottom)
    indent = main[bottom].index("╹")
    end = bottom - 1  # the agent/model row
    if not main[end][indent:].startswith(BAR):
        return None
    first = end
    while first > 0 and main[first - 1][indent:].startswith(BAR):
        first -= 1
    return Box(first, first, end)


def _transcript_rows(lines: list[str], box: Box | None) -> list[str]:
    return lines if box is None else _main(lines, box.end + 1)[: box.first]


def _closing(rows: list[str]) -> int | None:
    """Index of the last ▣ row: where the newest assistant message ends (or runs, while busy)."""
    for i in range(len(rows) - 1, -1, -1):
        if TURN_RE.match(rows[i]):
            return i
    return None


def _bar_blocks(rows: list[str]) -> list[tuple[int, int]]:
    """``(first, end)`` of every ┃-barred block: user turns, tool output, errors."""
    blocks: list[tuple[int, int]] = []
    first: int | None = None
    for i, row in enumerate([*rows, ""]):
        barred = row.lstrip().startswith(BAR)
        if barred and first is None:
            first = i
        elif not barred and first is not None:
            blocks.append((first, i))
            first = None
    return blocks


def _block_text(rows: list[str]) -> str:
    return "\n".join(row.strip().removeprefix(BAR).removeprefix("  ") for row in rows).strip()


def _failure(rows: list[str], closing: int) -> str | None:
    """A turn that ended without its duration: the ┃ block right above its ▣ row (the error)."""
    if CLOSED_RE.search(rows[closing]):
        return None
    above = [i for i in range(closing) if rows[i].strip()]
    if not above or not rows[above[-1]].lstrip().startswith(BAR):
        return None
    blocks = [block for block in _bar_blocks(rows[:closing]) if block[1] > above[-1]]
    return _block_text(rows[blocks[-1][0] : blocks[-1][1]]) if blocks else None


def _answer(rows: list[str]) -> str:
    """The last answer of the newest assistant message: 5-space indented text above its ▣ row,
    tool lines (⚙ …) left out."""
    closing = _closing(rows)
    if closing is None:
        return ""
    if (failure := _failure(rows, closing)) is not None:
        return failure
    earlier = [i for i in range(closing) if TURN_RE.match(rows[i])]
    start = earlier[-1] + 1 if earlier else 0
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for row in rows[start:closing]:
        text = row[5:] if row.startswith("     ") else None
        if text and not TOOL_RE.match(text):
            if current is None:
                current = []
                blocks.append(current)
            current.append(text)
        elif not row.strip() and current is not None:
            current.append("")
        else:
            current = None
    return "\n".join(blocks[-1]).strip() if blocks else ""


def _config(ctx: LaunchContext, base_url: str, bypass: bool, allowed: list[str] | None) -> dict[str, Any]:
    """``~/.config/opencode/opencode.json``: the model (against a local server, a provider ``cao`` of
    its own), the permissions and the MCP servers."""
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
    }
    model = cli.model_name(ctx, MODEL)
    if base_url:
        name = model.removeprefix("cao/") or "fake-model"
        config["provider"] = {
            "cao": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "cao",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": cli.LOCAL_KEY},
                "models": {name: {"name": name, "tool_call": True}},
            }
        }
        model = f"cao/{name}"
        config["small_model"] = model  # titles: else OpenCode picks a vendor's small model
    if model:
        config["model"] = model
    if bypass:
        config["permission"] = {"edit": "allow", "bash": "allow", "webfetch": "allow"}
    else:
        config["permission"] = {"edit": "ask", "bash": "ask", "webfetch": "ask"}
        for tool in allowed or ():
            config["permission"][tool] = "allow"
    config["mcp"] = {name: _mcp_entry(spec) for name, spec in cli.mcp_servers(ctx).items()}
    return config


def _mcp_entry(spec: dict[str, Any]) -> dict[str, Any]:
    """An MCP server in OpenCode's shape: ``remote`` with a ``url``, else ``local`` with one argv."""
    if "url" in spec:
        return {"type": "remote", "url": spec["url"], "enabled": True}
    return {
        "type": "local",
        "command": [spec["command"], *spec.get("args", [])],
        "environment": dict(spec.get("env", {})),
        "enabled": True,
    }


class OpenCodeProvider(BoxedTUI):
    name = "opencode"
    ignore = rule("ignore", IGNORE_NOTHING, doc=IGNORE_DOC)
    description = "OpenCode, `opencode`"
    paste_enter_delay = 0.3
    idle_tail_pattern = rule("idle_tail", r"^(?!.*esc interrupt)")
    placeholder = rule("placeholder", r'Ask anything… ".*"')
    asking = ASKING_RE
    knobs = (BIN, MODEL, BYPASS, *cli.EVERY_CLI, cli.ANTHROPIC_API_KEY, cli.OPENAI_API_KEY)
    hook_phases = HOOK_PHASES

    def usage(self, home: Path) -> list[UsageEntry] | None:
        """Its database's assistant messages' ``tokens`` (providers/usage_files.py)."""
        return usage_files.opencode(home)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        allowed = cli.allowed_tools(ctx)
        bypass = ctx.knob(BYPASS, allowed is None)
        env = cli.pane_env(
            ctx,
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_LSP_DOWNLOAD="1",
            OPENCODE_DISABLE_SHARE="1",
            OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
            OPENCODE_DISABLE_CLAUDE_CODE="1",  # don't read the user's ~/.claude (there is none here)
        )
        base_url = ctx.knob(cli.MODEL_BASE_URL).rstrip("/")
        keys = {cli.ANTHROPIC_API_KEY: "ANTHROPIC_API_KEY", cli.OPENAI_API_KEY: "OPENAI_API_KEY"}
        for knob, variable in keys.items():
            if value := ctx.knob(knob):
                env[variable] = value
        if not base_url and not any(ctx.knob(knob) for knob in keys):
            raise ProviderError(
                "opencode has no credentials: set CAO_ANTHROPIC_API_KEY or CAO_OPENAI_API_KEY (with "
                "CAO_OPENCODE_MODEL=provider/model), or CAO_MODEL_BASE_URL for a local model server, "
                "for cao-server"
            )
        config_dir = ctx.terminal_home / ".config" / "opencode"
        files = {config_dir / "opencode.json": json.dumps(_config(ctx, base_url, bypass, allowed), indent=2)}
        if prompt := cli.system_prompt(ctx):  # the global rules file, read at every start
            files[config_dir / "AGENTS.md"] = prompt
        if ctx.hooks:
            files.update(plugin_files(ctx, config_dir))
        command = [cli.find_cli(ctx, BIN, "opencode-ai")]
        return LaunchSpec(command=command, env=env, files=files)

    def find_box(self, lines: list[str]) -> Box | None:
        return _box(lines)

    def box_text(self, lines: list[str], box: Box) -> str:
        main = _main(lines, box.end + 1)
        indent = main[box.end + 1].index("╹")
        return "\n".join(row[indent + 1 :].removeprefix("  ") for row in main[box.first : box.end]).strip()

    def last_answer(self, lines: list[str], box: Box | None) -> str:
        return _answer(_transcript_rows(lines, box))

    def marks(self, screen: str) -> tuple[str | None, int]:
        """What a submit adds: the last echoed user turn's text (OpenCode has no visible queue)."""
        lines = self.lines(screen)
        rows = _transcript_rows(lines, _box(lines))
        blocks = _bar_blocks(rows)
        return (_block_text(rows[blocks[-1][0] : blocks[-1][1]]) if blocks else None), len(blocks)

    def with_box(self, lines: list[str], box: Box) -> Reading:
        rows = _transcript_rows(lines, box)
        if any(PERMISSION_RE.search(row) for row in rows[-12:]):
            return Reading(TerminalStatus.WAITING_USER_ANSWER)
        if any(BUSY_RE.search(line) for line in lines[box.end + 2 :]):  # the footer, under the ╹▀▀▀ edge
            return Reading(TerminalStatus.PROCESSING)
        closing = _closing(rows)
        if closing is None:  # no assistant message yet
            return Reading(TerminalStatus.IDLE if not _bar_blocks(rows) else TerminalStatus.PROCESSING)
        failed = _failure(rows, closing) is not None
        return Reading(TerminalStatus.ERROR if failed else TerminalStatus.COMPLETED)
