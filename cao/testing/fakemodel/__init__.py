"""A fake model server that speaks just enough of four model APIs to drive the real agent CLIs.

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
- OpenAI Chat Completions (OpenCode, Qwen Code, Kimi CLI, Copilot CLI's own-key mode):
  ``POST /v1/chat/completions`` (SSE ``data:`` chunks ending ``[DONE]``, or JSON) and ``GET /v1/models``.
- Control: ``GET /_fake/requests`` (request log as JSON; ``?bodies=0`` drops request bodies),
  ``DELETE /_fake/requests`` (clear it), ``GET /_fake/health``. A log entry has ``seq``, ``time``,
  ``method``, ``path``, ``query``, ``api`` and ``kind`` (``main``/``aux``/``probe``/``count_tokens``/
  ``unknown``), and for model calls ``prompt``, ``tool_results`` (count), ``stream``, ``action``
  (what was answered: text, tool call or error) and ``body`` (the request JSON).

Modules: ``script`` (the marker language below, API-independent), ``wire`` (request log, SSE
framing), one module per API (``anthropic``, ``openai_responses``, ``openai_chat``, ``gemini``), and
``server`` (the app, :class:`FakeModelServer`, ``main``).

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

Every marker can also be written with angle brackets, ``<<delay:2.5>>``, ``<<reply:some text>>``
(arguments then end at the first ``>>``); both forms mix in one prompt. Kimi CLI needs this form:
it reads ``[word:word]`` in typed text as an attachment placeholder and sends ``[[delay:2.5]]`` as
three text parts (``[``, ``[delay:2.5]``, ``]``), which arrive here joined by newlines.
"""

from __future__ import annotations

from cao.testing.fakemodel.script import Action, Conversation, Marker, Script, ToolCall, decide
from cao.testing.fakemodel.server import FakeModelServer, create_app, main
from cao.testing.fakemodel.wire import RequestLog

__all__ = [
    "Action",
    "Conversation",
    "FakeModelServer",
    "Marker",
    "RequestLog",
    "Script",
    "ToolCall",
    "create_app",
    "decide",
    "main",
]
