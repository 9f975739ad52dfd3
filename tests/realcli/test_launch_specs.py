"""What the real-CLI providers launch: pure checks of their LaunchSpecs (no bed, no CLI needed)."""

from __future__ import annotations

import json
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import providers
from cao.errors import ProviderError
from cao.knobs import Knob
from cao.profiles import Profile
from providers.base import LaunchContext, LaunchSpec


class Spec(NamedTuple):
    provider: str
    command: str  # the CLI's executable name
    prefix: str  # its knobs: CAO_<prefix>_BIN, _BYPASS, _MODEL
    bypass_flag: str
    key_knob: str  # CAO_* variable with a real API key
    key_env: str  # what the CLI reads it from
    extra_env: dict[str, str]  # variables the CLI gets besides base_env, HOME and the key


SPECS = [
    Spec(
        "claude_code",
        "claude",
        "CLAUDE",
        "--dangerously-skip-permissions",
        "CAO_ANTHROPIC_API_KEY",
        "ANTHROPIC_API_KEY",
        {"ANTHROPIC_BASE_URL": "http://127.0.0.1:18081", "DISABLE_AUTOUPDATER": "1"},
    ),
    Spec(
        "codex",
        "codex",
        "CODEX",
        "--dangerously-bypass-approvals-and-sandbox",
        "CAO_OPENAI_API_KEY",
        "CAO_CODEX_API_KEY",
        {},
    ),
    Spec(
        "gemini_cli",
        "gemini",
        "GEMINI",
        "--yolo",
        "CAO_GEMINI_API_KEY",
        "GEMINI_API_KEY",
        {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:18081", "GEMINI_TELEMETRY_ENABLED": "false"},
    ),
]


@pytest.fixture(params=SPECS, ids=[s.provider for s in SPECS])
def spec(request: pytest.FixtureRequest) -> Spec:
    result: Spec = request.param
    return result


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def context(tmp_path: Path, knobs: dict[str, str], path: str = "/nonexistent") -> LaunchContext:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return LaunchContext(
        terminal_id="1a2b3c4d",
        agent_profile="developer",
        working_directory=work,
        cao_home=tmp_path / "cao",
        server_url="http://127.0.0.1:9889",
        terminal_home=tmp_path / "cao" / "terminals" / "1a2b3c4d",
        base_env={
            "PATH": path,
            "LANG": "C.UTF-8",
            "TERM": "xterm-256color",
            "HOME": str(tmp_path / "user"),
            "CAO_TERMINAL_ID": "1a2b3c4d",
            "CAO_SERVER_URL": "http://127.0.0.1:9889",
        },
        settings_env=knobs,
    )


def launch(spec: Spec, tmp_path: Path, **knobs: str) -> LaunchSpec:
    cli = executable(tmp_path / "bin" / spec.command)
    settings = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", **knobs}
    return providers.get(spec.provider).launch(context(tmp_path, settings))


def mcp_server(spec: Spec, launched: LaunchSpec) -> dict[str, Any]:
    """The ``cao`` MCP server entry from whichever config file the provider writes."""
    for path, content in launched.files.items():
        if path.suffix == ".toml":
            server: dict[str, Any] = tomllib.loads(content)["mcp_servers"]["cao"]
            return server
        data = json.loads(content)
        if "mcpServers" in data:
            server = data["mcpServers"]["cao"]
            return server
    raise AssertionError(f"{spec.provider} configures no MCP server: {list(launched.files)}")


def test_environment_is_built_from_nothing_but_what_the_cli_needs(spec: Spec, tmp_path: Path) -> None:
    launched = launch(spec, tmp_path)
    ctx = context(tmp_path, {})
    assert launched.env["HOME"] == str(ctx.terminal_home)
    assert launched.env["CAO_TERMINAL_ID"] == "1a2b3c4d"
    assert launched.env[spec.key_env]  # a placeholder key for the local model server
    assert launched.env.items() >= spec.extra_env.items()
    assert all(path.is_relative_to(ctx.terminal_home) for path in launched.files)


def test_mcp_server_speaks_for_this_terminal(spec: Spec, tmp_path: Path) -> None:
    server = mcp_server(spec, launch(spec, tmp_path))
    assert (server["command"], server["args"]) == (sys.executable, ["-P", "-m", "cao.mcp"])
    assert server["env"] == {
        "CAO_TERMINAL_ID": "1a2b3c4d",
        "CAO_SERVER_URL": "http://127.0.0.1:9889",
        "CAO_HOME": str(tmp_path / "cao"),  # where it finds cao-server's API token
    }


def test_bypass_by_default_and_a_knob_to_get_prompts(spec: Spec, tmp_path: Path) -> None:
    assert spec.bypass_flag in launch(spec, tmp_path).command
    assert spec.bypass_flag not in launch(spec, tmp_path, **{f"CAO_{spec.prefix}_BYPASS": "false"}).command


def test_real_key_is_passed_through(spec: Spec, tmp_path: Path) -> None:
    launched = providers.get(spec.provider).launch(
        context(
            tmp_path,
            {
                f"CAO_{spec.prefix}_BIN": str(executable(tmp_path / spec.command)),
                spec.key_knob: "k-0123456789abcdefghijXYZ",
            },
        )
    )
    assert launched.env[spec.key_env] == "k-0123456789abcdefghijXYZ"
    assert not any("127.0.0.1:18081" in v for v in launched.env.values())


def test_cli_found_on_path_then_in_the_bed_cache(spec: Spec, tmp_path: Path) -> None:
    knobs = {"CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", "CAO_REALCLI_CACHE": str(tmp_path / "cache")}
    on_path = executable(tmp_path / "path" / spec.command)
    prov = providers.get(spec.provider)
    assert prov.launch(context(tmp_path, knobs, path=str(on_path.parent))).command[0] == str(on_path)
    cached = executable(tmp_path / "cache" / "node_modules" / ".bin" / spec.command)
    assert prov.launch(context(tmp_path, knobs)).command[0] == str(cached)


def test_missing_cli_or_credentials_say_what_to_do(spec: Spec, tmp_path: Path) -> None:
    prov = providers.get(spec.provider)
    knobs = {"CAO_MODEL_BASE_URL": "http://x", "CAO_REALCLI_CACHE": str(tmp_path / "empty")}
    with pytest.raises(ProviderError, match=rf"npm install -g .*CAO_{spec.prefix}_BIN"):
        prov.launch(context(tmp_path, knobs))
    with pytest.raises(ProviderError, match=spec.key_knob):
        prov.launch(context(tmp_path, {f"CAO_{spec.prefix}_BIN": str(executable(tmp_path / spec.command))}))


def test_model_knob(spec: Spec, tmp_path: Path) -> None:
    launched = launch(spec, tmp_path, **{f"CAO_{spec.prefix}_MODEL": "some-model"})
    config = "".join(launched.files.values())
    assert "some-model" in launched.command or 'model = "some-model"' in config


def test_claude_is_seeded_past_its_first_run_dialogs(tmp_path: Path) -> None:
    launched = launch(SPECS[0], tmp_path)
    home = context(tmp_path, {}).terminal_home
    state = json.loads(launched.files[home / ".claude.json"])
    assert state["hasCompletedOnboarding"] is True
    assert state["customApiKeyResponses"]["approved"] == [launched.env["ANTHROPIC_API_KEY"][-20:]]
    assert state["projects"][str(tmp_path / "work")]["hasTrustDialogAccepted"] is True
    settings = json.loads(launched.files[home / ".claude" / "settings.json"])
    assert settings["skipDangerousModePermissionPrompt"] is True


def test_codex_config_is_complete_and_keeps_codex_single_process(tmp_path: Path) -> None:
    launched = launch(SPECS[1], tmp_path)
    home = context(tmp_path, {}).terminal_home
    assert launched.env["CODEX_HOME"] == str(home / ".codex")
    config = tomllib.loads(launched.files[home / ".codex" / "config.toml"])
    assert config["model_provider"] == "cao"
    assert config["model_providers"]["cao"]["base_url"] == "http://127.0.0.1:18081/v1"
    assert config["model_providers"]["cao"]["env_key"] == "CAO_CODEX_API_KEY"
    assert config["projects"][str(tmp_path / "work")] == {"trust_level": "trusted"}
    assert config["features"]["daemon_auto_start"] is False
    assert config["check_for_update_on_startup"] is False
    assert "--no-alt-screen" in launched.command  # keeps the transcript in tmux's scrollback


def test_gemini_settings_skip_auth_and_trust_dialogs(tmp_path: Path) -> None:
    launched = launch(SPECS[2], tmp_path)
    home = context(tmp_path, {}).terminal_home
    settings = json.loads(launched.files[home / ".gemini" / "settings.json"])
    assert settings["security"] == {
        "auth": {"selectedType": "gemini-api-key"},
        "folderTrust": {"enabled": False},
    }
    assert settings["telemetry"]["enabled"] is False
    assert launched.env["COLORTERM"] == "truecolor"


PROFILE = Profile(
    name="tester",
    description="Writes the missing tests",
    system_prompt="You write tests first.",
    model="profile-model",
    mcp_servers={
        "docs": {"command": "docs-mcp", "args": ["--readonly"], "env": {"DOCS_ROOT": "/srv/docs"}},
        "cao": {"command": "not-this-one"},
    },
)


def test_profile_prompt_model_and_mcp_servers_reach_the_cli(spec: Spec, tmp_path: Path) -> None:
    cli = executable(tmp_path / "bin" / spec.command)
    knobs = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
    launched = providers.get(spec.provider).launch(replace(context(tmp_path, knobs), profile=PROFILE))
    prompt_files = [path for path, text in launched.files.items() if text == PROFILE.system_prompt]
    assert len(prompt_files) == 1
    config = "".join(launched.files.values())
    assert "profile-model" in launched.command or 'model = "profile-model"' in config
    assert mcp_server(spec, launched)["args"] == ["-P", "-m", "cao.mcp"]  # cao's own always wins
    assert "docs-mcp" in config and "/srv/docs" in config
    with_knob = providers.get(spec.provider).launch(
        replace(context(tmp_path, {**knobs, f"CAO_{spec.prefix}_MODEL": "knob-model"}), profile=PROFILE)
    )
    assert "profile-model" not in [*with_knob.command, *with_knob.files.values()]


def test_claude_profile_tool_allow_list_asks_for_the_rest(tmp_path: Path) -> None:
    profile = replace(PROFILE, allowed_tools=("Read", "Bash(pytest:*)"))
    launched = providers.get("claude_code").launch(
        replace(
            context(
                tmp_path,
                {"CAO_CLAUDE_BIN": str(executable(tmp_path / "claude")), "CAO_MODEL_BASE_URL": "http://x"},
            ),
            profile=profile,
        )
    )
    assert launched.command[launched.command.index("--allowedTools") + 1] == "Read,Bash(pytest:*),mcp__cao"
    assert "--dangerously-skip-permissions" not in launched.command


def npm_install(tmp_path: Path, package: str, version: str, command: str) -> Path:
    """A fake npm layout: ``node_modules/.bin/<command>`` → the package's script, its package.json."""
    root = tmp_path / "npm" / version / "node_modules"
    script = executable(root / package / "bin" / f"{command}.js")
    (root / package / "package.json").write_text(json.dumps({"name": package, "version": version}))
    link = root / ".bin" / command
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(script)
    return link


class Release(NamedTuple):
    provider: str
    package: str
    version: str
    has: tuple[str, ...]  # in the launch command
    lacks: tuple[str, ...]


RELEASES = [
    Release("codex", "@openai/codex", "0.77.0", (), ("--no-alt-screen",)),  # 0.77 rejects the flag
    Release("codex", "@openai/codex", "0.130.0", ("--no-alt-screen",), ()),
    Release(
        "claude_code",
        "@anthropic-ai/claude-code",
        "1.0.128",
        ("--append-system-prompt",),
        ("--append-system-prompt-file",),
    ),
    Release(
        "claude_code",
        "@anthropic-ai/claude-code",
        "2.0.77",
        ("--append-system-prompt",),
        ("--append-system-prompt-file",),
    ),
    Release(
        "claude_code",
        "@anthropic-ai/claude-code",
        "2.1.197",
        ("--append-system-prompt-file",),
        ("--append-system-prompt",),
    ),
]


@pytest.mark.parametrize("release", RELEASES, ids=[f"{r.provider}-{r.version}" for r in RELEASES])
def test_launch_leaves_out_what_an_older_release_rejects(release: Release, tmp_path: Path) -> None:
    spec = next(s for s in SPECS if s.provider == release.provider)
    cli = npm_install(tmp_path, release.package, release.version, spec.command)
    knobs = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
    launched = providers.get(release.provider).launch(replace(context(tmp_path, knobs), profile=PROFILE))
    assert set(release.has) <= set(launched.command)
    assert not set(release.lacks) & set(launched.command)


def test_claude_seed_fits_1_0_and_later(tmp_path: Path) -> None:
    """1.0.x crashes at start on a short ``projects`` entry and keeps the bypass answer in state."""
    launched = launch(SPECS[0], tmp_path)
    state = json.loads(launched.files[context(tmp_path, {}).terminal_home / ".claude.json"])
    project = state["projects"][str(tmp_path / "work")]
    assert project["allowedTools"] == [] and project["mcpServers"] == {}
    assert state["bypassPermissionsModeAccepted"] is True


def test_an_unrelated_package_json_is_no_release(tmp_path: Path) -> None:
    """A user's own ``codex`` wrapper in a project with its own package.json: the current flags."""
    cli = npm_install(tmp_path, "my-tools", "0.1.0", "codex")
    knobs = {"CAO_CODEX_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
    assert "--no-alt-screen" in providers.get("codex").launch(context(tmp_path, knobs)).command


# -- lifecycle hooks (cao/hookstate.py; what each release runs: docs/providers.md) -----------------
HOOK = "-P -m cao.hook --terminal 1a2b3c4d --server http://127.0.0.1:9889"
CLAUDE_PKG = "@anthropic-ai/claude-code"
TRUST_FLAG = "--dangerously-bypass-hook-trust"


def hook_config(launched: LaunchSpec) -> dict[str, Any]:
    """Where the provider put cao's hook: {event: command} from settings.json / hooks.json, or
    Codex's notify program as {"notify": argv}."""
    found: dict[str, Any] = {}
    for path, content in launched.files.items():
        data = tomllib.loads(content) if path.suffix == ".toml" else json.loads(content)
        if "notify" in data:
            found["notify"] = data["notify"]
        for event, entries in (data.get("hooks") or {}).items():
            if isinstance(entries, list):
                found[event] = entries[0]["hooks"][0]["command"]
    return found


@pytest.mark.parametrize(
    ("provider", "package", "version", "events", "flag"),
    [
        (
            "claude_code",
            "@anthropic-ai/claude-code",
            "2.1.197",
            {"UserPromptSubmit", "Stop", "PermissionRequest"},
            None,
        ),
        (
            "claude_code",
            "@anthropic-ai/claude-code",
            "1.0.128",
            {"UserPromptSubmit", "Stop", "Notification"},
            None,
        ),
        (
            "codex",
            "@openai/codex",
            "0.171.0",
            {"UserPromptSubmit", "Stop"},
            "--dangerously-bypass-hook-trust",
        ),
        ("codex", "@openai/codex", "0.130.0", {"notify"}, None),
        ("codex", "@openai/codex", "0.77.0", {"notify"}, None),
        ("gemini_cli", "@google/gemini-cli", "0.61.0", {"BeforeAgent", "AfterAgent", "Notification"}, None),
        ("gemini_cli", "@google/gemini-cli", "0.24.5", {"BeforeAgent", "AfterAgent"}, None),
    ],
)
def test_each_release_reports_its_turns_through_the_hooks_it_has(
    provider: str, package: str, version: str, events: set[str], flag: str | None, tmp_path: Path
) -> None:
    spec = next(s for s in SPECS if s.provider == provider)
    cli = npm_install(tmp_path, package, version, spec.command)
    knobs = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
    launched = providers.get(provider).launch(context(tmp_path, knobs))
    hooks = hook_config(launched)
    assert events <= set(hooks), hooks
    for event, command in hooks.items():
        line = " ".join(command) if isinstance(command, list) else command
        assert HOOK in line and line.startswith(sys.executable), (event, line)
    if provider == "claude_code" and version.startswith("1."):
        assert "PermissionRequest" not in hooks  # 1.0 has no such event
    if provider == "codex":
        assert ("notify" in hooks) != ("Stop" in hooks)  # one or the other: never both (duplicate ends)
    assert (flag in launched.command) if flag else "--dangerously-bypass-hook-trust" not in launched.command
    if provider == "gemini_cli":
        settings = json.loads(next(c for p, c in launched.files.items() if p.name == "settings.json"))
        switches = settings["hooks"] if version.startswith("0.24") else settings["hooksConfig"]
        assert switches["enabled"] is True and switches["notifications"] is False


def test_hooks_off_leaves_the_clis_config_alone(spec: Spec, tmp_path: Path) -> None:
    cli = executable(tmp_path / "bin" / spec.command)
    knobs = {f"CAO_{spec.prefix}_BIN": str(cli), "CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
    launched = providers.get(spec.provider).launch(replace(context(tmp_path, knobs), hooks=False))
    assert not any("cao.hook" in content for content in launched.files.values())
    assert "--dangerously-bypass-hook-trust" not in launched.command


# -- knobs (cao/knobs.py): declared by each provider, read only through ctx.knob -----------------------
def flag_knobs() -> list[tuple[str, str]]:
    return [
        (name, knob.name)
        for name in providers.names()
        for knob in providers.get(name).knobs
        if knob.kind == "flag"
    ]


@pytest.mark.parametrize(("provider", "knob"), flag_knobs(), ids=[f"{p}-{k}" for p, k in flag_knobs()])
def test_a_mistyped_flag_fails_the_launch_naming_the_variable(
    provider: str, knob: str, tmp_path: Path
) -> None:
    """``CAO_CLAUDE_BYPASS=ture`` once read as "off" without a word; cao-server's own flags refuse it."""
    knobs = {"CAO_MODEL_BASE_URL": "http://127.0.0.1:18081", knob: "ture"}
    for cli in (k for k in providers.get(provider).knobs if k.name.endswith("_BIN")):
        knobs[cli.name] = str(executable(tmp_path / "bin" / str(cli.default)))
    with pytest.raises(ProviderError, match=rf"^{knob}='ture' is not a boolean; use true or false"):
        providers.get(provider).launch(context(tmp_path, knobs))


def test_every_knob_is_declared_once_and_listed() -> None:
    """``providers.all_knobs()`` (what cao-server will check its environment against) holds every
    provider's knobs, one declaration per name; each provider module declares every knob it holds."""
    listed = {knob.name: knob for knob in providers.all_knobs()}
    assert list(listed) == sorted(listed)
    for name in providers.names():
        prov = providers.get(name)
        assert len({knob.name for knob in prov.knobs}) == len(prov.knobs), name
        for knob in prov.knobs:
            assert listed[knob.name] is knob, f"{knob.name} is declared twice"
            assert knob.name.startswith("CAO_") and knob.doc, knob
        module = sys.modules[type(prov).__module__]
        held = {value for value in vars(module).values() if isinstance(value, Knob)}
        assert held <= set(prov.knobs), f"{name} reads knobs it does not declare: {held - set(prov.knobs)}"


class Reads(dict[str, str]):
    """cao-server's environment for a launch, remembering every variable looked up in it."""

    def __init__(self, values: dict[str, str]) -> None:
        super().__init__(values)
        self.looked_up: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().get(key, default)


def test_a_launch_reads_only_the_knobs_its_provider_declares(tmp_path: Path) -> None:
    """Each provider launched with just a local model server, then with every knob it declares set
    (keys, tokens, endpoints: the other branches), with and without a profile."""
    rules = tmp_path / "rules.json"
    rules.write_text("{}")
    for name in providers.names():
        prov = providers.get(name)
        declared = {knob.name: knob for knob in prov.knobs}
        local = {"CAO_MODEL_BASE_URL": "http://127.0.0.1:18081"}
        everything = {knob: "true" if declared[knob].kind == "flag" else "some-value" for knob in declared}
        for knob in (k for k in declared if k.endswith("_BIN")):
            cli = str(executable(tmp_path / "bin" / str(declared[knob].default)))
            local[knob] = everything[knob] = cli
        everything.update({k: str(rules) for k, knob in declared.items() if knob.kind == "path"})
        for knobs in (local, everything):
            for profile in (None, replace(PROFILE, allowed_tools=("Read",))):
                env = Reads(knobs)
                prov.launch(replace(context(tmp_path, {}), settings_env=env, profile=profile))
                assert env.looked_up <= set(declared), (name, env.looked_up - set(declared))
                assert env.looked_up, name


def test_providers_read_knobs_only_through_the_context() -> None:
    """No provider pokes ``settings_env`` (raw strings, no parsing): ``ctx.knob(KNOB)`` reads them."""
    for path in sorted(Path(providers.__file__).parent.glob("*.py")):
        if path.name != "base.py":
            assert "settings_env" not in path.read_text(), path.name
