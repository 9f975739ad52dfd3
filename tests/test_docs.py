"""Docs are part of the feature: the generated CLI reference is current, links resolve, and the
README's test command is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from cao.docgen import KNOBS_BEGIN, render, with_knobs

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    assert (ROOT / "docs" / "cli.md").read_text() == render(), "docs/cli.md is stale: run `make docs`"


def test_knob_table_is_current():
    """docs/providers.md's table of the providers' CAO_* knobs is made from their declarations."""
    providers_md = (ROOT / "docs" / "providers.md").read_text()
    assert KNOBS_BEGIN in providers_md
    assert providers_md == with_knobs(providers_md), (
        "docs/providers.md's knob table is stale: run `make docs`"
    )


def test_readme_and_docs_links_resolve():
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", md.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (md.parent / target).exists(), f"{md.name} links to missing {target}"


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    two = re.findall(r"^make (\w+)\s+#", readme, re.M)[:2]
    assert two == ["demo", "test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_server_setting_is_read_once_and_documented():
    """Settings.from_env is the one reader of cao-server's CAO_* variables: the names it reads are
    SERVER_NAMES exactly, and docs/configuration.md has a row for each."""
    from cao.settings import SERVER_NAMES

    source = (ROOT / "cao" / "settings.py").read_text()
    reader = source[source.index("def from_env") : source.index("def with_")]
    read = set(re.findall(r'"(CAO_[A-Z_]+)"', reader))
    assert read == set(SERVER_NAMES)
    table = (ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name in SERVER_NAMES if f"`{name}`" not in table]
    assert missing == [], f"docs/configuration.md lacks {missing}"
    others = {
        m
        for path in (ROOT / "cao").rglob("*.py")
        if path.name not in ("settings.py", "hook.py")  # hook.py: the CLIs' hook program, stdlib only
        for m in re.findall(r'environ(?:\.get)?\(?\[?"(CAO_[A-Z_]+)"', path.read_text())
    }
    # cli.py says where a URL came from; server.py whether CAO_SERVER_URL was given
    assert others <= {"CAO_SERVER_URL", "CAO_API_PORT", "CAO_API_HOST"}, others


def test_documented_fault_points_are_the_ones_in_the_code():
    """docs/configuration.md and docs/testing.md list every crash point the code has, and no other."""
    code = "\n".join(p.read_text() for p in (ROOT / "cao").rglob("*.py"))
    points = set(re.findall(r"\b(?:faults\.hit|faults\.active|self\.fault)\(\"([a-z_]+)\"", code))
    assert {"before_commit", "after_paste", "after_pane_created"} <= points  # the pattern still matches
    for doc in ("docs/configuration.md", "docs/testing.md"):
        text = (ROOT / doc).read_text()
        section = text[text.index("CAO_FAULT_POINT") :][:900]
        listed = set(re.findall(r"`([a-z]+_[a-z_]+)`", section))
        assert listed == points, f"{doc}: missing {sorted(points - listed)}, stale {sorted(listed - points)}"
