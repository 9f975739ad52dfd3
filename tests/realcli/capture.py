"""Capture the real agent CLIs' screens in each status, for the providers' contract tests.

    python -m tests.realcli.capture [--out tests/screens] [--only claude_code,codex,gemini_cli]
                                    [--phases turns,prompts,typed,retrying,dialogs,exited]
                                    [--cli-version 0.77.0]   (with one provider in --only)

For each CLI, one at a time, inside a loopback-only bed (tests/realcli/bed.py): seed a throwaway
HOME so no first-run dialog appears, launch the CLI in a 200x50 tmux window with an environment
built from nothing (``env -i`` + exactly the variables below), drive it with bracketed pastes of
fake-model markers (cao/testing/fakemodel.py) and save ``capture-pane -p`` of each state to
``<out>/<provider>/<state>.txt``, plus ``<out>/<provider>/meta.json`` (CLI version, state -> expected
status, launch recipe, observed timings). Every process started is killed at the end.

Phases: ``turns`` (idle, processing, completed, tools, queued, error), ``prompts`` (permission
prompts and questions), ``typed`` (text pasted into the box but not submitted), ``retrying`` (a 5xx
the CLI is still retrying) and ``dialogs`` (each start-up dialog the CLI can show offline, brought
back by leaving one piece out of the seeded HOME; saved as ``dialog_<name>.txt``) and ``exited``
(the CLI quit with its exit command, as a dead pane shows it). A run of only some phases keeps the
other screens and updates meta.json's states. ``--cli-version`` captures an older release
(installed once under ``<cache>/versions/<cli>-<version>/``) into ``<out>/<provider>/<version>/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import providers
from providers.base import LaunchContext, LaunchSpec
from tests.prepare import VENV_CLIS, install_cli_version, prepare, venv_bin
from tests.realcli.bed import REPO_ROOT, Bed, cache_dir, installed_bins, wait_until, why_bed_cannot_run

FAKE_KEY_ANTHROPIC = "sk-ant-api03-cao-fake-key-0123456789abcdefghijklmnopqrstuvwxyz"
FAKE_KEY = "cao-fake-key-0123456789"
RECEIVER_ID = "abcd1234"

# A stdio MCP server named "cao" with one tool, send_message, that appends its calls to a file.
MCP_STUB = r"""
import json, sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("cao")
@server.tool()
def send_message(receiver_id: str, message: str) -> str:
    '''Send a message to another agent's inbox.'''
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"receiver_id": receiver_id, "message": message}) + "\n")
    return f"message queued for {receiver_id}"
server.run()
"""

Screen = str
Pred = Callable[[Screen], bool]


def lines(screen: Screen) -> list[str]:
    return screen.rstrip("\n").split("\n")


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2))


def _edit_text(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


# --------------------------------------------------------------------------------------------------
# Per-CLI recipes
# --------------------------------------------------------------------------------------------------


@dataclass
class Launch:
    home: Path
    work: Path
    fake_url: str
    mcp_command: list[str]
    mcp_env: dict[str, str]
    bin: Path

    def base_env(self) -> dict[str, str]:
        node_dir = str(Path(shutil.which("node") or "/usr/bin/node").parent)
        return {
            "HOME": str(self.home),
            "PATH": f"{node_dir}:/usr/local/bin:/usr/bin:/bin",
            "SHELL": "/bin/bash",
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
        }


@dataclass(frozen=True)
class Dialog:
    """A start-up dialog: launch with one piece of the seed left out and wait until it shows."""

    name: str  # saved as dialog_<name>.txt
    shows: Pred
    unseed: Callable[[Launch], None] = lambda launch: None
    drop_env: tuple[str, ...] = ()  # variables left out of the pane's environment
    bypass: bool = True


@dataclass
class Recipe:
    provider: str
    bin_name: str
    busy: Pred
    idle: Pred
    permission: Pred
    error: Pred
    enter_delay: float = 0.2
    asks_questions: bool = True  # the CLI offers the fake model a question tool outside plan mode
    retry_shown: Pred | None = None  # what the CLI shows while it retries a failed request, if anything
    queue_shown: Pred | None = None  # a message sent while busy shows as queued (captured when set)
    version: tuple[int, ...] = ()  # an older release being captured (--cli-version); () = the current one
    box_rows: int = 12  # how far up from the bottom typed text shows (Kimi's box is a tall one)

    def older_than(self, *version: int) -> bool:
        return bool(self.version) and self.version < version

    def ready(self, screen: Screen) -> bool:
        """Idle and done starting up (for a stable idle screen; input is accepted before this)."""
        return self.idle(screen)

    def finished(self, screen: Screen, reply: str) -> bool:
        """``reply`` is on screen and the turn is over."""
        return reply in screen and self.idle(screen)

    def seed(self, launch: Launch, bypass: bool) -> None:
        raise NotImplementedError

    def env(self, launch: Launch, bypass: bool) -> dict[str, str]:
        raise NotImplementedError

    def argv(self, launch: Launch, bypass: bool) -> list[str]:
        raise NotImplementedError

    def dialogs(self) -> list[Dialog]:
        """The start-up dialogs this CLI shows offline when a piece of the seed is missing."""
        return []

    def seed_retries(self, launch: Launch) -> None:
        """Let the CLI retry a failed request (the default seed may turn retries off)."""

    def prompt(self, text: str) -> str:
        """``text`` as this CLI must get it for the fake model to read its markers."""
        return text


def claude_project() -> dict[str, Any]:
    """A ``projects`` entry of ``~/.claude.json`` in the full shape 1.0.x needs (it crashes with
    ``allowedTools is not iterable`` on the short one); newer releases read it too."""
    return {
        "hasTrustDialogAccepted": True,
        "allowedTools": [],
        "mcpContextUris": [],
        "mcpServers": {},
        "enabledMcpjsonServers": [],
        "disabledMcpjsonServers": [],
        "hasCompletedProjectOnboarding": True,
    }


class Claude(Recipe):
    def __init__(self) -> None:
        super().__init__(
            provider="claude_code",
            bin_name="claude",
            busy=lambda s: "esc to interrupt" in s,
            # The box opens with ❯ (">" before 2.0) and a no-break space.
            idle=lambda s: (
                "esc to interrupt" not in s and any(line.startswith(("❯\xa0", ">\xa0")) for line in lines(s))
            ),
            permission=lambda s: "Do you want to proceed?" in s or "Enter to select" in s,
            error=lambda s: "API Error" in s,
            retry_shown=lambda s: "Retrying in" in s,
            # Not just "queued": the MCP tool's result line reads "message queued for abcd1234".
            queue_shown=lambda s: "queued messages" in s,
        )

    def seed(self, launch: Launch, bypass: bool) -> None:
        (launch.home / ".claude").mkdir(parents=True, exist_ok=True)
        state = {
            "hasCompletedOnboarding": True,
            "customApiKeyResponses": {"approved": [FAKE_KEY_ANTHROPIC[-20:]], "rejected": []},
            "bypassPermissionsModeAccepted": True,  # before 2.1: the bypass warning's answer lives here
            "projects": {str(launch.work): claude_project()},
        }
        (launch.home / ".claude.json").write_text(json.dumps(state, indent=2))
        settings = {"skipDangerousModePermissionPrompt": True}
        (launch.home / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2))
        mcp = {
            "mcpServers": {
                "cao": {
                    "command": launch.mcp_command[0],
                    "args": launch.mcp_command[1:],
                    "env": launch.mcp_env,
                }
            }
        }
        (launch.home / "mcp.json").write_text(json.dumps(mcp, indent=2))

    def env(self, launch: Launch, bypass: bool) -> dict[str, str]:
        env = {
            **launch.base_env(),
            "ANTHROPIC_BASE_URL": launch.fake_url,
            "ANTHROPIC_API_KEY": FAKE_KEY_ANTHROPIC,
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        if bypass and os.geteuid() == 0:
            env["IS_SANDBOX"] = "1"  # root + --dangerously-skip-permissions needs exactly this
        return env

    def argv(self, launch: Launch, bypass: bool) -> list[str]:
        argv = [str(launch.bin), "--mcp-config", str(launch.home / "mcp.json")]
        return [*argv, "--dangerously-skip-permissions"] if bypass else argv

    def dialogs(self) -> list[Dialog]:
        def state(edit: Callable[[dict[str, Any]], None]) -> Callable[[Launch], None]:
            return lambda launch: _edit_json(launch.home / ".claude.json", edit)

        def project_mcp(launch: Launch) -> None:
            servers = {"mcpServers": {"repo-tool": {"command": "true"}}}
            (launch.work / ".mcp.json").write_text(json.dumps(servers))

        def unseed_bypass(launch: Launch) -> None:  # the answer is in settings (2.1) or state (before)
            _edit_json(launch.home / ".claude" / "settings.json", dict.clear)
            _edit_json(launch.home / ".claude.json", lambda d: d.pop("bypassPermissionsModeAccepted"))

        return [
            Dialog(
                "trust",
                lambda s: "Yes, I trust this folder" in s,
                state(lambda d: d.update(projects={})),
            ),
            Dialog(
                "api_key",
                lambda s: "Do you want to use this API key?" in s,
                state(lambda d: d.pop("customApiKeyResponses")),
            ),
            Dialog(
                "onboarding",  # its first step, the theme picker
                lambda s: "Choose the text style" in s,
                state(lambda d: d.pop("hasCompletedOnboarding")),
            ),
            Dialog(
                "bypass",
                lambda s: "Yes, I accept" in s,
                unseed_bypass,
            ),
            Dialog(
                "project_mcp",  # a .mcp.json in the workdir; bypass mode skips this dialog
                lambda s: "New MCP server found" in s,
                project_mcp,
                bypass=False,
            ),
        ]


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(_toml_str(v) for v in values) + "]"


class Codex(Recipe):
    def __init__(self) -> None:
        super().__init__(
            provider="codex",
            bin_name="codex",
            busy=lambda s: "esc to interrupt" in s,
            idle=lambda s: "esc to interrupt" not in s and any(line.startswith("› ") for line in lines(s)),
            permission=lambda s: (
                "Would you like to run the following command?" in s or "Allow the cao MCP server" in s
            ),
            error=lambda s: any(line.startswith("■") for line in lines(s)),
            asks_questions=False,  # request_user_input is offered but only works in Plan mode
            retry_shown=lambda s: "Reconnecting..." in s,  # after its silent request retries
        )

    def seed(self, launch: Launch, bypass: bool) -> None:
        codex_home = launch.home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        # 0.171 accepts only "on-request" and "never" ("untrusted" is a fatal config error now).
        # Before 0.171 a simple shell command runs without asking under on-request + workspace-write,
        # and "untrusted" rejects the fake's escalation request outright; a read-only sandbox asks.
        asking = ("on-request", "read-only") if self.older_than(0, 171) else ("on-request", "workspace-write")
        approval, sandbox = ("never", "danger-full-access") if bypass else asking
        mcp_env = ", ".join(f"{k} = {_toml_str(v)}" for k, v in launch.mcp_env.items())
        config = f"""\
model = "fake-model"  # a real slug brings a model-upgrade dialog; unknown = one harmless warning
model_provider = "fake"
approval_policy = "{approval}"
sandbox_mode = "{sandbox}"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "{launch.fake_url}/v1"
env_key = "CAO_FAKE_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[projects.{_toml_str(str(launch.work))}]
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

[mcp_servers.cao]
command = {_toml_str(launch.mcp_command[0])}
args = {_toml_list(launch.mcp_command[1:])}
env = {{ {mcp_env} }}
"""
        (codex_home / "config.toml").write_text(config)

    def env(self, launch: Launch, bypass: bool) -> dict[str, str]:
        return {**launch.base_env(), "CODEX_HOME": str(launch.home / ".codex"), "CAO_FAKE_API_KEY": FAKE_KEY}

    def argv(self, launch: Launch, bypass: bool) -> list[str]:
        argv = [str(launch.bin)]
        return [*argv, "--dangerously-bypass-approvals-and-sandbox"] if bypass else argv

    def seed_retries(self, launch: Launch) -> None:
        _edit_text(
            launch.home / ".codex" / "config.toml", "request_max_retries = 0\nstream_max_retries = 0\n", ""
        )

    def dialogs(self) -> list[Dialog]:
        def update(launch: Launch) -> None:
            config = launch.home / ".codex" / "config.toml"
            _edit_text(config, "check_for_update_on_startup = false", "check_for_update_on_startup = true")
            checked = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # fresh: no network check
            version = {"latest_version": "99.0.0", "last_checked_at": checked, "dismissed_version": None}
            (launch.home / ".codex" / "version.json").write_text(json.dumps(version))

        def untrusted_repo(launch: Launch) -> None:
            # The prompt only shows for a folder inside a git repository.
            trusted = f'[projects.{_toml_str(str(launch.work))}]\ntrust_level = "trusted"\n'
            _edit_text(launch.home / ".codex" / "config.toml", trusted, "")
            subprocess.run(["git", "init", "-q", str(launch.work)], check=True, timeout=30)

        def no_provider(launch: Launch) -> None:
            # The built-in OpenAI provider and no stored login: the sign-in screen.
            _edit_text(launch.home / ".codex" / "config.toml", 'model_provider = "fake"\n', "")

        return [
            Dialog("update", lambda s: "Update available" in s and "Skip" in s, update),
            Dialog("trust", lambda s: "Trust this folder?" in s, untrusted_repo),
            Dialog("login", lambda s: "Sign in with ChatGPT" in s, no_provider),
        ]

    def ready(self, screen: Screen) -> bool:
        # The prompt shows over a "loading" splash; the model/cwd status line comes ~0.5-1 s later.
        return self.idle(screen) and "fake-model" in screen

    def finished(self, screen: Screen, reply: str) -> bool:
        # The answer shows ~0.1 s before "Worked for Ns • HH:MM" closes the turn; releases before
        # 0.171 show it only when the turn ends, and print no "Worked for" after a plain answer.
        if self.older_than(0, 171):
            return self.idle(screen) and f"• {reply}" in screen
        return self.idle(screen) and "Worked for" in after_echo(screen, reply)


GEMINI_BUSY = re.compile(r"\(esc to cancel, \d+[ms]")


class Gemini(Recipe):
    def __init__(self) -> None:
        super().__init__(
            provider="gemini_cli",
            bin_name="gemini",
            busy=lambda s: GEMINI_BUSY.search(s) is not None,
            idle=lambda s: GEMINI_BUSY.search(s) is None and "Type your message" in s,
            permission=lambda s: "Allow execution" in s or "Answer Questions" in s,
            error=lambda s: "✕" in s,
        )

    def seed(self, launch: Launch, bypass: bool) -> None:
        (launch.home / ".gemini").mkdir(parents=True, exist_ok=True)
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "telemetry": {"enabled": False},
            "ide": {"enabled": False},
            "ui": {"hideTips": True},
            "mcpServers": {
                "cao": {
                    "command": launch.mcp_command[0],
                    "args": launch.mcp_command[1:],
                    "env": launch.mcp_env,
                }
            },
        }
        (launch.home / ".gemini" / "settings.json").write_text(json.dumps(settings, indent=2))

    def env(self, launch: Launch, bypass: bool) -> dict[str, str]:
        return {
            **launch.base_env(),
            "GEMINI_API_KEY": FAKE_KEY,
            "GOOGLE_GEMINI_BASE_URL": launch.fake_url,
            "GEMINI_TELEMETRY_ENABLED": "false",
            "COLORTERM": "truecolor",  # else a "True color (24-bit) support not detected" banner
        }

    def argv(self, launch: Launch, bypass: bool) -> list[str]:
        argv = [str(launch.bin)]
        return [*argv, "--yolo"] if bypass else argv

    def dialogs(self) -> list[Dialog]:
        def settings(edit: Callable[[dict[str, Any]], None]) -> Callable[[Launch], None]:
            return lambda launch: _edit_json(launch.home / ".gemini" / "settings.json", edit)

        return [
            Dialog(
                "trust",
                lambda s: "Do you trust the files in this folder?" in s,
                settings(lambda d: d["security"]["folderTrust"].update(enabled=True)),
            ),
            Dialog(
                "auth",
                lambda s: "How would you like to authenticate" in s,
                settings(lambda d: d["security"].pop("auth")),
            ),
            Dialog("api_key", lambda s: "Enter Gemini API Key" in s, drop_env=("GEMINI_API_KEY",)),
        ]

    def ready(self, screen: Screen) -> bool:
        # The input box shows ~1-2 s before the header; prompts sent before then are queued
        # ("Waiting for MCP servers to initialize... prompts will be queued"). 0.24 draws a logo
        # and no version line; its MCP line shows once the servers are up.
        if self.older_than(0, 30):
            return self.idle(screen) and "MCP server" in screen
        return self.idle(screen) and "Gemini CLI v" in screen


# --------------------------------------------------------------------------------------------------
# CLIs captured through their provider's own launch (providers/<name>.py), so screens can't drift
# from what cao runs. Only the MCP server differs in effect: cao's own, with no cao-server behind it
# here, so the capture's send_message call shows as a failed tool (the turn still completes).
# --------------------------------------------------------------------------------------------------


class ProviderRecipe(Recipe):
    """Seed, environment and argv from ``providers.get(provider).launch(ctx)``."""

    knob = ""  # the provider's knob prefix: CAO_<knob>_BIN, CAO_<knob>_BYPASS

    def spec(self, launch: Launch, bypass: bool) -> LaunchSpec:
        ctx = LaunchContext(
            terminal_id=launch.mcp_env.get("CAO_TERMINAL_ID", "cap00001"),
            agent_profile="developer",
            working_directory=launch.work,
            cao_home=launch.home.parent / "cao",
            server_url="http://127.0.0.1:9",  # no cao-server in a capture
            terminal_home=launch.home,
            base_env=launch.base_env(),
            settings_env={
                "CAO_MODEL_BASE_URL": launch.fake_url,
                # describe_launch's placeholder path doesn't exist: resolve a real file, then name it
                f"CAO_{self.knob}_BIN": str(launch.bin) if launch.bin.exists() else sys.executable,
                f"CAO_{self.knob}_BYPASS": "true" if bypass else "false",
            },
        )
        return providers.get(self.provider).launch(ctx)

    def seed(self, launch: Launch, bypass: bool) -> None:
        for path, content in self.spec(launch, bypass).files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)

    def env(self, launch: Launch, bypass: bool) -> dict[str, str]:
        return self.spec(launch, bypass).env

    def argv(self, launch: Launch, bypass: bool) -> list[str]:
        return [str(launch.bin), *self.spec(launch, bypass).command[1:]]


class OpenCode(ProviderRecipe):
    knob = "OPENCODE"

    def __init__(self) -> None:
        super().__init__(
            provider="opencode",
            bin_name="opencode",
            busy=lambda s: "esc interrupt" in s,
            idle=lambda s: "esc interrupt" not in s and "╹▀▀▀" in s,
            permission=lambda s: "Permission required" in s or "Allow once" in s,
            error=lambda s: "_error (HTTP" in s and "esc interrupt" not in s,
            enter_delay=0.3,
            asks_questions=False,
        )

    def ready(self, screen: Screen) -> bool:
        return self.idle(screen) and "MCP" in screen  # the footer's MCP count comes last

    def finished(self, screen: Screen, reply: str) -> bool:
        return self.idle(screen) and re.search(r"▣  .* · \d", after_echo(screen, reply)) is not None


class QwenCode(ProviderRecipe):
    knob = "QWEN"

    def __init__(self) -> None:
        super().__init__(
            provider="qwen_code",
            bin_name="qwen",
            busy=lambda s: "esc to cancel" in s,
            idle=lambda s: "esc to cancel" not in s and "Type your message" in s,
            permission=lambda s: "Allow execution" in s or "Yes, allow once" in s,
            error=lambda s: "✕" in s,
            asks_questions=False,
        )

    def ready(self, screen: Screen) -> bool:
        return self.idle(screen) and "Connecting to MCP servers" not in screen and "Qwen Code (v" in screen


class Copilot(ProviderRecipe):
    knob = "COPILOT"

    def __init__(self) -> None:
        super().__init__(
            provider="copilot",
            bin_name="copilot",
            busy=lambda s: "Working" in s,
            idle=lambda s: "Working" not in s and "open sidebar" in s,
            permission=lambda s: "Do you want to" in s or "enter to select" in s,
            error=lambda s: "400" in s and "open sidebar" in s,
            asks_questions=False,
        )

    def ready(self, screen: Screen) -> bool:
        return self.idle(screen) and "Copilot v" in screen

    def finished(self, screen: Screen, reply: str) -> bool:
        # The footer drops "Working" a frame before the answer is drawn.
        return self.idle(screen) and f"● {reply}" in screen

    def dialogs(self) -> list[Dialog]:
        def untrusted(launch: Launch) -> None:
            _edit_json(launch.home / ".copilot" / "config.json", lambda d: d.update(trustedFolders=[]))

        return [Dialog("trust", lambda s: "Do you trust the files in this folder?" in s, untrusted)]


# Kimi reads "[word:word]" in typed text as an attachment placeholder and splits the message there,
# so one-word marker arguments go in the fake model's other syntax (cao/testing/fakemodel).
ONE_WORD_MARKER_RE = re.compile(r"\[\[(\w+:[\w.\-]+)\]\]")


# The live area over Kimi's box while a turn runs: a moon phase, or a braille spinner on a tool call.
KIMI_BUSY_RE = re.compile(
    r"^(?:[🌑🌒🌓🌔🌕🌖🌗🌘]|[⠀-⣿] (?:Composing|Using|Thinking|Connecting to MCP))", re.M
)


class KimiCli(ProviderRecipe):
    knob = "KIMI"

    def __init__(self) -> None:
        super().__init__(
            provider="kimi_cli",
            bin_name="kimi",
            busy=lambda s: KIMI_BUSY_RE.search(s) is not None,
            idle=lambda s: "── input ─" in s and KIMI_BUSY_RE.search(s) is None,
            permission=lambda s: "requesting approval" in s,
            error=lambda s: "LLM provider error" in s,
            asks_questions=False,  # the fake's chat API has no question tool: it'd be answer text
            box_rows=40,
            queue_shown=lambda s: " input · 1 queued " in s,
        )

    def ready(self, screen: Screen) -> bool:
        return self.idle(screen) and "MCP Servers:" in screen  # printed once the servers are up

    def finished(self, screen: Screen, reply: str) -> bool:
        return self.idle(screen) and f"• {reply}" in screen

    def prompt(self, text: str) -> str:
        return ONE_WORD_MARKER_RE.sub(r"<<\1>>", text)


# Hermes's input line while a turn runs: "⚕ ❯ msg=interrupt · /queue · …".
HERMES_BUSY_RE = re.compile(r"^⚕ ❯", re.M)


class Hermes(ProviderRecipe):
    knob = "HERMES"

    def __init__(self) -> None:
        super().__init__(
            provider="hermes",
            bin_name="hermes",
            busy=lambda s: HERMES_BUSY_RE.search(s) is not None,
            idle=lambda s: re.search(r"^─{20,}\n❯", s, re.M) is not None,
            permission=lambda s: re.search(r"^⚠ ❯", s, re.M) is not None,
            error=lambda s: "API call failed" in s or "HTTP 400" in s or "Error code: 400" in s,
            asks_questions=False,  # the fake's chat API has no question tool: it'd be answer text
            # no retry_shown: Hermes retries a 5xx under its plain busy screen (the "API call failed
            # (attempt 1/3)" notices are printed only once the turn has ended)
        )

    def finished(self, screen: Screen, reply: str) -> bool:
        return self.idle(screen) and reply in re.split(r"⚕ Hermes", screen)[-1]

    def dialogs(self) -> list[Dialog]:
        def config(edit: Callable[[dict[str, Any]], None]) -> Callable[[Launch], None]:
            return lambda launch: _edit_json(launch.home / ".hermes" / "config.yaml", edit)  # JSON is YAML

        return [
            Dialog(
                "hooks",  # each shell hook asks on the TTY once unless accepted beforehand
                lambda s: "Allow this hook to run? [y/N]" in s,
                config(lambda d: d.pop("hooks_auto_accept")),
            ),
            Dialog(
                "setup",  # no provider configured (and no provider key in the environment)
                lambda s: "Run setup now? [Y/n]" in s,
                config(lambda d: d.update(model="")),
            ),
        ]

    def prompt(self, text: str) -> str:
        # Hermes asks only for commands it deems dangerous (a recursive delete, chmod 777, ...).
        return text.replace("[[permission]]", "[[permission:chmod 777 cao-permission-probe.txt]]")


RECIPES: dict[str, Recipe] = {
    r.provider: r
    for r in (Claude(), Codex(), Gemini(), OpenCode(), QwenCode(), Copilot(), KimiCli(), Hermes())
}

# saved state -> status a provider must report for it
STATUS = {
    "idle": "idle",
    "processing": "processing",
    "completed": "completed",
    "completed_tools": "completed",
    "waiting_user_answer": "waiting_user_answer",
    "waiting_user_answer_mcp": "waiting_user_answer",
    "waiting_user_answer_question": "waiting_user_answer",
    "error": "error",
    "queued": "processing",
    "typed": "completed",  # the turn before is answered; the pasted text waits in the box
    "retrying": "processing",
    "exited": "unknown",  # the pane is dead (tmux's pane_dead says so); no screen reads ready
}


def status_of(state: str) -> str:
    """The status a provider must report for saved screen ``state`` (start-up dialogs wait for an answer)."""
    return "waiting_user_answer" if state.startswith("dialog_") else STATUS[state]


# --------------------------------------------------------------------------------------------------
# Driving one CLI
# --------------------------------------------------------------------------------------------------


class CaptureError(RuntimeError):
    pass


class Session:
    """One CLI in one pane, with helpers that wait for screens and save them."""

    def __init__(
        self,
        bed: Bed,
        recipe: Recipe,
        launch: Launch,
        bypass: bool,
        out: Path,
        timings: dict[str, list[Any]],
        debug: Path | None,
    ) -> None:
        self.bed, self.recipe, self.launch, self.bypass = bed, recipe, launch, bypass
        self.out, self.timings, self.debug = out, timings, debug
        self.pane = ""

    def open(
        self, unseed: Callable[[Launch], None] = lambda launch: None, drop_env: tuple[str, ...] = ()
    ) -> None:
        """Seed the HOME (then ``unseed`` takes a piece out again) and start the CLI in a new window."""
        self.launch.home.mkdir(parents=True, exist_ok=True)
        self.launch.work.mkdir(parents=True, exist_ok=True)
        self.recipe.seed(self.launch, self.bypass)
        unseed(self.launch)
        env = self.recipe.env(self.launch, self.bypass)
        argv = [
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items() if k not in drop_env),
            *self.recipe.argv(self.launch, self.bypass),
        ]
        self.pane = self.bed.new_window(self.recipe.bin_name, argv, cwd=self.launch.work)

    def start(self, timeout: float = 60, unseed: Callable[[Launch], None] = lambda launch: None) -> Screen:
        began = time.monotonic()
        self.open(unseed)
        self.wait("idle", self.recipe.idle, timeout)
        self.time("start_to_idle", began)
        self.wait("ready", self.recipe.ready, timeout)
        self.time("start_to_ready", began)
        screen = self.settle(self.recipe.ready)
        self.time("start_to_settled_idle", began)
        return screen

    def settle(self, pred: Pred, quiet: float = 1.0, timeout: float = 15) -> Screen:
        """Wait until the screen stops changing for ``quiet`` seconds (splash screens, late banners)."""
        deadline = time.monotonic() + timeout
        screen, since = self.bed.capture(self.pane), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.bed.capture(self.pane)
            if now != screen:
                screen, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet and pred(screen):
                break
        return screen

    def time(self, name: str, began: float) -> None:
        self.timings.setdefault(name, []).append(round(time.monotonic() - began, 3))

    def wait(self, what: str, pred: Pred, timeout: float, interval: float = 0.03) -> Screen:
        screen = self.bed.wait_for(self.pane, pred, timeout, interval)
        if screen is None:
            last = self.bed.capture(self.pane)
            if self.debug:
                self.debug.mkdir(parents=True, exist_ok=True)
                (self.debug / f"{self.recipe.provider}-timeout-{what}.txt").write_text(last)
            raise CaptureError(f"{self.recipe.provider}: timed out waiting for {what}; screen:\n{last}")
        return screen

    def save(self, state: str, screen: Screen) -> None:
        path = self.out / f"{state}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(screen)
        print(f"  saved {path.relative_to(self.out.parent) if self.out.parent in path.parents else path}")

    def send(self, text: str, busy_timeout: float = 10) -> float:
        """Paste ``text`` + Enter and wait until the CLI took it; return the time Enter was sent.

        Taken = busy, or a prompt/question opened (re-sending Enter there would answer it). When
        neither shows within 2 s and the text still sits in the input box (the bottom lines),
        Enter was swallowed (Gemini right after a paste or while finishing a turn): send it again.
        """
        text = self.recipe.prompt(text)
        self.bed.paste(self.pane, text, enter_delay=self.recipe.enter_delay, enter=False)
        time.sleep(self.recipe.enter_delay)
        entered = time.monotonic()
        self.bed.send_keys(self.pane, "Enter")
        accepted: Pred = lambda s: self.recipe.busy(s) or self.recipe.permission(s)  # noqa: E731
        head = text[:30]
        for attempt in range(2):
            if self.bed.wait_for(self.pane, accepted, 2.0 if attempt == 0 else busy_timeout, 0.01):
                self.time("enter_to_busy" if attempt == 0 else "enter_to_busy_after_resend", entered)
                return entered
            if attempt == 0 and any(head in line for line in lines(self.bed.capture(self.pane))[-10:]):
                self.timings.setdefault("enter_resent_for", []).append(head)
                self.bed.send_keys(self.pane, "Enter")
        self.timings.setdefault("busy_not_seen_for", []).append(head)
        return entered

    def capture_busy(self) -> Screen:
        return self.wait("processing", self.recipe.busy, 5)

    def stop(self, grace: float = 5.0) -> list[str]:
        """Kill the CLI's process group and window; report what was still alive ``grace`` s later.

        MCP servers run in their own process group (Codex) and exit on stdin EOF shortly after.
        """
        began = time.monotonic()
        ended_by = self.bed.kill_pane(self.pane)
        self.time(f"pane_group_ended_by_{ended_by}", began)
        keep = {p for p in self.bed.namespace_pids() if _cmdline(p).startswith(("tmux", "sleep infinity"))}
        if self.bed.fake is not None:
            keep.add(self.bed.fake.pid)

        def others() -> list[int]:
            return [p for p in self.bed.namespace_pids() if p not in keep]

        if wait_until(lambda: not others(), grace):
            return []
        left = [f"{p} {_cmdline(p)[:120]}" for p in others()]
        for pid in others():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left

    def approve(self, reply: str, timeout: float = 30) -> Screen:
        """Answer a prompt with its default choice (Enter) until ``reply`` arrives."""
        for _ in range(4):
            self.bed.send_keys(self.pane, "Enter")
            screen = self.bed.wait_for(self.pane, lambda s: self.recipe.finished(s, reply), timeout / 4, 0.05)
            if screen is not None:
                return screen
        return self.wait(f"reply {reply!r}", lambda s: self.recipe.finished(s, reply), 5)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def after_echo(screen: Screen, needle: str) -> str:
    """The part of the screen after the last line containing ``needle`` (e.g. the user's echo)."""
    idx = screen.rfind(needle)
    return screen[idx:] if idx >= 0 else ""


PHASES = ("turns", "prompts", "typed", "retrying", "dialogs", "exited")
# Pasted into the box without Enter for the "typed" screen (a delivery whose Enter was lost).
TYPED = "[cao message #7 from abcd1234]\nPlease reply typed-but-not-sent"


def capture_provider(
    bed: Bed,
    recipe: Recipe,
    bin_path: Path,
    out: Path,
    run_dir: Path,
    debug: Path | None,
    phases: tuple[str, ...] = PHASES,
) -> dict[str, Any]:
    timings: dict[str, list[Any]] = {}
    mcp_log = run_dir / f"{recipe.provider}-mcp-calls.jsonl"
    leftovers: list[str] = []

    def launch_for(tag: str) -> Launch:
        base = run_dir / f"{recipe.provider}-{tag}"
        return Launch(
            home=base / "home",
            work=base / "work",
            fake_url=bed.fake_url,
            mcp_command=[sys.executable, "-c", MCP_STUB, str(mcp_log)],
            mcp_env={"CAO_TERMINAL_ID": f"{recipe.provider[:4]}0001", "PYTHONPATH": str(REPO_ROOT)},
            bin=bin_path,
        )

    message = f'[[mcp:send_message {{"receiver_id":"{RECEIVER_ID}","message":"hi from {recipe.provider}"}}]]'
    if "turns" in phases:
        leftovers += capture_turns(bed, recipe, launch_for("bypass"), out, timings, debug, message)
    if "prompts" in phases:
        leftovers += capture_prompts(bed, recipe, launch_for("ask"), out, timings, debug, message)
    if "typed" in phases:
        leftovers += capture_typed(bed, recipe, launch_for("typed"), out, timings, debug)
    if "retrying" in phases:
        leftovers += capture_retrying(bed, recipe, launch_for("retrying"), out, timings, debug)
    if "exited" in phases:
        leftovers += capture_exited(bed, recipe, launch_for("exited"), out, timings, debug)
    if "dialogs" in phases:
        for dialog in recipe.dialogs():
            launch = launch_for(f"dialog-{dialog.name}")
            try:
                leftovers += capture_dialog(bed, recipe, launch, out, timings, debug, dialog)
            except CaptureError:
                if not recipe.version:
                    raise
                # An older release may not have this dialog (or not offline): note it, go on.
                timings.setdefault("dialogs_not_shown", []).append(dialog.name)
    calls = mcp_log.read_text().splitlines() if mcp_log.exists() else []
    return {"timings": timings, "leftover_processes": leftovers, "mcp_calls": calls}


def capture_turns(
    bed: Bed,
    recipe: Recipe,
    launch: Launch,
    out: Path,
    timings: dict[str, list[Any]],
    debug: Path | None,
    message: str,
) -> list[str]:
    """Bypass mode: idle, processing, completed, tools, queued, error."""
    session = Session(bed, recipe, launch, True, out, timings, debug)
    try:
        session.save("idle", session.start())

        reply = "The fake model says hello."
        session.send(f"Say hello slowly [[delay:6]][[reply:{reply}]]")
        time.sleep(1.5)  # let the spinner/timer settle into its steady look
        session.save("processing", session.capture_busy())
        done_at = time.monotonic()
        screen = session.wait("completed", lambda s: recipe.finished(s, reply), 30)
        session.time("rest_of_delay_to_completed", done_at)
        session.save("completed", screen)

        tools_reply = "Both tools ran."
        session.send(f"Run the tools [[shell:echo shell-ran-here]]{message}[[reply:{tools_reply}]]")
        screen = session.wait("completed_tools", lambda s: recipe.finished(s, tools_reply), 60)
        session.save("completed_tools", screen)

        # 1.0.x runs a message queued mid-turn, but that turn and every later one fail locally
        # ("Invalid API key · Please run /login", no request made): its queue isn't captured.
        if recipe.queue_shown is not None and not (recipe.provider == "claude_code" and recipe.older_than(2)):
            session.send("First long task [[delay:8]][[reply:First task finished.]]")
            session.bed.paste(
                session.pane,
                recipe.prompt("Second task, sent while busy [[reply:Second task finished.]]"),
                enter_delay=recipe.enter_delay,
            )
            queue_shown = recipe.queue_shown
            shown: Pred = lambda s: queue_shown(s) and recipe.busy(s)  # noqa: E731
            queued = session.bed.wait_for(session.pane, shown, 5)
            if queued is not None:
                session.save("queued", queued)
            else:  # 1.0.x keeps the text in the box while busy and shows no queue
                session.timings.setdefault("no_queue_shown", []).append(True)
            session.wait("both replies", lambda s: recipe.finished(s, "Second task finished."), 40)

        session.send("Please fail [[error:400]]")
        session.wait("error", lambda s: recipe.error(s) and recipe.idle(s), 60)
        session.save("error", session.settle(lambda s: recipe.error(s) and recipe.idle(s), quiet=0.5))
    finally:
        leftovers = session.stop()
    return leftovers


def capture_prompts(
    bed: Bed,
    recipe: Recipe,
    launch: Launch,
    out: Path,
    timings: dict[str, list[Any]],
    debug: Path | None,
    message: str,
) -> list[str]:
    """Default (non-bypass) mode: permission prompts and questions."""
    session = Session(bed, recipe, launch, False, out, timings, debug)
    try:
        session.start()
        session.send("Make a probe file [[permission]][[reply:Probe made.]]")
        session.wait("waiting_user_answer", recipe.permission, 30)
        session.save("waiting_user_answer", session.settle(recipe.permission, quiet=0.5))
        session.approve("Probe made.")

        session.send(f"Message a peer {message}[[reply:Peer messaged.]]")
        prompt_or_done = session.bed.wait_for(
            session.pane, lambda s: recipe.permission(s) or recipe.finished(s, "Peer messaged."), 30
        )
        if prompt_or_done is not None and recipe.permission(prompt_or_done):
            session.save("waiting_user_answer_mcp", session.settle(recipe.permission, quiet=0.5))
            session.approve("Peer messaged.")

        if recipe.asks_questions:
            session.send("Ask me something [[question:Which colour?|red|blue]][[reply:Colour noted.]]")
            # A release without a question tool (Gemini 0.24) gets the question as its answer text.
            asked = session.wait(
                "question", lambda s: recipe.permission(s) or recipe.finished(s, "(red / blue)"), 30
            )
            if recipe.permission(asked):
                session.save("waiting_user_answer_question", session.settle(recipe.permission, quiet=0.5))
                session.approve("Colour noted.")
    finally:
        leftovers = session.stop()
    return leftovers


def capture_typed(
    bed: Bed, recipe: Recipe, launch: Launch, out: Path, timings: dict[str, list[Any]], debug: Path | None
) -> list[str]:
    """After an answered turn, a message pasted into the box whose Enter never came."""
    session = Session(bed, recipe, launch, True, out, timings, debug)
    try:
        session.start()
        reply = "Hello from the fake model."
        session.send(f"Say hello [[reply:{reply}]]")
        session.wait("typed turn answered", lambda s: recipe.finished(s, reply), 30)
        bed.paste(session.pane, TYPED, enter=False)
        # The last line of the text shows near the bottom (Claude may fold a paste into a placeholder).
        tail = TYPED.rsplit("\n", 1)[-1]

        def in_box(screen: Screen) -> bool:
            return any(tail in line or "Pasted" in line for line in lines(screen)[-recipe.box_rows :])

        session.wait("typed text in the box", in_box, 10)
        session.save("typed", session.settle(in_box, quiet=0.5))
    finally:
        leftovers = session.stop()
    return leftovers


def capture_retrying(
    bed: Bed, recipe: Recipe, launch: Launch, out: Path, timings: dict[str, list[Any]], debug: Path | None
) -> list[str]:
    """A turn whose request failed with a 5xx and that the CLI is still retrying (busy, not error)."""
    session = Session(bed, recipe, launch, True, out, timings, debug)
    try:
        session.start(unseed=recipe.seed_retries)
        prompt = "Please fail and retry"
        session.send(f"{prompt} [[error:500]]")

        def tries() -> int:
            return sum(
                1
                for r in bed.fake_requests()
                if r.get("kind") == "main" and prompt in (r.get("prompt") or "")
            )

        if wait_until(lambda: tries() >= 2, 30) is None:
            raise CaptureError(f"{recipe.provider}: the failed request was not retried")
        shown = recipe.retry_shown or recipe.busy  # Gemini retries silently under its spinner
        session.wait("retrying", lambda s: recipe.busy(s) and shown(s), 30)
        time.sleep(0.5)  # past the first frame of the retry notice
        session.save("retrying", session.wait("retrying", lambda s: recipe.busy(s) and shown(s), 5))
    finally:
        leftovers = session.stop()
    return leftovers


def capture_exited(
    bed: Bed, recipe: Recipe, launch: Launch, out: Path, timings: dict[str, list[Any]], debug: Path | None
) -> list[str]:
    """After an answered turn, the CLI quit with its exit command: the screen a dead pane keeps
    (the bed's windows have ``remain-on-exit on``, so tmux adds its "Pane is dead" line)."""
    session = Session(bed, recipe, launch, True, out, timings, debug)
    try:
        session.start()
        reply = "Hello from the fake model."
        session.send(f"Say hello [[reply:{reply}]]")
        session.wait("exited turn answered", lambda s: recipe.finished(s, reply), 30)
        for _ in range(3):  # an exit command whose Enter was swallowed (Gemini) is sent again
            exit_command = providers.get(recipe.provider).exit_command
            bed.paste(session.pane, exit_command, enter_delay=recipe.enter_delay)
            if wait_until(lambda: bed.pane_dead(session.pane), 10):
                break
        else:
            screen = bed.capture(session.pane)
            raise CaptureError(f"{recipe.provider}: the CLI did not exit; screen:\n{screen}")
        time.sleep(0.3)
        session.save("exited", bed.capture(session.pane))
    finally:
        leftovers = session.stop()
    return leftovers


def capture_dialog(
    bed: Bed,
    recipe: Recipe,
    launch: Launch,
    out: Path,
    timings: dict[str, list[Any]],
    debug: Path | None,
    dialog: Dialog,
) -> list[str]:
    """A start-up dialog: the HOME seeded but for one piece, the CLI started, the dialog saved."""
    session = Session(bed, recipe, launch, dialog.bypass, out, timings, debug)
    try:
        began = time.monotonic()
        session.open(dialog.unseed, dialog.drop_env)
        session.wait(f"dialog {dialog.name}", dialog.shows, 60)
        session.time(f"start_to_dialog_{dialog.name}", began)
        session.save(f"dialog_{dialog.name}", session.settle(dialog.shows))
    finally:
        leftovers = session.stop()
    return leftovers


def describe_launch(recipe: Recipe) -> dict[str, Any]:
    """The launch recipe with placeholders, for meta.json."""
    launch = Launch(
        home=Path("<home>"),
        work=Path("<work>"),
        fake_url="http://127.0.0.1:<port>",
        mcp_command=["<python>", "<mcp server args>"],
        mcp_env={},
        bin=Path(
            f"<cache>/venvs/{VENV_CLIS[recipe.bin_name][0]}/bin/{recipe.bin_name}"
            if recipe.bin_name in VENV_CLIS
            else f"<cache>/node_modules/.bin/{recipe.bin_name}"
        ),
    )
    return {
        "cwd": "<work>",
        "argv_bypass": ["env", "-i", "<env>", *recipe.argv(launch, True)],
        "argv_default": ["env", "-i", "<env>", *recipe.argv(launch, False)],
        "env_bypass": recipe.env(launch, True),
        "env_default": recipe.env(launch, False),
    }


def cli_version(bed: Bed, recipe: Recipe, bin_path: Path, run_dir: Path) -> str:
    home = run_dir / f"{recipe.provider}-version"
    home.mkdir(parents=True, exist_ok=True)
    node_dir = str(Path(shutil.which("node") or "/usr/bin/node").parent)
    env = {"HOME": str(home), "PATH": f"{node_dir}:/usr/bin:/bin", "CODEX_HOME": str(home / ".codex")}
    (home / ".codex").mkdir(exist_ok=True)
    proc = bed.run_in_ns([str(bin_path), "--version"], env, timeout=60)
    if not proc.stdout.strip():
        return proc.stderr.strip()[-200:]
    found = proc.stdout.strip().splitlines()
    # the CLI's own line (Hermes prints its libraries' versions and its install directory too)
    named = [line for line in found if recipe.bin_name in line.lower() and re.search(r"\d+\.\d+\.\d+", line)]
    return (named or found)[-1]


def write_meta(
    path: Path, recipe: Recipe, version: str, result: dict[str, Any], phases: tuple[str, ...]
) -> None:
    """meta.json for the screens now in ``path``'s folder; a run of some phases keeps the rest."""
    partial = set(phases) != set(PHASES) and path.exists()
    meta: dict[str, Any] = json.loads(path.read_text()) if partial else {}
    saved = sorted(p.stem for p in path.parent.glob("*.txt"))
    meta.update(
        provider=recipe.provider,
        cli=recipe.bin_name,
        version=version,
        window="200x50",
        launch=describe_launch(recipe),
        states={state: status_of(state) for state in saved},
    )
    meta["timings_s"] = {**meta.get("timings_s", {}), **result["timings"]}
    if not partial or result["mcp_calls"]:
        meta["mcp_calls"] = result["mcp_calls"]
    left = result["leftover_processes"]
    meta["leftover_processes_after_kill"] = (
        [*meta.get("leftover_processes_after_kill", []), *left] if partial else left
    )
    path.write_text(json.dumps(meta, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.realcli.capture", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "screens")
    parser.add_argument("--only", default=",".join(RECIPES), help="comma-separated providers")
    parser.add_argument("--port", type=int, default=18081)
    parser.add_argument("--debug", type=Path, help="save timed-out screens and request logs here")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway HOMEs")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases (see above)")
    parser.add_argument(
        "--cli-version",
        help="capture this older release (installed in <cache>/versions/) into <out>/<provider>/<version>/",
    )
    args = parser.parse_args(argv)
    phases = tuple(phase.strip() for phase in args.phases.split(","))
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")

    if prepare(["realcli"]) != 0 or (reason := why_bed_cannot_run()):
        print(f"cannot run the real-CLI bed: {reason or 'the install failed'}", file=sys.stderr)
        return 1
    bins = {**(installed_bins() or {}), **{command: venv_bin(command) for command in VENV_CLIS}}
    out = args.out.resolve()
    providers_wanted = [provider.strip() for provider in args.only.split(",")]
    if args.cli_version and len(providers_wanted) != 1:
        parser.error("--cli-version needs exactly one provider in --only")
    # Not under /tmp (Codex warns about a CODEX_HOME there); a fixed name keeps the saved screens stable.
    run_dir = cache_dir() / "runs" / "capture"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for provider in providers_wanted:
            recipe = RECIPES[provider]
            bin_path, folder = bins[recipe.bin_name], out / recipe.provider
            if args.cli_version:
                bin_path = install_cli_version(recipe.bin_name, args.cli_version)
                folder = folder / args.cli_version
                recipe.version = tuple(int(part) for part in re.findall(r"\d+", args.cli_version)[:3])
            print(f"{recipe.provider} ({bin_path}):", flush=True)
            with Bed(port=args.port) as bed:
                version = cli_version(bed, recipe, bin_path, run_dir)
                try:
                    result = capture_provider(bed, recipe, bin_path, folder, run_dir, args.debug, phases)
                except CaptureError as exc:
                    print(f"  FAILED: {exc}", file=sys.stderr)
                    failed = True
                    result = {}
                finally:
                    if args.debug:
                        args.debug.mkdir(parents=True, exist_ok=True)
                        (args.debug / f"{recipe.provider}-requests.json").write_text(
                            json.dumps(bed.fake_requests(bodies=True), indent=1)
                        )
            if result:
                write_meta(folder / "meta.json", recipe, version, result, phases)
                print(f"  version {version}; leftovers: {result['leftover_processes'] or 'none'}")
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
