"""Every knob of cao, read once from an injectable environment mapping.

``Settings.from_env(environ)`` is the only place that reads ``CAO_*`` variables; everything else
takes a ``Settings`` object, so tests pass ``environ={...}`` instead of patching ``os.environ``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from cao.errors import InvalidInput
from cao.knobs import parse_flag, parse_number


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """Unset: ``default``; set (even to ""): parsed by the one boolean parser (cao/knobs.py)."""
    raw = environ.get(name)
    return default if raw is None else parse_flag(name, raw)


def _number(environ: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return parse_number(name, raw, example=default, minimum=minimum)


def _words(environ: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list, e.g. ``CAO_ALLOWED_ORIGINS=http://a:3000,http://b``."""
    return tuple(word.strip() for word in (environ.get(name) or "").split(",") if word.strip())


def _pairs(environ: Mapping[str, str], name: str) -> tuple[tuple[str, str], ...]:
    """``a=b`` pairs, comma-separated, e.g. ``CAO_PROVIDER_ALIASES=kiro_cli=claude_code``."""
    pairs = []
    for word in _words(environ, name):
        key, sep, value = word.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInput(f"{name}: {word!r} is not NAME=VALUE; use e.g. {name}=kiro_cli=claude_code")
        pairs.append((key.strip(), value.strip()))
    return tuple(pairs)


def database_url(raw: str | None, name: str = "CAO_DATABASE_URL") -> str | None:
    """A PostgreSQL URL (``postgresql://user:password@host:5432/cao``), or None for the SQLite file.
    The error never repeats the value: it may carry a password."""
    from urllib.parse import urlsplit

    raw = (raw or "").strip()
    if not raw:
        return None
    example = "e.g. postgresql://cao:PASSWORD@db.internal:5432/cao (or unset it for $CAO_HOME/cao.db)"
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - a port that isn't a number raises here
    except ValueError:
        raise InvalidInput(f"{name} is not a URL; give a postgresql:// URL, {example}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidInput(
            f"{name} must be a postgresql:// URL (its scheme is {parts.scheme or 'missing'!r}); {example}"
        )
    if not parts.path.strip("/"):
        raise InvalidInput(f"{name} names no database (the part after the last /); {example}")
    return raw


HOST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def host_name(raw: str | None, name: str = "CAO_HOST_NAME") -> str:
    """This server's name among the hosts sharing a store: ``raw``, else the machine's hostname."""
    value = (raw or "").strip()
    if not value:
        value = socket.gethostname().split(".")[0] or "localhost"
        if not HOST_NAME_RE.fullmatch(value):
            value = "localhost"
    if not HOST_NAME_RE.fullmatch(value):
        raise InvalidInput(
            f"{name}={value[:80]!r} is not a host name cao can use: 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. CAO_HOST_NAME=build-2)"
        )
    return value


MAX_HOST_LEASE = 600.0


def _lease(lease: float) -> float:
    """``CAO_HOST_LEASE``: at least three heartbeats, at most 10 minutes (a dead host's terminals
    read unreachable, and can be failed, only once its lease lapsed)."""
    if lease > MAX_HOST_LEASE:
        raise InvalidInput(
            f"CAO_HOST_LEASE={lease:g} is over {MAX_HOST_LEASE:g} s: a host that dies would hold its "
            "terminals that long; use e.g. CAO_HOST_LEASE=15"
        )
    return lease


def _url(environ: Mapping[str, str], name: str) -> str | None:
    """An http(s) URL, e.g. ``CAO_NOTIFY_URL=http://127.0.0.1:8000/cao``; unset or empty: None."""
    from urllib.parse import urlsplit

    raw = (environ.get(name) or "").strip()
    if not raw:
        return None
    example = "e.g. http://127.0.0.1:8000/cao"
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - a port that isn't a number raises here
    except ValueError as exc:
        raise InvalidInput(
            f"{name} is not a URL ({exc}); give an http:// or https:// URL, {example}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{name} must be an http:// or https:// URL with a host, {example}")
    return raw


@dataclass(frozen=True)
class Settings:
    home: Path
    tmux_socket: str | None = None
    tmux_control: bool = False  # opt-in: one persistent tmux control-mode client (docs/tmux.md)
    output_wakes: bool = True  # %output of busy receivers wakes delivery once they go quiet
    api_host: str = "127.0.0.1"
    api_port: int = 9889
    server_url: str = "http://127.0.0.1:9889"
    eager_delivery: bool = False
    # delivery engine
    watch_interval: float = 0.05
    sweep_interval: float = 30.0
    sweep_grace: float = 30.0
    max_attempts: int = 5
    lease_seconds: float = 60.0
    delivery_workers: int = 32
    mcp_ready_timeout: float = 30.0
    hooks: bool = True  # wire the agent CLIs' lifecycle hooks to cao-server (cao/hookstate.py)
    hook_settle: float = 5.0  # seconds a hook may be ahead of the screen before they disagree
    input_ready_timeout: float = 60.0  # typed input waits this long for a starting agent
    input_wait_timeout: float = 10.0  # typed input waits this long for a person's text or tmux mode
    recovery_settle: float = 0.5  # recovery waits this long after fencing a pane before it looks
    batch_max_messages: int = 20
    inline_limit: int = 4096  # a body longer than this (bytes) is announced, not typed (read_message)
    retry_delay: float = 1.0  # a failed attempt is retried after this long (and by the sweep)
    # tmux / logs
    log_cap_bytes: int = 8 * 1024 * 1024
    log_cap_interval: float = 2.0  # how often pane logs are checked against the cap
    pipe_check_interval: float = 5.0  # how often closed pane log pipes are looked for and reopened
    pane_width: int = 200
    pane_height: int = 50
    history_limit: int = 50000
    # store: a SQLite file in home (None), or a PostgreSQL server several hosts share
    database_url: str | None = field(default=None, repr=False)  # may carry a password
    busy_timeout: float = 5.0
    # hosts sharing one store (cao/hosts.py, docs/multi-host.md): this server's name among them, how
    # often it renews its lease and how long a lease lasts without renewal
    host_name: str = "localhost"
    host_heartbeat: float = 2.0
    host_lease: float = 15.0
    # testing only: os._exit(1) at a named point of the delivery path
    fault_point: str | None = None
    # bundled scripted agent
    scripted_record: bool = False
    # who may call the API (docs/security.md)
    api_token: str | None = field(default=None, repr=False)  # never in a log line
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    # another orchestrator's provider names, run by one of ours (docs/compatibility.md)
    provider_aliases: tuple[tuple[str, str], ...] = ()
    # where workers' git worktrees go (docs/worktrees.md); None = $CAO_HOME/worktrees
    worktrees_root: Path | None = None
    # the interpreter's thread switch interval (sys.setswitchinterval), for measuring
    gil_switch_interval: float = 0.0005
    # run the `setup:` commands of a repository's .cao/worktree.yaml (its code, on your machine)
    worktree_setup_commands: bool = False
    # coordination (docs/orchestration.md): the operator's webhook for worker events, and limits
    notify_url: str | None = field(default=None, repr=False)  # may carry a secret in its path
    notify_timeout: float = 5.0  # one POST waits this long
    notify_retries: int = 3  # a failed POST is tried again this often (1 s, 2 s, 4 s … apart)
    notice_unknown_after: float = 120.0  # a working agent whose status reads unknown this long: failed
    schedule_min_every: float = 60.0  # the shortest interval of a repeating wake-up
    schedules_per_terminal: int = 50

    @property
    def db_path(self) -> Path:
        return self.home / "cao.db"

    @property
    def db_location(self) -> Path | str:
        """The store: ``CAO_DATABASE_URL`` when set, else ``$CAO_HOME/cao.db``."""
        return self.database_url or self.db_path

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs" / "terminal"

    @property
    def server_log(self) -> Path:
        return self.home / "logs" / "server.log"

    @property
    def scripted_dir(self) -> Path:
        return self.home / "scripted"

    @property
    def profiles_dir(self) -> Path:
        return self.home / "agent-store"

    @property
    def worktrees_dir(self) -> Path:
        """Workers' git worktrees: ``<this>/<repository name>/<profile>-<terminal id>``."""
        return self.worktrees_root if self.worktrees_root is not None else self.home / "worktrees"

    @property
    def token_file(self) -> Path:
        """Where cao-server publishes the API token it uses, for cao, agents and their MCP servers."""
        return self.home / "api-token"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        home_env = env.get("CAO_HOME")
        home = Path(home_env).expanduser() if home_env else Path(env.get("HOME") or Path.home()) / ".cao"
        host = env.get("CAO_API_HOST") or "127.0.0.1"
        port = int(_number(env, "CAO_API_PORT", 9889, minimum=0))
        if port > 65535:
            raise InvalidInput(f"CAO_API_PORT={port} is not a TCP port; use 1-65535")
        url = env.get("CAO_SERVER_URL") or f"http://{host}:{port}"
        return cls(
            home=home,
            tmux_socket=env.get("CAO_TMUX_SOCKET") or None,
            tmux_control=_flag(env, "CAO_TMUX_CONTROL", False),
            output_wakes=_flag(env, "CAO_OUTPUT_WAKES", True),
            api_host=host,
            api_port=port,
            server_url=url.rstrip("/"),
            eager_delivery=_flag(env, "CAO_EAGER_INBOX_DELIVERY", False),
            watch_interval=_number(env, "CAO_WATCH_INTERVAL", 0.05, minimum=0.005),
            sweep_interval=_number(env, "CAO_INBOX_RECONCILE_INTERVAL", 30.0, minimum=0.05),
            sweep_grace=_number(env, "CAO_INBOX_RECONCILE_GRACE_SECONDS", 30.0),
            max_attempts=int(_number(env, "CAO_DELIVERY_MAX_ATTEMPTS", 5, minimum=1)),
            lease_seconds=_number(env, "CAO_DELIVERY_LEASE_SECONDS", 60.0, minimum=1),
            delivery_workers=int(_number(env, "CAO_DELIVERY_WORKERS", 32, minimum=1)),
            mcp_ready_timeout=_number(env, "CAO_MCP_READY_TIMEOUT", 30.0),
            hooks=_flag(env, "CAO_HOOKS", True),
            hook_settle=_number(env, "CAO_HOOK_SETTLE", 5.0),
            input_ready_timeout=_number(env, "CAO_INPUT_READY_TIMEOUT", 60.0),
            input_wait_timeout=_number(env, "CAO_INPUT_WAIT_TIMEOUT", 10.0),
            log_cap_bytes=int(_number(env, "CAO_LOG_CAP_BYTES", 8 * 1024 * 1024, minimum=4096)),
            log_cap_interval=_number(env, "CAO_LOG_CAP_INTERVAL", 2.0, minimum=0.05),
            pipe_check_interval=_number(env, "CAO_PIPE_CHECK_INTERVAL", 5.0, minimum=0.05),
            retry_delay=_number(env, "CAO_DELIVERY_RETRY_DELAY", 1.0, minimum=0.0),
            inline_limit=int(_number(env, "CAO_INBOX_INLINE_LIMIT", 4096, minimum=256)),
            database_url=database_url(env.get("CAO_DATABASE_URL")),
            busy_timeout=_number(env, "CAO_DB_BUSY_TIMEOUT", 5.0, minimum=0.01),
            host_name=host_name(env.get("CAO_HOST_NAME")),
            host_heartbeat=(beat := _number(env, "CAO_HOST_HEARTBEAT", 2.0, minimum=0.05)),
            host_lease=_lease(_number(env, "CAO_HOST_LEASE", max(15.0, 3 * beat), minimum=3 * beat)),
            fault_point=env.get("CAO_FAULT_POINT") or None,
            scripted_record=_flag(env, "CAO_SCRIPTED_RECORD", False),
            api_token=(env.get("CAO_API_TOKEN") or "").strip() or None,
            allowed_origins=_words(env, "CAO_ALLOWED_ORIGINS"),
            allowed_hosts=_words(env, "CAO_ALLOWED_HOSTS"),
            provider_aliases=_pairs(env, "CAO_PROVIDER_ALIASES"),
            worktrees_root=Path(env["CAO_WORKTREES_DIR"]).expanduser()
            if env.get("CAO_WORKTREES_DIR")
            else None,
            worktree_setup_commands=_flag(env, "CAO_WORKTREE_SETUP_COMMANDS", False),
            gil_switch_interval=_number(env, "CAO_GIL_SWITCH_INTERVAL", 0.0005, minimum=0.00001),
            notify_url=_url(env, "CAO_NOTIFY_URL"),
            notify_timeout=_number(env, "CAO_NOTIFY_TIMEOUT", 5.0, minimum=0.1),
            notify_retries=int(_number(env, "CAO_NOTIFY_RETRIES", 3, minimum=0)),
            notice_unknown_after=_number(env, "CAO_NOTICE_UNKNOWN_AFTER", 120.0, minimum=1),
            schedule_min_every=_number(env, "CAO_SCHEDULE_MIN_EVERY", 60.0, minimum=0.1),
            schedules_per_terminal=int(_number(env, "CAO_SCHEDULES_PER_TERMINAL", 50, minimum=1)),
        )

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    def ensure_dirs(self) -> None:
        for path in (self.home, self.logs_dir, self.scripted_dir, self.profiles_dir):
            path.mkdir(parents=True, exist_ok=True)


# -- the CAO_* names ----------------------------------------------------------------------------------
# What Settings.from_env reads (tests/test_docs.py checks docs/configuration.md names each one).
SERVER_NAMES = (
    "CAO_HOME",
    "CAO_TMUX_SOCKET",
    "CAO_TMUX_CONTROL",
    "CAO_OUTPUT_WAKES",
    "CAO_API_HOST",
    "CAO_API_PORT",
    "CAO_SERVER_URL",
    "CAO_EAGER_INBOX_DELIVERY",
    "CAO_WATCH_INTERVAL",
    "CAO_INBOX_RECONCILE_INTERVAL",
    "CAO_INBOX_RECONCILE_GRACE_SECONDS",
    "CAO_DELIVERY_MAX_ATTEMPTS",
    "CAO_DELIVERY_LEASE_SECONDS",
    "CAO_DELIVERY_WORKERS",
    "CAO_INBOX_INLINE_LIMIT",
    "CAO_MCP_READY_TIMEOUT",
    "CAO_HOOKS",
    "CAO_HOOK_SETTLE",
    "CAO_INPUT_READY_TIMEOUT",
    "CAO_INPUT_WAIT_TIMEOUT",
    "CAO_LOG_CAP_BYTES",
    "CAO_LOG_CAP_INTERVAL",
    "CAO_PIPE_CHECK_INTERVAL",
    "CAO_DELIVERY_RETRY_DELAY",
    "CAO_DATABASE_URL",
    "CAO_DB_BUSY_TIMEOUT",
    "CAO_HOST_NAME",
    "CAO_HOST_HEARTBEAT",
    "CAO_HOST_LEASE",
    "CAO_FAULT_POINT",
    "CAO_SCRIPTED_RECORD",
    "CAO_API_TOKEN",
    "CAO_ALLOWED_ORIGINS",
    "CAO_ALLOWED_HOSTS",
    "CAO_PROVIDER_ALIASES",
    "CAO_WORKTREES_DIR",
    "CAO_WORKTREE_SETUP_COMMANDS",
    "CAO_GIL_SWITCH_INTERVAL",
    "CAO_NOTIFY_URL",
    "CAO_NOTIFY_TIMEOUT",
    "CAO_NOTIFY_RETRIES",
    "CAO_NOTICE_UNKNOWN_AFTER",
    "CAO_SCHEDULE_MIN_EVERY",
    "CAO_SCHEDULES_PER_TERMINAL",
)
# What cao sets in each agent's own environment (cao-server started from an agent's pane has them).
AGENT_NAMES = ("CAO_TERMINAL_ID", "CAO_AGENT_PROFILE", "CAO_SCRIPTED_DIR", "CAO_SCRIPTED_HOOK")
# The test suite's own (tests/prepare.py, the real-CLI bed).
TEST_NAMES = ("CAO_TEST_CACHE", "CAO_REALCLI_CACHE", "CAO_REALCLI_PYTHON", "CAO_REALCLI_LOCK_WAIT")


def check_environment(environ: Mapping[str, str]) -> list[str]:
    """At cao-server's start: every provider knob that is set must parse (a bad value raises
    :class:`InvalidInput` naming it: ``CAO_CLAUDE_BYPASS=ture`` would otherwise only fail at a
    launch), and a ``CAO_*`` name nothing reads is worth a warning (a typo keeps a default
    silently). Returns the warnings."""
    import difflib

    import providers

    known = {*SERVER_NAMES, *AGENT_NAMES, *TEST_NAMES}
    for knob in providers.all_knobs():
        known.add(knob.name)
        if environ.get(knob.name, "").strip():
            knob.read(environ)
    warnings = []
    for name in sorted(k for k in environ if k.startswith("CAO_") and k not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else "; docs/configuration.md lists them"
        warnings.append(f"{name} is not a cao setting, so it changes nothing{hint}")
    return warnings
