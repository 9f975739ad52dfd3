"""How ``cao`` (and ``cao watch``, ``cao demo``) reach cao-server: where it is (the environment, or
the server running for this CAO_HOME), its token, and an httpx client whose errors become a
``click.ClickException`` that says what to do (exit 1)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import click
import httpx

from cao import apitoken, runfile
from cao.errors import CaoError, InvalidInput
from cao.names import validate_message_id, validate_session_name, validate_terminal_id
from cao.settings import Settings


class Client:
    """A small httpx client for cao-server; errors become ClickException (exit 1)."""

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.Client | None = None,
        timeout: float = 60.0,
        auth: httpx.Auth | None = None,
    ):
        self.base_url = base_url
        self.found_in: str = "CAO_SERVER_URL"  # where the URL came from, for the "not reachable" error
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout, auth=auth)

    def response(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The raw answer (for callers that read an error's fields); unreachable → exit 1. A path
        with a ``?``, a ``#`` or a ``.``/``..`` segment is refused before it is sent: cao's routes
        have none, so one came from a name or id a person typed, and sent as it is it would reach
        another route (``cao shutdown --session ../terminals/ID`` deleting that terminal)."""
        if "?" in path or "#" in path or any(seg in (".", "..") for seg in path.split("/")):
            raise click.ClickException(
                f"the name or id in {path!r} is not allowed: names and ids have no '/', '?', '#' or "
                "'..' in them (terminal ids are 8 hex digits; session names letters, digits, '_', '-')"
            )
        try:
            return self.http.request(method, path, **kwargs)
        except httpx.TransportError:
            raise click.ClickException(
                f"cao-server is not reachable at {self.base_url} ({self.found_in}); start it with "
                "`cao-server`, or point cao at a running one with CAO_SERVER_URL=http://HOST:PORT"
            ) from None

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.answer(self.response(method, path, **kwargs))

    def answer(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            if isinstance(detail, list):  # FastAPI validation errors
                detail = "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)
            raise click.ClickException(f"{detail} (HTTP {resp.status_code})")
        if resp.headers.get("content-type", "").startswith("application/json"):
            return resp.json()
        return resp.text

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)


def settings() -> Settings:
    """cao's settings from the environment; a bad value is a ClickException naming it."""
    try:
        return Settings.from_env()
    except CaoError as exc:
        raise click.ClickException(exc.message) from None


def server_location(settings: Settings, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The URL of the cao-server to talk to, and where it came from: CAO_SERVER_URL (or
    CAO_API_HOST/CAO_API_PORT) when set, else the server that is running for this CAO_HOME
    ($CAO_HOME/server.json), else the default."""
    env = os.environ if environ is None else environ
    if env.get("CAO_SERVER_URL"):
        return settings.server_url, "from CAO_SERVER_URL"
    if env.get("CAO_API_PORT") or env.get("CAO_API_HOST"):
        return settings.server_url, "from CAO_API_HOST/CAO_API_PORT"
    running = runfile.read(settings.home)
    if running is not None:
        return str(running["url"]).rstrip("/"), f"the server running for {settings.home}"
    return settings.server_url, f"the default; no cao-server is running for {settings.home}"


def for_context(ctx: click.Context) -> Client:
    """The command's client, made once per invocation (tests put their own in ``ctx.obj``)."""
    obj = ctx.ensure_object(dict)
    if "client" not in obj:
        found = settings()  # the token: CAO_API_TOKEN, else the one cao-server wrote to CAO_HOME
        url, found_in = server_location(found)
        client = Client(url, auth=apitoken.BearerAuth(found))
        client.found_in = found_in
        obj["client"] = client
    client_: Client = obj["client"]
    return client_


def _checked(validate: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, str | None], Any]:
    """A click callback that checks a name or id before it goes into a URL path (``?x=1`` or
    ``../`` would reach another route and answer something else): the server's own rule and words
    (cao/names.py), exit 1."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return validate(value)
        except InvalidInput as exc:
            raise click.ClickException(exc.message) from None

    return callback


checked_terminal_id = _checked(validate_terminal_id)  # 8 hex digits
checked_message_id = _checked(validate_message_id)  # digits: the id as an int
# a --session: with or without the cao- prefix, given on as typed
checked_session_name = _checked(lambda v: validate_session_name(v.removeprefix("cao-")) and v)
