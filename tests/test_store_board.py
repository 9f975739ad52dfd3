"""The coordination board on a real SQLite file (cao/store/board.py): compare-and-swap writes,
tombstones, history and its pruning, the limits (refused with nothing written), and writers racing
from threads and from separate connections."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cao.errors import BoardFull, FactMissing, InvalidInput, NotFound, PayloadTooLarge, VersionConflict
from cao.store import Store
from cao.store import board as rules
from tests.test_store import _terminal

pytestmark = pytest.mark.db_backends

S = "cao-x"  # the session tests.test_store._terminal puts its terminal in


@pytest.fixture
def store(db_location: Path | str) -> Iterator[Store]:
    s = Store(db_location, busy_timeout=5)
    _terminal(s)
    yield s
    s.close()


def rows(store: Store) -> list[tuple[Any, ...]]:
    """Every board row as stored: what "nothing was written" is checked against."""
    with store._read() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                "SELECT session_name, key, version, value, writer, head FROM board_fact ORDER BY 1, 2, 3"
            ).fetchall()
        ]


def test_a_write_names_the_version_it_replaces_and_each_success_is_the_next(store: Store):
    first = store.board_set(S, "build/status", "red", expected_version=0, writer="aaaa0001")
    assert (first.version, first.value, first.writer) == (1, '"red"', "aaaa0001")
    second = store.board_set(S, "build/status", {"ok": True, "n": 3}, expected_version=1, writer="cli")
    assert second.version == 2
    got = store.board_get(S, "build/status")
    assert (got.version, rules.decoded(got), got.writer) == (2, {"ok": True, "n": 3}, "cli")
    store.board_set(S, "a:first", [1, 2.5, None, "é"], expected_version=0, writer="cli")
    store.board_set(S, "build/owner", "ana", expected_version=0, writer="cli")
    assert [f.key for f in store.board_list(S)] == ["a:first", "build/owner", "build/status"]
    assert [f.key for f in store.board_list(S, "build/")] == ["build/owner", "build/status"]
    assert store.board_list(S, "nothing") == []
    assert rules.decoded(store.board_get(S, "a:first")) == [1, 2.5, None, "é"]
    # one head per key: the newest version
    assert [(k, v, head) for _, k, v, _, _, head in rows(store) if k == "build/status"] == [
        ("build/status", 1, 0),
        ("build/status", 2, 1),
    ]


def test_a_stale_expected_version_is_a_conflict_that_carries_the_current_fact(store: Store):
    store.board_set(S, "plan", "v1", expected_version=0, writer="aaaa0001")
    store.board_set(S, "plan", "v2", expected_version=1, writer="bbbb0002")
    before = rows(store)
    with pytest.raises(VersionConflict) as caught:
        store.board_set(S, "plan", "mine", expected_version=1, writer="aaaa0001")
    err = caught.value
    assert err.fields["current_version"] == 2
    assert err.fields["current_value"] == "v2" and err.fields["current_writer"] == "bbbb0002"
    assert err.fields["current_deleted"] is False and err.fields["current_at"]
    assert "retry with expected_version 2" in err.message and "nothing was written" in err.message
    assert rows(store) == before
    with pytest.raises(VersionConflict, match="never written"):  # a version of a key that has none
        store.board_set(S, "other", "x", expected_version=3, writer="cli")
    assert rows(store) == before


def test_expected_version_0_means_the_key_must_not_exist_yet(store: Store):
    store.board_set(S, "lock", "aaaa0001", expected_version=0, writer="aaaa0001")
    before = rows(store)
    with pytest.raises(VersionConflict, match="must not exist yet") as caught:
        store.board_set(S, "lock", "bbbb0002", expected_version=0, writer="bbbb0002")
    assert caught.value.fields["current_version"] == 1
    assert caught.value.fields["current_value"] == "aaaa0001"
    assert rows(store) == before


def test_a_delete_writes_a_tombstone_the_history_stays_and_the_versions_go_on(store: Store):
    store.board_set(S, "k", "one", expected_version=0, writer="cli")
    with pytest.raises(VersionConflict):
        store.board_delete(S, "k", expected_version=0, writer="cli")  # 0: only for a missing key
    gone = store.board_delete(S, "k", expected_version=1, writer="ana")
    assert (gone.version, gone.value) == (2, None)
    with pytest.raises(FactMissing, match="deleted at version 2 by ana") as missing:
        store.board_get(S, "k")
    assert missing.value.fields == {"current_version": 2}
    assert store.board_list(S) == []
    with pytest.raises(FactMissing, match="nothing to delete"):
        store.board_delete(S, "k", expected_version=2, writer="ana")
    with pytest.raises(VersionConflict, match="was deleted at version 2") as stale:
        store.board_set(S, "k", "x", expected_version=1, writer="cli")
    assert stale.value.fields["current_deleted"] is True
    # written again, from 0 or from the tombstone's version: the next version either way
    assert store.board_set(S, "k", "two", expected_version=0, writer="cli").version == 3
    store.board_delete(S, "k", expected_version=3, writer="cli")
    assert store.board_set(S, "k", "three", expected_version=4, writer="cli").version == 5
    history = store.board_history(S, "k")
    assert [(f.version, rules.decoded(f)) for f in history] == [
        (5, "three"),
        (4, None),
        (3, "two"),
        (2, None),
        (1, "one"),
    ]
    assert [f.version for f in store.board_history(S, "k", limit=2)] == [5, 4]
    with pytest.raises(FactMissing, match="never written") as never:
        store.board_history(S, "nope")
    assert never.value.fields == {"current_version": 0}
    with pytest.raises(FactMissing, match="never written"):
        store.board_delete(S, "nope", expected_version=0, writer="cli")


def test_a_key_keeps_its_newest_100_versions(store: Store):
    for v in range(rules.MAX_VERSIONS + 5):
        store.board_set(S, "counter", v, expected_version=v, writer="cli")
    kept = store.board_history(S, "counter")
    assert len(kept) == rules.MAX_VERSIONS == 100
    assert (kept[0].version, kept[-1].version) == (105, 6)
    assert len([r for r in rows(store) if r[1] == "counter"]) == 100  # pruned, not only hidden
    assert store.board_set(S, "counter", "next", expected_version=105, writer="cli").version == 106


def test_a_keys_history_keeps_at_most_256_kib_and_always_its_newest_version(store: Store):
    big = "x" * (60 * 1024)
    for v in range(6):
        store.board_set(S, "blob", big, expected_version=v, writer="cli")
    kept = store.board_history(S, "blob")
    assert [f.version for f in kept] == [6, 5, 4, 3]  # four of ~60 KiB fit in 256 KiB, five don't
    assert sum(len(f.value or "") for f in kept) <= rules.MAX_HISTORY_BYTES


class BadWrite(NamedTuple):
    key: Any
    value: Any
    error: type[Exception]
    words: str
    expected: Any = None  # None: the right one (the write would succeed but for what is wrong)


BAD_WRITES = [
    BadWrite("", "v", InvalidInput, "not a board key"),
    BadWrite("k" * 201, "v", InvalidInput, "1-200 characters"),
    BadWrite("has space", "v", InvalidInput, "not a board key"),
    BadWrite("ünicode", "v", InvalidInput, "not a board key"),
    BadWrite("a?b", "v", InvalidInput, "not a board key"),
    BadWrite("/lead", "v", InvalidInput, "none may be empty"),
    BadWrite("trail/", "v", InvalidInput, "none may be empty"),
    BadWrite("a//b", "v", InvalidInput, "none may be empty"),
    BadWrite("a/../b", "v", InvalidInput, "'.' or '..'"),
    BadWrite("./a", "v", InvalidInput, "'.' or '..'"),
    BadWrite("k", None, InvalidInput, "delete it"),
    BadWrite("k", float("nan"), InvalidInput, "not plain JSON"),
    BadWrite("k", {"a": float("inf")}, InvalidInput, "not plain JSON"),
    BadWrite("k", {1, 2}, InvalidInput, "not plain JSON"),
    BadWrite("k", "\ud800", InvalidInput, "lone UTF-16 surrogate"),
    BadWrite("k", "x" * (64 * 1024), PayloadTooLarge, "over the 65536-byte (64 KiB) limit"),
    BadWrite("k", "v", InvalidInput, "out of range", -1),
    BadWrite("k", "v", InvalidInput, "out of range", 2**53 + 1),
    BadWrite("k", "v", InvalidInput, "whole number", True),
    BadWrite("k", "v", InvalidInput, "whole number", 1.0),
    BadWrite("k", "v", InvalidInput, "whole number", "1"),
]


@pytest.mark.parametrize("case", BAD_WRITES, ids=[f"{c.words}-{i}" for i, c in enumerate(BAD_WRITES)])
def test_bad_input_is_refused_by_name_with_nothing_written(store: Store, case: BadWrite):
    store.board_set(S, "k", "kept", expected_version=0, writer="cli")
    before = rows(store)
    right = 1 if case.key == "k" else 0
    expected = right if case.expected is None else case.expected
    with pytest.raises(case.error, match=re.escape(case.words)):
        store.board_set(S, case.key, case.value, expected_version=expected, writer="cli")
    assert rows(store) == before


def test_a_value_just_within_64_kib_is_kept_byte_for_byte(store: Store):
    value = "é" * ((rules.MAX_VALUE_BYTES - 2) // 2)  # two quotes, two bytes a letter
    store.board_set(S, "big", value, expected_version=0, writer="cli")
    assert rules.decoded(store.board_get(S, "big")) == value


def test_a_session_holds_at_most_1000_keys_and_deleting_one_makes_room(store: Store):
    for i in range(rules.MAX_KEYS):
        store.board_set(S, f"k{i:04d}", i, expected_version=0, writer="cli")
    before = rows(store)
    with pytest.raises(BoardFull, match="holds 1000 keys, its limit") as full:
        store.board_set(S, "one-more", 1, expected_version=0, writer="cli")
    assert full.value.fields == {"limit": 1000} and "Delete keys" in full.value.message
    assert rows(store) == before
    store.board_set(S, "k0000", "updated", expected_version=1, writer="cli")  # an existing key: fine
    store.board_delete(S, "k0001", expected_version=1, writer="cli")
    assert store.board_set(S, "one-more", 1, expected_version=0, writer="cli").version == 1
    with pytest.raises(BoardFull):
        store.board_set(S, "k0001", "back", expected_version=0, writer="cli")  # a deleted key is new
    _terminal(store, "bbbb0002")  # the limit is per session: another one's board is its own
    with store._write() as conn:
        conn.execute("UPDATE terminal SET session_name = 'cao-y' WHERE id = 'bbbb0002'")
    assert store.board_set("cao-y", "k", 1, expected_version=0, writer="cli").version == 1


def test_past_the_deleted_keys_limit_the_oldest_deletion_is_forgotten_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(rules, "MAX_DELETED_KEYS", 2)
    now = [1000.0]
    store.clock = lambda: now[0]
    for key in ("d1", "d2", "d3"):
        store.board_set(S, key, "v", expected_version=0, writer="cli")
        now[0] += 1
        store.board_delete(S, key, expected_version=1, writer="cli")
        now[0] += 1
    assert {r[1] for r in rows(store)} == {"d2", "d3", ""}  # "": the floor its versions reached
    with pytest.raises(FactMissing, match="never written"):
        store.board_history(S, "d1")
    assert [f.version for f in store.board_history(S, "d2")] == [2, 1]
    # written again, d1 starts above the versions it had (a stale version of it can't match again)
    assert store.board_set(S, "d1", "again", expected_version=0, writer="cli").version == 3


def test_a_board_needs_a_session_some_terminal_ran_in_and_outlives_its_terminals(store: Store):
    with pytest.raises(NotFound, match="session cao-nope not found"):
        store.board_set("cao-nope", "k", 1, expected_version=0, writer="cli")
    with pytest.raises(NotFound, match="session cao-nope not found"):
        store.board_list("cao-nope")
    assert rows(store) == []
    store.board_set(S, "k", 1, expected_version=0, writer="cli")
    store.delete_terminal("aaaa0001")
    assert rules.decoded(store.board_get(S, "k")) == 1


def _race(writers: list[Any], expected: int) -> tuple[list[int], list[VersionConflict]]:
    """Each writer (a store) writes "k" from its own thread, released together."""
    start = threading.Barrier(len(writers))
    won: list[int] = []
    lost: list[VersionConflict] = []

    def write(i: int, store: Store) -> None:
        start.wait()
        try:
            won.append(store.board_set(S, "k", f"w{i}", expected_version=expected, writer=f"w{i}").version)
        except VersionConflict as exc:
            lost.append(exc)

    threads = [threading.Thread(target=write, args=(i, s)) for i, s in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return won, lost


def test_writers_racing_from_threads_with_the_same_expected_version_one_wins(store: Store):
    store.board_set(S, "k", "start", expected_version=0, writer="cli")
    won, lost = _race([store] * 8, expected=1)
    assert won == [2] and len(lost) == 7
    winner = store.board_get(S, "k")
    assert all(e.fields["current_version"] == 2 for e in lost)
    assert all(e.fields["current_value"] == rules.decoded(winner) for e in lost)


def test_writers_racing_on_separate_connections_one_wins(store: Store, tmp_path: Path):
    """Separate Store objects share no lock in Python: only SQLite's BEGIN IMMEDIATE orders them."""
    others = [Store(store.location, busy_timeout=10) for _ in range(6)]
    try:
        won, lost = _race(others, expected=0)
    finally:
        for s in others:
            s.close()
    assert won == [1] and len(lost) == 5
    assert [f.version for f in store.board_history(S, "k")] == [1]


def test_an_older_database_gains_the_board_and_keeps_its_rows(tmp_path: Path):
    from cao.store import MIGRATIONS, SCHEMA_VERSION

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for version in range(1, 10):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        conn.execute("PRAGMA user_version = 9")
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION >= 11
    _terminal(s)
    assert s.board_set(S, "k", "v", expected_version=0, writer="cli").version == 1
    assert time.time() - s.board_get(S, "k").at < 60
