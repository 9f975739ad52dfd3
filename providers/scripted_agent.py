"""The bundled scripted agent: a real interactive terminal program that behaves like an agent CLI.

It runs in a tmux pane like Claude Code or Codex would: it switches the terminal to raw mode,
enables bracketed-paste mode (one paste = one input, newlines included), shows an idle prompt,
a spinner while "thinking", a reply, then the prompt again. It can ask a permission question,
show an error, and send messages to other terminals through the cao HTTP API. Standard library
only, so it starts in a few tens of milliseconds.

Screen (what ``providers/scripted.py`` recognises)::

    cao scripted agent · terminal 1a2b3c4d · profile developer
    › first line of a user turn            (continuation lines are indented two spaces)
    ● first line of the reply
    ✗ error text                           (an error turn)
    ? Allow tool deploy? (y/n)             (waiting for the user's answer)
    ⠹ thinking… (2s · esc to interrupt)    (busy; "· 1 queued" when input waits)
    ❯ text being typed                     (idle prompt = input box)

Rules (JSON; ``$CAO_SCRIPTED_RULES`` or ``$CAO_SCRIPTED_DIR/<profile>.json``, else the defaults)::

    {"startup_delay": 0.0,
     "record": true,                 # or a path; default $CAO_SCRIPTED_DIR/received/<id>.jsonl
     "rules": [
       {"match": "regex", "reply": "text {first_line} {sender} {group}", "delay": 1.5,
        "send": [{"to": "{sender}", "message": "done: {task}"}],
        "ask": "Allow tool deploy?",  "error": "API Error: 500 overloaded"}],
     "default": {"reply": "ok: {first_line}"}}

The first rule whose ``match`` is found in a message applies (to every match of it in that
message, so ``^delegate (?P<to>\\w+) (?P<task>.*)$`` with re.MULTILINE delegates each line).
Inbox messages arrive as ``[cao message #ID from SENDER] (ref NONCE)`` headers followed by the
body (and, for long bodies, an ``[end of cao message #ID] (ref NONCE)`` trailer); several in one
paste are split and answered one by one. ``"swallow_enters": N`` makes the agent ignore the first N
Enters after each paste (a TUI that drops an Enter while it paints), for delivery tests.

``"usage": {"model": "m", "input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 0,
"cache_write_tokens": 0}`` in a rule records one model response's tokens per matching message, as
a JSON line in ``$CAO_SCRIPTED_USAGE`` (the way a real CLI's transcript does; cao counts them).

``"hooks": true`` makes it run lifecycle hooks the way Claude Code does (the command in
``$CAO_SCRIPTED_HOOK``, a JSON list, with a JSON object on stdin, waited for): ``UserPromptSubmit``
with the ``prompt`` when a turn starts, ``Stop`` with ``last_assistant_message`` when it ends,
``Notification`` (``permission_prompt``) when it asks, ``SessionStart`` once its prompt first
shows; with ``"steps": [1.0, 2.0]`` in a rule, a turn makes that many tool calls (seconds each)
before its answer (``delay`` then counts from the last one), and after each one runs
``PostToolUse``: text the hook prints as ``{"hookSpecificOutput": {"additionalContext": …}}`` joins
the running turn (drawn as a ``⎿`` block, recorded as ``context``). ``"prompt_mark": "» "`` draws
the input prompt with another mark and ``"busy_text": "◐ working"`` another busy line, as a new
release might: screens its provider has never seen.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import termios
import time
import tty
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

# the kinds of the records it appends (docs/scripted-agent.md): its file format, not cao's states
RECEIVED, TURN_DONE, STOPPED, CONTEXT = "received", "done", "stopped", "context"

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
PASTE_START = b"\x1b[200~"
PASTE_END = b"\x1b[201~"
HEADER_RE = re.compile(
    r"^\[cao message #(?P<id>\d+) from (?P<sender>[^\]\s]+)\](?: \(ref (?P<ref>[0-9a-f]+)\))?$", re.M
)
TRAILER_RE = re.compile(r"\n?^\[end of cao message #\d+\] \(ref [0-9a-f]+\)$", re.M)
ESC_WAIT = 0.05  # a lone ESC not followed by more within this is the Escape key
DEFAULT_RULES: dict[str, Any] = {"rules": [], "default": {"reply": "ok: {first_line}"}}


class Plan(NamedTuple):
    msg: dict[str, Any]
    rule: dict[str, Any]
    groups: list[dict[str, str]]


class _Defaults(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def split_messages(text: str) -> list[dict[str, Any]]:
    """Split one submitted turn into the inbox messages it carries (or one plain message)."""
    heads = list(HEADER_RE.finditer(text))
    if not heads:
        return [{"id": None, "sender": None, "body": text}]
    out: list[dict[str, Any]] = []
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        body = TRAILER_RE.sub("", text[head.end() : end]).strip("\n")
        out.append({"id": int(head["id"]), "sender": head["sender"], "body": body})
    return out


def api_token(environ: dict[str, str] | None = None) -> str | None:
    """cao-server's API token, as cao.apitoken finds it: $CAO_API_TOKEN, else $CAO_HOME/api-token."""
    env: dict[str, str] = dict(os.environ) if environ is None else environ
    if token := env.get("CAO_API_TOKEN", "").strip():
        return token
    home = env.get("CAO_HOME")
    if not home:
        return None
    try:
        return (Path(home) / "api-token").read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


class Agent:
    """The agent: ``feed`` it the bytes a terminal sends, ``tick`` it as time passes; it writes its
    screen with ``out``. ``run`` drives it in a real terminal; tests can drive it in memory
    (cao/testing/panes.py) with their own environment, clock and output."""

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        environ: dict[str, str] | None = None,
        now: Any = time.monotonic,
        out: Any = None,
        wall: Any = time.time,
    ) -> None:
        self.env = dict(os.environ if environ is None else environ)
        self.now = now  # the monotonic clock
        self.wall = wall  # the wall clock (its usage records' times)
        self.out = out  # where the screen goes (None: file descriptor 1)
        self.tid = args.terminal_id or self.env.get("CAO_TERMINAL_ID", "local")
        self.responses = 0  # model responses it recorded usage for (``"usage"`` in a rule)
        self.profile = self.env.get("CAO_AGENT_PROFILE", "developer")
        self.server = (args.server or self.env.get("CAO_SERVER_URL", "http://127.0.0.1:9889")).rstrip("/")
        self.config = self._load_rules(args.rules)
        self.record_path = self._record_path(args.record)
        self.input = ""
        self.queue: list[str] = []
        self.busy = False
        self.busy_started = 0.0
        self.busy_until = 0.0
        self.steps: list[float] = []  # the running turn's tool steps still to come (rules "steps")
        self.steps_total = 0
        self.after_steps = 0.0  # seconds from its last tool step to its answer
        self.pending_turn: list[Plan] | None = None
        self.waiting_answer: list[Plan] | None = None
        self.in_paste = False
        self.swallow = 0  # Enters still to ignore after the last paste (rules: swallow_enters)
        self.paste_buf = b""
        self.raw_buf = b""
        self.esc_at = 0.0  # when a lone ESC arrived (the Escape key, once ESC_WAIT passes)
        self.spin = 0
        self.last_spin = 0.0
        self.running = True
        self.last_reply = ""

    # -- configuration -------------------------------------------------------------------------
    def _load_rules(self, path_arg: str | None) -> dict[str, Any]:
        candidates = [path_arg, self.env.get("CAO_SCRIPTED_RULES")]
        rules_dir = self.env.get("CAO_SCRIPTED_DIR")
        if rules_dir:
            candidates.append(str(Path(rules_dir) / f"{self.profile}.json"))
        for cand in candidates:
            if cand and Path(cand).is_file():
                data = json.loads(Path(cand).read_text())
                return {**DEFAULT_RULES, **data}
        return dict(DEFAULT_RULES)

    def _record_path(self, arg: str | None) -> Path | None:
        want = arg or self.env.get("CAO_SCRIPTED_RECORD") or self.config.get("record")
        if not want or want in ("0", "false", False):
            return None
        if want in ("1", "true", True):
            base = Path(self.env.get("CAO_SCRIPTED_DIR") or ".") / "received"
            base.mkdir(parents=True, exist_ok=True)
            return base / f"{self.tid}.jsonl"
        path = Path(str(want))
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- output ---------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        if self.out is not None:
            self.out(text)
            return
        data = text.encode("utf-8", "replace")
        while data:
            n = os.write(1, data)
            data = data[n:]

    def prompt(self) -> None:
        lines = self.input.split("\n")
        shown = lines[0][:150]
        if len(lines) > 1:
            shown += f" [+{len(lines) - 1} lines] …{lines[-1][-60:]}"  # the tail too: what was added last
        self.write("\r\x1b[K" + str(self.config.get("prompt_mark", "❯ ")) + shown)

    def spinner(self) -> None:
        secs = int(self.now() - self.busy_started)
        queued = f" · {len(self.queue)} queued" if self.queue else ""
        frame = SPINNER[self.spin % len(SPINNER)]
        if busy := self.config.get("busy_text"):  # another busy line, as a new release might draw
            self.write(f"\r\x1b[K{busy} {frame} {secs}s{queued}")
            return
        self.write(f"\r\x1b[K{frame} thinking… ({secs}s{queued} · esc to interrupt)")

    def block(self, mark: str, text: str) -> None:
        lines = text.split("\n") or [""]
        out = [f"{mark} {lines[0]}"] + [f"  {line}" for line in lines[1:]]
        self.write("\r\x1b[K" + "\n".join(out) + "\n")

    # -- input parsing --------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if data == b"\x1b":
            self.esc_at = self.now()
        self.raw_buf += data
        while self.raw_buf:
            if self.in_paste:
                end = self.raw_buf.find(PASTE_END)
                if end < 0:
                    keep = len(PASTE_END) - 1
                    self.paste_buf += self.raw_buf[:-keep] if len(self.raw_buf) > keep else b""
                    self.raw_buf = self.raw_buf[-keep:] if len(self.raw_buf) > keep else self.raw_buf
                    return
                self.paste_buf += self.raw_buf[:end]
                self.raw_buf = self.raw_buf[end + len(PASTE_END) :]
                self.in_paste = False
                text = self.paste_buf.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
                self.paste_buf = b""
                self.swallow = int(self.config.get("swallow_enters", 0))
                self.type_text(text)
                continue
            start = self.raw_buf.find(PASTE_START)
            chunk = self.raw_buf if start < 0 else self.raw_buf[:start]
            if start < 0 and self.raw_buf.endswith(b"\x1b"):
                chunk = self.raw_buf[:-1]  # maybe the start of a paste marker; wait for more
            consumed = self.keys(chunk)
            self.raw_buf = self.raw_buf[consumed:]
            if start >= 0 and consumed == start:
                self.raw_buf = self.raw_buf[len(PASTE_START) :]
                self.in_paste = True
                continue
            return

    def keys(self, chunk: bytes) -> int:
        """Handle typed keys; returns how many bytes were consumed."""
        i = 0
        while i < len(chunk):
            b = chunk[i : i + 1]
            if b == b"\x1b":
                m = re.match(rb"\x1b(\[[0-9;?]*[ -/]*[@-~]|O.|.)", chunk[i:], re.S)
                if m is None:
                    return i  # incomplete escape sequence
                i += m.end()
                continue
            i += 1
            if b in (b"\r", b"\n") and self.swallow > 0:
                self.swallow -= 1
            elif b in (b"\r", b"\n"):
                self.submit()
            elif b in (b"\x7f", b"\x08"):
                self.input = self.input[:-1]
                self.redraw()
            elif b == b"\x03":
                self.input = ""
                self.redraw()
            elif b == b"\x04" and not self.input and not self.busy:
                self.running = False
            else:
                # decode multi-byte UTF-8 typed characters
                j = i
                while j < len(chunk) and 0x80 <= chunk[j] < 0xC0:
                    j += 1
                self.type_text(chunk[i - 1 : j].decode("utf-8", "replace"))
                i = j
        return i

    def type_text(self, text: str) -> None:
        self.input += text
        self.redraw()

    def redraw(self) -> None:
        if self.busy:
            self.spinner()
        elif self.waiting_answer is None:
            self.prompt()

    # -- lifecycle hooks (rules: "hooks": true) ---------------------------------------------------
    def hook(self, event: str, **fields: str) -> str:
        """Run the hook for ``event`` and wait for it; returns what it printed on stdout."""
        command = self.env.get("CAO_SCRIPTED_HOOK")
        if not self.config.get("hooks") or not command:
            return ""
        payload = json.dumps({"hook_event_name": event, "session_id": self.tid, **fields}).encode()
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            done = subprocess.run(
                json.loads(command),
                input=payload,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
            return done.stdout.decode("utf-8", "replace")
        return ""

    def tool_step(self, n: int, of: int) -> None:
        """One tool call of a turn (rules ``steps``) finished: its PostToolUse hook runs, and text it
        hands back (``hookSpecificOutput.additionalContext``, as Claude Code reads it) joins the
        turn: drawn above the spinner and recorded as ``context``."""
        self.write("\r\x1b[K")
        self.block("⚒", f"tool step {n}/{of} done")
        out = self.hook("PostToolUse", tool_name="Bash")
        try:
            context = json.loads(out)["hookSpecificOutput"]["additionalContext"] if out.strip() else ""
        except (ValueError, KeyError, TypeError):
            context = ""
        if isinstance(context, str) and context:
            self.block("⎿", context)
            self._append(
                {
                    "kind": "context",
                    "t": time.time(),
                    "terminal": self.tid,
                    "messages": split_messages(context),
                }
            )
        self.spinner()

    # -- turns ----------------------------------------------------------------------------------
    def submit(self) -> None:
        text, self.input = self.input, ""
        if self.waiting_answer is not None:
            self.answer(text.strip().lower())
            return
        if not text.strip():
            self.redraw()
            return
        if text.strip() in ("/exit", "/quit"):
            self.write("\r\x1b[Kbye\n")
            self.running = False
            return
        # Recorded on arrival (before it runs), so a queued message shows it came in mid-turn.
        self.record(text, split_messages(text), arrived_busy=self.busy)
        if self.busy:
            self.queue.append(text)
            self.spinner()
            return
        self.start_turn(text)

    def record(self, text: str, messages: list[dict[str, Any]], arrived_busy: bool) -> None:
        self._append(
            {
                "kind": "received",
                "t": time.time(),
                "terminal": self.tid,
                "arrived_busy": arrived_busy,
                "text": text,
                "messages": messages,
            }
        )

    def _append(self, entry: dict[str, Any]) -> None:
        if self.record_path is None:
            return
        try:
            with self.record_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
        except OSError as exc:  # a full disk: the agent goes on (the record is the tests' only)
            sys.stderr.write(f"cao scripted agent: could not record: {exc}\n")

    def start_turn(self, text: str) -> None:
        self.hook("UserPromptSubmit", prompt=text)
        messages = split_messages(text)
        self.write("\r\x1b[K")
        self.block("›", text)
        plans = [Plan(msg, *self.match(msg["body"])) for msg in messages]
        delay = max(float(p.rule.get("delay", 0)) for p in plans)
        self.steps = [float(s) for p in plans for s in p.rule.get("steps", [])]
        self.steps_total = len(self.steps)
        self.after_steps = delay
        if self.steps:
            delay = self.steps[0]
        ask = next((p.rule["ask"] for p in plans if p.rule.get("ask")), None)
        self.busy = True
        self.busy_started = self.now()
        self.busy_until = self.busy_started + delay
        self.pending_turn = plans
        if ask:
            self.busy = False
            self.waiting_answer = self.pending_turn
            self.pending_turn = None
            self.write(f"\r\x1b[K? {ask} (y/n)")
            self.hook("Notification", notification_type="permission_prompt", message=str(ask))
            return
        if delay <= 0 and not self.steps:
            self.finish_turn()
        else:
            self.spinner()

    def answer(self, text: str) -> None:
        turn, self.waiting_answer = self.waiting_answer, None
        assert turn is not None
        self.write("\n")
        if text.startswith("y"):
            self.pending_turn = turn
            self.busy = True
            self.finish_turn()
        else:
            self.block("●", "permission denied; nothing was done")
            self.write("\n")
            self.end_turn()

    def match(self, body: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
        for rule in self.config.get("rules", []):
            pattern = re.compile(rule.get("match", ""), re.M | re.S if rule.get("dotall") else re.M)
            found = [m.groupdict() for m in pattern.finditer(body)]
            if found:
                return rule, found
        return self.config.get("default", DEFAULT_RULES["default"]), [{}]

    def finish_turn(self) -> None:
        assert self.pending_turn is not None
        plans, self.pending_turn = self.pending_turn, None
        replies: list[str] = []
        self.write("\r\x1b[K")
        for plan in plans:
            rule, groups, msg = plan.rule, plan.groups, plan.msg
            body = msg["body"]
            first = body.strip().split("\n", 1)[0][:80] if body.strip() else ""
            base = {
                "first_line": first,
                "message": body,
                "sender": msg["sender"] or "",
                "message_id": str(msg["id"] or ""),
                "terminal_id": self.tid,
            }
            notes: list[str] = []
            for groupdict in groups:
                values = _Defaults({**base, **{k: v or "" for k, v in groupdict.items()}})
                for send in rule.get("send", []):
                    notes.append(self.send(send["to"].format_map(values), send["message"].format_map(values)))
                if rule.get("result"):
                    notes.append(self.report(rule["result"], values))
            values = _Defaults({**base, **{k: v or "" for k, v in groups[0].items()}})
            if rule.get("usage"):
                self.spend(rule["usage"])
            if rule.get("error"):
                self.block("✗", str(rule["error"]).format_map(values))
                continue
            reply = str(rule.get("reply", "")).format_map(values)
            text = "\n".join([reply, *notes]) if reply else "\n".join(notes)
            if text:
                self.block("●", text)
                replies.append(text)
        self.write("\n")
        self.last_reply = "\n".join(replies)
        self.end_turn()

    def spend(self, spec: dict[str, Any]) -> None:
        """Record one model response's tokens the way a CLI's transcript would
        (``$CAO_SCRIPTED_USAGE``, JSON lines; cao reads them: providers/scripted.py ``usage``)."""
        path = self.env.get("CAO_SCRIPTED_USAGE")
        if not path:
            return
        self.responses += 1
        entry = {
            "id": f"{self.tid}-{self.responses}",
            "at": self.wall(),
            "model": str(spec.get("model", "scripted-1")),
            **{
                k: int(spec.get(k, 0))
                for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
            },
        }
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        except OSError as exc:
            sys.stderr.write(f"cao scripted agent: could not record usage: {exc}\n")

    def end_turn(self) -> None:
        self.busy = False
        self.hook("Stop", last_assistant_message=self.last_reply)
        self.last_reply = ""
        self._append({"kind": TURN_DONE, "t": time.time(), "terminal": self.tid})
        if self.queue:
            self.start_turn(self.queue.pop(0))
        else:
            self.prompt()

    def report(self, spec: dict[str, Any], values: Any) -> str:
        """A rule's ``result``: report_result as the MCP tool does (POST /terminals/{me}/result)."""
        body: dict[str, Any] = {
            "by": self.tid,
            "status": str(spec.get("status", "done")).format_map(values),
            "summary": str(spec.get("summary", "{first_line}")).format_map(values),
        }
        if spec.get("details") is not None:
            body["details"] = spec["details"]
        try:
            receipt = self._post(f"/terminals/{self.tid}/result", body)
            return f"reported result {receipt.get('result_id')} ({body['status']})"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return f"could not report the result: {exc}"

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if token := api_token(self.env):
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            f"{self.server}{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
        return out

    def send(self, to: str, message: str) -> str:
        data = json.dumps({"sender_id": self.tid, "message": message}).encode()
        headers = {"Content-Type": "application/json"}
        if token := api_token(self.env):
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            f"{self.server}/terminals/{to}/inbox/messages", data=data, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                receipt = json.loads(resp.read())
            return f"sent message #{receipt.get('message_id')} to {to}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return f"could not send to {to}: {exc}"

    # -- main loop ------------------------------------------------------------------------------
    def start(self, sleep: Any) -> None:
        """Draw the banner and the first prompt (after the rules' start-up delay)."""
        self.write("\x1b[?2004h")
        self.write(f"cao scripted agent · terminal {self.tid} · profile {self.profile}\n")
        delay = float(self.config.get("startup_delay", 0))
        if delay > 0:
            self.write("starting…")
            sleep(delay)
            self.write("\r\x1b[K")
        self.write("\n")
        self.prompt()
        self.hook("SessionStart", source="startup")

    def escape(self) -> None:
        """The Escape key (alone): stops a running turn, as the real CLIs do; its reply is never
        written, text typed meanwhile stays in the input. Ignored at the prompt or a question."""
        if not self.busy or self.pending_turn is None:
            return
        self.pending_turn = None
        self.busy = False
        self.steps = []
        self.write("\r\x1b[K")
        self.block("⎋", "interrupted")
        self.write("\n")
        self._append({"kind": "stopped", "t": time.time(), "terminal": self.tid})
        if self.queue:
            self.start_turn(self.queue.pop(0))
        else:
            self.prompt()

    def tick(self) -> None:
        """Time has passed: a lone Escape is the key (not the start of a sequence); finish a turn
        that is due, or move the spinner."""
        if self.raw_buf == b"\x1b" and self.now() - self.esc_at >= ESC_WAIT:
            self.raw_buf = b""
            self.escape()
        if self.busy and self.pending_turn is not None:
            now = self.now()
            if now >= self.busy_until and self.steps:
                self.steps.pop(0)
                self.tool_step(self.steps_total - len(self.steps), self.steps_total)
                self.busy_until = self.now() + (self.steps[0] if self.steps else self.after_steps)
            elif now >= self.busy_until:
                self.finish_turn()
            elif now >= self.last_spin + 0.1:
                self.spin += 1
                self.last_spin = now
                self.spinner()

    def run(self) -> int:
        fd = sys.stdin.fileno()
        old = termios.tcgetattr(fd) if os.isatty(fd) else None
        if old is not None:
            tty.setraw(fd)
            attrs = termios.tcgetattr(fd)
            attrs[1] |= termios.OPOST | termios.ONLCR
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        try:
            self.start(sleep=time.sleep)
            while self.running:
                timeout = None
                if self.busy:
                    now = self.now()
                    timeout = max(0.0, min(self.busy_until - now, self.last_spin + 0.1 - now))
                if self.raw_buf == b"\x1b":
                    timeout = ESC_WAIT if timeout is None else min(timeout, ESC_WAIT)
                ready, _, _ = select.select([fd], [], [], timeout)
                if ready:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    self.feed(data)
                self.tick()
        finally:
            self.write("\x1b[?2004l\r\n")
            if old is not None:
                termios.tcsetattr(fd, termios.TCSADRAIN, old)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cao-scripted-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--terminal-id")
    parser.add_argument("--rules", help="rules JSON file")
    parser.add_argument("--record", help="append every received message to this JSONL file")
    parser.add_argument("--server", help="cao-server URL for sending messages")
    return Agent(parser.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
