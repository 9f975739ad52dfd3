"""Agent profiles: parsing and validation, the store and the built-ins, `cao install` / `cao profiles`,
and how a terminal resolves its profile (real tmux, real scripted agents)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from cao import profiles
from cao.api import create_app
from cao.cli import cli
from cao.core import Cao
from cao.errors import CaoError, InvalidInput, NotFound
from providers.base import LaunchContext, LaunchSpec
from providers.scripted import ScriptedProvider
from tests.helpers import write_rules

BUILTINS = ["code_supervisor", "developer", "reviewer"]

TESTER = """\
---
name: tester
description: Writes the missing tests
provider: scripted_eager
model: sonnet
allowed_tools: [Read, Edit, "Bash(pytest:*)"]
mcp_servers:
  docs:
    command: docs-mcp
    args: [--readonly]
    env: {DOCS_ROOT: /srv/docs}
---

You write tests first.

Then you run them.
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _profile(name: str = "tester", extra: str = "", body: str = "Prompt.") -> str:
    return f"---\nname: {name}\ndescription: d\n{extra}---\n{body}\n"


# -- parsing ---------------------------------------------------------------------------------------
def test_parse_reads_every_field_and_the_body_is_the_system_prompt():
    p = profiles.parse(TESTER, "tester.md")
    assert (p.name, p.description, p.provider, p.model) == (
        "tester",
        "Writes the missing tests",
        "scripted_eager",
        "sonnet",
    )
    assert p.allowed_tools == ("Read", "Edit", "Bash(pytest:*)")
    assert p.mcp_servers == {
        "docs": {"command": "docs-mcp", "args": ["--readonly"], "env": {"DOCS_ROOT": "/srv/docs"}}
    }
    assert p.system_prompt == "You write tests first.\n\nThen you run them."
    assert p.source == "tester.md" and not p.builtin
    minimal = profiles.parse(_profile())
    assert (minimal.provider, minimal.model, minimal.allowed_tools, dict(minimal.mcp_servers)) == (
        None,
        None,
        None,
        {},
    )
    assert json.loads(json.dumps(p.as_dict()))["allowed_tools"] == ["Read", "Edit", "Bash(pytest:*)"]


class Bad(NamedTuple):
    text: str
    expect: str


BAD = {
    "no-front-matter": Bad("just a prompt\n", "no YAML front matter"),
    "unclosed-front-matter": Bad("---\nname: x\ndescription: d\n", "no YAML front matter"),
    "invalid-yaml": Bad("---\nname: [x\n---\nbody\n", "not valid YAML"),
    "not-a-mapping": Bad("---\n- a\n- b\n---\nbody\n", "must be a mapping"),
    "unknown-field": Bad(_profile(extra="allowed-tools: [Read]\n"), "unknown field(s) allowed-tools"),
    "missing-name": Bad("---\ndescription: d\n---\nbody\n", "name is required"),
    "missing-description": Bad("---\nname: x\n---\nbody\n", "description is required"),
    "bad-name": Bad(_profile(name="no spaces"), "'no spaces' is not allowed"),
    "name-not-a-string": Bad("---\nname: 12\ndescription: d\n---\n", "name must be a string"),
    "unknown-provider": Bad(_profile(extra="provider: cursor\n"), "provider 'cursor' is unknown"),
    "tools-not-a-list": Bad(_profile(extra="allowed_tools: Read\n"), "allowed_tools must be a list"),
    "server-not-a-mapping": Bad(_profile(extra="mcp_servers: [a]\n"), "mcp_servers must be a mapping"),
    "server-without-command": Bad(_profile(extra="mcp_servers: {a: {args: []}}\n"), "needs a command"),
    "server-args-not-strings": Bad(
        _profile(extra="mcp_servers: {a: {command: x, args: [1]}}\n"), "mcp_servers.a.args must be a list"
    ),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_invalid_profiles_are_rejected_with_the_file_and_the_fix(case: Bad):
    with pytest.raises(InvalidInput) as err:
        profiles.parse(case.text, "/store/x.md")
    assert err.value.message.startswith("/store/x.md: ")
    assert case.expect in err.value.message


# -- built-ins, store, lookup ----------------------------------------------------------------------
def test_builtins_work_with_no_store(tmp_path: Path):
    store = tmp_path / "missing"
    assert profiles.names(store) == BUILTINS
    for p in profiles.list(store):
        assert p.builtin and p.description and len(p.system_prompt) > 200
    assert "handoff" in profiles.load("code_supervisor", store).system_prompt
    assert not store.exists()


def test_the_store_shadows_builtins_and_adds_profiles(tmp_path: Path):
    store = tmp_path / "agent-store"
    _write(store / "tester.md", TESTER)
    _write(store / "reviewer.md", _profile("reviewer", body="My own reviewer."))
    assert profiles.names(store) == [*BUILTINS, "tester"]
    assert profiles.load("reviewer", store).system_prompt == "My own reviewer."
    assert profiles.load("developer", store).builtin
    assert [p.name for p in profiles.list(store)] == [*BUILTINS, "tester"]


def test_load_errors_name_the_choices(tmp_path: Path):
    store = tmp_path / "agent-store"
    _write(store / "tester.md", TESTER)
    with pytest.raises(NotFound) as err:
        profiles.load("nosuch", store)
    assert "'nosuch' not found" in err.value.message and "developer, reviewer, tester" in err.value.message
    assert "cao install" in err.value.message
    _write(store / "renamed.md", TESTER)
    with pytest.raises(InvalidInput, match=r"declares name 'tester' but the file is renamed\.md"):
        profiles.load("renamed", store)
    with pytest.raises(InvalidInput, match="not allowed"):
        profiles.load("../etc/passwd", store)


def test_install_from_a_file_or_a_builtin(tmp_path: Path):
    store = tmp_path / "agent-store"
    src = _write(tmp_path / "src" / "anything.md", TESTER)
    profile, dest = profiles.install(str(src), store)
    assert dest == store / "tester.md" and dest.read_text() == TESTER
    assert profile.source == str(dest) and profiles.load("tester", store) == profile
    _, dest = profiles.install("reviewer", store)  # a built-in, copied to be edited
    assert dest == store / "reviewer.md" and not profiles.load("reviewer", store).builtin
    # invalid or missing sources install nothing
    bad = _write(tmp_path / "src" / "bad.md", "---\nname: bad\n---\n")
    with pytest.raises(InvalidInput, match="description is required"):
        profiles.install(str(bad), store)
    with pytest.raises(NotFound, match="no profile file at"):
        profiles.install(str(tmp_path / "nope.md"), store)
    with pytest.raises(NotFound, match="neither a file nor a built-in profile"):
        profiles.install("nosuch", store)
    assert sorted(p.name for p in store.iterdir()) == ["reviewer.md", "tester.md"]


# -- through the API, and the CLI on it -----------------------------------------------------------
FIELDS = {
    "name", "description", "provider", "model", "allowed_tools", "mcp_servers", "use_worktree", "source",
    "system_prompt",
}  # fmt: skip


def test_profiles_through_the_api_list_show_and_install(core: Cao, tmp_path: Path):
    store = core.settings.profiles_dir
    with TestClient(create_app(core)) as client:
        listed = client.get("/profiles").json()
        assert [p["name"] for p in listed] == BUILTINS and set(listed[0]) == FIELDS
        assert client.get("/profiles/reviewer").json()["source"] == "builtin"
        missing = client.get("/profiles/nosuch")
        assert (
            missing.status_code == 404 and "code_supervisor, developer, reviewer" in missing.json()["detail"]
        )
        assert client.get("/profiles/bad%0Aname").status_code == 422
        made = client.post("/profiles", json={"text": TESTER})
        assert made.status_code == 201, made.text
        assert made.json()["name"] == "tester" and made.json()["path"] == str(store / "tester.md")
        assert (store / "tester.md").read_text() == TESTER
        assert client.get("/profiles/tester").json()["provider"] == "scripted_eager"
        copied = client.post("/profiles", params={"builtin": "reviewer"})
        assert copied.status_code == 201 and copied.json()["source"] == str(store / "reviewer.md")
        # refused, and nothing written: neither or both, a broken profile, an unknown built-in
        for body, words in [
            ({}, "exactly one of text"),
            ({"text": TESTER, "builtin": "reviewer"}, "exactly one of text"),
            ({"text": "no front matter"}, "no YAML front matter"),
            ({"text": "   "}, "text"),
            ({"builtin": "nosuch"}, "neither a file nor a built-in"),
            ({"builtin": "../x"}, "is not allowed"),
        ]:
            r = client.post("/profiles", json=body)
            assert r.status_code in (404, 422) and words in r.json()["detail"], (body, r.text)
    assert sorted(p.name for p in store.iterdir()) == ["reviewer.md", "tester.md"]


def test_two_installs_of_one_profile_at_once_leave_one_whole_file(core: Cao):
    """Each install writes its own temporary file and renames it over the profile: the last rename
    wins and no reader ever sees half a file (a shared temporary name used to fail one of them)."""
    import concurrent.futures

    texts = [TESTER.replace("Writes the missing tests", f"Writes test {i}") for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        done = list(pool.map(lambda t: core.install_profile(text=t), texts))
    assert len(done) == 8
    assert (core.settings.profiles_dir / "tester.md").read_text() in texts
    assert [p.name for p in core.settings.profiles_dir.iterdir()] == ["tester.md"]  # no leftovers


@pytest.fixture
def run(core: Cao):
    """``cao`` against this test's server (through the API only: no CAO_HOME of its own)."""
    from cao.client import Client

    with TestClient(create_app(core)) as http:
        client = Client("http://testserver", http=http)
        yield lambda *args: CliRunner().invoke(
            cli, list(args), obj={"client": client}, env={"CAO_HOME": "/nonexistent"}
        )


def test_cli_install_and_profiles(run: Any, core: Cao, tmp_path: Path):
    listed = run("profiles", "--json")
    assert listed.exit_code == 0, listed.output
    assert [p["name"] for p in json.loads(listed.output)] == BUILTINS and set(
        json.loads(listed.output)[0]
    ) == FIELDS
    src = _write(tmp_path / "tester.md", TESTER)
    installed = run("install", str(src))
    assert installed.exit_code == 0, installed.output
    assert "installed profile tester" in installed.output
    assert (core.settings.profiles_dir / "tester.md").read_text() == TESTER  # the server's store
    table = run("profiles")
    assert table.exit_code == 0 and "│ tester " in table.output  # the rich table, for people
    broken = run("install", str(_write(tmp_path / "x.md", "no front matter")))
    assert broken.exit_code == 1 and "no YAML front matter" in broken.output
    gone = run("install", str(tmp_path / "nope.md"))
    assert gone.exit_code == 1 and "no profile file at" in gone.output
    builtin = run("install", "reviewer", "--json")
    assert builtin.exit_code == 0 and json.loads(builtin.output)["path"].endswith("agent-store/reviewer.md")


# -- terminals resolve their profile ---------------------------------------------------------------
def test_unknown_profile_is_422_naming_the_available_ones(core: Cao):
    with pytest.raises(InvalidInput) as err:
        core.lifecycle.create(agent_profile="nosuch")
    assert "'nosuch' not found" in err.value.message
    assert "code_supervisor, developer, reviewer" in err.value.message
    with TestClient(create_app(core)) as client:
        r = client.post("/sessions", json={"agent_profile": "nosuch"})
    assert r.status_code == 422 and "code_supervisor, developer, reviewer" in r.json()["detail"]
    assert core.store.list_terminals() == [] and core.tmux.list_sessions() == []


def test_a_profile_pins_the_provider_unless_the_request_names_one(core: Cao):
    _write(core.settings.profiles_dir / "tester.md", TESTER)  # provider: scripted_eager
    pinned = core.lifecycle.create(agent_profile="tester", session_name="pin")
    assert pinned.provider == "scripted_eager"
    chosen = core.lifecycle.create(
        agent_profile="tester", provider="scripted", session_name="pin", new_session=False
    )
    assert chosen.provider == "scripted"
    assert core.lifecycle.create(agent_profile="reviewer", session_name="plain").provider == "scripted"


def test_scripted_rule_names_stay_valid_for_scripted_providers_only(core: Cao):
    write_rules(core.settings.home, "demo_worker", {"rules": []})
    t = core.lifecycle.create(agent_profile="demo_worker")
    assert (t.agent_profile, t.provider) == ("demo_worker", "scripted")
    with pytest.raises(InvalidInput, match="'demo_worker' not found"):
        core.lifecycle.create(agent_profile="demo_worker", provider="codex")


def test_the_provider_gets_the_loaded_profile(core: Cao, monkeypatch: pytest.MonkeyPatch):
    seen: dict[str, Any] = {}
    launch = ScriptedProvider.launch

    def spy(self: ScriptedProvider, ctx: LaunchContext) -> LaunchSpec:
        seen[ctx.agent_profile] = ctx.profile
        return launch(self, ctx)

    monkeypatch.setattr(ScriptedProvider, "launch", spy)
    write_rules(core.settings.home, "slow", {"rules": []})
    core.lifecycle.create(agent_profile="reviewer", session_name="a")
    core.lifecycle.create(agent_profile="slow", session_name="b")
    assert seen["reviewer"] == profiles.load("reviewer", core.settings.profiles_dir)
    assert seen["slow"] is None


def test_an_installed_profile_is_made_like_any_file_the_user_writes(tmp_path: Path):
    """Mode 0666 less the umask, as before installs went through the server (not mkstemp's 0600)."""
    old = os.umask(0o022)
    try:
        _, dest = profiles.install_text(TESTER, tmp_path / "agent-store")
    finally:
        os.umask(old)
    assert dest.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in dest.parent.iterdir()] == ["tester.md"]  # no temporary file left


@pytest.mark.parametrize("what", ["file", "dangling symlink"])
def test_an_agent_store_that_is_no_directory_is_named_in_the_error(tmp_path: Path, what: str):
    store = tmp_path / "agent-store"
    if what == "file":
        store.write_text("not a directory")
    else:
        store.symlink_to(tmp_path / "nowhere" / "at-all")
    with pytest.raises(CaoError, match=f"the agent store {store} can't be written"):
        profiles.install_text(TESTER, store)


def test_cli_install_of_a_broken_file_names_the_file(run: Any, tmp_path: Path):
    broken = _write(tmp_path / "x.md", "no front matter")
    out = run("install", str(broken))
    assert out.exit_code == 1 and f"{broken}: no YAML front matter" in out.output, out.output
