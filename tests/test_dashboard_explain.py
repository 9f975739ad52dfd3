"""The dashboard's agent page shows what decided its status (the explain panel), its tokens and
cost per task, and copies a redacted bug report to the clipboard — or, where the clipboard is
refused, selects it in a text area. The system's Chromium under Playwright, a real cao-server, a
scripted agent on a private tmux socket."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import ServerProcess, wait_until, write_rules
from tests.test_dashboard import CHROMIUM, CHROMIUM_ARGS, sync_api

pytestmark = pytest.mark.browser

SPEND = {"model": "claude-haiku-4-5", "input_tokens": 1234, "output_tokens": 56}


@pytest.fixture
def agent(make_server: Any) -> Any:
    srv: ServerProcess = make_server()
    write_rules(
        srv.home, "spender", {"record": True, "rules": [{"match": "^task", "reply": "done", "usage": SPEND}]}
    )
    with srv.client() as c:
        tid = c.post("/sessions", json={"session_name": "explained", "agent_profile": "spender"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        mid = c.post(
            f"/terminals/{tid}/inbox/messages",
            json={"message": "task one", "sender_id": "operator", "kind": "task"},
        ).json()["message_id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "completed", what="its answer")
        yield srv, c, tid, mid


def open_page(srv: ServerProcess, tid: str, *, clipboard: bool) -> tuple[Any, Any, Any, list[str]]:
    p = sync_api.sync_playwright().start()
    b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    ctx = b.new_context(permissions=["clipboard-read", "clipboard-write"] if clipboard else [])
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{srv.url}/#/t/{tid}")
    return p, b, page, errors


def test_the_agent_page_explains_its_status_shows_its_cost_and_copies_a_report(agent: Any) -> None:
    srv, c, tid, mid = agent
    p, b, page, errors = open_page(srv, tid, clipboard=True)
    try:
        page.wait_for_selector("[data-testid=explain][data-status]", timeout=10_000)
        text = page.locator("[data-testid=explain]").inner_text()
        ex = c.get(f"/terminals/{tid}/explain").json()
        assert ex["status"] == "completed" and text.startswith("status: completed  (decided by the screen)")
        rule = ex["screen"]["matched"][0]["rule"]
        assert rule in text  # the rule that matched, by name, with its lines
        total = page.locator("[data-testid=usage-total]").inner_text()
        assert total.startswith("1,290 tokens") and "1 responses" in total
        assert f"m{mid}" in page.locator("#usage table").inner_text()
        page.click("#explain-copy")
        copied = wait_until(lambda: page.evaluate("navigator.clipboard.readText()"), what="the report copied")
        assert "### cao status misread report" in copied and '"status": "completed"' in copied
        assert str(srv.home) not in copied  # redacted
        assert page.locator("#bug-report").is_hidden()
        c.post(f"/terminals/{tid}/input", json={"message": "hello"})  # a new status: read on demand
        wait_until(lambda: "ok: hello" in c.get(f"/terminals/{tid}/output").json()["output"], what="answered")
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "completed", what="completed")
        reads: list[str] = []  # not polled: read again only when asked
        page.on("request", lambda r: reads.append(r.url) if "/explain" in r.url else None)
        page.wait_for_timeout(1500)
        assert reads == []
        page.click("#explain-again")  # the new turn moved the prompt: other lines are named now
        page.wait_for_function(
            "(before) => document.querySelector('[data-testid=explain]').textContent !== before", arg=text
        )
        assert len(reads) == 1
        again = c.get(f"/terminals/{tid}/explain").json()["text"]
        assert page.locator("[data-testid=explain]").inner_text() == again.rstrip("\n")
        assert errors == []
    finally:
        b.close()
        p.stop()


def test_without_a_clipboard_the_report_is_selected_for_the_person_to_copy(agent: Any) -> None:
    srv, _c, tid, _ = agent
    p, b, page, errors = open_page(srv, tid, clipboard=False)
    try:
        page.wait_for_selector("[data-testid=explain][data-status]", timeout=10_000)
        page.evaluate("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
        page.click("#explain-copy")
        page.wait_for_selector("#bug-report:not([hidden])")
        value = page.locator("#bug-report").input_value()
        assert "### cao status misread report" in value and str(srv.home) not in value
        selected = page.evaluate(
            "(() => { const a = document.querySelector('#bug-report'); "
            "return a.selectionEnd - a.selectionStart; })()"
        )
        assert selected == len(value)
        assert errors == []
    finally:
        b.close()
        p.stop()


def test_hostile_screen_text_stays_text_in_the_explain_panel(make_server: Any) -> None:
    srv: ServerProcess = make_server()
    body = "Allow <img src=x onerror=window.__pwned=1>?"
    write_rules(srv.home, "asker", {"rules": [{"match": "^go$", "ask": body, "reply": "ok"}]})
    with srv.client() as c:
        tid = c.post("/sessions", json={"session_name": "hostile", "agent_profile": "asker"}).json()["id"]
        wait_until(lambda: c.get(f"/terminals/{tid}").json()["status"] == "idle", what="idle")
        c.post(f"/terminals/{tid}/input", json={"message": "go"})
        # the question line (screen text) is one the question rule matched: the panel shows it
        wait_until(lambda: body in c.get(f"/terminals/{tid}/explain").json()["text"], what="in explain")
        p, b, page, errors = open_page(srv, tid, clipboard=False)
        try:
            page.wait_for_selector("[data-testid=explain][data-status]", timeout=10_000)
            assert body in page.locator("[data-testid=explain]").inner_text()  # shown, as text
            assert page.evaluate("window.__pwned") is None
            assert page.locator("#explain img").count() == 0
            assert errors == []
        finally:
            b.close()
            p.stop()
