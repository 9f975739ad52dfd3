"""The web dashboard in a real browser: the system's Chromium driven by Playwright (nothing
downloaded at run time), against a real cao-server with scripted agents on a private tmux socket.

Screenshots of each view go to a temp dir; with ``UPDATE_SCREENSHOTS=1`` they replace the ones
under docs/screenshots/ that the README shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import REPO, ServerProcess, read_records, wait_until, write_rules
from tests.prepare import AptPackage, items, missing_hint

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Keep the browser off the network: no background services, no component updates, no QUIC.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
]

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
if CHROMIUM is None:  # pragma: no cover - depends on the machine
    why = next((i.blocker() for i in items() if isinstance(i, AptPackage) and i.package == "chromium"), None)
    pytest.skip(missing_hint("Chromium", "browser", why), allow_module_level=True)


@pytest.fixture
def browser() -> Iterator[Any]:
    """A fresh headless Chromium (Playwright gives it a new, empty profile directory)."""
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def team(make_server) -> Iterator[tuple[ServerProcess, httpx.Client, str, str]]:
    srv: ServerProcess = make_server()
    write_rules(
        srv.home, "slow", {"record": True, "rules": [{"match": "^work", "delay": 2.0, "reply": "done"}]}
    )
    with srv.client() as c:
        boss = c.post("/sessions", json={"session_name": "dash", "agent_profile": "slow"}).json()["id"]
        worker = c.post(
            "/sessions/dash/terminals", json={"agent_profile": "slow", "supervisor_id": boss, "notify": False}
        ).json()["id"]
        for tid in (boss, worker):
            wait_until(lambda t=tid: c.get(f"/terminals/{t}").json()["status"] == "idle", what="idle")
        yield srv, c, boss, worker


def _shot(page: Any, name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.png"
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        dest = REPO / "docs" / "screenshots"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / f"{name}.png")
    assert path.stat().st_size > 5000  # a real rendering, not an empty page


def test_fleet_shows_the_team_and_a_status_change_appears_live(browser, team, tmp_path: Path):
    srv, c, boss, worker = team
    page = browser.new_page(viewport={"width": 1400, "height": 700})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(srv.url + "/")
    page.wait_for_selector(f"[data-testid=status-{boss}]")
    page.wait_for_selector("#live.on")  # the table comes from a fetch, before the stream opens
    assert page.locator("#live").inner_text() == "live"
    assert page.locator(f"tr.worker[data-terminal='{worker}']").count() == 1  # supervisor → worker tree
    # the "new agent" form starts on the provider the CLI and the API use when none is named
    assert page.locator("select[name=provider]").input_value() == "scripted"
    c.post(f"/terminals/{boss}/input", json={"message": "work for a while"})
    page.wait_for_selector(f"[data-testid=status-{boss}][data-status=processing]", timeout=10_000)
    _shot(page, "fleet", tmp_path)
    page.wait_for_selector(f"[data-testid=status-{boss}][data-status=completed]", timeout=10_000)
    assert errors == []


def test_the_attention_list_shows_a_blocked_worker_live_and_jumps_to_it(browser, make_server, tmp_path: Path):
    srv: ServerProcess = make_server()
    write_rules(
        srv.home, "asker", {"rules": [{"match": "^deploy$", "ask": "Allow tool deploy?", "reply": "ok"}]}
    )
    with srv.client() as c:
        boss = c.post("/sessions", json={"session_name": "need"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{boss}").json()["status"] == "idle", what="idle")
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url + "/")
        page.wait_for_selector("[data-testid=needs-empty]")
        page.wait_for_selector("#live.on")
        body = {"agent_profile": "asker", "supervisor_id": boss, "initial_message": "deploy"}
        worker = c.post("/sessions/need/terminals", json=body).json()["id"]
        # live: it waits for a person now, and the worker event (blocked) is listed, from the stream
        page.wait_for_selector(f"#needs-list tr[data-needs='{worker}'][data-kind=now]", timeout=15_000)
        page.wait_for_selector(f"#needs-list tr[data-needs='{worker}'][data-event=blocked]", timeout=15_000)
        assert "waits for a person" in page.locator(f"tr[data-needs='{worker}'][data-kind=now]").inner_text()
        _shot(page, "attention-list", tmp_path)
        page.locator(f"tr[data-needs='{worker}'][data-event=blocked] a").click()  # the jump
        page.wait_for_url(f"**/#/t/{worker}")
        page.wait_for_selector("#attention-state")
        assert errors == []


def test_a_message_moves_from_pending_to_delivered_on_screen(browser, team, tmp_path: Path):
    srv, c, boss, worker = team
    page = browser.new_page(viewport={"width": 1400, "height": 700})
    page.goto(srv.url + "/#/messages")
    page.wait_for_selector("#live.on")
    c.post(f"/terminals/{worker}/input", json={"message": "work hard"})
    wait_until(lambda: c.get(f"/terminals/{worker}").json()["status"] == "processing")
    mid = c.post(
        f"/terminals/{worker}/inbox/messages", json={"message": "token-dash", "sender_id": boss}
    ).json()["message_id"]
    page.wait_for_selector(f"[data-testid=message-{mid}][data-status=pending]", timeout=10_000)
    assert "receiver busy" in page.locator(f"tr[data-message='{mid}']").inner_text()
    _shot(page, "messages", tmp_path)
    page.wait_for_selector(f"[data-testid=message-{mid}][data-status=delivered]", timeout=15_000)
    assert page.locator(".matrix td.n[data-n='1']").count() == 1  # boss → worker, at a glance


def test_typing_in_the_terminal_view_reaches_the_agent(browser, team, tmp_path: Path):
    srv, c, boss, _worker = team
    page = browser.new_page(viewport={"width": 1500, "height": 800})
    page.goto(srv.url + f"/#/t/{boss}")
    page.wait_for_selector(".xterm-rows")
    page.wait_for_function("document.querySelector('.xterm-rows').innerText.includes('cao scripted agent')")
    page.fill("#input textarea", "hello from the browser \u001b[201~ /exit")
    page.click("#input button")
    wait_until(lambda: read_records(srv.home, boss), timeout=10, what="the agent received the typed input")
    [rec] = read_records(srv.home, boss)
    assert rec["text"] == "hello from the browser ␛[201~ /exit"  # neutralised, one input, not keystrokes
    page.wait_for_function(
        "document.querySelector('.xterm-rows').innerText.includes('ok: hello from the browser')",
        timeout=10_000,
    )
    _shot(page, "terminal", tmp_path)
    assert c.get(f"/terminals/{boss}").json()["status"] in ("idle", "completed")  # /exit was not run


def test_the_dashboard_follows_the_apis_access_rules(browser, make_server, tmp_path: Path):
    token = "t" * 32
    srv: ServerProcess = make_server(CAO_API_TOKEN=token)
    page = browser.new_page()
    page.goto(srv.url + "/")
    page.wait_for_selector(".login")  # the page loads, the API refuses it without the token
    assert "cao dashboard" in page.locator(".login").inner_text()
    assert page.goto(srv.url + "/login?code=wrong").status == 401
    assert page.goto(srv.url + f"/login?token={token}").status == 401  # the token is no login link
    auth = {"Authorization": f"Bearer {token}"}
    link = httpx.post(srv.url + "/login-codes", headers=auth).json()["url"]
    page.goto(srv.url + link)
    page.wait_for_selector("#live.on")  # the cookie carries the token: API, events
    cookie = next(ck for ck in page.context.cookies() if ck["name"] == "cao_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    # a crafted link can't smuggle a path into the terminal view's requests (found by a review)
    page.goto(srv.url + "/#/t/../sessions?provider=scripted&session_name=pwned&initial_message=X&z=")
    page.wait_for_selector("#fleet")  # not a terminal id: the fleet view, no terminal view to send from
    assert page.locator("#input").count() == 0
    sessions = httpx.get(srv.url + "/sessions", headers={"Authorization": f"Bearer {token}"}).json()
    assert sessions == []
    # a page from another origin can't open the terminal stream (no CORS for WebSockets)
    ws = httpx.get(
        srv.url + "/terminals/abcdef12/stream",
        headers={
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Origin": "http://evil.example",
            "Cookie": f"cao_token={token}",
        },
    )
    assert ws.status_code == 403


def test_the_attention_panel_shows_and_manages_a_busy_agents_queue(browser, make_server, tmp_path: Path):
    srv: ServerProcess = make_server()
    write_rules(
        srv.home, "busy", {"record": True, "rules": [{"match": "^long work$", "delay": 60, "reply": "done"}]}
    )
    with srv.client() as c:
        tid = c.post("/sessions", json={"session_name": "attn", "agent_profile": "busy"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        c.post(f"/terminals/{tid}/input", json={"message": "long work"})
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "processing", what="busy")

        def send(body: str, **attention: Any) -> int:
            r = c.post(f"/terminals/{tid}/inbox/messages", json={"message": body, **attention})
            assert r.status_code == 201, r.text
            return int(r.json()["message_id"])

        def message(mid: int) -> dict[str, Any]:
            return dict(c.get(f"/messages/{mid}").json())

        low = send("fyi: the nightly build is green", sender_id="ci", kind="notice", priority="low")
        normal = send("review the parser change", sender_id="alice", kind="task", priority="normal")
        urgent = send("stop: prod is down", sender_id="bob", priority="urgent", ttl_seconds=1800)

        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(srv.url + f"/#/t/{tid}")
        page.wait_for_selector("#live.on")
        page.wait_for_selector("#attention-state[data-attention=working]")
        queue = page.locator("#attention-queue tr[data-queue]")

        def shown() -> list[tuple[str, str]]:
            return [
                (str(r.get_attribute("data-queue")), r.locator("select").input_value()) for r in queue.all()
            ]

        # served by priority: urgent, then normal, then low, each with its priority and why it waits
        assert shown() == [(str(urgent), "urgent"), (str(normal), "normal"), (str(low), "low")]
        row = page.locator(f"tr[data-queue='{urgent}']")
        assert "receiver busy" in row.inner_text()
        assert "expires" in row.inner_text()  # its deadline
        assert "chat" in row.inner_text()  # from a name: a person's message
        assert "task" in page.locator(f"tr[data-queue='{normal}']").inner_text()

        # drop needs a reason: an empty one is refused on the page, nothing is sent
        page.once("dialog", lambda d: d.accept("  "))
        page.click(f"button[data-drop='{normal}']")
        page.wait_for_function(
            "document.querySelector('#toast').innerText.includes('a reason is required')", timeout=5000
        )
        assert message(normal)["status"] == "pending"

        # drop it with a reason: dropped in the store, gone from the queue, on the timeline with why
        page.once("dialog", lambda d: d.accept("alice reviewed it herself"))
        page.click(f"button[data-drop='{normal}']")
        wait_until(lambda: message(normal)["status"] == "dropped", what="dropped through the page")
        m = message(normal)
        assert m["closed_reason"] == "alice reviewed it herself" and m["closed_by"] == "dashboard"
        page.wait_for_selector(f"tr[data-queue='{normal}']", state="detached", timeout=5000)
        dropped = page.locator(f"#attention-timeline tr[data-event=dropped][data-message-id='{normal}']")
        dropped.wait_for(timeout=5000)
        assert "alice reviewed it herself" in dropped.inner_text() and "dashboard" in dropped.inner_text()
        assert page.locator("#attention-timeline tr").first.get_attribute("data-event") == "dropped"  # newest

        # re-prioritise with the select: the store has it, the queue re-orders
        page.select_option(f"select[data-prioritize='{low}']", "high")
        wait_until(lambda: message(low)["priority"] == "high", what="prioritized through the page")
        page.wait_for_selector(f"tr[data-queue='{low}'][data-priority=high]", timeout=5000)
        moved = page.locator(f"#attention-timeline tr[data-event=prioritized][data-message-id='{low}']")
        assert "low → high" in moved.inner_text() and "dashboard" in moved.inner_text()

        # defer 10 min: deliver_at about ten minutes out, and it moves behind the claimable one
        page.click(f"button[data-defer='{urgent}']")
        wait_until(lambda: message(urgent)["deliver_at"] is not None, what="deferred through the page")
        due = datetime.fromisoformat(message(urgent)["deliver_at"]).timestamp() - time.time()
        assert 590 < due <= 600
        page.wait_for_function(
            f"[...document.querySelectorAll('#attention-queue tr[data-queue]')].map(r => r.dataset.queue)"
            f".join() === '{low},{urgent}'",
            timeout=5000,
        )
        assert "not before" in page.locator(f"tr[data-queue='{urgent}']").inner_text()

        # live: a change made elsewhere (the CLI, an agent) shows without a reload
        c.post(f"/messages/{low}/prioritize", json={"priority": "low", "by": "carol", "reason": "later"})
        page.wait_for_selector(f"tr[data-queue='{low}'][data-priority=low]", timeout=5000)
        newest = page.locator("#attention-timeline tr").first
        assert newest.get_attribute("data-event") == "prioritized" and "carol" in newest.inner_text()
        _shot(page, "attention", tmp_path)

        # an action the server refuses: its detail in the toast (the page's view was stale)
        page.route("**/attention*", lambda route: route.abort())  # keep the stale view on screen
        assert c.post(f"/messages/{low}/cancel").json()["status"] == "cancelled"
        page.once("dialog", lambda d: d.accept("too late"))
        page.click(f"button[data-drop='{low}']")
        page.wait_for_function(
            "document.querySelector('#toast').innerText.includes("
            f"'message {low} is cancelled; only a pending message can be dropped')",
            timeout=5000,
        )
        assert message(low)["status"] == "cancelled"
        assert errors == []


def test_the_session_view_shows_its_board_and_follows_writes_live(browser, team, tmp_path: Path):
    srv, c, boss, worker = team

    def put(key: str, value: Any, expected: int, by: str) -> None:
        r = c.put(
            f"/sessions/dash/board/{key}", json={"value": value, "expected_version": expected, "by": by}
        )
        assert r.status_code == 200, r.text

    put("build/status", {"green": False, "failing": ["test_parser"]}, 0, worker)
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(srv.url + "/")
    page.wait_for_selector("#live.on")
    page.locator(f"tr[data-terminal='{boss}'] a[href='#/s/cao-dash']").click()  # the fleet links it
    row = page.locator("#board-facts tr[data-board-key='build/status']")
    row.wait_for(timeout=5000)
    cells = [td.inner_text() for td in row.locator("td").all()]
    assert cells[:4] == ["build/status", '{"green":false,"failing":["test_parser"]}', "1", worker]
    assert cells[4].endswith("ago")
    assert page.locator(f"#session-terminals tr[data-terminal='{boss}']").count() == 1
    assert page.locator(f"#session-terminals tr[data-terminal='{worker}']").count() == 1

    # written elsewhere (an agent, the CLI): on screen without a reload, on the board.set event
    put("build/status", {"green": True}, 1, boss)
    page.wait_for_selector("tr[data-board-key='build/status'][data-version='2']", timeout=5000)
    assert boss in row.inner_text() and '{"green":true}' in row.inner_text()
    put("notes/long", "x" * 500, 0, "ana")
    long = page.locator("tr[data-board-key='notes/long'] td.value")
    long.wait_for(timeout=5000)
    assert long.inner_text() == '"' + "x" * 118 + "…"  # cut at 120 characters on screen
    keys = [r.get_attribute("data-board-key") for r in page.locator("#board-facts tr").all()]
    assert keys == ["build/status", "notes/long"]  # sorted by key
    _shot(page, "board", tmp_path)
    assert c.request("DELETE", "/sessions/dash/board/notes/long", params={"expected_version": 1}).is_success
    page.wait_for_selector("tr[data-board-key='notes/long']", state="detached", timeout=5000)
    # writing told the page, and nobody else: neither agent was handed anything
    assert read_records(srv.home, boss) == [] and read_records(srv.home, worker) == []
    assert errors == []


def test_the_hosts_panel_shows_every_host_and_one_that_stops(browser, tmp_path: Path, pg_url: str):
    """Two cao-servers sharing a PostgreSQL store: the fleet view lists both hosts, each agent with
    its host, and a host whose heartbeat stops turns lapsed (docs/multi-host.md)."""
    fast = {"CAO_DATABASE_URL": pg_url, "CAO_HOST_HEARTBEAT": "0.2", "CAO_HOST_LEASE": "1.5"}
    servers = []
    try:
        for name in ("alpha", "beta"):
            sock = f"cao-test-{os.urandom(4).hex()}"
            servers.append(ServerProcess(tmp_path / name, sock, REPO, CAO_HOST_NAME=name, **fast).start())
        alpha, beta = servers
        with alpha.client() as c:
            tid = c.post("/sessions", json={"host": "beta"}).json()["id"]
            wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        page = browser.new_page(viewport={"width": 1400, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(alpha.url + "/")
        page.wait_for_selector("[data-testid=host-alpha][data-status=alive]")
        page.wait_for_selector("[data-testid=host-beta][data-status=alive]")
        assert page.locator(f"[data-testid=host-of-{tid}]").inner_text() == "beta"
        assert page.locator("select[name=host]").input_value() == "alpha"  # a new agent: here by default
        beta.kill()
        page.wait_for_selector("[data-testid=host-beta][data-status=lapsed]", timeout=15_000)
        page.wait_for_selector(f"[data-testid=status-{tid}][data-status=host_unreachable]", timeout=15_000)
        _shot(page, "hosts", tmp_path)
        assert errors == []
    finally:
        for srv in servers:
            srv.stop()
            subprocess.run(["tmux", "-L", srv.socket_name, "kill-server"], capture_output=True)
