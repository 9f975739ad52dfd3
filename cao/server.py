"""``cao-server``: the HTTP API plus the delivery engine, in one process per ``CAO_HOME``."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import sys
from pathlib import Path
from typing import IO

import click

import cao
from cao.errors import CaoError
from cao.settings import Settings

logger = logging.getLogger("cao.server")

EPILOG = """\b
Examples:
  cao-server                          # 127.0.0.1:9889, agents on your default tmux server
  CAO_TMUX_SOCKET=cao cao-server      # agents on a private tmux server (tmux -L cao attach)
  CAO_EAGER_INBOX_DELIVERY=true cao-server --port 9999

\b
Environment: CAO_HOME (default ~/.cao), CAO_TMUX_SOCKET, CAO_API_HOST, CAO_API_PORT,
CAO_EAGER_INBOX_DELIVERY, CAO_WATCH_INTERVAL, CAO_INBOX_RECONCILE_INTERVAL,
CAO_INBOX_RECONCILE_GRACE_SECONDS, CAO_DELIVERY_MAX_ATTEMPTS (see docs/configuration.md).
"""


def _lock(home: Path) -> IO[str]:
    """One server per CAO_HOME: a second one would race the first for the same panes."""
    home.mkdir(parents=True, exist_ok=True)
    fh = (home / "server.lock").open("a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        raise click.ClickException(
            f"another cao-server (pid {pid}) is already using {home}; stop it first or set CAO_HOME"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


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


def configure_logging(settings: Settings, level: str) -> None:
    settings.server_log.parent.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    root = logging.getLogger()
    root.setLevel(level.upper())
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(settings.server_log)):
        handler.setFormatter(fmt)
        root.addHandler(handler)


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
@click.version_option(cao.__version__, "--version")
def main(host: str | None, port: int | None, log_level: str) -> None:
    """Run the cao HTTP API and the inbox delivery engine.

    Agents run in tmux windows (one per terminal, sessions named cao-NAME); this server creates
    them, reads their status from the screen, and delivers inbox messages to them.
    """
    import uvicorn

    from cao.api import create_app
    from cao.core import Cao

    try:
        settings = Settings.from_env()
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    host = host or settings.api_host
    port = settings.api_port if port is None else port
    if not 0 <= port <= 65535:
        raise click.BadParameter(f"{port} is not a TCP port; use 1-65535", param_hint="--port")
    settings = settings.with_(
        api_host=host, api_port=port, server_url=os.environ.get("CAO_SERVER_URL") or f"http://{host}:{port}"
    )
    lock = _lock(settings.home)
    if not _port_free(host, port):
        raise click.ClickException(
            f"{host}:{port} is already in use; pick another with --port or CAO_API_PORT"
        )
    configure_logging(settings, log_level)
    # Many short-lived threads (HTTP workers, delivery runners) pass the GIL back and forth; the
    # default 5 ms switch interval adds up to tens of ms per request under load. 0.5 ms keeps
    # send latency low (CAO_GIL_SWITCH_INTERVAL overrides it, for measuring).
    sys.setswitchinterval(float(os.environ.get("CAO_GIL_SWITCH_INTERVAL", "0.0005")))
    try:
        core = Cao(settings)
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    adopted = core.start()
    logger.info(
        "cao-server listening on %s:%s (home %s, tmux socket %s, adopted %d, gone %d)",
        host,
        port,
        settings.home,
        settings.tmux_socket or "default",
        len(adopted["adopted"]),
        len(adopted["gone"]),
    )
    try:
        uvicorn.run(create_app(core), host=host, port=port, log_level="warning", access_log=False)
    finally:
        core.stop()
        lock.close()


if __name__ == "__main__":
    main()
