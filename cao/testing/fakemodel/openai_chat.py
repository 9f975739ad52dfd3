"""OpenAI Chat Completions (OpenCode, Qwen Code, Kimi CLI, Hermes and other OpenAI-compatible
clients): ``POST /v1/chat/completions`` (also without ``/v1``), SSE ``data:`` chunks ending
``data: [DONE]``, or one JSON ``chat.completion`` with ``"stream": false``; ``GET /v1/models`` lists
one model and ``GET /v1/models/<id>`` describes any.

Tool naming differs by client, so it is taken from the request's tool list: an MCP tool is the one
named ``<tool>`` or ending ``_<tool>``/``-<tool>`` (OpenCode ``cao_send_message``, Qwen
``mcp__cao__send_message``, Copilot ``cao-send_message``), preferring one that names the server
(Qwen Code lists MCP tools only after a ``tool_search`` call, which is made first and not counted
as a step); the shell tool is the first of ``bash``/``Shell``/``run_shell_command``/… offered, its
arguments filled from its schema.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cao.testing.fakemodel.openai_responses import openai_error  # the same error shape
from cao.testing.fakemodel.script import (
    DEFAULT_PERMISSION_COMMAND,
    JSON,
    Action,
    Conversation,
    Marker,
    Script,
    ToolCall,
    as_text,
    decide,
    example_from_schema,
    parse_mcp_arg,
    parse_question_arg,
    say_question,
    user_texts,
)
from cao.testing.fakemodel.wire import (
    SSE_HEADERS,
    RequestLog,
    chunks,
    log_entry,
    next_id,
    read_json,
    usage_of,
)

SHELL_TOOLS = (
    "bash",
    "shell",
    "run_shell_command",
    "shell_command",
    "exec_command",
    "run_in_terminal",
    "terminal",  # Hermes
)
COMMAND_KEYS = ("command", "cmd")
TOOL_SEARCH = "tool_search"  # Qwen Code: reveals deferred (MCP) tools


def _text(content: Any) -> list[str]:
    """The text parts of a chat message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return [content]
    return [p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text"]


def chat_conversation(body: JSON) -> Conversation:
    messages = body.get("messages") or []
    start, prompt = -1, ""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") != "user":
            continue
        texts = user_texts(_text(msg.get("content")))
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    later = messages[start + 1 :]
    searches = {  # tool-discovery calls made this turn: their results are not steps of the script
        call.get("id")
        for m in later
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if (call.get("function") or {}).get("name") == TOOL_SEARCH
    }
    results = [
        as_text(m.get("content"))
        for m in later
        if m.get("role") == "tool" and m.get("tool_call_id") not in searches
    ]
    return Conversation(prompt, results, bool(body.get("tools")), waited_for_mcp=bool(searches))


def _functions(body: JSON) -> list[JSON]:
    return [t.get("function") or t for t in body.get("tools") or [] if isinstance(t, dict)]


def _fill(spec: JSON, given: JSON) -> JSON:
    """``given`` plus a small value for every other required parameter of ``spec``."""
    params = spec.get("parameters") or {}
    props = params.get("properties") or {}
    args = dict(given)
    for key in params.get("required") or []:
        if key not in args:
            args[key] = example_from_schema(props.get(key), "Run a shell command", key)
    return args


def chat_tool(body: JSON, conv: Conversation, marker: Marker) -> ToolCall:
    functions = _functions(body)
    names = [str(f.get("name", "")) for f in functions]
    if marker.name == "mcp":
        server, tool, args = parse_mcp_arg(marker.arg)
        candidates = [n for n in names if n == tool or n.endswith((f"_{tool}", f"-{tool}"))]
        named = [n for n in candidates if server in n.removesuffix(tool)]
        if not named and TOOL_SEARCH in names and not conv.waited_for_mcp:
            # Qwen Code offers MCP tools only after a search reveals them (mcp__<server>__<tool>).
            return ToolCall(TOOL_SEARCH, {"query": f"select:mcp__{server}__{tool}"})
        return ToolCall((named or candidates or [f"{server}_{tool}"])[0], args)
    if marker.name == "question":
        question, options = parse_question_arg(marker.arg)
        return say_question(question, options)
    command = marker.arg or ("echo fake" if marker.name == "shell" else DEFAULT_PERMISSION_COMMAND)
    for spec in functions:
        if str(spec.get("name", "")).lower() in SHELL_TOOLS:
            props = (spec.get("parameters") or {}).get("properties") or {}
            key = next((k for k in COMMAND_KEYS if k in props), "command")
            given: JSON = {key: command}
            if "description" in props:
                given["description"] = "Run a shell command"
            return ToolCall(str(spec["name"]), _fill(spec, given))
    return ToolCall("bash", {"command": command})


def chat_json_schema(body: JSON) -> Any:
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return (fmt.get("json_schema") or {}).get("schema") or {"type": "object"}
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    return None


class ChatReply:
    def __init__(self, body: JSON, action: Action, delay: float, chunked: float) -> None:
        self.model = str(body.get("model") or "fake-model")
        self.action = action
        self.delay = delay
        self.chunk_delay = chunked
        n = next_id()
        self.id = f"chatcmpl-fake-{n:06d}"
        self.created = int(time.time())
        self.stream_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.usage = {**usage_of(n), "cache_write": 0}  # (no cache writes in this API)

    def api_usage(self) -> JSON:
        """OpenAI's dialect: ``prompt_tokens`` counts the cached ones too."""
        u = self.usage
        prompt = u["input"] + u["cache_read"]
        return {
            "prompt_tokens": prompt,
            "completion_tokens": u["output"],
            "total_tokens": prompt + u["output"],
            "prompt_tokens_details": {"cached_tokens": u["cache_read"]},
        }

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.action.kind == "tool" else "stop"

    def tool_calls(self) -> list[JSON]:
        tool = self.action.tool
        assert tool is not None
        call = {"name": tool.name, "arguments": json.dumps(tool.args)}
        return [{"id": f"call_{self.id[-6:]}", "type": "function", "function": call}]

    def completion(self) -> JSON:
        message: JSON = {"role": "assistant", "content": None}
        if self.action.kind == "tool":
            message["tool_calls"] = self.tool_calls()
        else:
            message["content"] = self.action.text
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.api_usage(),
        }

    def chunk(self, delta: JSON, finish: str | None = None) -> bytes:
        data = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.chunk({"role": "assistant", "content": ""})
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.action.kind == "tool":
            calls = [{"index": 0, **call} for call in self.tool_calls()]
            yield self.chunk({"tool_calls": calls})
        else:
            for i, piece in enumerate(chunks(self.action.text, self.chunk_delay > 0)):
                if i and self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                yield self.chunk({"content": piece})
        yield self.chunk({}, self.finish_reason)
        if self.stream_usage:
            data = {"id": self.id, "object": "chat.completion.chunk", "created": self.created}
            data.update(model=self.model, choices=[], usage=self.api_usage())
            yield f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
        yield b"data: [DONE]\n\n"


def routes(log: RequestLog) -> list[Route]:
    """The routes of this API, logging to ``log``."""

    async def chat_completions(request: Request) -> Response:
        body = await read_json(request)
        entry = log_entry(request, "openai_chat", body)
        conv = chat_conversation(body)
        script = Script.parse(conv.prompt)
        stream = bool(body.get("stream"))
        entry.update(prompt=conv.prompt, tool_results=len(conv.tool_results), stream=stream)
        schema = chat_json_schema(body)
        if conv.has_tools:
            action = decide(script, conv, lambda m: chat_tool(body, conv, m))
            delay, chunk_delay = script.delay, script.chunk_delay
        else:
            text = json.dumps(example_from_schema(schema, script.title())) if schema else script.title()
            action = Action("text", text=text)
            delay, chunk_delay = 0.0, 0.0
        entry.update(kind="main" if conv.has_tools else "aux", action=action.summary())
        log.add(entry)
        if action.kind == "error":
            await asyncio.sleep(delay)
            return JSONResponse(openai_error(action.status), status_code=action.status)
        reply = ChatReply(body, action, delay, chunk_delay)
        if not stream or reply.stream_usage:  # what this reply reports (logged in place)
            entry.update(reply_id=reply.id, usage=reply.usage)
        else:
            entry.update(reply_id=reply.id)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(reply.completion())
        return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def models(request: Request) -> Response:
        log.add({**log_entry(request, "openai_chat", None), "kind": "probe"})
        return JSONResponse({"object": "list", "data": [_model("fake-model")]})

    async def model(request: Request) -> Response:  # Hermes asks for its model's entry at start
        log.add({**log_entry(request, "openai_chat", None), "kind": "probe"})
        return JSONResponse(_model(request.path_params["model"]))

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
    ]


def _model(name: str) -> JSON:
    return {"id": name, "object": "model", "created": 0, "owned_by": "cao"}
