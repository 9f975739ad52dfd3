"""Launch specs of OpenCode, Qwen Code, Copilot CLI, Kimi CLI and Hermes: pure checks (no bed, no CLI
needed)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tomllib
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
    prompt_file: bool = True  # the profile's prompt is a file of its own (else part of an agent file)


SPECS = [
    Spec("opencode", "opencode", "OPENCODE", ".config/opencode/opencode.json", "mcp"),
    Spec("qwen_code", "qwen", "QWEN", ".qwen/settings.json", "mcpServers"),
    Spec("copilot", "copilot", "COPILOT", "mcp.json", "mcpServers"),
    Spec("kimi_cli", "kimi", "KIMI", ".kimi/mcp.json", "mcpServers", prompt_file=False),
    Spec("hermes", "hermes", "HERMES", ".hermes/config.yaml", "mcp_servers", prompt_file=False),
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
    assert argv == [sys.executable, "-P", "-m", "cao.mcp"]  # the profile's "cao" never wins
    assert (cao.get("env") or cao.get("environment")) == {
        "CAO_TERMINAL_ID": "1a2b3c4d",
        "CAO_SERVER_URL": "http://127.0.0.1:9889",
        "CAO_HOME": str(tmp_path / "cao"),
    }
    assert "docs" in servers(spec, tmp_path, launch(spec, tmp_path, profile=PROFILE))


def test_profile_prompt_and_model(spec: Spec, tmp_path: Path) -> None:
    launched = launch(spec, tmp_path, profile=PROFILE)
    prompt = PROFILE.system_prompt
    assert [
        text for text in launched.files.values() if (text == prompt if spec.prompt_file else prompt in text)
    ]
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


def test_kimi_gets_a_whole_config_and_the_profile_prompt_beside_its_own(tmp_path: Path) -> None:
    launched = launch(SPECS[3], tmp_path, profile=PROFILE)
    home = context(tmp_path, {}).terminal_home
    config = tomllib.loads(launched.files[home / ".kimi" / "config.toml"])
    assert config["telemetry"] is False
    assert config["models"][config["default_model"]]["model"] == "profile-model"
    assert config["providers"]["cao"] == {
        "type": "openai_legacy",
        "base_url": "http://127.0.0.1:18081/v1",
        "api_key": "cao-local-model-server-key",
    }
    assert launched.env["KIMI_CLI_NO_AUTO_UPDATE"] == "1"
    # The prompt is added to Kimi's own system prompt (its tool rules stay), not put in its place.
    agent_file = launched.command[launched.command.index("--agent-file") + 1]
    agent = json.loads(launched.files[Path(agent_file)])["agent"]
    assert agent == {"extend": "default", "system_prompt_args": {"ROLE_ADDITIONAL": PROFILE.system_prompt}}
    assert "--agent-file" not in launch(SPECS[3], tmp_path).command


def test_kimi_with_a_real_key_talks_to_moonshot_and_needs_a_model(tmp_path: Path) -> None:
    cli = executable(tmp_path / "bin" / "kimi")
    knobs = {"CAO_KIMI_BIN": str(cli), "CAO_KIMI_API_KEY": "sk-real"}
    with pytest.raises(ProviderError, match="CAO_KIMI_MODEL"):
        providers.get("kimi_cli").launch(context(tmp_path, knobs))
    launched = providers.get("kimi_cli").launch(context(tmp_path, {**knobs, "CAO_KIMI_MODEL": "kimi-k2"}))
    home = context(tmp_path, {}).terminal_home
    config = tomllib.loads(launched.files[home / ".kimi" / "config.toml"])
    assert config["providers"]["cao"] == {
        "type": "kimi",
        "base_url": "https://api.moonshot.ai/v1",
        "api_key": "sk-real",
    }
    assert config["models"]["cao"]["model"] == "kimi-k2"


def test_kimi_found_on_path_then_in_the_bed_venv(tmp_path: Path) -> None:
    knobs = {"CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", "CAO_REALCLI_CACHE": str(tmp_path / "cache")}
    with pytest.raises(ProviderError, match=r"kimi-cli==1\.51\.0"):  # never the installer stub
        providers.get("kimi_cli").launch(context(tmp_path, knobs))
    venv = executable(tmp_path / "cache" / "venvs" / "kimi-cli" / "bin" / "kimi")
    assert providers.get("kimi_cli").launch(context(tmp_path, knobs)).command[0] == str(venv)
    on_path = executable(tmp_path / "bin" / "kimi")
    launched = providers.get("kimi_cli").launch(context(tmp_path, knobs, path=str(on_path.parent)))
    assert launched.command[0] == str(on_path)


def hermes_config(tmp_path: Path, launched: LaunchSpec) -> dict[str, Any]:
    home = context(tmp_path, {}).terminal_home
    result: dict[str, Any] = json.loads(launched.files[home / ".hermes" / "config.yaml"])  # YAML reads JSON
    return result


def test_hermes_config_home_is_the_terminals_and_the_prompt_is_added_to_its_own(tmp_path: Path) -> None:
    launched = launch(SPECS[4], tmp_path, profile=PROFILE)
    home = context(tmp_path, {}).terminal_home
    assert launched.env["HERMES_HOME"] == str(home / ".hermes")  # never the user's ~/.hermes
    config = hermes_config(tmp_path, launched)
    # provider "custom" with a model: the first-run "isn't configured yet" question never shows
    assert config["model"] == {
        "provider": "custom",
        "base_url": "http://127.0.0.1:18081/v1",
        "default": "profile-model",
        "api_key": "cao-local-model-server-key",
    }
    assert config["agent"]["system_prompt"] == PROFILE.system_prompt  # Hermes's own prompt stays
    assert config["model_catalog"]["enabled"] is False
    assert config["display"]["user_message_preview"]["last_lines"] == 0  # the echo shows it all
    assert config["approvals"]["mode"] == "off" and "--yolo" in launched.command
    asking = launch(SPECS[4], tmp_path, CAO_HERMES_BYPASS="false")
    assert hermes_config(tmp_path, asking)["approvals"]["mode"] == "manual"
    assert "--yolo" not in asking.command
    assert hermes_config(tmp_path, launch(SPECS[4], tmp_path))["agent"]["system_prompt"] == ""


def test_hermes_with_a_real_key_talks_to_openrouter_and_needs_a_model(tmp_path: Path) -> None:
    cli = executable(tmp_path / "bin" / "hermes")
    knobs = {"CAO_HERMES_BIN": str(cli), "CAO_HERMES_API_KEY": "sk-or-real"}
    with pytest.raises(ProviderError, match="CAO_HERMES_MODEL"):
        providers.get("hermes").launch(context(tmp_path, knobs))
    launched = providers.get("hermes").launch(context(tmp_path, {**knobs, "CAO_HERMES_MODEL": "m/x"}))
    assert hermes_config(tmp_path, launched)["model"] == {
        "provider": "custom",
        "base_url": "https://openrouter.ai/api/v1",
        "default": "m/x",
        "api_key": "sk-or-real",
    }


def test_hermes_found_on_path_then_in_the_bed_venv(tmp_path: Path) -> None:
    knobs = {"CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", "CAO_REALCLI_CACHE": str(tmp_path / "cache")}
    with pytest.raises(ProviderError, match=r"'hermes-agent\[mcp\]==0\.19\.0'"):
        providers.get("hermes").launch(context(tmp_path, knobs))
    venv = executable(tmp_path / "cache" / "venvs" / "hermes-agent" / "bin" / "hermes")
    assert providers.get("hermes").launch(context(tmp_path, knobs)).command[0] == str(venv)
    on_path = executable(tmp_path / "bin" / "hermes")
    launched = providers.get("hermes").launch(context(tmp_path, knobs, path=str(on_path.parent)))
    assert launched.command[0] == str(on_path)


def test_hermes_reports_its_turns_through_shell_hooks_it_accepts_itself(tmp_path: Path) -> None:
    config = hermes_config(tmp_path, launch(SPECS[4], tmp_path))
    assert config["hooks_auto_accept"] is True  # else Hermes asks on its TTY before the first turn
    assert set(config["hooks"]) == {
        "pre_llm_call",
        "post_llm_call",
        "on_session_end",
        "pre_approval_request",
        "on_session_finalize",
    }
    for event, (hook,) in config["hooks"].items():
        argv = shlex.split(hook["command"])  # Hermes splits it the same way, no shell
        assert argv[:4] == [sys.executable, "-P", "-m", "cao.hook"] and argv[-2:] == ["hermes", event]
        assert "--terminal 1a2b3c4d --server http://127.0.0.1:9889" in hook["command"]
    knobs = {
        "CAO_HERMES_BIN": str(tmp_path / "bin" / "hermes"),
        "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081",
    }
    off = hermes_config(
        tmp_path, providers.get("hermes").launch(replace(context(tmp_path, knobs), hooks=False))
    )
    assert "hooks" not in off and "cao.hook" not in json.dumps(off)


def opencode_plugin(tmp_path: Path, **changes: Any) -> dict[Path, str]:
    ctx = replace(
        context(
            tmp_path,
            {
                "CAO_OPENCODE_BIN": str(executable(tmp_path / "bin" / "opencode")),
                "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081",
            },
        ),
        **changes,
    )
    return providers.get("opencode").launch(ctx).files


def test_opencode_reports_its_turns_through_a_plugin_that_needs_no_install(tmp_path: Path) -> None:
    files = opencode_plugin(tmp_path)
    config = context(tmp_path, {}).terminal_home / ".config" / "opencode"
    source = files[config / "plugin" / "cao.js"]
    assert '"cao.hook", "--terminal", "1a2b3c4d", "--server", "http://127.0.0.1:9889"' in source
    # OpenCode installs @opencode-ai/plugin from npm into a config folder with plugins unless its
    # lock already names it and node_modules exists (offline, that install hangs its start)
    lock = json.loads(files[config / "package-lock.json"])
    assert "@opencode-ai/plugin" in lock["packages"][""]["dependencies"]
    assert "@opencode-ai/plugin" in json.loads(files[config / "package.json"])["dependencies"]
    assert (config / "node_modules" / ".cao") in files
    off = opencode_plugin(tmp_path, hooks=False)
    assert not any("plugin" in str(p) for p in off) and "cao.hook" not in json.dumps(list(off.values()))


NODE_DRIVER = """
const mod = await import(process.argv[2]);
const hooks = await mod.CaoHooks({});
const ev = (type, properties) => hooks.event({ event: { type, properties } });
await ev("session.created", { info: { id: "main" } });
await ev("session.created", { info: { id: "kid", parentID: "main" } });
await hooks["chat.message"]({ sessionID: "main" }, { parts: [
  { type: "text", text: "first line" }, { type: "text", text: "hidden", synthetic: true },
  { type: "text", text: "second line" }] });
await hooks["chat.message"]({ sessionID: "kid" }, { parts: [{ type: "text", text: "subagent" }] });
await ev("session.status", { sessionID: "main", status: { type: "busy" } });
await ev("permission.asked", { sessionID: "main", title: "Run rm?" });
await ev("session.idle", { sessionID: "kid" });
await ev("session.idle", { sessionID: "main" });
"""


def run_plugin(tmp_path: Path, hang_on: str = "", limit_ms: int = 10000) -> list[Any]:
    """The written plugin under node, its hook program swapped for a recorder (which hangs, never
    exiting, on the event ``hang_on``), driven through NODE_DRIVER: what the recorder got, in order."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (OpenCode's plugins are JavaScript)")
    record = tmp_path / "hooks.jsonl"
    recorder = tmp_path / "recorder.py"
    recorder.write_text(
        "import json, sys, time\n"
        f"if sys.argv[1] == {hang_on!r}:\n"
        "    time.sleep(20)  # a hook that hangs (not killed: it records late, and the test fails)\n"
        "time.sleep(0.05)  # a slow hook: the next must still come after it\n"
        f"open({str(record)!r}, 'a').write(json.dumps([sys.argv[1:], json.load(sys.stdin)]) + '\\n')\n"
    )
    files = opencode_plugin(tmp_path)
    plugin = next(p for p in files if p.name == "cao.js")
    argv = json.dumps([sys.executable, str(recorder)])
    source = files[plugin].replace(files[plugin].split("const CMD = ", 1)[1].split(";", 1)[0], argv, 1)
    assert "const LIMIT_MS = 10000;" in source
    source = source.replace("const LIMIT_MS = 10000;", f"const LIMIT_MS = {limit_ms};")
    (tmp_path / "cao.mjs").write_text(source)
    (tmp_path / "driver.mjs").write_text(NODE_DRIVER)
    # node exits only once every hook process it started has ended (or was killed)
    subprocess.run([node, str(tmp_path / "driver.mjs"), str(tmp_path / "cao.mjs")], check=True, timeout=60)
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_opencode_plugin_reports_in_order_and_skips_subagent_sessions(tmp_path: Path) -> None:
    assert run_plugin(tmp_path) == [
        [["session.created"], {"hook_event_name": "session.created"}],
        [["chat.message"], {"hook_event_name": "chat.message", "prompt": "first line\nsecond line"}],
        [["permission.asked"], {"hook_event_name": "permission.asked", "message": "Run rm?"}],
        [["session.idle"], {"hook_event_name": "session.idle"}],
    ]


def test_opencode_plugin_kills_a_hook_that_hangs_and_the_next_reports_still_go(tmp_path: Path) -> None:
    got = run_plugin(tmp_path, hang_on="permission.asked", limit_ms=500)
    assert [event for (event,), _ in got] == ["session.created", "chat.message", "session.idle"]


def test_copilot_reports_its_turns_through_user_level_hooks_in_its_own_home(tmp_path: Path) -> None:
    knobs = {
        "CAO_COPILOT_BIN": str(executable(tmp_path / "bin" / "copilot")),
        "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081",
    }
    home = context(tmp_path, {}).terminal_home
    files = providers.get("copilot").launch(context(tmp_path, knobs)).files
    config = json.loads(files[home / ".copilot" / "hooks" / "cao.json"])
    assert config["version"] == 1
    assert set(config["hooks"]) == {"sessionStart", "userPromptSubmitted", "agentStop", "sessionEnd"}
    for event, (hook,) in config["hooks"].items():
        argv = shlex.split(hook["bash"])
        assert argv[:4] == [sys.executable, "-P", "-m", "cao.hook"] and argv[-2:] == ["copilot", event]
        assert "--terminal 1a2b3c4d --server http://127.0.0.1:9889" in hook["bash"]
    assert not any(".github" in str(p) for p in files)  # never into the user's repository
    off = providers.get("copilot").launch(replace(context(tmp_path, knobs), hooks=False)).files
    assert not any("hooks" in str(p) for p in off)
