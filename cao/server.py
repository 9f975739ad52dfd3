"""``cao-server``: the HTTP API plus the delivery engine, in one process per ``CAO_HOME``."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

import click

import cao
from cao import apitoken, runfile, security
from cao.errors import CaoError
from cao.settings import Settings, check_environment
from cao.settings import database_url as settings_database_url

logger = logging.getLogger("cao.server")

EPILOG = """\b
Examples:
  cao-server                          # 127.0.0.1:9889, agents on your default tmux server
  CAO_TMUX_SOCKET=cao cao-server      # agents on a private tmux server (tmux -L cao attach)
  CAO_EAGER_INBOX_DELIVERY=true cao-server --port 9999
  CAO_DATABASE_URL=postgresql://cao:PASSWORD@db:5432/cao cao-server   # a store shared by hosts
  CAO_HOST_NAME=build-2 CAO_SERVER_URL=http://build-2:9889 cao-server --host 0.0.0.0   # one of them

\b
Environment: CAO_HOME (default ~/.cao), CAO_TMUX_SOCKET, CAO_API_HOST, CAO_API_PORT,
CAO_EAGER_INBOX_DELIVERY, CAO_WATCH_INTERVAL, CAO_INBOX_RECONCILE_INTERVAL,
CAO_INBOX_RECONCILE_GRACE_SECONDS, CAO_DELIVERY_MAX_ATTEMPTS, CAO_API_TOKEN, CAO_ALLOWED_HOSTS,
CAO_ALLOWED_ORIGINS, CAO_DATABASE_URL, CAO_HOST_NAME (see docs/configuration.md, docs/security.md
and docs/multi-host.md; prefer CAO_DATABASE_URL to --database-url: a command line is seen by ps).

\b
Listening beyond loopback (--host 0.0.0.0) needs a token:
  export CAO_API_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
cao-server writes the token it uses to $CAO_HOME/api-token (mode 0600), where cao and the agents'
MCP servers find it.
"""


class _Lock:
    """One server per CAO_HOME: a second one would race the first for the same panes. The lock is
    held on the home directory itself (a deleted ``server.lock`` can't break it) and on
    ``server.lock``, which names the holder's pid."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.dir_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
        self.file: IO[str] | None = None
        try:
            fcntl.flock(self.dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.file = (home / "server.lock").open("a+")
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = "?"
            with contextlib.suppress(OSError):
                pid = (home / "server.lock").read_text().strip() or "?"
            self.close()
            raise click.ClickException(
                f"another cao-server (pid {pid}) is already using {home}; stop it first or set CAO_HOME"
            ) from None
        except BaseException:
            self.close()
            raise
        self.file.seek(0)
        self.file.truncate()
        self.file.write(str(os.getpid()))
        self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        with contextlib.suppress(OSError):
            os.close(self.dir_fd)


def _file_problem(exc: OSError) -> str:
    where = exc.filename2 or exc.filename or "a file under CAO_HOME"  # a rename: the target
    if isinstance(exc, IsADirectoryError):
        return f"{where} is a directory; remove it (cao-server makes that file itself)"
    return f"cannot use {where}: {exc.strerror or exc}; fix its permissions or remove it, then start again"


def _port_free(host: str, port: int) -> bool:
    if port == 0:
        return True
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# What every LogRecord has; anything else on a record came from ``extra={...}``.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and not k.startswith("_")}


class JsonLines(logging.Formatter):
    """One JSON object per line: time, level, logger, message, every ``extra`` field, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{record.msecs:03.0f}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **extra_fields(record),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class KeyValues(logging.Formatter):
    """For people: the classic line, then ``key=value`` for every ``extra`` field."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in extra_fields(record).items())
        return f"{text} {fields}" if fields else text


def configure_logging(settings: Settings, level: str) -> None:
    """stderr for people, ``$CAO_HOME/logs/server.log`` as JSON lines for tools (uvicorn's too)."""
    settings.server_log.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.setLevel(level.upper())
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(KeyValues("%(asctime)s %(levelname)s %(name)s %(message)s"))
    file = logging.FileHandler(settings.server_log)
    file.setFormatter(JsonLines())
    for handler in (stderr, file):
        root.addHandler(handler)


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(settings: Settings) -> None:
    """Beyond loopback, whoever reaches the port could run commands as you: a token is required."""
    if settings.api_token is not None:
        apitoken.check(settings.api_token)
    elif not is_loopback(settings.api_host):
        raise click.ClickException(
            f"refusing to listen on {settings.api_host} without an API token: anyone who can reach it "
            "could type into your agents. Set one and start again:\n"
            f"  export CAO_API_TOKEN=$({apitoken.GENERATE})\n"
            "cao and your agents pick it up from $CAO_HOME/api-token (docs/security.md); "
            "or listen on 127.0.0.1"
        )


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option("--host", default=None, help="Address to listen on (default CAO_API_HOST or 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port to listen on (default CAO_API_PORT or 9889).")
@click.option(
    "--log-level",
    default="info",
    type=click.Choice(["debug", "info", "warning", "error"]),
    show_default=True,
    help="Server log level (message bodies are never logged at info).",
)
@click.option(
    "--database-url",
    default=None,
    metavar="URL",
    help="The store: a postgresql:// URL shared by several hosts (default CAO_DATABASE_URL, else "
    "the SQLite file $CAO_HOME/cao.db). docs/multi-host.md.",
)
@click.version_option(cao.__version__, "--version")
def main(host: str | None, port: int | None, log_level: str, database_url: str | None) -> None:
    """Run the cao HTTP API and the inbox delivery engine.

    Agents run in tmux windows (one per terminal, sessions named cao-NAME); this server creates
    them, reads their status from the screen, and delivers inbox messages to them.
    """
    import uvicorn

    from cao.api import create_app
    from cao.core import Cao

    try:
        settings = Settings.from_env()
        unknown = check_environment(os.environ)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    for warning in unknown:
        click.echo(f"warning: {warning}", err=True)
    if database_url is not None:
        try:
            settings = settings.with_(database_url=settings_database_url(database_url, "--database-url"))
        except CaoError as exc:
            raise click.BadParameter(exc.message, param_hint="--database-url") from None
    host = host or settings.api_host
    port = settings.api_port if port is None else port
    if not 0 <= port <= 65535:
        raise click.BadParameter(f"{port} is not a TCP port; use 1-65535", param_hint="--port")
    settings = settings.with_(
        api_host=host,
        api_port=port,
        # CAO_SERVER_URL when set (agents reach the server there), else this address
        server_url=settings.server_url if os.environ.get("CAO_SERVER_URL") else f"http://{host}:{port}",
    )
    try:
        check_exposure(settings)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    try:
        lock = _Lock(settings.home)
    except OSError as exc:
        raise click.ClickException(_file_problem(exc)) from None
    if not _port_free(host, port):
        raise click.ClickException(
            f"{host}:{port} is already in use; pick another with --port or CAO_API_PORT"
        )
    configure_logging(settings, log_level)
    # Many short-lived threads (HTTP workers, delivery runners) pass the GIL back and forth; the
    # default 5 ms switch interval adds up to tens of ms per request under load. 0.5 ms keeps
    # send latency low (CAO_GIL_SWITCH_INTERVAL overrides it, for measuring).
    sys.setswitchinterval(settings.gil_switch_interval)
    try:
        core = Cao(settings)
        # this process lost its host name (an operator failed the host, or it was taken over): stop
        core.on_fenced.append(lambda _why: os.kill(os.getpid(), signal.SIGTERM))
        apitoken.publish(settings)
        core.engine.keepers.append(lambda: apitoken.keep(settings))
        adopted = core.start()
        runfile.write(settings.home, url=settings.server_url, tmux_socket=settings.tmux_socket)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    except OSError as exc:  # a file under CAO_HOME that is a directory, unreadable, on a full disk
        raise click.ClickException(_file_problem(exc)) from None
    logger.info(
        "cao-server listening on %s:%s (home %s, store %s, tmux socket %s, adopted %d, gone %d)",
        host,
        port,
        settings.home,
        core.store.where,
        settings.tmux_socket or "default",
        len(adopted["adopted"]),
        len(adopted["gone"]),
    )
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it under the handler that was there
    # before: make that one leave through Python, so the cleanup below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(
            create_app(core),
            host=host,
            port=port,
            http="h11",  # its limit below is what lets a long URL reach the guard and get a 414
            h11_max_incomplete_event_size=security.H11_MAX_EVENT,
            log_config=None,  # uvicorn's lines go through our handlers (JSON in the file)
            log_level="warning",
            access_log=False,  # the query form would put message bodies in it
            # an open event stream (a dashboard) never ends by itself: stop waiting for it, so a
            # stop (or a host that lost its name) ends the process and releases CAO_HOME
            timeout_graceful_shutdown=3,
        )
    finally:
        runfile.remove(settings.home)
        core.stop()
        lock.close()


if __name__ == "__main__":
    main()
