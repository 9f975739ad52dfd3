"""``cao db copy``: a SQLite store moved into an empty PostgreSQL database exactly (cao/store/copy.py)."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from cao.cli import cli
from cao.store import Store
from cao.store.schema import TABLES
from tests.helpers import add_terminal_row


def _filled(path: Path) -> dict[str, int]:
    """A store with rows in several tables, and an id counter ahead of the rows (deleted ones)."""
    store = Store(path)
    for tid in ("aaaa0001", "aaaa0002"):
        add_terminal_row(store, tid)
    for i in range(30):
        store.add_message(sender_id="cli", receiver_id="aaaa0001" if i % 2 else "aaaa0002", body=f"m{i} ✓")
    store.close()
    with sqlite3.connect(path) as conn:  # the last five deleted: their ids are never handed out again
        conn.execute("DELETE FROM message WHERE id > 25")
        counts = {
            m.__table__.name: conn.execute(f"SELECT COUNT(*) FROM {m.__table__.name}").fetchone()[0]  # type: ignore[attr-defined]
            for m in TABLES
            if m.__table__.name != "store_meta"  # type: ignore[attr-defined]
        }
    return counts


def test_every_row_arrives_and_ids_go_on_after_the_file_s(tmp_path: Path, pg_url: str):
    from cao.store.copy import copy_store

    src = tmp_path / "cao.db"
    counts = _filled(src)
    done = copy_store(src, pg_url, host="build-1")
    assert done["rows"] == counts and done["total"] == sum(counts.values())
    target = Store(pg_url)
    try:
        assert [t.host for t in target.list_terminals()] == ["build-1", "build-1"]
        msgs = sorted(m.id or 0 for m in target.list_messages(limit=100))
        assert msgs == list(range(1, 26))
        assert target.get_message(3).body == "m2 ✓"
        new, _ = target.add_message(sender_id="cli", receiver_id="aaaa0001", body="after the copy")
        assert new.id == 31  # after the file's counter (30), not after its last row (25)
    finally:
        target.close()


def test_a_target_with_rows_is_refused_and_nothing_is_merged(tmp_path: Path, pg_url: str):
    from cao.errors import Conflict
    from cao.store.copy import copy_store

    src = tmp_path / "cao.db"
    _filled(src)
    copy_store(src, pg_url, host="h")
    with pytest.raises(Conflict, match="is not empty"):
        copy_store(src, pg_url, host="h")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM message").fetchone()[0] == 25


def test_a_copy_that_fails_half_way_leaves_the_target_empty(tmp_path: Path, pg_url: str):
    from cao.errors import InvalidInput
    from cao.store.copy import copy_store

    src = tmp_path / "cao.db"
    _filled(src)
    with sqlite3.connect(src) as conn:  # a row PostgreSQL refuses (NUL in text), in the last table copied
        conn.execute("UPDATE message SET body = 'a' || char(0) || 'b' WHERE id = 25")
    with pytest.raises(InvalidInput, match=r"message: a row could not be copied .*NUL"):
        copy_store(src, pg_url, host="h")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM terminal").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM message").fetchone()[0] == 0


def test_the_command_refuses_while_cao_server_runs_on_the_home(tmp_path: Path, pg_url: str):
    home = tmp_path / "cao-home"
    home.mkdir()
    _filled(home / "cao.db")
    env = {"CAO_HOME": str(home), "CAO_DATABASE_URL": pg_url, "CAO_HOST_NAME": "h1"}
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)  # what a running cao-server holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = CliRunner().invoke(cli, ["db", "copy"], env=env)
    finally:
        os.close(fd)
    assert held.exit_code == 1 and "already using" in held.output, held.output
    # the file named with --from, from another home: its own home's server is what writes it
    mine = tmp_path / "my-home"
    mine.mkdir()
    other = {"CAO_HOME": str(mine), "CAO_DATABASE_URL": pg_url}
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = CliRunner().invoke(cli, ["db", "copy", "--from", str(home / "cao.db")], env=other)
    finally:
        os.close(fd)
    assert held.exit_code == 1 and "already using" in held.output, held.output
    # a home whose cao.db is a link to another disk: the home's server is what writes it
    linked, disk = tmp_path / "linked-home", tmp_path / "disk"
    linked.mkdir()
    disk.mkdir()
    _filled(disk / "cao.db")
    (linked / "cao.db").symlink_to(disk / "cao.db")
    fd = os.open(linked, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = CliRunner().invoke(cli, ["db", "copy"], env={**other, "CAO_HOME": str(linked)})
    finally:
        os.close(fd)
    assert held.exit_code == 1 and "already using" in held.output, held.output
    assert not (disk / "server.lock").exists()  # nothing of the lock written beside it
    typo = CliRunner().invoke(cli, ["db", "copy", "--from", str(tmp_path / "no" / "cao.db")], env=other)
    assert typo.exit_code == 1 and "not a cao database file" in typo.output, typo.output
    assert not (tmp_path / "no").exists()  # nothing made for a wrong path
    done = CliRunner().invoke(cli, ["db", "copy", "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert '"host": "h1"' in done.output
    none = CliRunner().invoke(cli, ["db", "copy"], env={"CAO_HOME": str(home)})
    assert none.exit_code == 2 and "CAO_DATABASE_URL" in none.output


def test_a_home_reached_through_a_link_or_dotdot_copies_with_no_server_running(tmp_path: Path, pg_url: str):
    """The directory named twice (the link and its target, or ``..``) is locked once: no server
    runs, so the copy goes ahead instead of finding itself in the way."""
    real = tmp_path / "real"
    real.mkdir()
    _filled(real / "cao.db")
    (tmp_path / "link").symlink_to(real)
    env = {"CAO_HOME": str(tmp_path / "link"), "CAO_DATABASE_URL": pg_url, "CAO_HOST_NAME": "h1"}
    dotted = str(real / ".." / "real" / "cao.db")
    refused = CliRunner().invoke(
        cli, ["db", "copy", "--from", dotted, "--to", "postgresql://u@127.0.0.1:1/x"], env=env
    )
    assert "already using" not in refused.output, refused.output  # past the lock: the database is unreachable
    done = CliRunner().invoke(cli, ["db", "copy"], env=env)
    assert done.exit_code == 0 and "copied" in done.output, done.output
