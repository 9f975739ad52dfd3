"""Gemini (Gemini CLI): ``POST /v1beta/models/{model}:generateContent`` (JSON),
``:streamGenerateContent?alt=sse`` (SSE ``data:`` lines) and ``:countTokens``.
"""

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
        texts = user_texts([p.get("text", "") for p in content.get("parts") or [] if "text" in p])
        if texts:
            start, prompt = i, "\n".join(texts)
            break
    results = [
        as_text(part["functionResponse"].get("response"))
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


def gemini_chunk(parts: list[JSON], finish: bool, usage: dict[str, int] | None = None) -> JSON:
    candidate: JSON = {"content": {"role": "model", "parts": parts}, "index": 0}
    chunk: JSON = {"candidates": [candidate], "modelVersion": "fake-model"}
    if finish:
        candidate["finishReason"] = "STOP"
        u = usage or {"input": 10, "output": 10, "cache_read": 0}
        # promptTokenCount counts the cached ones too, as Gemini's does
        chunk["usageMetadata"] = {
            "promptTokenCount": u["input"] + u["cache_read"],
            "cachedContentTokenCount": u["cache_read"],
            "candidatesTokenCount": u["output"],
            "totalTokenCount": u["input"] + u["cache_read"] + u["output"],
        }
    return chunk


def gemini_parts(action: Action) -> list[JSON]:
    tool = action.tool
    if action.kind == "tool" and tool is not None:
        return [{"functionCall": {"name": tool.name, "args": tool.args}}]
    return [{"text": action.text}]


async def gemini_stream(
    action: Action, delay: float, chunk_delay: float, usage: dict[str, int]
) -> AsyncIterator[bytes]:
    if delay:
        await asyncio.sleep(delay)
    if action.kind == "tool":
        yield sse(None, gemini_chunk(gemini_parts(action), finish=True, usage=usage))
        return
    pieces = chunks(action.text, chunk_delay > 0)
    for i, piece in enumerate(pieces):
        if i and chunk_delay:
            await asyncio.sleep(chunk_delay)
        yield sse(None, gemini_chunk([{"text": piece}], finish=i == len(pieces) - 1, usage=usage))


def gemini_error(status: int) -> JSON:
    return {
        "error": {
            "code": status,
            "message": f"fake error (HTTP {status})",
            "status": GEMINI_STATUS.get(status, "UNKNOWN"),
        }
    }


def routes(log: RequestLog) -> list[Route]:
    """The routes of this API, logging to ``log``."""

    async def gemini_models(request: Request) -> Response:
        model, _, method = request.path_params["target"].partition(":")
        body = await read_json(request)
        entry = log_entry(request, "gemini", body)
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
        n = next_id()
        usage = {**usage_of(n), "cache_write": 0}  # (no cache writes in this API)
        entry.update(
            reply_id=f"gemini_fake_{n:06d}", usage=usage
        )  # what this reply reports (logged in place)
        if not stream:
            await asyncio.sleep(delay)
            return JSONResponse(gemini_chunk(gemini_parts(action), finish=True, usage=usage))
        return StreamingResponse(
            gemini_stream(action, delay, chunk_delay, usage),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    return [
        Route("/v1beta/models/{target}", gemini_models, methods=["POST"]),
    ]
