"""The marker language: what the fake model answers to one prompt (see the package docstring).

API-independent: a prompt's markers become a :class:`Script`; each API module turns a request into
a :class:`Conversation` and :func:`decide` picks the :class:`Action` (error, tool call or text),
naming tools with the API's own ``make_tool``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

# ``[[name:arg]]``, or the same as ``<<name:arg>>`` for a CLI that rewrites the first form (Kimi CLI
# reads ``[word:word]`` in typed text as an attachment placeholder and splits the message there).
MARKER_RE = re.compile(r"\[\[(\w+)(?::(.*?))?\]\]|<<(\w+)(?::(.*?))?>>", re.S)
DEFAULT_PERMISSION_COMMAND = "touch cao-permission-probe.txt"
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
            bracketed = match.group(1) is not None
            name = (match.group(1) if bracketed else match.group(3)).lower()
            arg = match.group(2) if bracketed else match.group(4)
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


def as_text(content: Any) -> str:
    """Text of a tool result in any of the shapes the CLIs send."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(as_text(c) for c in content)
    if isinstance(content, dict):
        for key in ("text", "output", "content", "result", "llmContent", "error"):
            if key in content:
                return as_text(content[key])
        return json.dumps(content)
    return "" if content is None else str(content)


# A context block some CLIs put in front of the typed text, in the same text part (Copilot CLI).
LEADING_CONTEXT_RE = re.compile(r"^\s*<(current_datetime)>.*?</\1>\s*", re.S)


def user_texts(texts: list[str]) -> list[str]:
    texts = [LEADING_CONTEXT_RE.sub("", t) for t in texts]
    return [t for t in texts if t.strip() and not t.lstrip().startswith(WRAPPER_PREFIXES)]
