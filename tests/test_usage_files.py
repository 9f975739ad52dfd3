"""The CLIs' usage readers (providers/usage_files.py) on small files in the shapes the real
programs write (seen in the bed: tests/realcli/test_usage_realcli.py): one response on several
lines counts once, a line being written is skipped, a foreign file is ignored, nothing recorded
reads unknown (None) and a CLI that records but made no request reads []."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import providers

pytestmark = pytest.mark.fast


def lines(path: Path, *records: object, tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_claude_transcripts(tmp_path: Path):
    claude = providers.get("claude_code")
    assert claude.usage(tmp_path) is None  # no ~/.claude: unknown
    (tmp_path / ".claude" / "projects").mkdir(parents=True)
    assert claude.usage(tmp_path) == []
    block = {"id": "msg_1", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 5, "output_tokens": 1}}
    final = {**block, "usage": {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 70}}
    lines(
        tmp_path / ".claude/projects/-w/s1.jsonl",
        {"type": "user", "timestamp": "2026-12-02T10:00:00Z", "message": {"content": "hi"}},
        {"type": "assistant", "timestamp": "2026-12-02T10:00:01Z", "message": block},
        {"type": "assistant", "timestamp": "2026-12-02T10:00:02Z", "message": final},  # the same response
        {
            "type": "assistant",
            "timestamp": "2026-12-02T10:00:03Z",
            "message": {"id": "msg_2", "usage": "odd"},
        },
        tail='{"type": "assistant", "timestamp": "2026-12-02T10:00:04Z", "mess',
    )
    (tmp_path / ".claude/projects/-w/notes.txt").write_text("not a transcript")
    got = claude.usage(tmp_path)
    assert got is not None and len(got) == 1
    e = got[0]
    assert (e.key, e.input_tokens, e.output_tokens, e.cache_read_tokens) == ("msg_1", 5, 9, 70)
    assert e.at == pytest.approx(1796205601.0)  # its first line's time: when the response began


def test_codex_rollouts(tmp_path: Path):
    codex = providers.get("codex")
    assert codex.usage(tmp_path) is None
    (tmp_path / ".codex").mkdir()
    assert codex.usage(tmp_path) == []

    def count(total: int, last_in: int, cached: int, out: int, at: str) -> dict[str, object]:
        usage = {"input_tokens": last_in, "cached_input_tokens": cached, "output_tokens": out}
        info = {
            "total_token_usage": {"total_tokens": total, "input_tokens": total},
            "last_token_usage": usage,
        }
        return {"timestamp": at, "type": "event_msg", "payload": {"type": "token_count", "info": info}}

    lines(
        tmp_path / ".codex/sessions/2026/12/02/rollout-x.jsonl",
        {"timestamp": "2026-12-02T10:00:00Z", "type": "turn_context", "payload": {"model": "gpt-5-codex"}},
        count(1100, 1100, 1000, 20, "2026-12-02T10:00:01Z"),
        count(1100, 1100, 1000, 20, "2026-12-02T10:00:02Z"),  # the same running sum again
        {
            "timestamp": "2026-12-02T10:00:03Z",
            "type": "event_msg",
            "payload": {"type": "token_count", "info": None},
        },
        count(2300, 1200, 1100, 30, "2026-12-02T10:00:04Z"),
    )
    got = codex.usage(tmp_path)
    assert got is not None
    assert [(e.model, e.input_tokens, e.cache_read_tokens, e.output_tokens) for e in got] == [
        ("gpt-5-codex", 100, 1000, 20),
        ("gpt-5-codex", 100, 1100, 30),
    ]


def test_gemini_chats_both_formats(tmp_path: Path):
    gemini = providers.get("gemini_cli")
    assert gemini.usage(tmp_path) is None
    msg = {"id": "g1", "timestamp": "2026-12-02T10:00:01Z", "type": "gemini", "model": "gemini-2.5-pro"}
    tokens = {"input": 1200, "output": 30, "cached": 1000, "thoughts": 5, "tool": 0, "total": 1235}
    lines(  # 0.45: records and $set updates; the message rewritten with its final counts
        tmp_path / ".gemini" / "tmp" / "work" / "chats" / "session-a.jsonl",
        {"sessionId": "s", "kind": "main"},
        {"$set": {"messages": [{**msg, "tokens": {**tokens, "output": 1}}]}},
        {"$set": {"messages": [{**msg, "tokens": tokens}]}},
        tail='{"$set": {"messa',
    )
    old = {"messages": [{**msg, "id": "g2", "tokens": {"input": 50, "output": 7, "cached": 0}}]}
    chats = tmp_path / ".gemini" / "tmp" / "old" / "chats"
    chats.mkdir(parents=True)
    (chats / "session-b.json").write_text(json.dumps(old))  # 0.24: one object
    got = gemini.usage(tmp_path)
    assert got is not None
    assert sorted((e.key, e.input_tokens, e.cache_read_tokens, e.output_tokens) for e in got) == [
        ("g1", 200, 1000, 35),
        ("g2", 50, 0, 7),
    ]


def test_clis_that_record_nothing_cao_reads_are_unknown(tmp_path: Path):
    for name in ("kimi_cli", "opencode", "copilot", "hermes", "qwen_code"):
        assert providers.get(name).usage(tmp_path) is None, name


def test_a_fifo_a_link_out_of_home_and_a_directory_in_a_files_place_are_not_read(tmp_path: Path):
    """An agent's HOME is its own: a FIFO named like a transcript would block the reader forever,
    a link to / would make every read walk the machine."""
    import os

    home = tmp_path / "home"
    projects = home / ".claude" / "projects" / "-w"
    projects.mkdir(parents=True)
    os.mkfifo(projects / "s1.jsonl")
    (projects / "s2.jsonl").mkdir()
    outside = tmp_path / "elsewhere"
    lines(
        outside / "deep" / "x.jsonl",
        {"type": "assistant", "timestamp": 1, "message": {"id": "m", "usage": {}}},
    )
    (projects / "link").symlink_to(outside)
    (projects / "s3.jsonl").symlink_to(outside / "deep" / "x.jsonl")
    assert providers.get("claude_code").usage(home) == []
    (home / "scripted-usage.jsonl").unlink(missing_ok=True)
    os.mkfifo(home / "scripted-usage.jsonl")
    assert providers.get("scripted").usage(home) is None
