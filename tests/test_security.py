"""Only the operator and their own agents can drive cao-server, and no input makes it fall over.

In-process (TestClient over a real core) for the tables of refused and odd requests; real
``cao-server`` subprocesses where the transport matters (long URLs, bodies streamed in, start-up
refusals, the token file, the log file) or where other processes must find the token.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import pytest
from fastapi.testclient import TestClient
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import TextContent

from cao import apitoken
from cao.api import create_app
from cao.core import Cao
from cao.security import Policy, split_host
from cao.server import JsonLines
from cao.settings import Settings
from tests.helpers import REPO, ServerProcess, received_bodies, server_env, wait_until, write_rules

TOKEN = "test-token-0123456789abcdef"
PORT = 9889  # the settings fixture's api_port


@pytest.fixture
def app_for(make_core: Callable[..., Cao], settings: Settings) -> Iterator[Callable[..., TestClient]]:
    """A TestClient over create_app for these settings changes (the core isn't started: no agents)."""
    clients: list[TestClient] = []

    def make(**changes: Any) -> TestClient:
        client = TestClient(create_app(make_core(settings.with_(**changes), start=False)))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def assert_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body: dict[str, Any] = r.json()
    assert isinstance(body["detail"], str) and body["detail"]
    assert isinstance(body["error"], str) and body["error"]
    return body


# -- browser-safe by default -------------------------------------------------------------------------
class Browser(NamedTuple):
    id: str
    method: str
    path: str
    headers: dict[str, str]
    status: int  # 403/400 refused; anything else means the route answered


LOCAL = f"127.0.0.1:{PORT}"
BROWSER = [
    Browser("simple cross-site POST", "post", "/sessions", {"origin": "http://evil.example"}, 403),
    Browser(
        "text/plain cross-site POST",
        "post",
        "/sessions",
        {"origin": "http://evil.example", "content-type": "text/plain"},
        403,
    ),
    Browser(
        "cross-site typing", "post", "/terminals/abcdef12/input?message=rm", {"origin": "http://e.x"}, 403
    ),
    Browser("cross-site DELETE", "delete", "/sessions/x", {"origin": "https://evil.example"}, 403),
    Browser("opaque origin", "post", "/sessions", {"origin": "null"}, 403),
    Browser("dev server on another port", "post", "/sessions", {"origin": "http://localhost:3000"}, 403),
    Browser("same origin", "post", "/sessions?provider=nope", {"origin": f"http://{LOCAL}"}, 422),
    Browser(
        "other loopback name, our port",
        "post",
        "/sessions?provider=nope",
        {"origin": f"http://localhost:{PORT}"},
        422,
    ),
    Browser("no origin (not a browser)", "post", "/sessions?provider=nope", {}, 422),
    Browser("cross-site read", "get", "/sessions", {"origin": "http://evil.example"}, 200),
    Browser("rebinding", "get", "/terminals", {"host": f"evil.example:{PORT}"}, 400),
    Browser("rebinding, state change", "post", "/sessions", {"host": f"evil.example:{PORT}"}, 400),
    Browser("loopback name, other port", "get", "/terminals", {"host": "127.0.0.1:8080"}, 400),
    Browser("malformed host", "get", "/terminals", {"host": "127.0.0.1:x"}, 400),
    Browser("127.0.0.1", "get", "/terminals", {"host": LOCAL}, 200),
    Browser("localhost", "get", "/terminals", {"host": f"localhost:{PORT}"}, 200),
    Browser("::1", "get", "/terminals", {"host": f"[::1]:{PORT}"}, 200),
    Browser("configured host", "get", "/terminals", {"host": "cao.internal"}, 200),
    Browser(
        "configured origin", "post", "/sessions?provider=nope", {"origin": "http://ui.internal:3000"}, 422
    ),
]


@pytest.mark.parametrize("case", BROWSER, ids=[c.id for c in BROWSER])
def test_browser_requests_are_refused_unless_same_origin_or_allowed(app_for, case: Browser):
    client = app_for(
        allowed_hosts=("testserver", "cao.internal"), allowed_origins=("http://ui.internal:3000",)
    )
    headers = {"host": LOCAL, **case.headers}
    r = client.request(case.method.upper(), case.path, headers=headers)
    if case.status in (400, 403):
        body = assert_error(r, case.status)
        assert body["error"] == ("OriginNotAllowed" if case.status == 403 else "HostNotAllowed")
        assert ("CAO_ALLOWED_ORIGINS" if case.status == 403 else "CAO_ALLOWED_HOSTS") in body["detail"]
    else:
        assert r.status_code == case.status, r.text


def test_a_refused_cross_site_post_starts_nothing(core: Cao):
    with TestClient(create_app(core)) as client:
        r = client.post(
            "/sessions",
            content=b'{"working_directory": "/"}',
            headers={"origin": "http://evil.example", "content-type": "text/plain"},
        )
        assert r.status_code == 403
        assert core.store.list_terminals() == [] and core.tmux.list_sessions() == []


class Body(NamedTuple):
    id: str
    kwargs: dict[str, Any]
    status: int


BODIES = [
    Body("text/plain", {"content": b'{"provider": "nope"}', "headers": {"content-type": "text/plain"}}, 415),
    Body("form", {"data": {"provider": "nope"}}, 415),
    Body("no content type", {"content": b'{"provider": "nope"}'}, 415),
    Body("query string, no body", {"params": {"provider": "nope"}}, 422),
    Body("JSON", {"json": {"provider": "nope"}}, 422),
    Body(
        "JSON with charset",
        {"content": b'{"provider": "nope"}', "headers": {"content-type": "Application/JSON; charset=utf-8"}},
        422,
    ),
]


@pytest.mark.parametrize("case", BODIES, ids=[b.id for b in BODIES])
def test_only_json_bodies_reach_the_routes(app_for, case: Body):
    r = app_for().post("/sessions", **case.kwargs)
    body = assert_error(r, case.status)
    if case.status == 422:
        assert "choose one of" in body["detail"]  # the route itself read the parameter
    else:
        assert "application/json" in body["detail"]


# -- tokens ----------------------------------------------------------------------------------------------
class Auth(NamedTuple):
    id: str
    path: str
    headers: dict[str, str]
    status: int


AUTH = [
    Auth("missing", "/terminals", {}, 401),
    Auth("wrong", "/terminals", {"authorization": "Bearer not-the-token-at-all"}, 401),
    Auth("prefix of it", "/terminals", {"authorization": f"Bearer {TOKEN[:-1]}"}, 401),
    Auth("not bearer", "/terminals", {"authorization": f"Basic {TOKEN}"}, 401),
    Auth("right", "/terminals", {"authorization": f"Bearer {TOKEN}"}, 200),
    Auth("scheme in lower case", "/terminals", {"authorization": f"bearer {TOKEN}"}, 200),
    Auth("schema needs it", "/openapi.json", {}, 401),
    Auth("health is open (liveness probes)", "/health", {}, 200),
]


@pytest.mark.parametrize("case", AUTH, ids=[a.id for a in AUTH])
def test_a_configured_token_is_required(app_for, case: Auth):
    r = app_for(api_token=TOKEN).get(case.path, headers=case.headers)
    if case.status == 401:
        body = assert_error(r, 401)
        assert body["error"] == "Unauthorized" and "CAO_API_TOKEN" in body["detail"]
        assert r.headers["www-authenticate"] == "Bearer"
        assert TOKEN not in r.text
    else:
        assert r.status_code == case.status, r.text


def test_bearer_auth_rereads_a_rotated_token_once(tmp_path: Path):
    settings = Settings(home=tmp_path)
    settings.token_file.write_text("old-token-0123456789\n")
    seen: list[str | None] = []
    rotations = ["new-token-0123456789"]

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") == "Bearer new-token-0123456789":
            return httpx.Response(200, json={"ok": True})
        if rotations:  # cao-server was restarted with a new token while this client ran
            settings.token_file.write_text(rotations.pop() + "\n")
        return httpx.Response(401, json={"detail": "no", "error": "Unauthorized"})

    auth = apitoken.BearerAuth(settings)
    with httpx.Client(transport=httpx.MockTransport(server), auth=auth, base_url="http://cao") as http:
        assert http.get("/terminals").status_code == 200
        assert seen == ["Bearer old-token-0123456789", "Bearer new-token-0123456789"]
        settings.token_file.unlink()
        assert http.get("/terminals").status_code == 401  # nothing new to try: one request, the 401 stands
        assert seen[2:] == [None]


def test_the_environment_wins_over_the_file(tmp_path: Path):
    settings = Settings(home=tmp_path, api_token="from-the-environment-123")
    settings.token_file.write_text("from-the-file-0123456789")
    assert apitoken.read(settings) == "from-the-environment-123"
    assert apitoken.read(settings.with_(api_token=None)) == "from-the-file-0123456789"
    assert apitoken.read(Settings(home=tmp_path / "elsewhere")) is None


def test_non_loopback_bind_without_a_token_is_refused(tmp_path: Path, tmux_socket: str):
    env = server_env(tmp_path / "cao", tmux_socket, 9)
    for host in ("0.0.0.0", "::", "192.0.2.1"):
        proc = subprocess.run(
            [sys.executable, "-m", "cao.server", "--host", host],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert proc.returncode == 1, proc.stderr
        assert f"refusing to listen on {host} without an API token" in proc.stderr
        assert "export CAO_API_TOKEN=$(python3 -c" in proc.stderr
    weak = subprocess.run(
        [sys.executable, "-m", "cao.server"],
        env={**env, "CAO_API_TOKEN": "short"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert weak.returncode == 1 and "at least 16" in weak.stderr
    assert not (tmp_path / "cao" / "api-token").exists()


def test_token_reaches_cao_the_scripted_agents_and_mcp_without_copying(make_server, tmp_path: Path):
    home = tmp_path / "cao"
    write_rules(
        home,
        "relay",
        {
            "rules": [
                {
                    "match": r"^pass to (?P<to>\w+): (?P<text>.+)$",
                    "reply": "passed",
                    "send": [{"to": "{to}", "message": "{text}"}],
                }
            ]
        },
    )
    srv: ServerProcess = make_server(home, CAO_API_TOKEN=TOKEN, CAO_SCRIPTED_RECORD="1")
    token_file = home / "api-token"
    assert token_file.read_text().strip() == TOKEN
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with srv.client() as anonymous:
        assert_error(anonymous.get("/terminals"), 401)
    # cao, with CAO_HOME only: it reads the token cao-server wrote
    env = {k: v for k, v in srv.env.items() if k != "CAO_API_TOKEN"} | {"CAO_SERVER_URL": srv.url}

    def cao(*args: str) -> Any:
        proc = subprocess.run(
            [sys.executable, "-m", "cao", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    relay = cao("launch", "--headless", "--agents", "relay", "--session-name", "tok", "--json")["id"]
    target = cao("launch", "--headless", "--session-name", "tok2", "--json")["id"]
    headers = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as http:
        for tid in (relay, target):
            wait_until(lambda tid=tid: http.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        # the scripted agent sends with urllib: its token comes from $CAO_HOME/api-token too
        cao("send", relay, f"pass to {target}: via the relay", "--json")
        wait_until(lambda: "via the relay" in received_bodies(home, target), timeout=20, what="relayed")
        sent = http.get(f"/terminals/{target}/inbox/messages").json()
        assert [(m["sender_id"], m["message"]) for m in sent] == [(relay, "via the relay")]
    assert {t["id"] for t in cao("status", "--json")} == {relay, target}

    # cao-mcp-server as an agent CLI starts it: CAO_HOME, no token in its environment
    async def whoami() -> str:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "cao.mcp"],
            env={"CAO_SERVER_URL": srv.url, "CAO_TERMINAL_ID": target, "CAO_HOME": str(home)},
            cwd=REPO,
        )
        with (home / "mcp.stderr").open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as mcp,
            ):
                await mcp.initialize()
                result = await mcp.call_tool("whoami", {})
                assert not result.is_error, result.content
                return "\n".join(c.text for c in result.content if isinstance(c, TextContent))

    assert target in anyio.run(whoami)


def test_a_server_without_token_removes_a_stale_token_file(make_server, tmp_path: Path):
    home = tmp_path / "cao"
    home.mkdir()
    (home / "api-token").write_text("left-over-from-an-earlier-run\n")
    srv = make_server(home)
    assert not (home / "api-token").exists()
    with srv.client() as http:
        assert http.get("/terminals").status_code == 200  # loopback without a token: zero setup


# -- odd input is a clean 4xx JSON error ---------------------------------------------------------------
class Odd(NamedTuple):
    id: str
    method: str
    path: str
    kwargs: dict[str, Any]
    status: int


def raw_json(data: bytes) -> dict[str, Any]:
    return {"content": data, "headers": {"content-type": "application/json"}}


INBOX = "/terminals/abcdef12/inbox/messages"
ODD = [
    Odd("superscript digit id", "get", "/messages/%C2%B2", {}, 422),
    Odd("arabic-indic digit id", "get", "/messages/%D9%A3", {}, 422),
    Odd("fullwidth digit id", "post", "/messages/%EF%BC%93/cancel", {}, 422),
    Odd("NUL in a path", "get", "/sessions/%00", {}, 422),
    Odd("NUL in a path, delete", "delete", "/sessions/a%00b", {}, 422),
    Odd("lone surrogate", "post", "/sessions", raw_json(b'{"session_name": "\\ud800"}'), 422),
    Odd("lone surrogate message", "post", INBOX, raw_json(b'{"message": "hi \\udfff"}'), 422),
    Odd("100k nested [", "post", "/sessions", raw_json(b"[" * 100_000), 422),
    Odd("100k nested {", "post", "/sessions", raw_json(b'{"a":' * 100_000), 422),
    Odd(
        "5,000-char working_directory",
        "post",
        "/sessions",
        {"json": {"working_directory": "/" + "a" * 5000}},
        422,
    ),
    Odd(
        "300-char path component",
        "post",
        "/sessions",
        {"json": {"working_directory": "/tmp/" + "a" * 300}},
        422,
    ),
    Odd(
        "unknown user's home",
        "post",
        "/sessions",
        {"json": {"working_directory": "~no-such-user-cao/x"}},
        422,
    ),
    Odd("NUL in working_directory", "post", "/sessions", {"params": {"working_directory": "/tmp\x00"}}, 422),
    Odd("control character in a name", "post", "/sessions", {"json": {"session_name": "a\x1b[2J"}}, 422),
    Odd("limit=abc", "get", "/messages?limit=abc", {}, 422),
    Odd("limit=abc, inbox", "get", f"{INBOX}?limit=abc", {}, 422),
    Odd("limit=1e999", "get", "/messages?limit=1e999", {}, 422),
    Odd("unknown route", "get", "/no/such/route", {}, 404),
    Odd("wrong method", "put", "/sessions", {}, 405),
    Odd("whitespace-only message", "post", INBOX, {"json": {"message": " \n\t\u3000"}}, 422),
    Odd("zero-width message", "post", INBOX, {"json": {"message": "\u200b\u200d\u2060\ufeff"}}, 422),
    Odd(
        "zero-width input, query form",
        "post",
        "/terminals/abcdef12/input",
        {"params": {"message": "\u200b "}},
        422,
    ),
    Odd("visible text among zero-widths", "post", INBOX, {"json": {"message": "\u200bhi"}}, 404),
    Odd("not JSON", "post", "/sessions", raw_json(b"{not json"), 422),
    Odd("not UTF-8", "post", INBOX, raw_json(b'{"message": "\xff\xfe"}'), 422),
    Odd("a 5,000-digit number", "post", "/sessions", raw_json(b'{"a": 1' + b"1" * 5000 + b"}"), 422),
    Odd(
        "a timeout past float's range",
        "post",
        "/terminals/run-step",
        raw_json(b'{"agent": "x", "prompt": "p", "timeout": 1' + b"0" * 400 + b"}"),
        422,
    ),
    Odd("JSON array", "post", "/sessions", {"json": [1, 2]}, 422),
    Odd("message not a string", "post", INBOX, {"json": {"message": {"a": 1}}}, 422),
]


@pytest.mark.parametrize("case", ODD, ids=[o.id for o in ODD])
def test_odd_input_is_a_clean_4xx_json_error(app_for, case: Odd):
    client = app_for()  # TestClient raises any server-side exception: a 500 would fail loudly here
    r = client.request(case.method.upper(), case.path, **case.kwargs)
    assert_error(r, case.status)


def test_policy_reads_host_headers_strictly():
    table = {
        "127.0.0.1:9889": ("127.0.0.1", 9889),
        "LOCALHOST": ("localhost", None),
        "localhost.:80": ("localhost", 80),
        "[::1]:9889": ("::1", 9889),
        "[::1]": ("::1", None),
        "[::1": None,
        "a:b": None,
        "a:": None,
        "a:1234567": None,
        ":80": None,
        "a:٣": None,
    }
    assert {value: split_host(value) for value in table} == table
    policy = Policy.from_settings(Settings(home=Path("/"), api_host="0.0.0.0", api_port=0))
    assert policy.host_allowed("localhost:1234")  # port 0: whichever port we got
    assert not policy.host_allowed("0.0.0.0:1234")


# -- the transport: long URLs, bodies streamed in --------------------------------------------------------
def _exchange(port: int, head: bytes, chunks: Iterable[bytes] = ()) -> bytes:
    """Send ``head`` then each chunk (until the server stops reading), then read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except OSError:
                break
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while select.select([sock], [], [], 30)[0]:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
        return answer


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_long_url_gets_a_414_not_a_reset(make_server):
    srv: ServerProcess = make_server()
    head = b"GET /messages?x=" + b"a" * 200_000 + f" HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode()
    answer = _exchange(srv.port, head)
    assert answer.startswith(b"HTTP/1.1 414 "), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "URITooLong"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_an_oversize_body_is_refused_as_it_streams_in(make_server, framing: str):
    """200 MB sent in 64 KiB chunks: 413, and the server's memory doesn't grow with it."""
    srv: ServerProcess = make_server()
    assert srv.proc is not None
    pid, total, chunk = srv.proc.pid, 200 * 1024 * 1024, b" " * 65536
    with srv.client() as http:  # warm up the request path first, so the numbers compare like with like
        http.post("/terminals/abcdef12/inbox/messages", json={"message": "warm"})
    rss_before, peak_before = _status_kb(pid, "VmRSS"), _status_kb(pid, "VmHWM")
    if framing == "chunked":
        head_fields, frame = "Transfer-Encoding: chunked", b"10000\r\n" + chunk + b"\r\n"
    else:
        head_fields, frame = f"Content-Length: {total}", chunk
    head = (
        f"POST /terminals/abcdef12/inbox/messages HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
        f"Content-Type: application/json\r\n{head_fields}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = _exchange(srv.port, head, (frame for _ in range(total // len(chunk))))
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "PayloadTooLarge"
    grew_mb = (_status_kb(pid, "VmRSS") - rss_before) / 1024
    peak_grew_mb = (_status_kb(pid, "VmHWM") - peak_before) / 1024
    print(f"{framing}: RSS +{grew_mb:.1f} MB, peak +{peak_grew_mb:.1f} MB, {time.monotonic() - started:.1f}s")
    assert grew_mb < 8 and peak_grew_mb < 8, (grew_mb, peak_grew_mb)
    with srv.client() as http:
        assert http.get("/health").status_code == 200  # and it still serves


# -- the structured server log -------------------------------------------------------------------------
def test_the_log_file_is_json_lines_with_every_extra_field():
    record = logging.LogRecord("cao.delivery", logging.WARNING, __file__, 1, "delivery %s", ("failed",), None)
    record.__dict__.update(terminal_id="abcdef12", message_ids=[3, 4], error="pane gone")
    line = json.loads(JsonLines().format(record))
    assert (
        line["msg"] == "delivery failed" and line["level"] == "warning" and line["logger"] == "cao.delivery"
    )
    assert (line["terminal_id"], line["message_ids"], line["error"]) == ("abcdef12", [3, 4], "pane gone")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    assert "RuntimeError: boom" in json.loads(JsonLines().format(record))["exc"]


def test_server_log_lines_carry_their_ids(make_server, tmp_path: Path):
    srv: ServerProcess = make_server()
    with srv.client() as http:
        tid = http.post("/sessions", json={"session_name": "log"}).json()["id"]
        wait_until(lambda: http.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        mid = http.post(f"/terminals/{tid}/inbox/messages", json={"message": "log me"}).json()["message_id"]
        wait_until(lambda: http.get(f"/messages/{mid}").json()["status"] == "delivered", what="delivered")
        http.post("/sessions", headers={"origin": "http://evil.example"})
    log = srv.home / "logs" / "server.log"

    def lines() -> list[dict[str, Any]]:
        return [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON

    wait_until(lambda: any(line["msg"] == "request refused" for line in lines()), what="refusal logged")
    created = next(line for line in lines() if line["msg"] == "terminal created")
    assert created["terminal_id"] == tid and created["provider"] == "scripted"
    delivered = next(line for line in lines() if mid in line.get("message_ids", []))
    assert delivered["terminal_id"] == tid and delivered["level"] == "info"
    refused = next(line for line in lines() if line["msg"] == "request refused")
    assert (refused["status"], refused["reason"], refused["path"]) == (403, "OriginNotAllowed", "/sessions")
    assert "log me" not in log.read_text()


def test_login_codes_work_once_and_expire():
    """The dashboard's login link carries a code, not the token: spent once, dead after its TTL."""
    from cao.dashboard import LOGIN_CODES_MAX, LoginCodes

    now = [0.0]
    codes = LoginCodes(ttl=10, clock=lambda: now[0])
    first, second = codes.issue(), codes.issue()
    assert first != second
    assert codes.spend(first) and not codes.spend(first)
    now[0] = 10.5
    assert not codes.spend(second)  # expired unspent
    assert not codes.spend("") and not codes.spend("made-up")
    flood = [codes.issue() for _ in range(LOGIN_CODES_MAX + 5)]  # bounded: the oldest go first
    assert not codes.spend(flood[0]) and codes.spend(flood[-1])
