"""A fake model server that speaks just enough of three model APIs to drive the real agent CLIs.

Run it (on loopback only) with::

    python -m cao.testing.fakemodel --port 18081 [--host 127.0.0.1] [--uds /path/ctl.sock]

or in-process::

    with FakeModelServer(port=0) as fake:
        ...  # point a CLI at fake.url; read fake.requests()

APIs served
-----------
- Anthropic Messages (Claude Code): ``POST /v1/messages`` (``?beta=true`` or not), SSE or JSON.
- OpenAI Responses (Codex): ``POST /v1/responses``, SSE (or JSON when ``"stream": false``).
- Gemini (Gemini CLI): ``POST /v1beta/models/{model}:generateContent`` (JSON),
  ``:streamGenerateContent?alt=sse`` (SSE ``data:`` lines) and ``:countTokens``.
- Control: ``GET /_fake/requests`` (request log as JSON; ``?bodies=0`` drops request bodies),
  ``DELETE /_fake/requests`` (clear it), ``GET /_fake/health``. A log entry has ``seq``, ``time``,
  ``method``, ``path``, ``query``, ``api`` and ``kind`` (``main``/``aux``/``probe``/``count_tokens``/
  ``unknown``), and for model calls ``prompt``, ``tool_results`` (count), ``stream``, ``action``
  (what was answered: text, tool call or error) and ``body`` (the request JSON).

Which requests are scripted
---------------------------
A request that offers tools is a *main* request: its reply is scripted by markers (below). A request
without tools is an *auxiliary* one (Claude's and Codex's title requests, Gemini's model router and
next-speaker checks): it is answered at once, ignoring markers, with JSON built from the requested
schema when the request asks for JSON (``output_format``/``text.format``/``responseJsonSchema``),
else with a short title made from the prompt.

The prompt is the text of the last *user* message that carries text (tool results travel in user
messages too; those do not count), minus the wrapper texts the CLIs add (Claude's
``<system-reminder>`` blocks, Codex's ``<environment_context>``/AGENTS.md items, Gemini's
``<session_context>`` part).

Marker language (markers go anywhere in the prompt)
---------------------------------------------------
``[[delay:2.5]]``
    Wait 2.5 s before answering. For streamed replies the response headers and the opening events
    (Claude ``message_start``, Codex ``response.created``) go out first, then the wait, then the content;
    for errors and JSON replies the whole response waits. Applies to every main request of the turn
    (each step of a tool loop waits again).
``[[chunk_delay:0.2]]``
    Stream the answer text in small chunks (about three words each) with 0.2 s between chunks.
``[[reply:some text]]``
    The final answer text. Without it the answer is ``fake answer: <first 60 chars of the prompt
    with the markers removed>``, or ``done: <snippet of the last tool output>`` after tool calls.
``[[shell:echo hi]]``
    Call the CLI's shell tool: ``Bash`` (Claude), ``exec_command`` (Codex), ``run_shell_command``
    (Gemini); the tool's actual name and argument shape are taken from the request's tool list.
``[[mcp:send_message {"receiver_id":"abcd1234","message":"hi"}]]``
    Call an MCP tool of the server ``cao`` (``[[mcp:other.tool {...}]]`` names another server):
    ``mcp__cao__send_message`` (Claude), ``send_message`` in namespace ``mcp__cao`` (Codex),
    ``mcp_cao_send_message`` (Gemini). The JSON object is the tool's arguments (default ``{}``).
    Claude and Codex accept a first prompt before their MCP servers have connected, so the tool can
    be missing from that request. Claude then gets a ``WaitForMcpServers`` call first (at most once
    per turn; its result does not count as a step). Codex gets the call anyway and fails it without
    reaching the server, so give Codex a few seconds after start (its status line appears ~1 s
    after the prompt; MCP was ready by ~4 s here) or send a tool-less message first. Gemini queues
    prompts until its MCP servers are up.
``[[permission]]`` / ``[[permission:touch x]]``
    A shell call that needs approval when the CLI is not in bypass/yolo mode (default command
    ``touch cao-permission-probe.txt``; for Codex it also asks for escalated sandbox permissions
    when the tool accepts that).
``[[question:Pick a colour?|red|blue]]``
    Ask the user a multiple-choice question through the CLI's question tool (Claude
    ``AskUserQuestion``, Gemini ``ask_user``). Codex (its ``request_user_input`` works only in Plan
    mode) and a CLI without such a tool get the question as the plain answer text instead.
``[[error:500]]`` / ``[[error:400]]`` / ``[[error:429]]`` ...
    Answer with that HTTP status and a body in the API's own error format. Every retry of the same
    turn gets the same error (the prompt does not change).

Tool markers run in the order they appear, one per model call: the first main request of a turn
gets the first tool call, the request carrying one tool result gets the second, and so on; once
every tool marker has been used the final text is sent. Marker arguments end at the first ``]]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

JSON = dict[str, Any]

MARKER_RE = re.compile(r"\[\[(\w+)(?::(.*?))?\]\]", re.S)
DEFAULT_PERMISSION_COMMAND = "touch cao-permission-probe.txt"
_ids = itertools.count(1)
WAIT_FOR_MCP = "WaitForMcpServers"
TOOL_MARKERS = ("shell", "mcp", "permission", "question")

# Texts the CLIs put into user messages that are not what the user typed.
WRAPPER_PREFIXES = (
    "<system-reminder>",
    "<environment_context>",
    "<user_instructions>",
    "<session_context>",
    "<permissions instructions>",
    "<INSTRUCTIONS>",
    "# AGENTS.md instructions",
    "<local-command-",
    "<command-name>",
)


# --------------------------------------------------------------------------------------------------
# Script: what to answer
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    name: str
    arg: str | None


@dataclass
class Script:
    """The markers of one prompt, decoded."""

    prompt: str
    delay: float = 0.0
    chunk_delay: float = 0.0
    reply: str | None = None
    error: int | None = None
    tools: list[Marker] = field(default_factory=list)

    @classmethod
    def parse(cls, prompt: str) -> Script:
        script = cls(prompt=prompt)
        for match in MARKER_RE.finditer(prompt):
            name, arg = match.group(1).lower(), match.group(2)
            if name == "delay":
                script.delay = _float(arg)
            elif name == "chunk_delay":
                script.chunk_delay = _float(arg)
            elif name == "reply":
                script.reply = arg or ""
            elif name == "error":
                script.error = int(_float(arg) or 500)
            elif name in TOOL_MARKERS:
                script.tools.append(Marker(name, arg))
        return script

    @property
    def plain_prompt(self) -> str:
        return " ".join(MARKER_RE.sub(" ", self.prompt).split())

    def default_answer(self) -> str:
        text = self.plain_prompt[:60]
        return f"fake answer: {text}" if text else "fake answer."

    def title(self) -> str:
        text = self.prompt
        if inner := re.search(r"<session>(.*?)</session>", text, re.S):  # Claude's title request
            text = inner.group(1)
        elif "User prompt:\n" in text:  # Codex's title request
            text = text.rsplit("User prompt:\n", 1)[1]
        text = MARKER_RE.sub(" ", text)
        words = text.split()[:5]
        return " ".join(words) if words else "Fake session"


def _float(value: str | None) -> float:
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class ToolCall:
    """A tool call to send, already in the API's naming; ``namespace`` is Codex-only."""

    name: str
    args: JSON
    namespace: str | None = None


@dataclass(frozen=True)
class Action:
    """What a main request gets: an error, a tool call, or a final text."""

    kind: str  # "error" | "tool" | "text"
    text: str = ""
    tool: ToolCall | None = None
    status: int = 200

    def summary(self) -> JSON:
        out: JSON = {"kind": self.kind}
        if self.kind == "text":
            out["text"] = self.text
        elif self.kind == "tool" and self.tool is not None:
            out["tool"] = {"name": self.tool.name, "args": self.tool.args, "namespace": self.tool.namespace}
        else:
            out["status"] = self.status
        return out


@dataclass
class Conversation:
    """What an API adapter extracted from one request body."""

    prompt: str
    tool_results: list[str]
    has_tools: bool
    waited_for_mcp: bool = False  # Claude: a WaitForMcpServers call was already made this turn


def snippet(text: str, limit: int = 80) -> str:
    return " ".join(text.split())[:limit]


def decide(script: Script, conv: Conversation, make_tool: Callable[[Marker], ToolCall]) -> Action:
    """Pick the reply of a main request. ``make_tool(marker) -> ToolCall`` is the API's tool namer."""
    if script.error is not None:
        return Action("error", status=script.error)
    done = len(conv.tool_results)
    if done < len(script.tools):
        tool = make_tool(script.tools[done])
        if not tool.name:  # the CLI has no such tool (e.g. no question tool): say it instead
            return Action("text", text=str(tool.args.get("text", "")))
        return Action("tool", tool=tool)
    if script.reply is not None:
        return Action("text", text=script.reply)
    if done:
        return Action("text", text=f"done: {snippet(conv.tool_results[-1])}")
    return Action("text", text=script.default_answer())


def parse_mcp_arg(arg: str | None) -> tuple[str, str, JSON]:
    """``"send_message {...}"`` -> ("cao", "send_message", {...}); ``"srv.tool"`` names the server."""
    text = (arg or "").strip()
    name, _, rest = text.partition(" ")
    server, dot, tool = name.partition(".")
    if not dot:
        server, tool = "cao", name
    args: JSON = {}
    if rest.strip():
        try:
            loaded = json.loads(rest)
            args = loaded if isinstance(loaded, dict) else {"value": loaded}
        except json.JSONDecodeError:
            args = {"text": rest.strip()}
    return server, tool or "send_message", args


def parse_question_arg(arg: str | None) -> tuple[str, list[str]]:
    parts = [p.strip() for p in (arg or "").split("|")]
    question = parts[0] or "Which option?"
    options = [p for p in parts[1:] if p] or ["yes", "no"]
    return question, options


def say_question(question: str, options: list[str]) -> ToolCall:
    """No question tool: a nameless call that ``decide`` turns into the question as plain text."""
    return ToolCall("", {"text": f"{question} ({' / '.join(options)})"})


def example_from_schema(schema: Any, hint: str, key: str = "") -> Any:
    """A small value that satisfies ``schema`` (JSON Schema or Gemini's OpenAPI-ish dialect)."""
    if not isinstance(schema, dict):
        return hint
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        # "user" first: Gemini's next-speaker check must not make the CLI continue by itself.
        return "user" if "user" in enum else enum[0]
    for combo in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(combo), list) and schema[combo]:
            return example_from_schema(schema[combo][0], hint, key)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    kind = str(kind or ("object" if "properties" in schema else "string")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: example_from_schema(v, hint, k) for k, v in props.items()}
    if kind == "array":
        count = int(schema.get("minItems") or 0)
        return [example_from_schema(schema.get("items"), hint, key) for _ in range(count)]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        return int(low) if kind == "integer" else float(low)
    if kind == "boolean":
        return False
    lowered = key.lower()
    text = "fake reasoning" if "reason" in lowered or "explanation" in lowered else hint
    limit = schema.get("maxLength")
    return text[: int(limit)].rstrip() if isinstance(limit, int) else text


# --------------------------------------------------------------------------------------------------
# Request log
# --------------------------------------------------------------------------------------------------


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[JSON] = []

    def add(self, entry: JSON) -> JSON:
        with self._lock:
            entry["seq"] = len(self._items) + 1
            self._items.append(entry)
        return entry

    def items(self, bodies: bool = True) -> list[JSON]:
        with self._lock:
            items = list(self._items)
        if bodies:
            return items
        return [{k: v for k, v in item.items() if k != "body"} for item in items]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


def _entry(request: Request, api: str, body: Any) -> JSON:
    return {
        "time": time.time(),
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "api": api,
        "body": body,
    }


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw.decode("utf-8", "replace")}


def _sse(event: str | None, data: JSON) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _chunks(text: str, chunked: bool) -> list[str]:
    if not chunked:
        return [text]
    words = re.findall(r"\s*\S+\s*", text) or [text]
    return ["".join(words[i : i + 3]) for i in range(0, len(words), 3)]


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _as_text(content: Any) -> str:
    """Text of a tool result in any of the shapes the CLIs send."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_as_text(c) for c in content)
    if isinstance(content, dict):
        for key in ("text", "output", "content", "result", "llmContent", "error"):
            if key in content:
                return _as_text(content[key])
        return json.dumps(content)
    return "" if content is None else str(content)


def _user_texts(texts: list[str]) -> list[str]:
    return [t for t in texts if t.strip() and not t.lstrip().startswith(WRAPPER_PREFIXES)]


# --------------------------------------------------------------------------------------------------
# Anthropic Messages
# --------------------------------------------------------------------------------------------------

ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_conversation(body: JSON) -> Conversation:
    messages = body.get("messages") or []
    start, prompt = -1, ""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "user":
            continue
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        texts = _user_texts([b.get("text", "") for b in blocks if b.get("type") == "text"])
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    later = [m for m in messages[start + 1 :] if isinstance(m.get("content"), list)]
    waits = {
        block.get("id")
        for msg in later
        if msg.get("role") == "assistant"
        for block in msg["content"]
        if block.get("type") == "tool_use" and block.get("name") == WAIT_FOR_MCP
    }
    results = [
        _as_text(block.get("content"))
        for msg in later
        if msg.get("role") == "user"
        for block in msg["content"]
        if block.get("type") == "tool_result" and block.get("tool_use_id") not in waits
    ]
    return Conversation(prompt, results, bool(body.get("tools")), waited_for_mcp=bool(waits))


def anthropic_tool(body: JSON, conv: Conversation, marker: Marker) -> ToolCall:
    names = [t.get("name", "") for t in body.get("tools") or []]
    if marker.name == "mcp":
        server, tool, args = parse_mcp_arg(marker.arg)
        wanted = f"mcp__{server}__{tool}"
        if wanted not in names:
            wanted = next((n for n in names if n.endswith(f"__{tool}")), wanted)
        if wanted not in names and WAIT_FOR_MCP in names and not conv.waited_for_mcp:
            # Claude sends its first request before its MCP servers connect; it offers this tool to wait.
            return ToolCall(WAIT_FOR_MCP, {"servers": [server]})
        return ToolCall(wanted, args)
    if marker.name == "question":
        question, options = parse_question_arg(marker.arg)
        if "AskUserQuestion" not in names:
            return say_question(question, options)
        return ToolCall(
            "AskUserQuestion",
            {
                "questions": [
                    {
                        "question": question,
                        "header": "Question",
                        "options": [{"label": o, "description": f"Choose {o}"} for o in options],
                        "multiSelect": False,
                    }
                ]
            },
        )
    command = marker.arg or ("echo fake" if marker.name == "shell" else DEFAULT_PERMISSION_COMMAND)
    return ToolCall("Bash", {"command": command, "description": "Run a shell command"})


def anthropic_json_format(body: JSON) -> Any:
    fmt = body.get("output_format") or (body.get("output_config") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return fmt.get("schema") or {"type": "object"}
    return None


def anthropic_aux_text(body: JSON, script: Script) -> str:
    schema = anthropic_json_format(body)
    if schema is not None:
        return json.dumps(example_from_schema(schema, script.title()))
    system = json.dumps(body.get("system") or "")
    if "isNewTopic" in system:
        return json.dumps({"isNewTopic": True, "title": script.title()})
    if "json" in system.lower() and "title" in system.lower():
        return json.dumps({"title": script.title()})
    return script.title()


class AnthropicReply:
    def __init__(self, body: JSON, action: Action, delay: float, chunked: float) -> None:
        self.model = str(body.get("model") or "fake-model")
        self.action = action
        self.delay = delay
        self.chunk_delay = chunked
        self.id = f"msg_fake_{next(_ids):06d}"

    def content(self) -> list[JSON]:
        tool = self.action.tool
        if self.action.kind == "tool" and tool is not None:
            return [{"type": "tool_use", "id": f"toolu_{self.id[4:]}", "name": tool.name, "input": tool.args}]
        return [{"type": "text", "text": self.action.text}]

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.action.kind == "tool" else "end_turn"

    def message(self) -> JSON:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content(),
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }

    async def stream(self) -> AsyncIterator[bytes]:
        start = {**self.message(), "content": [], "stop_reason": None}
        start["usage"] = {
            "input_tokens": 10,
            "output_tokens": 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        yield _sse("message_start", {"type": "message_start", "message": start})
        yield _sse("ping", {"type": "ping"})
        if self.delay:
            await asyncio.sleep(self.delay)
        for index, block in enumerate(self.content()):
            if block["type"] == "tool_use":
                opening = {**block, "input": {}}
                yield _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opening},
                )
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                yield _sse(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
            else:
                yield _sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                for i, piece in enumerate(_chunks(block["text"], self.chunk_delay > 0)):
                    if i and self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                    delta = {"type": "text_delta", "text": piece}
                    yield _sse(
                        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                    )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 10},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})


def anthropic_error(status: int) -> JSON:
    kind = ANTHROPIC_ERRORS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": f"fake {kind} (HTTP {status})"}}


# --------------------------------------------------------------------------------------------------
# OpenAI Responses
# --------------------------------------------------------------------------------------------------


def openai_conversation(body: JSON) -> Conversation:
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    items = items or []
    start, prompt = -1, ""
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        if item.get("role") != "user" or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        parts = [{"text": content}] if isinstance(content, str) else content or []
        texts = _user_texts([p.get("text", "") for p in parts if isinstance(p, dict)])
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    results = [
        _as_text(item.get("output"))
        for item in items[start + 1 :]
        if str(item.get("type", "")).endswith("call_output")
    ]
    return Conversation(prompt, results, bool(body.get("tools")))


def _openai_tools(body: JSON) -> Iterator[tuple[str | None, JSON]]:
    """(namespace, tool) for every function tool, flattening namespace tools."""
    for tool in body.get("tools") or []:
        if tool.get("type") == "namespace" or "tools" in tool:
            for inner in tool.get("tools") or []:
                yield tool.get("name"), inner
        else:
            yield None, tool


def openai_tool(body: JSON, marker: Marker) -> ToolCall:
    tools = list(_openai_tools(body))
    if marker.name == "mcp":
        server, tool, args = parse_mcp_arg(marker.arg)
        namespace = f"mcp__{server}"
        for ns, spec in tools:
            if spec.get("name") == tool and (ns == namespace or ns is None):
                return ToolCall(tool, args, ns)
            if spec.get("name") == f"{namespace}__{tool}":  # older Codex: flat names
                return ToolCall(spec["name"], args)
        return ToolCall(tool, args, namespace)
    if marker.name == "question":
        # Codex offers request_user_input but refuses it outside Plan mode
        # ("request_user_input is unavailable in Default mode"), so the question goes out as text.
        question, options = parse_question_arg(marker.arg)
        return say_question(question, options)
    command = marker.arg or ("echo fake" if marker.name == "shell" else DEFAULT_PERMISSION_COMMAND)
    for _, spec in tools:
        name = spec.get("name")
        if name not in ("exec_command", "shell_command", "shell", "local_shell"):
            continue
        props = (spec.get("parameters") or {}).get("properties") or {}
        call_args: JSON = {}
        if "cmd" in props:
            call_args["cmd"] = command
        elif (props.get("command") or {}).get("type") == "array":
            call_args["command"] = ["bash", "-lc", command]
        else:
            call_args["command"] = command
        if marker.name == "permission" and "sandbox_permissions" in props:
            call_args["sandbox_permissions"] = "require_escalated"
            if "justification" in props:
                call_args["justification"] = "The fake model asks for approval."
        return ToolCall(str(name), call_args)
    return ToolCall("exec_command", {"cmd": command})


def openai_json_schema(body: JSON) -> Any:
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        return fmt.get("schema") or {"type": "object"}
    return None


class OpenAIReply:
    def __init__(self, body: JSON, action: Action, delay: float, chunked: float) -> None:
        self.model = str(body.get("model") or "fake-model")
        self.action = action
        self.delay = delay
        self.chunk_delay = chunked
        stamp = f"{next(_ids):06d}"
        self.id = f"resp_fake_{stamp}"
        self.item_id = f"item_fake_{stamp}"
        self.seq = 0

    def item(self) -> JSON:
        tool = self.action.tool
        if self.action.kind == "tool" and tool is not None:
            item: JSON = {
                "id": self.item_id,
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_{self.item_id}",
                "name": tool.name,
                "arguments": json.dumps(tool.args),
            }
            if tool.namespace:
                item["namespace"] = tool.namespace
            return item
        return {
            "id": self.item_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": self.action.text, "annotations": []}],
        }

    def response(self, status: str, output: list[JSON]) -> JSON:
        out: JSON = {
            "id": self.id,
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": self.model,
            "output": output,
        }
        if status == "completed":
            out["usage"] = {
                "input_tokens": 10,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 10,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 20,
            }
        return out

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return _sse(kind, data)

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.event("response.created", response=self.response("in_progress", []))
        yield self.event("response.in_progress", response=self.response("in_progress", []))
        if self.delay:
            await asyncio.sleep(self.delay)
        item = self.item()
        ref = {"item_id": self.item_id, "output_index": 0}
        if item["type"] == "function_call":
            yield self.event(
                "response.output_item.added",
                output_index=0,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            yield self.event("response.function_call_arguments.delta", **ref, delta=item["arguments"])
            yield self.event("response.function_call_arguments.done", **ref, arguments=item["arguments"])
        else:
            text = self.action.text
            yield self.event(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield self.event("response.content_part.added", **ref, content_index=0, part=part)
            for i, piece in enumerate(_chunks(text, self.chunk_delay > 0)):
                if i and self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield self.event("response.output_text.delta", **ref, content_index=0, delta=piece)
            yield self.event("response.output_text.done", **ref, content_index=0, text=text)
            yield self.event(
                "response.content_part.done", **ref, content_index=0, part={**part, "text": text}
            )
        yield self.event("response.output_item.done", output_index=0, item=item)
        yield self.event("response.completed", response=self.response("completed", [item]))


def openai_error(status: int) -> JSON:
    kind = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(
        status, "server_error"
    )
    return {"error": {"message": f"fake {kind} (HTTP {status})", "type": kind, "param": None, "code": kind}}


# --------------------------------------------------------------------------------------------------
# Gemini
# --------------------------------------------------------------------------------------------------

GEMINI_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def gemini_conversation(body: JSON) -> Conversation:
    contents = body.get("contents") or []
    start, prompt = -1, ""
    for i in range(len(contents) - 1, -1, -1):
        content = contents[i]
        if content.get("role", "user") != "user":
            continue
        texts = _user_texts([p.get("text", "") for p in content.get("parts") or [] if "text" in p])
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    results = [
        _as_text(part["functionResponse"].get("response"))
        for content in contents[start + 1 :]
        for part in content.get("parts") or []
        if "functionResponse" in part
    ]
    has_tools = any(t.get("functionDeclarations") for t in body.get("tools") or [])
    return Conversation(prompt, results, has_tools)


def gemini_tool(body: JSON, marker: Marker) -> ToolCall:
    names = [d.get("name", "") for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []]
    if marker.name == "mcp":
        server, tool, args = parse_mcp_arg(marker.arg)
        wanted = f"mcp_{server}_{tool}"
        if wanted not in names:
            wanted = next((n for n in names if n.endswith(f"_{tool}") and n.startswith("mcp_")), wanted)
        return ToolCall(wanted, args)
    if marker.name == "question":
        question, options = parse_question_arg(marker.arg)
        qs = [
            {
                "question": question,
                "header": "Question",
                "type": "choice",
                "options": [{"label": o, "description": f"Choose {o}"} for o in options],
            }
        ]
        return (
            ToolCall("ask_user", {"questions": qs})
            if "ask_user" in names
            else say_question(question, options)
        )
    command = marker.arg or ("echo fake" if marker.name == "shell" else DEFAULT_PERMISSION_COMMAND)
    return ToolCall("run_shell_command", {"command": command, "description": "Run a shell command"})


def gemini_json_schema(body: JSON) -> Any:
    config = body.get("generationConfig") or body.get("generation_config") or {}
    for key in ("responseJsonSchema", "responseSchema", "response_json_schema", "response_schema"):
        if key in config:
            return config[key]
    if config.get("responseMimeType") == "application/json":
        return {"type": "object"}
    return None


def gemini_chunk(parts: list[JSON], finish: bool) -> JSON:
    candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
    chunk: JSON = {"candidates": [candidate], "modelVersion": "fake-model"}
    if finish:
        candidate["finishReason"] = "STOP"
        chunk["usageMetadata"] = {"promptTokenCount": 10, "candidatesTokenCount": 10, "totalTokenCount": 20}
    return chunk


def gemini_parts(action: Action) -> list[JSON]:
    tool = action.tool
    if action.kind == "tool" and tool is not None:
        return [{"functionCall": {"name": tool.name, "args": tool.args}}]
    return [{"text": action.text}]


async def gemini_stream(action: Action, delay: float, chunk_delay: float) -> AsyncIterator[bytes]:
    if delay:
        await asyncio.sleep(delay)
    if action.kind == "tool":
        yield _sse(None, gemini_chunk(gemini_parts(action), finish=True))
        return
    pieces = _chunks(action.text, chunk_delay > 0)
    for i, piece in enumerate(pieces):
        if i and chunk_delay:
            await asyncio.sleep(chunk_delay)
        yield _sse(None, gemini_chunk([{"text": piece}], finish=i == len(pieces) - 1))


def gemini_error(status: int) -> JSON:
    return {
        "error": {
            "code": status,
            "message": f"fake error (HTTP {status})",
            "status": GEMINI_STATUS.get(status, "UNKNOWN"),
        }
    }


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------


def create_app(log: RequestLog | None = None) -> Starlette:
    """The Starlette app; ``log`` is the request log it fills (a new one by default)."""
    log = log if log is not None else RequestLog()

    async def anthropic_messages(request: Request) -> Response:
        body = await _read_json(request)
        entry = _entry(request, "anthropic", body)
        conv = anthropic_conversation(body)
        script = Script.parse(conv.prompt)
        stream = bool(body.get("stream"))
        entry.update(prompt=conv.prompt, tool_results=len(conv.tool_results), stream=stream)
        if conv.has_tools:
            action = decide(script, conv, lambda m: anthropic_tool(body, conv, m))
            delay, chunk_delay = script.delay, script.chunk_delay
        else:
            action = Action("text", text=anthropic_aux_text(body, script))
            delay, chunk_delay = 0.0, 0.0
        entry.update(kind="main" if conv.has_tools else "aux", action=action.summary())
        log.add(entry)
        if action.kind == "error":
            await asyncio.sleep(delay)
            return JSONResponse(anthropic_error(action.status), status_code=action.status)
        reply = AnthropicReply(body, action, delay, chunk_delay)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(reply.message())
        return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def anthropic_count_tokens(request: Request) -> Response:
        body = await _read_json(request)
        log.add({**_entry(request, "anthropic", body), "kind": "count_tokens"})
        return JSONResponse({"input_tokens": max(1, len(json.dumps(body)) // 4)})

    async def openai_responses(request: Request) -> Response:
        body = await _read_json(request)
        entry = _entry(request, "openai", body)
        conv = openai_conversation(body)
        script = Script.parse(conv.prompt)
        stream = body.get("stream", True) is not False
        entry.update(prompt=conv.prompt, tool_results=len(conv.tool_results), stream=stream)
        if conv.has_tools:
            action = decide(script, conv, lambda m: openai_tool(body, m))
            delay, chunk_delay = script.delay, script.chunk_delay
        else:
            schema = openai_json_schema(body)
            text = json.dumps(example_from_schema(schema, script.title())) if schema else script.title()
            action = Action("text", text=text)
            delay, chunk_delay = 0.0, 0.0
        entry.update(kind="main" if conv.has_tools else "aux", action=action.summary())
        log.add(entry)
        if action.kind == "error":
            await asyncio.sleep(delay)
            return JSONResponse(openai_error(action.status), status_code=action.status)
        reply = OpenAIReply(body, action, delay, chunk_delay)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(reply.response("completed", [reply.item()]))
        return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def gemini_models(request: Request) -> Response:
        model, _, method = request.path_params["target"].partition(":")
        body = await _read_json(request)
        entry = _entry(request, "gemini", body)
        entry["model"] = model
        if method == "countTokens":
            log.add({**entry, "kind": "count_tokens"})
            return JSONResponse({"totalTokens": max(1, len(json.dumps(body)) // 4)})
        if method not in ("generateContent", "streamGenerateContent"):
            log.add({**entry, "kind": "unknown"})
            return JSONResponse(gemini_error(404), status_code=404)
        conv = gemini_conversation(body)
        script = Script.parse(conv.prompt)
        stream = method == "streamGenerateContent"
        entry.update(prompt=conv.prompt, tool_results=len(conv.tool_results), stream=stream)
        schema = gemini_json_schema(body)
        if conv.has_tools or (stream and schema is None):
            action = decide(script, conv, lambda m: gemini_tool(body, m))
            delay, chunk_delay, kind = script.delay, script.chunk_delay, "main"
        else:
            text = json.dumps(example_from_schema(schema, script.title())) if schema else script.title()
            action = Action("text", text=text)
            delay, chunk_delay, kind = 0.0, 0.0, "aux"
        entry.update(kind=kind, action=action.summary())
        log.add(entry)
        if action.kind == "error":
            await asyncio.sleep(delay)
            return JSONResponse(gemini_error(action.status), status_code=action.status)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(gemini_chunk(gemini_parts(action), finish=True))
        return StreamingResponse(
            gemini_stream(action, delay, chunk_delay), media_type="text/event-stream", headers=SSE_HEADERS
        )

    async def fake_requests(request: Request) -> Response:
        if request.method == "DELETE":
            log.clear()
            return JSONResponse({"cleared": True})
        bodies = request.query_params.get("bodies", "1") not in ("0", "false", "no")
        return JSONResponse(log.items(bodies=bodies))

    async def fake_health(request: Request) -> Response:
        return JSONResponse({"ok": True, "requests": len(log.items(bodies=False))})

    async def root(request: Request) -> Response:
        log.add({**_entry(request, "none", None), "kind": "probe"})  # Claude sends HEAD / at start
        return JSONResponse({"ok": True})

    async def not_found(request: Request) -> Response:
        log.add({**_entry(request, "unknown", await _read_json(request)), "kind": "unknown"})
        return JSONResponse(
            {"error": {"message": f"fake model server: no route {request.url.path}"}}, status_code=404
        )

    app = Starlette(
        routes=[
            Route("/v1/messages", anthropic_messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", anthropic_count_tokens, methods=["POST"]),
            Route("/v1/responses", openai_responses, methods=["POST"]),
            Route("/v1beta/models/{target}", gemini_models, methods=["POST"]),
            Route("/_fake/requests", fake_requests, methods=["GET", "DELETE"]),
            Route("/_fake/health", fake_health, methods=["GET"]),
            Route("/", root, methods=["GET", "HEAD"]),
            Route("/{rest:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
        ]
    )
    app.state.request_log = log
    return app


def _tcp_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _unix_socket(path: str) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _server(app: Starlette, verbose: bool) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=1,
        lifespan="off",
    )
    return uvicorn.Server(config)


class FakeModelServer:
    """The fake model server on a background thread: ``with FakeModelServer() as fake: fake.url``."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", uds: str | None = None) -> None:
        self.host = host
        self.log = RequestLog()
        self.app = create_app(self.log)
        self._sockets = [_tcp_socket(host, port)]
        if uds:
            self._sockets.append(_unix_socket(uds))
        self.port: int = self._sockets[0].getsockname()[1]
        self._server = _server(self.app, verbose=False)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def requests(self, bodies: bool = True) -> list[JSON]:
        return self.log.items(bodies=bodies)

    def start(self, timeout: float = 10.0) -> FakeModelServer:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": self._sockets}, name="fakemodel", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake model server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> FakeModelServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cao.testing.fakemodel", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, default=18081)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--uds", help="also serve on this Unix socket (reachable from outside a netns)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    sockets = [_tcp_socket(args.host, args.port)]
    if args.uds:
        sockets.append(_unix_socket(args.uds))
    port = sockets[0].getsockname()[1]
    print(f"fakemodel listening on http://{args.host}:{port}", flush=True)
    _server(create_app(), verbose=args.verbose).run(sockets=sockets)


if __name__ == "__main__":
    main()
