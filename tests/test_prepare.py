"""tests/prepare.py, the step of `make test` that installs what the tiers need: what it finds
present, what it skips and why, and a failed install named with its package (no network here:
the items are pointed at a temp cache and at programs that fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import prepare as prep


def test_an_npm_item_is_present_only_at_its_pinned_release(tmp_path: Path):
    item = prep.NpmPackages("x", ("realcli",), 1, prefix=tmp_path, packages=(("@scope/cli", "1.2.3"),))
    assert not item.present()
    manifest = tmp_path / "node_modules" / "@scope" / "cli" / "package.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"name": "@scope/cli", "version": "1.2.2"}))
    assert not item.present()  # another release is no substitute: its screens may differ
    manifest.write_text(json.dumps({"name": "@scope/cli", "version": "1.2.3"}))
    assert item.present()


def test_a_venv_item_is_present_once_its_install_finished(tmp_path: Path):
    item = prep.PythonVenv("v", ("integration",), 1, venv=tmp_path / "v", requirements=("pkg==1",))
    assert not item.present()
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / ".cao-installed").write_text("pkg==2")  # an earlier pin: redone
    assert not item.present()
    (tmp_path / "v" / ".cao-installed").write_text("pkg==1")
    assert item.present()


def test_check_lists_what_is_missing_and_installs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    env = {"CAO_TEST_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    catalogue = [i for i in prep.items(env) if not isinstance(i, prep.AptPackage)]
    assert prep.prepare(prep.TIERS, check=True, environ=env, catalogue=catalogue) == 0
    out = capsys.readouterr().out
    assert f"cache: {tmp_path / 'cache'}" in out
    assert "reference clients cli-agent-orchestrator 2.5.4" in out and "to download" in out
    assert not (tmp_path / "cache" / "refclients").exists()  # nothing installed


def test_a_failed_install_is_an_error_naming_the_package_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    failing = prep.PythonVenv(
        "reference clients broken-pkg 9.9",
        ("integration",),
        1,
        venv=tmp_path / "venv",
        requirements=("broken-pkg==9.9",),
        python=lambda: "/bin/false",  # `python -m venv` fails
    )
    fine = prep.PythonVenv("already there", ("integration",), 1, venv=tmp_path / "ok", requirements=("a==1",))
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / ".cao-installed").write_text("a==1")
    env = {"CAO_TEST_CACHE": str(tmp_path / "cache")}
    assert prep.prepare(["integration"], environ=env, catalogue=[fine, failing]) == 1
    out = capsys.readouterr().out
    assert "[ok  ] already there" in out
    assert "error: reference clients broken-pkg 9.9: pip install broken-pkg==9.9 failed" in out
    assert "make test stopped before the tests" in out
    assert not (tmp_path / "venv").exists()  # nothing half-made left behind


def test_a_tier_this_machine_cant_run_is_skipped_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    unreachable = prep.PythonVenv(
        "kimi", ("realcli",), 1, venv=tmp_path / "k", python=lambda: None, python_hint="no Python 3.12+"
    )
    assert prep.prepare(["realcli"], environ={}, catalogue=[unreachable]) == 0
    out = capsys.readouterr().out
    assert "[skip] kimi  — no Python 3.12+" in out
    assert "its realcli tests will skip: no Python 3.12+" in out


def test_every_tier_named_and_the_namespace_commands_fit_the_user():
    assert prep.TIERS == ("fast", "integration", "realcli", "browser")
    assert prep.holder_argv("root")[:2] == ["unshare", "-n"]
    user = prep.holder_argv("user")
    assert "--map-current-user" in user and "--keep-caps" in user
    assert prep.join_argv(42, "user")[-1] == "--preserve-credentials"
    assert prep.missing_hint("Chromium", "browser").endswith("python -m tests.prepare browser)")
