"""The program an agent CLI runs on a lifecycle event: report it to cao-server, quickly, and never
get in the CLI's way.

    python -m cao.hook --terminal ID --server URL --home CAO_HOME --key KEY SOURCE [EVENT] [JSON]

``SOURCE`` names the CLI (``claude``, ``codex``, ``gemini``, ``kimi``, ``qwen``, ``hermes``,
``opencode``: its plugin, providers/opencode.py; ``copilot``). Hooks
pass a JSON object on stdin (with ``hook_event_name``: Claude Code, Gemini CLI, Kimi CLI, Qwen Code,
Codex 0.171's hooks.json, Hermes, which puts the event's own fields under ``extra``); Codex's
``notify`` program gets one JSON argument instead (with ``type``, e.g. ``agent-turn-complete``).
``EVENT`` overrides the event name. Only the fields cao uses are sent (event name, submitted
prompts, the answer, a notification's text) to ``POST /terminals/{ID}/hooks`` with the server's
API token (``$CAO_HOME/api-token``) and this terminal's own hook key (``X-Cao-Hook-Key``, given by
cao at launch), so no other holder of the token can report for this terminal.

Standard library only (it runs on every turn). It prints nothing on stdout (Claude Code adds a
``UserPromptSubmit`` hook's stdout to the prompt) and always exits 0 (exit code 2 would block the
CLI's turn); a failure is one line on stderr. See docs/providers.md ("Lifecycle hooks").

The one exception is the turn-appending hook (Claude Code's ``PostToolUse``, Gemini CLI's
``AfterTool``…: docs/attention.md): when the server's answer carries a ``hand`` (urgent messages
for the running turn, already claimed), it prints ``hand.stdout`` — the CLI adds it to the turn —,
closes stdout, and then tells the server (``POST /terminals/{ID}/hooks/handed``) so they are
marked delivered.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

SOURCES = ("claude", "codex", "gemini", "kimi", "qwen", "hermes", "opencode", "copilot")
TIMEOUT = 3.0  # seconds for the whole request; the CLI waits for us
STDIN_WAIT = 1.5  # seconds for the CLI's JSON on stdin
STDIN_LIMIT = 4 * 1024 * 1024
TEXT_LIMIT = 65_536  # characters kept of one prompt or answer


def _stdin_json(wait: float = STDIN_WAIT) -> dict[str, Any]:
    """The JSON object the CLI writes on stdin: read until it parses or stdin closes, for at most
    ``wait`` seconds (a CLI that never closes our stdin must not hold its own turn up)."""
    if sys.stdin is None or sys.stdin.isatty():
        return {}
    fd = sys.stdin.fileno()
    deadline = time.monotonic() + wait
    raw = b""
    while len(raw) < STDIN_LIMIT:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        raw += chunk
        try:
            data = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            continue
        return data if isinstance(data, dict) else {}
    try:
        data = json.loads(raw.decode("utf-8", "replace") or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: object) -> str:
    return value[:TEXT_LIMIT] if isinstance(value, str) else ""


def report(source: str, event: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    """The body cao-server gets: the event's name and the few fields cao uses."""
    name = event or payload.get("hook_event_name") or payload.get("type") or ""
    found = payload.get("extra")
    extra: dict[str, Any] = found if isinstance(found, dict) else {}  # Hermes
    prompts: list[str] = []
    if prompt := _text(payload.get("prompt") or extra.get("user_message")):
        prompts.append(prompt)
    inputs = payload.get("input-messages") or payload.get("input_messages")
    if isinstance(inputs, list):
        prompts += [_text(item) for item in inputs if isinstance(item, str)]
    last = (
        payload.get("last_assistant_message")
        or payload.get("last-assistant-message")
        or payload.get("prompt_response")
        or extra.get("assistant_response")
    )
    body: dict[str, Any] = {"source": source, "event": str(name)[:100]}
    if prompts:
        body["prompts"] = prompts[-16:]
    if text := _text(last):
        body["last_message"] = text
    for key in ("notification_type", "message", "title", "reason"):
        value = payload.get(key) if isinstance(payload.get(key), str) else extra.get(key)
        if isinstance(value, str):
            body[key] = value[:1000]
    transcript = payload.get("transcript_path")
    if isinstance(transcript, str) and 0 < len(transcript) <= 4096:
        body["transcript_path"] = transcript  # where a hand-over shows (evidence after a crash)
    return body


def post(
    server: str, terminal: str, home: str, body: dict[str, Any], key: str = "", path: str = "hooks"
) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-Cao-Hook-Key"] = key
    token = os.environ.get("CAO_API_TOKEN", "").strip()
    if not token and home:
        try:
            token = (Path(home) / "api-token").read_text().strip()
        except OSError:
            token = ""
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(
        f"{server.rstrip('/')}/terminals/{terminal}/{path}",
        data=json.dumps(body).encode(),
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        raw = response.read(1024 * 1024)
    try:
        answer = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def hand_over(answer: dict[str, Any]) -> str | None:
    """The claim of a hand-over the server's answer carries, once its text is printed; None: none."""
    hand = answer.get("hand")
    if (
        not isinstance(hand, dict)
        or not isinstance(hand.get("stdout"), str)
        or not isinstance(hand.get("claim"), str)
    ):
        return None
    sys.stdout.write(hand["stdout"])
    sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.close(1)  # the CLI reads our stdout to its end: it has the text now
    return str(hand["claim"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cao.hook", description=__doc__.split("\n\n")[0])
    parser.add_argument("--terminal", required=True, help="the cao terminal id the CLI runs in")
    parser.add_argument("--server", required=True, help="cao-server's URL")
    parser.add_argument("--home", default="", help="cao-server's CAO_HOME (where its API token is)")
    parser.add_argument("--key", default="", help="this terminal's hook key (cao passes it at launch)")
    parser.add_argument("source", choices=SOURCES, help="the CLI that runs it")
    parser.add_argument("rest", nargs="*", help="[EVENT] [JSON] (codex appends its JSON here)")
    args = parser.parse_args(argv)
    event: str | None = None
    payload: dict[str, Any] = {}
    for item in args.rest:
        if item.lstrip().startswith("{"):
            try:
                parsed = json.loads(item)
            except ValueError:
                continue
            payload = parsed if isinstance(parsed, dict) else {}
        else:
            event = item
    if not payload:  # hooks pass it on stdin; Codex's notify appends it as the last argument
        payload = _stdin_json()
    body = report(args.source, event, payload)
    failed: list[BaseException] = []
    answers: list[dict[str, Any]] = []

    def send() -> None:
        try:
            answers.append(post(args.server, args.terminal, args.home, body, args.key))
        except Exception as exc:  # any failure (refused, reset, garbage, a 4xx/5xx): say so, never raise
            failed.append(exc)

    # The whole request within TIMEOUT, however the server answers (a daemon thread: a server
    # that trickles bytes is left behind when this process exits).
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(TIMEOUT)
    if sender.is_alive():
        print(f"cao hook: {args.server} did not answer within {TIMEOUT:g} s", file=sys.stderr)
    elif failed:
        print(f"cao hook: could not report to {args.server}: {failed[0]}", file=sys.stderr)
    elif answers and (claim := hand_over(answers[0])) is not None:

        def confirm() -> None:
            try:
                post(args.server, args.terminal, args.home, {"claim": claim}, args.key, "hooks/handed")
            except Exception as exc:  # the claim then waits for recovery (evidence or the lease)
                failed.append(exc)

        confirmer = threading.Thread(target=confirm, daemon=True)
        confirmer.start()
        confirmer.join(TIMEOUT)
        if failed or confirmer.is_alive():
            print("cao hook: could not confirm the hand-over; cao will find it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        pass  # argparse has said what was wrong
    except BaseException as exc:  # never fail the CLI's turn (exit 2 would even block it)
        with contextlib.suppress(Exception):
            print(f"cao hook: {exc!r}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(0)  # don't wait for a sender thread still stuck on a slow server
