"""OpenAI Responses (Codex): ``POST /v1/responses``, SSE (or JSON with ``"stream": false``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

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
    sse,
    usage_of,
)


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
        texts = user_texts([p.get("text", "") for p in parts if isinstance(p, dict)])
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    results = [
        as_text(item.get("output"))
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
        n = next_id()
        stamp = f"{n:06d}"
        self.id = f"resp_fake_{stamp}"
        self.usage = {**usage_of(n), "cache_write": 0}  # (no cache writes in this API)
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
            u = self.usage  # input_tokens counts the cached ones too, as OpenAI's do
            out["usage"] = {
                "input_tokens": u["input"] + u["cache_read"],
                "input_tokens_details": {"cached_tokens": u["cache_read"]},
                "output_tokens": u["output"],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u["input"] + u["cache_read"] + u["output"],
            }
        return out

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(kind, data)

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
            for i, piece in enumerate(chunks(text, self.chunk_delay > 0)):
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


def routes(log: RequestLog) -> list[Route]:
    """The routes of this API, logging to ``log``."""

    async def openai_responses(request: Request) -> Response:
        body = await read_json(request)
        entry = log_entry(request, "openai", body)
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
        entry.update(reply_id=reply.id, usage=reply.usage)  # what this reply reports (logged in place)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(reply.response("completed", [reply.item()]))
        return StreamingResponse(reply.stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    return [
        Route("/v1/responses", openai_responses, methods=["POST"]),
    ]
