"""Launch specs of OpenCode, Qwen Code and Copilot CLI: pure checks (no bed, no CLI needed)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import providers
from cao.errors import ProviderError
from providers.base import LaunchSpec
from tests.realcli.test_launch_specs import PROFILE, context, executable


class Spec(NamedTuple):
    provider: str
    command: str
    prefix: str  # CAO_<prefix>_BIN …
    config: str  # the config file (relative to the terminal's home) that holds the MCP servers
    servers_key: str  # where in it


SPECS = [
    Spec("opencode", "opencode", "OPENCODE", ".config/opencode/opencode.json", "mcp"),
    Spec("qwen_code", "qwen", "QWEN", ".qwen/settings.json", "mcpServers"),
    Spec("copilot", "copilot", "COPILOT", "mcp.json", "mcpServers"),
]


@pytest.fixture(params=SPECS, ids=[s.provider for s in SPECS])
def spec(request: pytest.FixtureRequest) -> Spec:
    result: Spec = request.param
    return result


def launch(spec: Spec, tmp_path: Path, profile: Any = None, **knobs: str) -> LaunchSpec:
    cli = executable(tmp_path / "bin" / spec.command)
    settings = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", **knobs}
    return providers.get(spec.provider).launch(replace(context(tmp_path, settings), profile=profile))


def servers(spec: Spec, tmp_path: Path, launched: LaunchSpec) -> dict[str, Any]:
    home = context(tmp_path, {}).terminal_home
    result: dict[str, Any] = json.loads(launched.files[home / spec.config])[spec.servers_key]
    return result


def test_everything_lives_in_the_terminal_home(spec: Spec, tmp_path: Path) -> None:
    launched = launch(spec, tmp_path)
    home = context(tmp_path, {}).terminal_home
    assert launched.env["HOME"] == str(home)
    assert launched.env["CAO_TERMINAL_ID"] == "1a2b3c4d"
    assert all(path.is_relative_to(home) for path in launched.files)
    assert "127.0.0.1:18081" in json.dumps([launched.env, *launched.files.values()])


def test_mcp_server_speaks_for_this_terminal(spec: Spec, tmp_path: Path) -> None:
    cao = servers(spec, tmp_path, launch(spec, tmp_path, profile=PROFILE))["cao"]
    argv = cao["command"] if isinstance(cao["command"], list) else [cao["command"], *cao["args"]]
    assert argv == [sys.executable, "-m", "cao.mcp"]  # the profile's "cao" never wins
    assert (cao.get("env") or cao.get("environment")) == {
        "CAO_TERMINAL_ID": "1a2b3c4d",
        "CAO_SERVER_URL": "http://127.0.0.1:9889",
        "CAO_HOME": str(tmp_path / "cao"),
    }
    assert "docs" in servers(spec, tmp_path, launch(spec, tmp_path, profile=PROFILE))


def test_profile_prompt_and_model(spec: Spec, tmp_path: Path) -> None:
    launched = launch(spec, tmp_path, profile=PROFILE)
    assert [text for text in launched.files.values() if text == PROFILE.system_prompt]
    everything = json.dumps([launched.command, launched.env, *launched.files.values()])
    assert "profile-model" in everything
    knob = launch(spec, tmp_path, profile=PROFILE, **{f"CAO_{spec.prefix}_MODEL": "knob-model"})
    assert "profile-model" not in json.dumps([knob.command, knob.env, *knob.files.values()])


def test_missing_credentials_say_what_to_do(spec: Spec, tmp_path: Path) -> None:
    cli = executable(tmp_path / spec.command)
    with pytest.raises(ProviderError, match="has no credentials: set CAO_"):
        providers.get(spec.provider).launch(context(tmp_path, {f"CAO_{spec.prefix}_BIN": str(cli)}))


def test_bypass_knob_turns_prompts_back_on(spec: Spec, tmp_path: Path) -> None:
    on, off = launch(spec, tmp_path), launch(spec, tmp_path, **{f"CAO_{spec.prefix}_BYPASS": "false"})
    assert json.dumps([on.command, *on.files.values()]) != json.dumps([off.command, *off.files.values()])


def test_copilot_trusts_the_workdir_and_needs_no_sign_in_offline(tmp_path: Path) -> None:
    launched = launch(SPECS[2], tmp_path)
    home = context(tmp_path, {}).terminal_home
    state = json.loads(launched.files[home / ".copilot" / "config.json"])
    assert state["trustedFolders"] == [str(tmp_path / "work")]
    assert launched.env["COPILOT_PROVIDER_BASE_URL"] == "http://127.0.0.1:18081/v1"
    assert launched.env["COPILOT_OFFLINE"] == "true"
