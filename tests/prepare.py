"""Everything the test suite needs beyond the project's ``.venv``, installed before pytest starts.

    python -m tests.prepare [TIER ...]        install what those tiers need (default: every tier)
    python -m tests.prepare --check [TIER ...] say what is there and what is missing; install nothing

``make test`` runs this first, as its own visible step, so no test downloads or installs anything
in its setup (a test whose need is missing skips and names the command that installs it). Each
item says what it fetches and how big it is, then what it took; the last line is the total.
Idempotent (an item that is there is not touched) and resumable (an item interrupted half-way is
redone; npm's and pip's own caches keep what was already downloaded). Works as root and as a user
with sudo (only the system packages need it).

Where a tier can't run on this machine at all (no network namespaces for the real CLIs, no apt-get
for Chromium, no Python 3.12 for two of the CLIs), its items are skipped with the reason, the run
still succeeds, and those tests skip with the same reason. An install that was tried and failed
is an error (exit 1) that names the package and the fix.

The tiers (tests/conftest.py marks every test with one):

    fast         no tmux, no server process, nothing installed        (python -m pytest -m fast)
    integration  real tmux, real cao-server, scripted agents, the reference orchestrator's clients
    realcli      the real agent CLIs, offline, in a loopback-only network namespace
    browser      the dashboard in the system's Chromium (Playwright drives it)

Where things go: ``$CAO_TEST_CACHE`` (default ``${XDG_CACHE_HOME:-~/.cache}/cao``): ``realcli/``
holds the agent CLIs, ``refclients/`` the reference clients. Chromium and PostgreSQL come from
apt-get (Debian's ``postgresql`` may set up and start its own cluster on install; the tests never
use it: they start a server of their own in a temp dir, on a unix socket).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TIERS = ("fast", "integration", "realcli", "browser")

# The agent CLIs the real-CLI tier runs, pinned: a newer release may draw its screens differently
# (docs/testing.md says how to move a pin). command -> (npm package, release).
CLI_PACKAGES: dict[str, tuple[str, str]] = {
    "claude": ("@anthropic-ai/claude-code", "2.1.197"),
    "codex": ("@openai/codex", "0.171.0"),
    "gemini": ("@google/gemini-cli", "0.61.0"),
    "opencode": ("opencode-ai", "1.18.33"),
    "qwen": ("@qwen-code/qwen-code", "0.15.10"),
    "copilot": ("@github/copilot", "1.0.102"),
}
# Older releases the suite also proves (each beside the current ones, under realcli/versions/).
OLDER_CLIS: tuple[tuple[str, str], ...] = (("claude", "1.0.128"), ("codex", "0.77.0"), ("gemini", "0.24.5"))
# Python CLIs, each pinned in its own virtualenv under realcli/venvs/<package>:
# command -> (PyPI package, release). kimi-cli 1.52.0 is a stub that downloads and runs its
# vendor's installer script; 1.51.0 is the last release that is the CLI itself. hermes-agent
# 0.19.0 is the last release on PyPI (its vendor installs from git since).
VENV_CLIS: dict[str, tuple[str, str]] = {"kimi": ("kimi-cli", "1.51.0"), "hermes": ("hermes-agent", "0.19.0")}
# command -> (the package's extra, a distribution only it brings): Hermes runs MCP servers only with
# its "mcp" extra (without it, it lists them as configured and never starts them).
VENV_EXTRAS: dict[str, tuple[str, str]] = {"hermes": ("mcp", "mcp")}
# The reference orchestrator's clients (tests/test_compat.py): release -> what else to install.
# 2.1.1 imports httpx without declaring it, and predates mcp 2 / fastmcp 3 (which dropped httpx):
# install it with the libraries of its own time, as its users ran it.
REF_PACKAGE = "cli-agent-orchestrator"
REF_VERSIONS: dict[str, tuple[str, ...]] = {
    "2.5.4": (),
    "2.1.1": ("fastmcp>=2.14,<3", "mcp>=1.23,<2", "httpx>=0.27"),
}
# What each item downloads from an empty cache, as measured here (docs/testing.md): the estimate
# printed before an install; what an install really downloaded is measured and printed after it.
REF_DOWNLOAD_MB = {"2.5.4": 47, "2.1.1": 32}
OLDER_DOWNLOAD_MB = {"claude": 43, "codex": 139, "gemini": 127}
VENV_DOWNLOAD_MB = {"kimi": 65, "hermes": 39}
INSTALL_TIMEOUT = 1200.0  # seconds for one item
HEARTBEAT = 15.0  # seconds between "still installing" lines


class PrepareFailed(Exception):
    """An install was tried and failed; the message names the package and the fix."""


# --------------------------------------------------------------------------------------------------
# Where things are
# --------------------------------------------------------------------------------------------------


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$CAO_TEST_CACHE``, else ``$XDG_CACHE_HOME/cao``, else ``~/.cache/cao``."""
    env = os.environ if environ is None else environ
    if env.get("CAO_TEST_CACHE"):
        return Path(env["CAO_TEST_CACHE"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base).expanduser() / "cao"


def realcli_cache(environ: Mapping[str, str] | None = None) -> Path:
    """Where the agent CLIs go: ``$CAO_REALCLI_CACHE``, else ``<cache root>/realcli``."""
    env = os.environ if environ is None else environ
    if env.get("CAO_REALCLI_CACHE"):
        return Path(env["CAO_REALCLI_CACHE"]).expanduser()
    return cache_root(env) / "realcli"


def refclients_cache(environ: Mapping[str, str] | None = None) -> Path:
    return cache_root(environ) / "refclients"


def cli_bin(command: str, cache: Path | None = None) -> Path:
    """The current (pinned) release of an npm CLI: ``<cache>/node_modules/.bin/<command>``."""
    return (cache or realcli_cache()) / "node_modules" / ".bin" / command


def version_bin(command: str, version: str, cache: Path | None = None) -> Path:
    """An older release: ``<cache>/versions/<command>-<version>/node_modules/.bin/<command>``."""
    prefix = (cache or realcli_cache()) / "versions" / f"{command}-{version}"
    return prefix / "node_modules" / ".bin" / command


def venv_bin(command: str, cache: Path | None = None) -> Path:
    """A Python CLI of ``VENV_CLIS``: ``<cache>/venvs/<package>/bin/<command>``."""
    package, _ = VENV_CLIS[command]
    return (cache or realcli_cache()) / "venvs" / package / "bin" / command


def refclient_venv(version: str, cache: Path | None = None) -> Path:
    return (cache or refclients_cache()) / version


def missing_hint(what: str, tier: str, blocker: str | None = None) -> str:
    """The sentence a test skips with when something it needs isn't installed: why it can't be
    installed here (``blocker``), else how to install it."""
    if blocker:
        return f"{what} can't be installed here: {blocker}"
    return f"{what} is not installed; `make test` installs it first (or: python -m tests.prepare {tier})"


def venv_cli_blocker() -> str | None:
    """Why the Python CLIs (``VENV_CLIS``) can't be installed here, or None."""
    if python_for_venvs() is None:
        return "no Python 3.12+ found (set CAO_REALCLI_PYTHON=/path/to/python3.12)"
    return None


# --------------------------------------------------------------------------------------------------
# Can a tier run here at all?
# --------------------------------------------------------------------------------------------------


def netns_mode() -> str:
    """How the loopback-only namespace is made: ``root`` (``unshare -n``) or ``user`` (a user
    namespace that keeps this uid, for a non-root user: ``unshare -U -n --map-current-user``)."""
    return "root" if os.geteuid() == 0 else "user"


def holder_argv(mode: str | None = None) -> list[str]:
    """The process that holds the namespace open, with ``lo`` already up."""
    if (mode or netns_mode()) == "root":
        return ["unshare", "-n", "sh", "-c", "ip link set lo up && exec sleep infinity"]
    # --keep-caps: the holder keeps its capabilities in the new user namespace across exec, so it can
    # bring lo up; everything that joins later keeps the user's own uid (--preserve-credentials)
    return [
        "unshare",
        "-U",
        "-n",
        "--map-current-user",
        "--keep-caps",
        "sh",
        "-c",
        "ip link set lo up && exec sleep infinity",
    ]


def join_argv(pid: int, mode: str | None = None) -> list[str]:
    """``argv`` prefix that runs a command inside the namespace held by ``pid``."""
    if (mode or netns_mode()) == "root":
        return ["nsenter", "-t", str(pid), "-n"]
    return ["nsenter", "-t", str(pid), "-U", "-n", "--preserve-credentials"]


def netns_problem() -> str | None:
    """Why a loopback-only network namespace cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "the real-CLI bed needs Linux network namespaces"
    for tool, package in (("unshare", "util-linux"), ("nsenter", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (needed for the loopback-only real-CLI bed; package {package})"
    for tool in ("setsid", "tmux"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (needed for the loopback-only real-CLI bed)"
    argv = holder_argv()
    argv[-1] = "ip link set lo up"
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    if proc.returncode != 0:
        how = "`unshare -n`" if netns_mode() == "root" else "a user namespace (`unshare -U -n`)"
        return f"no permission to create a network namespace with {how}: {proc.stderr.strip()[:200]}"
    return None


def node_problem() -> str | None:
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (the agent CLIs need Node.js 20+ and npm)"
    return None


def python_for_venvs(environ: Mapping[str, str] | None = None) -> str | None:
    """A Python >= 3.12 to build the Python CLIs' virtualenvs with (kimi-cli needs 3.12+):
    ``$CAO_REALCLI_PYTHON``, this interpreter, one on PATH, or a pyenv-installed one (pyenv's shims
    fail for versions that are installed but not selected)."""
    env = os.environ if environ is None else environ
    pyenv = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [env.get("CAO_REALCLI_PYTHON", ""), sys.executable]
    candidates += [shutil.which(name) or "" for name in ("python3.13", "python3.12", "python3")]
    with contextlib.suppress(OSError):
        candidates += [str(path) for path in sorted(pyenv.glob("3.1[2-9]*/bin/python3"), reverse=True)]
    for candidate in filter(None, candidates):
        try:
            proc = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.stdout.strip() == "True":
            return candidate
    return None


# --------------------------------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------------------------------


def say(text: str) -> None:
    print(text, flush=True)


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def mb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@dataclass
class Item:
    """One thing to install. Subclasses say whether it is there and how to install it."""

    name: str
    tiers: tuple[str, ...]
    download_mb: int  # as measured on an empty cache (docs/testing.md): for the estimate only
    state: str = "?"
    detail: str = ""
    seconds: float = 0.0
    downloaded: int = 0
    on_disk: int = 0
    reported: int | None = None  # bytes the installer itself said it downloads (apt-get does)

    def present(self) -> bool:
        raise NotImplementedError

    def blocker(self) -> str | None:
        """Why this can't be installed on this machine (its tier's tests skip), or None."""
        return None

    def install(self) -> None:
        raise NotImplementedError

    def caches(self) -> list[Path]:
        """Download caches whose growth is this item's download."""
        return []

    def where(self) -> Path | None:
        return None


@dataclass
class AptPackage(Item):
    package: str = ""
    commands: tuple[str, ...] = ()
    globs: tuple[str, ...] = ()  # programs the package puts off PATH (PostgreSQL's initdb)

    def present(self) -> bool:
        return any(shutil.which(c) for c in self.commands) or any(glob.glob(g) for g in self.globs)

    def blocker(self) -> str | None:
        if shutil.which("apt-get") is None:
            return f"no apt-get here: install {self.package} with your package manager"
        if os.geteuid() != 0 and shutil.which("sudo") is None:
            return f"not root and no sudo: install {self.package} as root (apt-get install {self.package})"
        return None

    def caches(self) -> list[Path]:
        return [Path("/var/cache/apt/archives")]

    def install(self) -> None:
        sudo: list[str] = []
        if os.geteuid() != 0:
            sudo = ["sudo"]
            if not sys.stdin.isatty() and run(["sudo", "-n", "true"], timeout=30)[0] != 0:
                raise PrepareFailed(
                    f"installing {self.package} needs sudo, and sudo wants a password with no terminal to "
                    f"ask on; run `sudo apt-get install {self.package}` once, then `make test` again"
                )
        # sudo takes VAR=value before the command; env= covers root (no sudo) and sudo keeping it
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        apt = [*sudo, *(["DEBIAN_FRONTEND=noninteractive"] if sudo else []), "apt-get"]
        install = [*apt, "install", "-y", "-q", "--no-install-recommends", self.package]
        code, out = run(install, env=env, show=_apt_line)
        if code != 0:  # stale or empty package lists (a fresh machine): refresh them once, then retry
            say("    refreshing the package lists (apt-get update)")
            code, out = run([*apt, "update", "-q"], env=env)
            if code == 0:
                code, out = run(install, env=env, show=_apt_line)
        # "Need to get 95.3 MB of archives", or "Need to get 0 B/117 MB" when apt's cache has them
        if m := re.search(r"Need to get ([\d.,]+) ([kMG]?)B", out):
            scale = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
            self.reported = int(float(m.group(1).replace(",", "")) * scale)
        if code != 0:
            by_hand = " ".join([*sudo, "apt-get", "install", self.package])
            raise PrepareFailed(
                f"apt-get install {self.package} failed (exit {code}): {tail(out)}; fix the cause, or "
                f"install it yourself (`{by_hand}`) and run `make test` again"
            )
        if not self.present():
            raise PrepareFailed(
                f"apt-get installed {self.package} but none of {self.commands + self.globs} is there"
            )


@dataclass
class NpmPackages(Item):
    prefix: Path = Path()
    packages: tuple[tuple[str, str], ...] = ()  # (npm package, release)

    def installed_version(self, package: str) -> str | None:
        try:
            data = json.loads((self.prefix / "node_modules" / package / "package.json").read_text())
        except (OSError, ValueError):
            return None
        version = data.get("version")
        return version if isinstance(version, str) else None

    def present(self) -> bool:
        return all(self.installed_version(p) == v for p, v in self.packages)

    def blocker(self) -> str | None:
        return node_problem() or netns_problem()

    def caches(self) -> list[Path]:
        code, out = run(["npm", "config", "get", "cache"], timeout=60)
        return [Path(out.strip())] if code == 0 and out.strip() else []

    def where(self) -> Path:
        return self.prefix

    def install(self) -> None:
        self.prefix.mkdir(parents=True, exist_ok=True)
        specs = [f"{p}@{v}" for p, v in self.packages]
        argv = [
            "npm",
            "install",
            "--prefix",
            str(self.prefix),
            # --prefix also moves npm's global config (<prefix>/etc/npmrc): keep the machine's, or
            # its cafile, proxy and registry settings silently stop applying
            *npm_globalconfig(),
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            # fail in about a minute, not after npm's default retries of every request (minutes)
            "--fetch-retries=1",
            "--fetch-retry-mintimeout=2000",
            "--fetch-retry-maxtimeout=10000",
        ]
        code, out = run([*argv, *specs], cwd=self.prefix, show=_npm_line)
        if code != 0 or not self.present():
            raise PrepareFailed(
                f"npm install {' '.join(specs)} failed (exit {code}): {tail(out)}; is the npm registry "
                f"reachable (`npm ping`)? Run `make test` again to resume, or remove {self.prefix} to "
                "start over"
            )


@dataclass
class PythonVenv(Item):
    venv: Path = Path()
    requirements: tuple[str, ...] = ()
    python: Callable[[], str | None] = field(default=lambda: sys.executable)
    python_hint: str = ""

    @property
    def marker(self) -> Path:
        return self.venv / ".cao-installed"

    def wanted(self) -> str:
        return " ".join(self.requirements)

    def present(self) -> bool:
        try:
            return self.marker.read_text() == self.wanted()
        except OSError:
            return False

    def blocker(self) -> str | None:
        if self.python() is None:
            return self.python_hint or "no suitable Python found"
        return None

    def caches(self) -> list[Path]:
        code, out = run([sys.executable, "-m", "pip", "cache", "dir"], timeout=60)
        return [Path(out.strip())] if code == 0 and out.strip() else []

    def where(self) -> Path:
        return self.venv

    def install(self) -> None:
        python = self.python()
        assert python is not None
        shutil.rmtree(self.venv, ignore_errors=True)  # a half-finished earlier install
        self.venv.parent.mkdir(parents=True, exist_ok=True)
        code, out = run([python, "-m", "venv", str(self.venv)], timeout=300)
        if code == 0:
            pip = [str(self.venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
            code, out = run([*pip, "--progress-bar", "off", *self.requirements], show=_pip_line)
        if code != 0:
            shutil.rmtree(self.venv, ignore_errors=True)
            raise PrepareFailed(
                f"pip install {self.wanted()} failed (exit {code}): {tail(out)}; is the package index "
                "reachable? Run `make test` again to retry"
            )
        self.marker.write_text(self.wanted())


def npm_globalconfig() -> list[str]:
    """``--globalconfig <npm's own>``, asked without ``--prefix`` (which would move it)."""
    code, out = run(["npm", "config", "get", "globalconfig"], timeout=60)
    path = out.strip().splitlines()[-1] if code == 0 and out.strip() else ""
    return ["--globalconfig", path] if path else []


def _npm_line(line: str) -> bool:
    return line.startswith(("npm error", "npm ERR!", "npm warn"))  # what goes wrong, as it happens


def _apt_line(line: str) -> bool:
    return line.startswith(("Get:", "Need to get", "After this operation"))


def _pip_line(line: str) -> bool:
    return line.startswith("Downloading") and "(" in line  # pip: "Downloading x.whl (1.2 MB)"


def items(environ: Mapping[str, str] | None = None) -> list[Item]:
    """Everything any tier needs, in the order it is installed."""
    cli = realcli_cache(environ)
    refs = refclients_cache(environ)
    out: list[Item] = [
        AptPackage(
            "chromium (system package)",
            ("browser",),
            117,
            package="chromium",
            commands=("chromium", "chromium-browser"),
        ),
        # the store's tests on PostgreSQL start their own server from it (cao/testing/pgserver.py)
        AptPackage(
            "postgresql (system package)",
            ("integration",),
            45,
            package="postgresql",
            commands=("initdb",),
            globs=("/usr/lib/postgresql/*/bin/initdb",),
        ),
    ]
    for version, extras in REF_VERSIONS.items():
        out.append(
            PythonVenv(
                f"reference clients {REF_PACKAGE} {version}",
                ("integration", "realcli") if version == "2.5.4" else ("integration",),
                REF_DOWNLOAD_MB[version],
                venv=refclient_venv(version, refs),
                requirements=(f"{REF_PACKAGE}=={version}", *extras),
            )
        )
    out.append(
        NpmPackages(
            f"agent CLIs ({', '.join(CLI_PACKAGES)})",
            ("realcli",),
            545,
            prefix=cli,
            packages=tuple(CLI_PACKAGES.values()),
        )
    )
    for command, version in OLDER_CLIS:
        package = CLI_PACKAGES[command][0]
        out.append(
            NpmPackages(
                f"{command} {version} (an older release)",
                ("realcli",),
                OLDER_DOWNLOAD_MB[command],
                prefix=version_bin(command, version, cli).parents[2],
                packages=((package, version),),
            )
        )
    for command, (package, release) in VENV_CLIS.items():
        extra, _ = VENV_EXTRAS.get(command, ("", ""))
        out.append(
            PythonVenv(
                f"{command} ({package} {release})",
                ("realcli",),
                VENV_DOWNLOAD_MB[command],
                venv=venv_bin(command, cli).parents[1],
                requirements=(f"{package}[{extra}]=={release}" if extra else f"{package}=={release}",),
                python=python_for_venvs,
                python_hint=f"no Python 3.12+ found for {package} "
                "(set CAO_REALCLI_PYTHON=/path/to/python3.12)",
            )
        )
    return out


def install_cli_version(command: str, version: str, cache: Path | None = None) -> Path:
    """Any release of an npm CLI beside the pinned ones (``make screens --cli-version``), once."""
    binary = version_bin(command, version, cache)
    item = NpmPackages(
        f"{command} {version}",
        ("realcli",),
        60,
        prefix=binary.parents[2],
        packages=((CLI_PACKAGES[command][0], version),),
    )
    if not item.present():
        say(f"installing {command} {version} into {item.prefix}")
        item.install()
    return binary


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def tail(out: str, n: int = 300) -> str:
    return " ".join(out.split())[-n:] or "no output"


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = INSTALL_TIMEOUT,
    show: Callable[[str], bool] | None = None,
) -> tuple[int, str]:
    """Run ``argv``; lines ``show`` picks are printed as they come, and a heartbeat every
    ``HEARTBEAT`` seconds says it is still going. Returns (exit code, output)."""
    lines: list[str] = []
    started = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT):
            say(f"    … still running ({time.monotonic() - started:.0f} s)")

    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    except OSError as exc:
        return 127, str(exc)
    beat = threading.Thread(target=heartbeat, daemon=True)
    if show is not None or timeout > 60:
        beat.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        with proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip())
                if show is not None and show(line):
                    say(f"    {line.strip()}")
            code = proc.wait()
    finally:
        killer.cancel()
        done.set()
    if code == -9:
        lines.append(f"gave up after {timeout:g} s")
    return code, "\n".join(lines)


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """One prepare at a time per cache (two `make test` runs side by side)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(
    tiers: Sequence[str],
    *,
    check: bool = False,
    environ: Mapping[str, str] | None = None,
    catalogue: Sequence[Item] | None = None,
) -> int:
    """Install what ``tiers`` need from ``catalogue`` (default: :func:`items`); 0, or 1 if an
    install failed (each failure printed with its package and fix)."""
    wanted = [i for i in (items(environ) if catalogue is None else catalogue) if set(i.tiers) & set(tiers)]
    root = cache_root(environ)
    say(f"preparing the test tiers {', '.join(tiers)} (cache: {root})")
    if not wanted:
        say("  nothing to install for these tiers")
        return 0
    todo: list[Item] = []
    for item in wanted:
        if item.present():
            item.state = "present"
        elif (why := item.blocker()) is not None:
            item.state, item.detail = "skipped", why
        else:
            item.state = "missing"
            todo.append(item)
        label = {"present": "ok", "skipped": "skip", "missing": "get"}[item.state]
        extra = f"  ~{item.download_mb} MB to download" if item.state == "missing" else ""
        say(f"  [{label:4}] {item.name}{extra}{'  — ' + item.detail if item.detail else ''}")
    if not todo:
        say("  everything these tiers can use here is installed")
        return _finish(wanted, 0.0)
    estimate = sum(i.download_mb for i in todo)
    say(f"  to install: {len(todo)} item(s), about {mb(estimate * 1e6)} to download")
    if check:
        return 0
    started = time.monotonic()
    with locked(root):
        for n, item in enumerate(todo, 1):
            if item.present():  # another run installed it while we waited for the lock
                item.state = "present"
                continue
            say(f"[{n}/{len(todo)}] {item.name} (about {item.download_mb} MB)")
            caches = item.caches()
            before = sum(dir_bytes(c) for c in caches)
            t0 = time.monotonic()
            try:
                item.install()
            except PrepareFailed as exc:
                item.state, item.detail = "failed", str(exc)
                say(f"    FAILED: {exc}")
            else:
                item.state = "installed"
            item.seconds = time.monotonic() - t0
            grown = max(0, sum(dir_bytes(c) for c in caches) - before)
            item.downloaded = item.reported if item.reported is not None else grown
            where = item.where()
            item.on_disk = dir_bytes(where) if where is not None and where.exists() else 0
            if item.state == "installed":
                disk = f", {mb(item.on_disk)} on disk" if item.on_disk else ""
                say(f"    done in {item.seconds:.0f} s: {mb(item.downloaded)} downloaded{disk}")
    return _finish(wanted, time.monotonic() - started)


def _finish(wanted: list[Item], seconds: float) -> int:
    installed = [i for i in wanted if i.state == "installed"]
    failed = [i for i in wanted if i.state == "failed"]
    skipped = [i for i in wanted if i.state == "skipped"]
    if installed or failed:
        down = sum(i.downloaded for i in installed)
        disk = sum(i.on_disk for i in installed)
        tried = f"{len(installed)} installed" + (f", {len(failed)} failed" if failed else "")
        say(f"prepare took {seconds / 60:.1f} min: {tried}; {mb(down)} downloaded, {mb(disk)} on disk")
    for item in skipped:
        tiers = "/".join(item.tiers)
        say(f"note: {item.name} can't be installed here, so its {tiers} tests will skip: {item.detail}")
    if failed:
        for item in failed:
            say(f"error: {item.name}: {item.detail}")
        say("make test stopped before the tests: fix the above, then run it again (what is done is kept)")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.prepare",
        description="Install what the test tiers need (before pytest; idempotent and resumable).",
        epilog="Example: python -m tests.prepare realcli   # just the real agent CLIs",
    )
    parser.add_argument("tiers", nargs="*", metavar="TIER", help=f"one of {', '.join(TIERS)} (default: all)")
    parser.add_argument("--check", action="store_true", help="say what is missing; install nothing")
    args = parser.parse_args(argv)
    if unknown := [t for t in args.tiers if t not in TIERS]:
        parser.error(f"unknown tier {unknown[0]!r}; choose from {', '.join(TIERS)}")
    return prepare(args.tiers or TIERS, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
