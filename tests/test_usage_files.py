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
        assert providers.get(name).usage(tmp_path) is None, name  # no folder of theirs yet


def triples(got: object) -> list[tuple[str, int, int, int, int]]:
    assert isinstance(got, list)
    return sorted(
        (e.key, e.input_tokens, e.output_tokens, e.cache_read_tokens, e.cache_write_tokens) for e in got
    )


def test_qwen_api_response_records_its_subagents_too(tmp_path: Path):
    qwen = providers.get("qwen_code")
    (tmp_path / ".qwen").mkdir()
    assert qwen.usage(tmp_path) == []

    def response(rid: str, inp: object, out: int, cached: int, thoughts: int = 0, **more: object) -> dict:
        event = {
            "event.name": "qwen-code.api_response",
            "response_id": rid,
            "model": "qwen3-coder-plus",
            "input_token_count": inp,
            "output_token_count": out,
            "cached_content_token_count": cached,
            "thoughts_token_count": thoughts,
            **more,
        }
        return {
            "type": "system",
            "subtype": "ui_telemetry",
            "timestamp": "2026-12-03T11:16:35.696Z",
            "systemPayload": {"uiEvent": event},
        }

    lines(
        tmp_path / ".qwen" / "projects" / "-w" / "chats" / "s1.jsonl",
        {"type": "user", "timestamp": "2026-12-03T11:16:35Z", "message": {"parts": [{"text": "hi"}]}},
        response("r1", 1154, 29, 1033, thoughts=4),
        # the same answer as an assistant record: not counted again (the telemetry record is the bill)
        {
            "type": "assistant",
            "timestamp": "2026-12-03T11:16:36Z",
            "usageMetadata": {"promptTokenCount": 1154},
        },
        response("r2", 1172, 32, 1044, subagent_name="managed-auto-memory-extractor"),
        response("r3", "many", 1, 0),  # not a count: 0
        {"type": "system", "subtype": "ui_telemetry", "systemPayload": {"uiEvent": {"event.name": "other"}}},
        tail='{"type": "system", "subtype": "ui_tele',
    )
    assert triples(qwen.usage(tmp_path)) == [
        ("r1", 121, 33, 1033, 0),
        ("r2", 128, 32, 1044, 0),
        ("r3", 0, 1, 0, 0),
    ]


def test_copilot_usage_records(tmp_path: Path):
    copilot = providers.get("copilot")
    (tmp_path / ".copilot").mkdir()
    assert copilot.usage(tmp_path) == []

    def record(call: str, inp: int, out: int, read: int, write: int = 0) -> dict:
        usage = {
            "model": "gpt-5-mini",
            "inputTokens": inp,
            "outputTokens": out,
            "cacheReadTokens": read,
            "cacheWriteTokens": write,
            "apiCallId": call,
        }
        return {"type": "session.usage_record", "timestamp": "2026-12-03T11:16:47Z", "data": {"usage": usage}}

    events = tmp_path / ".copilot" / "session-state" / "0d9c" / "events.jsonl"
    lines(
        events,
        {"type": "session.start", "timestamp": "2026-12-03T11:16:40Z", "data": {}},
        record("c1", 1190, 35, 1055),
        record("c1", 1190, 35, 1055),  # written again: once
        record("c2", 10, 1e400, 0, 3),  # broken: counted at the cap, so it can't hide spending
        {"type": "session.usage_record", "timestamp": "2026-12-03T11:16:48Z", "data": "odd"},
    )
    assert triples(copilot.usage(tmp_path)) == [("c1", 135, 35, 1055, 0), ("c2", 10, 10**12, 0, 3)]


def test_kimi_status_updates_name_the_model_from_its_config(tmp_path: Path):
    kimi = providers.get("kimi_cli")
    (tmp_path / ".kimi").mkdir()
    assert kimi.usage(tmp_path) == []
    (tmp_path / ".kimi" / "config.toml").write_text(
        'default_model = "cao"\n[models.cao]\nprovider = "cao"\nmodel = "kimi-k2"\n'
    )

    def status(mid: str, other: int, out: int, read: int, made: int = 0, at: object = 1796296619.6) -> dict:
        usage = {"input_other": other, "output": out, "input_cache_read": read, "input_cache_creation": made}
        payload = {"context_tokens": 1208, "token_usage": usage, "message_id": mid}
        return {"timestamp": at, "message": {"type": "StatusUpdate", "payload": payload}}

    lines(
        tmp_path / ".kimi" / "sessions" / "0e71" / "6356" / "wire.jsonl",
        {"type": "metadata", "protocol_version": "1.10"},
        {"timestamp": 1796296619.2, "message": {"type": "TurnBegin", "payload": {}}},
        status("k1", 142, 38, 1066),
        status("k2", 5, 1, 0, 7),
        status("k3", 5, 1, 0, at=1e400),  # no usable time: skipped alone
    )
    got = kimi.usage(tmp_path)
    assert triples(got) == [("k1", 142, 38, 1066, 0), ("k2", 5, 1, 0, 7)]
    assert got is not None and {e.model for e in got} == {"kimi-k2"}


def test_opencode_database_counts_finished_replies_and_survives_a_bad_row(tmp_path: Path):
    import sqlite3

    opencode = providers.get("opencode")
    share = tmp_path / ".local" / "share" / "opencode"
    share.mkdir(parents=True)
    assert opencode.usage(tmp_path) == []  # its folder, no database yet
    db = sqlite3.connect(share / "opencode.db")
    db.execute("CREATE TABLE message (id TEXT PRIMARY KEY, session_id TEXT, time_created INTEGER, data TEXT)")

    def msg(
        mid: str, created: object, tokens: object, completed: bool = True, role: str = "assistant"
    ) -> None:
        t: dict[str, object] = {"created": created, **({"completed": 1796296584451} if completed else {})}
        data = {"role": role, "modelID": "gpt-5", "time": t, "tokens": tokens}
        db.execute("INSERT INTO message VALUES (?, 's', 0, ?)", (mid, json.dumps(data)))

    def tokens(inp: int, out: int, reasoning: int, read: int, write: int) -> dict:
        return {"input": inp, "output": out, "reasoning": reasoning, "cache": {"read": read, "write": write}}

    msg("u1", 1796296583109, None, role="user")
    msg("a1", 1796296583965, tokens(114, 26, 4, 1022, 9))
    msg("a2", 1796296590000, tokens(0, 0, 0, 0, 0), completed=False)  # being written: not yet
    msg("a3", 10**400, tokens(1, 1, 0, 0, 0))  # an impossible time: skipped alone
    db.execute("INSERT INTO message VALUES ('x', 's', 0, 'not json')")
    db.commit()
    assert triples(opencode.usage(tmp_path)) == [("a1", 114, 30, 1022, 9)]
    db.execute("DROP TABLE message")
    db.commit()
    db.close()
    assert opencode.usage(tmp_path) is None  # can't be read now: what was read before stays


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
