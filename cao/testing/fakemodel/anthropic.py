"""Anthropic Messages (Claude Code): ``POST /v1/messages`` (SSE or JSON) and ``/v1/messages/count_tokens``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cao.testing.fakemodel.script import (
    DEFAULT_PERMISSION_COMMAND,
    JSON,
    WAIT_FOR_MCP,
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
    sse,
    usage_of,
)

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
        texts = user_texts([b.get("text", "") for b in blocks if b.get("type") == "text"])
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
        as_text(block.get("content"))
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
        n = next_id()
        self.id = f"msg_fake_{n:06d}"
        self.usage = usage_of(n)

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
            "usage": self.api_usage(),
        }

    def api_usage(self) -> JSON:
        u = self.usage
        return {
            "input_tokens": u["input"],
            "output_tokens": u["output"],
            "cache_creation_input_tokens": u["cache_write"],
            "cache_read_input_tokens": u["cache_read"],
        }

    async def stream(self) -> AsyncIterator[bytes]:
        start = {**self.message(), "content": [], "stop_reason": None}
        start["usage"] = (
            self.api_usage()
        )  # (the real API counts output up from 1; a fixed count is traceable)
        yield sse("message_start", {"type": "message_start", "message": start})
        yield sse("ping", {"type": "ping"})
        if self.delay:
            await asyncio.sleep(self.delay)
        for index, block in enumerate(self.content()):
            if block["type"] == "tool_use":
                opening = {**block, "input": {}}
                yield sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opening},
                )
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                yield sse(
                    "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                )
            else:
                yield sse(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                for i, piece in enumerate(chunks(block["text"], self.chunk_delay > 0)):
                    if i and self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
                    delta = {"type": "text_delta", "text": piece}
                    yield sse(
                        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
                    )
            yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": self.usage["output"]},
            },
        )
        yield sse("message_stop", {"type": "message_stop"})


def anthropic_error(status: int) -> JSON:
    kind = ANTHROPIC_ERRORS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": f"fake {kind} (HTTP {status})"}}


def routes(log: RequestLog) -> list[Route]:
    """The routes of this API, logging to ``log``."""

    async def anthropic_messages(request: Request) -> Response:
        body = await read_json(request)
        entry = log_entry(request, "anthropic", body)
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
        entry.update(reply_id=reply.id, usage=reply.usage)  # what this reply reports (logged in place)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(reply.message())
        return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def anthropic_count_tokens(request: Request) -> Response:
        body = await read_json(request)
        log.add({**log_entry(request, "anthropic", body), "kind": "count_tokens"})
        return JSONResponse({"input_tokens": max(1, len(json.dumps(body)) // 4)})

    return [
        Route("/v1/messages", anthropic_messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", anthropic_count_tokens, methods=["POST"]),
    ]
