"""Shared fixtures: a private tmux server per test, HOME/CAO_HOME in tmp, no TMUX*/CAO_* leaking in.

Every process a test starts is stopped by that test (the fixtures below own them).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cao.core import Cao
from cao.settings import Settings
from cao.testing import pgserver
from cao.testing.pgserver import PgServer
from cao.tmux import Tmux
from tests.helpers import REPO, Clock, ServerProcess

# -- tiers: every test is in exactly one (tests/prepare.py installs what each needs) ----------------
#   fast         no tmux, no server process          integration  real tmux, cao-server, scripted agents
#   realcli      the real agent CLIs in the bed       browser      the dashboard in Chromium
TIERS = ("fast", "integration", "realcli", "browser")
_TIER_SEEN: dict[str, list[float]] = {}  # tier -> [tests, passed, failed, skipped, seconds]


def tier_of(item: pytest.Item) -> str:
    """A test's tier: an explicit ``realcli``/``browser``/``integration`` mark, else ``integration``
    for anything that gets a private tmux server (every cao-server and agent starts from one), else
    ``fast``."""
    for tier in ("realcli", "browser", "integration"):
        if item.get_closest_marker(tier) is not None:
            return tier
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("db_backend") == "postgresql":
        return "integration"  # a real PostgreSQL server (cao/testing/pgserver.py)
    fixtures = getattr(item, "fixturenames", ())
    return "integration" if "tmux_socket" in fixtures or "pg_server" in fixtures else "fast"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier (so ``-m fast`` selects one) and run the tiers in order, fast
    first: a broken change shows in seconds, not at the end of the real CLIs. With the suite on
    PostgreSQL, a test of the SQLite file itself (``sqlite_only``) skips, saying so."""
    for item in items:
        marker = item.get_closest_marker("sqlite_only")
        if marker is not None and os.environ.get("CAO_TEST_DATABASE") == "postgresql":
            item.add_marker(pytest.mark.skip(reason=f"tests the SQLite file itself: {marker.args[0]}"))
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: TIERS.index(tier_of(item)))  # stable: modules stay together


_TIER_OF: dict[str, str] = {}  # nodeid -> tier, for the hooks that get no item
_TIER_COUNT: dict[str, int] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    _TIER_SEEN.clear()
    _TIER_OF.clear()
    _TIER_OF.update({item.nodeid: tier_of(item) for item in session.items})
    _TIER_COUNT.clear()
    for tier in _TIER_OF.values():
        _TIER_COUNT[tier] = _TIER_COUNT.get(tier, 0) + 1
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and len(session.items) > 1:
        parts = ", ".join(f"{tier} {_TIER_COUNT[tier]}" for tier in TIERS if tier in _TIER_COUNT)
        reporter.write_line(f"tiers: {parts} (each tier's time is summed at the end)")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """A heading when a tier begins (here, outside the test's output capture)."""
    tier = _TIER_OF.get(nodeid, "fast")
    if tier in _TIER_SEEN:
        return
    _TIER_SEEN[tier] = [0, 0, 0, 0, 0.0]
    reporter = _REPORTER[0].pluginmanager.get_plugin("terminalreporter") if _REPORTER else None
    if reporter is not None and len(_TIER_OF) > 1:
        n = _TIER_COUNT.get(tier, 0)
        if getattr(reporter._tw, "width_of_current_line", 0):  # after a row of progress dots
            reporter.write("\n")
        reporter.write_line(f"── {tier} tier: {n} test{'s' if n != 1 else ''} ({TIER_WHAT[tier]})")


_REPORTER: list[pytest.Config] = []  # the config, whose terminal reporter writes the headings


def pytest_configure(config: pytest.Config) -> None:
    _REPORTER[:] = [config]


TIER_WHAT = {
    "fast": "no tmux, no server",
    "integration": "real tmux, cao-server, scripted agents",
    "realcli": "the real agent CLIs, offline, in a loopback-only namespace",
    "browser": "the dashboard in Chromium",
}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _TIER_OF.get(report.nodeid, "fast")
    seen = _TIER_SEEN.setdefault(tier, [0, 0, 0, 0, 0.0])
    seen[4] += report.duration
    if report.when == "setup":
        seen[0] += 1
    if report.failed:
        seen[2] += 1
    elif report.skipped:
        seen[3] += 1
    elif report.passed and report.when == "call":
        seen[1] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TIER_SEEN:
        return
    terminalreporter.section("where the time went", sep="-")
    for tier in TIERS:
        if tier in _TIER_SEEN:
            n, passed, failed, skipped, seconds = _TIER_SEEN[tier]
            terminalreporter.write_line(
                f"{tier:<12} {int(n):>4} tests  {int(passed):>4} passed  {int(failed):>3} failed  "
                f"{int(skipped):>3} skipped  {seconds / 60:6.1f} min"
            )


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Strip TMUX*/CAO_* and point HOME at a temp dir, for this test and what it starts."""
    for key in list(os.environ):
        if key.startswith(("TMUX", "CAO_")):
            monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return dict(os.environ)


@pytest.fixture
def tmux_socket() -> Iterator[str]:
    name = f"cao-test-{secrets.token_hex(4)}"
    yield name
    tmux = Tmux(name)
    tmux.kill_server()
    with contextlib.suppress(Exception):
        path = tmux.server.socket_path or f"/tmp/tmux-{os.getuid()}/{name}"
        Path(path).unlink(missing_ok=True)
    Path(f"/tmp/tmux-{os.getuid()}/{name}").unlink(missing_ok=True)


@pytest.fixture
def tmux(tmux_socket: str, tmux_client: str) -> Iterator[Tmux]:
    client = Tmux(tmux_socket, control=tmux_client == "control")
    yield client
    client.shutdown()


# -- both tmux clients: a module marked ``pytestmark = pytest.mark.tmux_clients`` runs each test
# twice, over the control-mode client (opt-in: CAO_TMUX_CONTROL=true) and over forked clients (the
# default, and the fallback); other tests run on the default
TMUX_CLIENTS = ("control", "forked")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marked = metafunc.definition.get_closest_marker("tmux_clients") is not None
    if marked and "tmux_client" in metafunc.fixturenames:
        metafunc.parametrize("tmux_client", TMUX_CLIENTS, indirect=True)
    both = metafunc.definition.get_closest_marker("db_backends") is not None
    if both and "db_backend" in metafunc.fixturenames:
        metafunc.parametrize("db_backend", DB_BACKENDS, indirect=True)


# -- both store backends: a module marked ``pytestmark = pytest.mark.db_backends`` runs each test
# that takes ``db_location`` twice, on a SQLite file and on a database of a real PostgreSQL server
# (one server for the whole run, a new database per test: cao/testing/pgserver.py)
DB_BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    why = pgserver.missing_reason()
    if why is not None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="cao-pg-"))
    server = PgServer.start(root)
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A new, empty database on the test server, dropped after the test."""
    url = pg_server.new_database()
    yield url
    pg_server.drop_database(url)


@pytest.fixture
def db_backend(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "sqlite"))


@pytest.fixture
def db_location(request: pytest.FixtureRequest, db_backend: str, tmp_path: Path) -> Path | str:
    """Where this test's store lives: a SQLite file, or a new PostgreSQL database's URL."""
    if db_backend == "postgresql":
        return str(request.getfixturevalue("pg_url"))
    return tmp_path / "cao.db"


@pytest.fixture
def tmux_client(request: pytest.FixtureRequest) -> str:
    """Which tmux client cao-server uses in this test: ``forked`` (the default) or ``control``."""
    return str(getattr(request, "param", "forked"))


# The whole suite on PostgreSQL: ``CAO_TEST_DATABASE=postgresql python -m pytest`` gives every
# core and cao-server a new database of the test server instead of $CAO_HOME/cao.db (read here,
# before clean_env strips CAO_* from the tests' environment).
SUITE_DATABASE = os.environ.get("CAO_TEST_DATABASE", "sqlite")


@pytest.fixture
def suite_database_url(request: pytest.FixtureRequest) -> str | None:
    """The database this test's cao runs on when the suite runs on PostgreSQL (else None)."""
    if SUITE_DATABASE != "postgresql":
        return None
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def settings(tmp_path: Path, tmux_socket: str, tmux_client: str, suite_database_url: str | None) -> Settings:
    return Settings(
        home=tmp_path / "cao",
        database_url=suite_database_url,
        tmux_socket=tmux_socket,
        tmux_control=tmux_client == "control",
        server_url="http://127.0.0.1:9",  # nothing listens: agents can't reach a server in core tests
        sweep_interval=0.5,
        sweep_grace=1.0,
        scripted_record=True,
        allowed_hosts=("testserver",),  # FastAPI's TestClient sends Host: testserver
    )


@pytest.fixture
def make_core(clean_env: dict[str, str]) -> Iterator[Callable[..., Cao]]:
    made: list[Cao] = []

    def make(settings: Settings, *, start: bool = True) -> Cao:
        core = Cao(settings, environ=clean_env)
        if start:
            core.start()
        made.append(core)
        return core

    yield make
    for core in made:
        core.stop()


@pytest.fixture
def core(make_core: Callable[..., Cao], settings: Settings) -> Cao:
    return make_core(settings)


@pytest.fixture
def make_server(
    tmp_path: Path, tmux_socket: str, tmux_client: str, suite_database_url: str | None
) -> Iterator[Callable[..., ServerProcess]]:
    made: list[ServerProcess] = []

    def make(home: Path | None = None, cwd: Path = REPO, **env: str) -> ServerProcess:
        env.setdefault("CAO_TMUX_CONTROL", "true" if tmux_client == "control" else "false")
        if suite_database_url is not None:
            env.setdefault("CAO_DATABASE_URL", suite_database_url)
        if "CAO_DATABASE_URL" in env:  # a server killed and started again waits out its lease
            env.setdefault("CAO_HOST_HEARTBEAT", "0.3")
            env.setdefault("CAO_HOST_LEASE", "1.5")
        srv = ServerProcess(home or tmp_path / "cao", tmux_socket, cwd, **env)
        made.append(srv)
        return srv.start()

    yield make
    for srv in made:
        srv.stop()


@pytest.fixture
def clock() -> Clock:
    """A hand-moved clock for a store under test (tests/helpers.py ``Clock``)."""
    return Clock()
