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
