"""A user's fixes to how cao reads their CLI's screen: ``$CAO_HOME/providers/<provider>.rules``
(format: providers/rules.py ``parse_overrides``; docs/providers.md), read and checked when
cao-server starts (an error names the file and the line, and the server does not start), and by
``cao explain --screen`` / ``cao rules`` to try one before a restart.
"""

from __future__ import annotations

from pathlib import Path

import providers
from cao.errors import InvalidInput
from cao.files import read_small_file
from providers import rules

FILE_LIMIT = 256 * 1024


def owners() -> dict[str, list[str]]:
    """Each rules owner (an override file's name) and the providers that read with its rules."""
    found: dict[str, list[str]] = {}
    for name in providers.names():
        found.setdefault(rules.owner_of(providers.get(name)), []).append(name)
    return found


def owner_for(provider_name: str) -> str:
    return rules.owner_of(providers.get(provider_name))


def read_file(path: Path, owner: str) -> list[rules.Override]:
    data = read_small_file(path, FILE_LIMIT, "rules file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidInput(f"{path}:{line}: not UTF-8 text ({exc.reason})") from None
    try:
        return rules.parse_overrides(text, owner, str(path))
    except rules.OverrideError as exc:
        raise InvalidInput(str(exc)) from None


def load(home: Path) -> dict[str, list[rules.Override]]:
    """Every override file under ``home``/providers, checked; nothing is applied here."""
    folder = home / "providers"
    known = owners()
    found: dict[str, list[rules.Override]] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        if path.suffix != ".rules":
            continue
        if path.stem not in known:
            raise InvalidInput(
                f"{path}: no provider reads rules named {path.stem!r}; name the file after one of: "
                + ", ".join(sorted(known))
            )
        found[path.stem] = read_file(path, path.stem)
    return found


def install(home: Path) -> dict[str, list[rules.Override]]:
    """Check every override file under ``home`` and put them in effect (for this process: the
    providers' rules are shared by everything in it); a broken one raises and changes nothing."""
    found = load(home)
    rules.reset_overrides()
    for owner, overrides in found.items():
        rules.apply_overrides(owner, overrides)
    return found
