"""Agent CLI providers. ``get(name)`` returns one, ``names()`` lists them, ``all_knobs()`` lists
the ``CAO_*`` variables they read.

Each module holds one small provider class (see ``providers/base.py`` for the contract).
"""

from __future__ import annotations

import importlib
from typing import Any

from cao.knobs import Knob
from providers.base import LaunchContext, LaunchSpec, Provider, TerminalStatus

__all__ = [
    "LaunchContext",
    "LaunchSpec",
    "Provider",
    "TerminalStatus",
    "all_knobs",
    "default_name",
    "get",
    "names",
]

# name -> "module:Class"; imported lazily so a provider's imports cost nothing until it is used.
_REGISTRY: dict[str, str] = {
    "scripted": "providers.scripted:ScriptedProvider",
    "scripted_eager": "providers.scripted:EagerScriptedProvider",
    "claude_code": "providers.claude_code:ClaudeCodeProvider",
    "codex": "providers.codex:CodexProvider",
    "gemini_cli": "providers.gemini_cli:GeminiCliProvider",
    "opencode": "providers.opencode:OpenCodeProvider",
    "qwen_code": "providers.qwen_code:QwenCodeProvider",
    "copilot": "providers.copilot:CopilotProvider",
    "kimi_cli": "providers.kimi_cli:KimiCliProvider",
    "hermes": "providers.hermes:HermesProvider",
}
_CACHE: dict[str, Provider] = {}


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Provider:
    if name not in _REGISTRY:
        from cao.errors import ProviderError

        raise ProviderError(f"unknown provider {name!r}; choose one of: {', '.join(names())}")
    if name not in _CACHE:
        module_name, _, cls_name = _REGISTRY[name].partition(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        _CACHE[name] = cls()
    return _CACHE[name]


def default_name() -> str:
    """The provider used when none is given: the bundled scripted agent (always available)."""
    return "scripted"


def all_knobs() -> tuple[Knob[Any], ...]:
    """Every knob any provider reads (``Provider.knobs``), each once: a knob several providers share
    (``CAO_MODEL_BASE_URL``) is one declaration. Sorted by name. Costs importing the provider modules
    (no launch, no I/O)."""
    found = {knob.name: knob for name in names() for knob in get(name).knobs}
    return tuple(found[name] for name in sorted(found))
