"""A git worktree per worker, on real git repositories in temp dirs: isolation, setup, nothing
lost at delete, review and merge (clean and conflicting), adoption after a restart, the HTTP
routes, the CLI and MCP tools over them. Workers' "edits" are files this test writes into their
worktrees (scripted agents don't edit files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from fastapi.testclient import TestClient

from cao.api import create_app
from cao.core import Cao
from cao.errors import InvalidInput
from cao.settings import Settings
from cao.worktrees import MergeConflict, NotMergeable
from tests.helpers import wait_until, write_rules

ECHO = {"rules": [], "default": {"reply": "ok: {first_line}"}}


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(
        [
            "git",
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@localhost",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def commit_all(cwd: Path, message: str) -> str:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "-m", message)
    return git(cwd, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository on branch main with one commit: app.py and a .gitignore for .env."""
    path = tmp_path / "proj"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "app.py").write_text("line 1\nline 2\nline 3\n")
    (path / ".gitignore").write_text(".env\n")
    commit_all(path, "initial")
    return path


@pytest.fixture
def wt_core(core: Cao) -> Cao:
    write_rules(core.settings.home, "dev", ECHO)
    return core


def make_worker(core: Cao, repo: Path, **kw: Any) -> dict[str, Any]:
    term = core.create_terminal(agent_profile="dev", working_directory=str(repo), use_worktree=True, **kw)
    assert term["worktree"], term
    return term


def ready(core: Cao, tid: str) -> None:
    wait_until(
        lambda: core.terminal_view(tid)["status"] in ("idle", "completed"), timeout=15, what=f"{tid} ready"
    )


def tree(term: dict[str, Any]) -> Path:
    return Path(term["worktree"]["path"])


# -- creation and isolation ------------------------------------------------------------------------
def test_parallel_workers_edit_the_same_file_without_seeing_each_other(wt_core: Cao, repo: Path):
    a, b = make_worker(wt_core, repo), make_worker(wt_core, repo)
    for term in (a, b):
        path = tree(term)
        assert term["worktree"]["branch"] == f"cao/dev-{term['id']}"
        assert path == wt_core.settings.worktrees_dir / "proj" / f"dev-{term['id']}"
        assert not path.resolve().is_relative_to(repo.resolve())  # outside the main checkout
        assert term["working_directory"] == str(path)
        assert term["worktree"]["base_branch"] == "main"
        assert git(path, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
        ready(wt_core, term["id"])
    (tree(a) / "app.py").write_text("line 1\nA was here\nline 3\n")
    (tree(b) / "app.py").write_text("line 1\nB was here\nline 3\n")
    assert "A was here" in (tree(a) / "app.py").read_text()
    assert "B was here" in (tree(b) / "app.py").read_text()
    assert (repo / "app.py").read_text() == "line 1\nline 2\nline 3\n"
    assert git(repo, "status", "--porcelain") == ""
    want = {"files": 1, "insertions": 1, "deletions": 1, "untracked": 0}  # the dashboard's (cached 2 s)
    wait_until(lambda: wt_core.terminal_view(a["id"])["worktree"]["diffstat"] == want, timeout=5)


def test_the_agent_starts_in_the_same_subdirectory_of_its_worktree(wt_core: Cao, repo: Path):
    (repo / "pkg").mkdir()
    (repo / "pkg" / "mod.py").write_text("x = 1\n")
    commit_all(repo, "pkg")
    term = make_worker(wt_core, repo / "pkg")
    assert term["working_directory"] == str(tree(term) / "pkg")


class Refusal(NamedTuple):
    make: Callable[[Path], Path]
    words: str


REFUSALS = {
    "not a repository": Refusal(lambda tmp: tmp, "not inside a git repository"),
    "no commit yet": Refusal(lambda tmp: (git(tmp, "init", "-q"), tmp)[1], "no commit yet"),
    "bad setup file": Refusal(
        lambda tmp: _repo_with(tmp, {".cao/worktree.yaml": "copy: [../../etc/passwd]\n"}),
        "relative path inside",
    ),
}


def _repo_with(tmp: Path, files: dict[str, str]) -> Path:
    git(tmp, "init", "-q", "-b", "main")
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    commit_all(tmp, "x")
    return tmp


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_no_worktree_possible_is_a_clear_422_and_leaves_nothing(wt_core: Cao, tmp_path: Path, case: Refusal):
    where = tmp_path / "d"
    where.mkdir()
    directory = case.make(where)
    with pytest.raises(InvalidInput, match=case.words) as err:
        wt_core.create_terminal(agent_profile="dev", working_directory=str(directory), use_worktree=True)
    assert err.value.status_code == 422
    assert wt_core.list_terminals() == []
    assert not wt_core.settings.worktrees_dir.exists() or not any(
        wt_core.settings.worktrees_dir.rglob("dev-*")
    )


def test_a_profile_can_ask_for_a_worktree_by_default(wt_core: Cao, repo: Path):
    store = wt_core.settings.profiles_dir
    (store / "isolated.md").write_text("---\nname: isolated\ndescription: d\nuse_worktree: true\n---\nhi\n")
    term = wt_core.create_terminal(agent_profile="isolated", working_directory=str(repo))
    assert term["worktree"]["branch"] == f"cao/isolated-{term['id']}"
    off = wt_core.create_terminal(agent_profile="isolated", working_directory=str(repo), use_worktree=False)
    assert off["worktree"] is None and off["working_directory"] == str(repo)


# -- setup -----------------------------------------------------------------------------------------
def test_setup_copies_and_links_files_and_runs_commands_in_the_pane(
    make_core: Callable[..., Cao], settings: Settings, repo: Path
):
    wt_core = make_core(settings.with_(worktree_setup_commands=True))  # the operator opted in
    write_rules(wt_core.settings.home, "dev", ECHO)
    (repo / ".cao").mkdir()
    (repo / ".cao" / "worktree.yaml").write_text(
        "copy: [.env, missing.txt]\nlink: [data]\n"
        "setup: ['echo setup-ran-$((40+2)) > made.txt; echo visible-$((6*7))']\n"
    )
    commit_all(repo, "setup config")
    (repo / ".env").write_text("SECRET=1\n")  # ignored by git: only a copy brings it along
    (repo / "data").mkdir()
    (repo / "data" / "big.bin").write_text("blob")  # untracked: linked
    term = make_worker(wt_core, repo)
    path = tree(term)
    assert (path / ".env").read_text() == "SECRET=1\n"
    assert (path / "data").is_symlink() and (path / "data" / "big.bin").read_text() == "blob"
    ready(wt_core, term["id"])
    screen = wt_core.output(term["id"])
    assert "[cao] copied .env" in screen and "[cao] linked data" in screen
    assert "not in the checkout, skipped: missing.txt" in screen
    assert "visible-42" in screen and "[cao] setup done" in screen
    assert (path / "made.txt").read_text() == "setup-ran-42\n"  # ran in the worktree's root
    # the setup's own files are not the worker's changes; what the setup command made is
    diff = wt_core.diff(term["id"])
    assert "made.txt" in diff["diff"] and "data" not in diff["diff"] and ".env" not in diff["diff"]


# -- nothing is ever lost --------------------------------------------------------------------------
def test_delete_keeps_uncommitted_work_and_unmerged_commits(wt_core: Cao, repo: Path):
    busy, idle = make_worker(wt_core, repo), make_worker(wt_core, repo)
    bpath = tree(busy)
    (bpath / "app.py").write_text("line 1\ncommitted\nline 3\n")
    committed = commit_all(bpath, "worker's own commit")
    (bpath / "app.py").write_text("line 1\ncommitted\nline 3\nuncommitted\n")
    (bpath / "new.txt").write_text("brand new\n")
    wt_core.delete_terminal(busy["id"])
    wt_core.delete_terminal(idle["id"])
    branch = busy["worktree"]["branch"]
    # the busy worker's branch stays, with its commit and a wip commit holding the rest
    assert not bpath.exists()
    assert git(repo, "rev-parse", f"{branch}~1") == committed
    assert "wip" in git(repo, "log", "-1", "--format=%s", branch)
    assert git(repo, "show", f"{branch}:new.txt") == "brand new"
    assert "uncommitted" in git(repo, "show", f"{branch}:app.py")
    row = wt_core.store.get_worktree(busy["id"])
    assert row is not None and row.state == "removed" and "kept" in (row.note or "")
    # the idle worker had nothing: its worktree and branch are gone
    assert not tree(idle).exists()
    assert git(repo, "branch", "--list", idle["worktree"]["branch"]) == ""
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    # the main checkout was never touched
    assert git(repo, "status", "--porcelain") == "" and (repo / "app.py").read_text().count("line") == 3


# -- nothing is ever lost: what a hostile review tried at delete -------------------------------------
def git_may_fail(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    argv = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-c", "commit.gpgsign=false"]
    return subprocess.run([*argv, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def retired(core: Cao, term: dict[str, Any]) -> tuple[str, str]:
    """Delete the worker; its worktree row's (state, note)."""
    core.delete_terminal(term["id"])
    row = core.store.get_worktree(term["id"])
    assert row is not None
    return row.state, row.note or ""


def heads(repo: Path, pattern: str) -> dict[str, str]:
    """Branches matching ``pattern`` → their commits."""
    out = git(repo, "for-each-ref", "--format=%(refname:short) %(objectname)", f"refs/heads/{pattern}")
    return dict(line.split() for line in out.splitlines())


def on_a_branch(repo: Path, commit: str) -> bool:
    return bool(git(repo, "for-each-ref", "--contains", commit, "refs/heads"))


def test_commits_on_a_detached_head_stay_on_a_named_branch(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    git(path, "checkout", "-q", "--detach")
    (path / "left.txt").write_text("left behind\n")
    left = commit_all(path, "left behind on a detached HEAD")
    git(path, "checkout", "-q", branch)  # git warns that one commit is left behind, on no branch
    git(path, "checkout", "-q", "--detach")
    (path / "app.py").write_text("line 1\ndetached\nline 3\n")
    last = commit_all(path, "detached work")
    (path / "app.py").write_text("line 1\ndetached\nline 3\nuncommitted\n")
    # a per-worktree ref lives in the worktree's entry, which goes with it
    loose = git(path, "commit-tree", f"{left}^{{tree}}", "-m", "only a worktree ref has it")
    git(path, "update-ref", "refs/worktree/mine", loose)
    state, note = retired(wt_core, term)
    assert state == "removed" and not path.exists()
    assert on_a_branch(repo, left) and on_a_branch(repo, last)
    # the commits that went with the worktree's reflog and its own refs: a branch each
    saved = heads(repo, f"{branch}-saved-*")
    assert sorted(saved.values()) == sorted([left, loose]) and "refs/worktree/mine" in note
    assert all(name in note for name in saved) and f"{branch}-saved-{left[:10]}" in saved  # its sha
    # HEAD, detached at delete: its commits and the wip commit on top
    [(name, wip)] = heads(repo, f"{branch}-detached-*").items()
    assert git(repo, "rev-parse", f"{wip}~1") == last and name in note and "detached" in note
    assert "uncommitted" in git(repo, "show", f"{wip}:app.py")


def test_a_detached_head_is_saved_even_when_the_worktree_folder_is_already_gone(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    git(path, "checkout", "-q", "--detach")
    (path / "lost.txt").write_text("only on a detached HEAD\n")
    commit = commit_all(path, "detached")
    shutil.rmtree(path)
    state, note = retired(wt_core, term)
    assert (
        state == "removed"
        and on_a_branch(repo, commit)
        and list(heads(repo, f"{branch}-detached-*").values()) == [commit]
    )
    assert "already gone" in note and git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1


def test_ignored_files_keep_the_worktree_as_it_is(
    make_core: Callable[..., Cao], settings: Settings, repo: Path
):
    (repo / ".gitignore").write_text(".env\nbuild/\n*.log\n")
    commit_all(repo, "ignore more")
    core = make_core(settings)
    write_rules(settings.home, "dev", ECHO)
    term = make_worker(core, repo)
    path = tree(term)
    (path / ".env").write_text("TOKEN=made-by-the-worker\n")
    (path / "build").mkdir()
    (path / "build" / "out.bin").write_text("artifact")
    (path / "build" / "more.bin").write_text("artifact")
    (path / "run.log").write_text("log\n")
    (path / "app.py").write_text("line 1\nchanged\nline 3\n")
    head = git(path, "rev-parse", "HEAD")
    state, note = retired(core, term)
    assert state == "kept" and path.is_dir()
    assert (path / ".env").read_text() == "TOKEN=made-by-the-worker\n"
    assert (path / "build" / "out.bin").read_text() == "artifact" and (path / "run.log").exists()
    for words in ("ignored", ".env", "build/ (2 files)", "run.log", "kept"):
        assert words in note, note
    # kept as it is: nothing committed, the branch and the worker's index untouched
    assert git(path, "rev-parse", "HEAD") == head and git(path, "status", "--porcelain") == "M app.py"
    # its uncommitted work is still only there: review shows it, a merge would leave it out
    assert core.diff(term["id"])["includes_uncommitted"] is True and "app.py" in core.diff(term["id"])["diff"]
    with pytest.raises(NotMergeable, match="uncommitted changes"):
        core.merge(term["id"])
    listing = {w["path"]: w for w in TestClient(create_app(core)).get("/worktrees").json()}
    assert listing[str(path)]["state"] == "kept" and ".env" in listing[str(path)]["note"]
    # after a restart it is an orphan, and the reason still says why it was kept
    core.stop()
    again = make_core(settings)
    [row] = [w for w in again.worktrees() if w["path"] == str(path)]
    assert row["orphan"] is True and ".env" in str(row["reason"]) and "kept at delete" in str(row["reason"])


def test_ignored_files_the_operator_lets_go_are_discarded(wt_core: Cao, repo: Path):
    (repo / ".gitignore").write_text(".env\n__pycache__/\n")
    (repo / ".cao").mkdir()
    (repo / ".cao" / "worktree.yaml").write_text("discard: ['__pycache__/']\n")
    commit_all(repo, "discard caches")
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    (path / "pkg" / "__pycache__").mkdir(parents=True)
    (path / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0cache")
    (path / "pkg" / "mod.py").write_text("x = 1\n")
    state, note = retired(wt_core, term)
    assert state == "removed" and not path.exists()
    assert "discarded 1 ignored file" in note and git(repo, "show", f"{branch}:pkg/mod.py") == "x = 1"


def test_a_repository_nested_in_the_worktree_keeps_it(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path = tree(term)
    nested = path / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q", "-b", "main")
    (nested / "lib.py").write_text("def f(): pass\n")
    commit = commit_all(nested, "the nested repository's own commit")
    (path / "app.py").write_text("line 1\nchanged\nline 3\n")
    state, note = retired(wt_core, term)
    assert state == "kept" and nested.is_dir(), note
    assert git(nested, "cat-file", "-t", commit) == "commit"
    assert "vendor/lib" in note and "nested" in note
    assert git(repo, "rev-parse", term["worktree"]["branch"]) == git(repo, "rev-parse", "main")


class Sub(NamedTuple):
    work: Callable[[Path], None]  # what the worker does in its checked-out submodule
    state: str
    words: str


SUB_COMMIT = "a commit only this submodule checkout has"


def _sub_commit(sub: Path) -> None:
    (sub / "lib.py").write_text("changed in the submodule\n")
    commit_all(sub, SUB_COMMIT)


SUBS = {
    "a submodule with a commit of its own": Sub(_sub_commit, "kept", "submodule"),
    "a submodule with an uncommitted change": Sub(
        lambda sub: (sub / "lib.py").write_text("uncommitted\n"), "kept", "submodule"
    ),
    "a submodule whose .git was deleted, with a file in it": Sub(
        lambda sub: ((sub / ".git").unlink(), (sub / "mine.txt").write_text("git can't see me\n")),
        "kept",
        "no .git",
    ),
    "an untouched submodule": Sub(lambda sub: None, "removed", "worktree removed"),
}


@pytest.mark.parametrize("case", SUBS.values(), ids=SUBS.keys())
def test_submodules_at_delete(wt_core: Cao, repo: Path, tmp_path: Path, case: Sub):
    lib = tmp_path / "lib"
    lib.mkdir()
    git(lib, "init", "-q", "-b", "main")
    (lib / "lib.py").write_text("library\n")
    commit_all(lib, "library")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    commit_all(repo, "a submodule")
    term = make_worker(wt_core, repo)
    path = tree(term)
    git(path, "-c", "protocol.file.allow=always", "submodule", "update", "--init", "-q")
    case.work(path / "lib")
    files = sorted(p.name for p in (path / "lib").iterdir())
    state, note = retired(wt_core, term)
    assert state == case.state and case.words in note, note
    if state == "kept":  # as the worker left it: its commit, its change, its file
        assert sorted(p.name for p in (path / "lib").iterdir()) == files
        if (path / "lib" / ".git").exists():
            assert git(path / "lib", "log", "-1", "--format=%s") in ("library", SUB_COMMIT)


def test_a_worker_that_switched_branches_is_told_where_its_work_went(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    git(path, "switch", "-q", "-c", "feature")
    (path / "feature.py").write_text("feature\n")
    feature = commit_all(path, "on the worker's own branch")
    (path / "app.py").write_text("line 1\nuncommitted on feature\nline 3\n")
    state, note = retired(wt_core, term)
    assert state == "removed"
    assert git(repo, "rev-parse", "feature") == feature  # cao does not move a branch it did not make
    [(saved, wip)] = heads(repo, f"{branch}-wip-*").items()
    assert git(repo, "rev-parse", f"{wip}~1") == feature
    assert "uncommitted on feature" in git(repo, "show", f"{wip}:app.py")
    assert "switched to branch feature" in note and f"on new branch {saved}" in note, note
    assert f"on {branch};" not in note  # the old note said the work went on cao's branch


class Foreign(NamedTuple):
    rewrite: Callable[[Path, Path], object]  # (worktree, another repository)
    words: str


FOREIGN = {
    "its .git points at another repository": Foreign(
        lambda path, other: (path / ".git").write_text(f"gitdir: {other / '.git'}\n"), "another"
    ),
    "its .git replaced by a repository of its own": Foreign(
        lambda path, other: ((path / ".git").unlink(), git(path, "init", "-q")), "another"
    ),
}


@pytest.mark.parametrize("case", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_worktree_whose_git_link_was_rewritten_is_not_touched(
    wt_core: Cao, repo: Path, tmp_path: Path, case: Foreign
):
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    (other / "theirs.txt").write_text("not cao's\n")
    theirs = commit_all(other, "another repository")
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    (path / "app.py").write_text("line 1\nthe worker's\nline 3\n")
    case.rewrite(path, other)
    state, note = retired(wt_core, term)
    assert git(other, "rev-parse", "HEAD") == theirs and git(other, "for-each-ref").count("\n") == 0
    assert state == "kept" and path.is_dir() and "the worker's" in (path / "app.py").read_text()
    assert "not touched" in note and case.words in note, note
    assert git(repo, "rev-parse", branch) == git(repo, "rev-parse", "main")
    assert wt_core.diff(term["id"])["includes_uncommitted"] is False  # cao reads nothing in there
    with pytest.raises(NotMergeable, match="can't tell what it holds"):
        wt_core.merge(term["id"])


def _conflicting(path: Path, branch: str) -> None:
    """A branch ``other`` whose change to app.py conflicts with one on the worker's branch."""
    git(path, "switch", "-q", "-c", "other")
    (path / "app.py").write_text("line 1\nother\nline 3\n")
    commit_all(path, "other")
    git(path, "switch", "-q", branch)
    (path / "app.py").write_text("line 1\nmine\nline 3\n")
    commit_all(path, "mine")


def _stash_pop_conflict(path: Path, branch: str) -> None:
    (path / "app.py").write_text("line 1\nstashed\nline 3\n")
    git(path, "stash", "-q")
    (path / "app.py").write_text("line 1\ncommitted\nline 3\n")
    commit_all(path, "committed")
    git_may_fail(path, "stash", "pop")


class Stuck(NamedTuple):
    make: Callable[[Path, str], object]  # (worktree, its branch)
    words: str


STUCK = {
    "merge in progress": Stuck(
        lambda p, b: (_conflicting(p, b), git_may_fail(p, "merge", "other")), "a merge is in progress"
    ),
    "rebase in progress": Stuck(
        lambda p, b: (_conflicting(p, b), git_may_fail(p, "rebase", "other")), "a rebase is in progress"
    ),
    "cherry-pick in progress": Stuck(
        lambda p, b: (_conflicting(p, b), git_may_fail(p, "cherry-pick", "other")),
        "a cherry-pick is in progress",
    ),
    "bisect in progress": Stuck(
        lambda p, b: (_conflicting(p, b), git(p, "bisect", "start", "HEAD", "HEAD~1")),
        "a bisect is in progress",
    ),
    "unresolved conflicts after a stash pop": Stuck(_stash_pop_conflict, "unresolved conflicts"),
    "worktree locked": Stuck(
        lambda p, b: git(p, "worktree", "lock", "--reason", "usb stick", str(p)), "locked"
    ),
}


@pytest.mark.parametrize("case", STUCK.values(), ids=STUCK.keys())
def test_an_operation_in_progress_keeps_the_worktree_untouched(wt_core: Cao, repo: Path, case: Stuck):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    case.make(path, branch)
    before = (git(path, "rev-parse", "HEAD"), git(path, "status", "--porcelain"), git(repo, "for-each-ref"))
    state, note = retired(wt_core, term)
    assert state == "kept" and case.words in note, note
    after = (git(path, "rev-parse", "HEAD"), git(path, "status", "--porcelain"), git(repo, "for-each-ref"))
    assert after == before


def test_the_repositorys_hooks_and_config_run_nothing_at_delete(wt_core: Cao, repo: Path, tmp_path: Path):
    """cao's wip commit is not blocked, altered or used to run code by the repository's hooks,
    fsmonitor or filter drivers (a worker can write them all into the repository's config)."""
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    marks = tmp_path / "marks"
    marks.mkdir()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    names = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "reference-transaction")
    for name in (*names, "post-index-change", "fsmonitor"):
        (hooks / name).write_text(f'#!/bin/sh\ntouch {marks / name}\necho altered >> "$1"\nexit 1\n')
        (hooks / name).chmod(0o755)
    (path / "data.dat").write_text("raw data\n")
    (path / "big.lfs").write_text("large\n")
    (path / ".gitattributes").write_text("*.dat filter=evil\n*.lfs filter=lfs\n")
    (path / "app.py").write_text("line 1\nwork\nline 3\n")
    # the operator's own (global) filter is honoured; the repository's can't replace it
    git(repo, "config", "--global", "filter.lfs.clean", "tr a-z A-Z")
    for key, value in {
        "core.hooksPath": str(hooks),
        "core.fsmonitor": str(hooks / "fsmonitor"),
        "filter.evil.clean": f"touch {marks / 'filter'}; cat",
        "filter.evil.required": "true",
        "filter.lfs.clean": f"touch {marks / 'lfs'}; cat",
    }.items():
        git(repo, "config", key, value)
    state, note = retired(wt_core, term)
    assert sorted(p.name for p in marks.iterdir()) == []
    assert state == "removed", note
    assert (
        git(repo, "log", "-1", "--format=%B", branch)
        == f"wip: uncommitted work of dev {term['id']}, saved by cao at delete"
    )
    assert (
        git(repo, "show", f"{branch}:data.dat") == "raw data"
        and git(repo, "show", f"{branch}:big.lfs") == "LARGE"
    )


def test_a_filter_that_cannot_run_keeps_the_worktree(wt_core: Cao, repo: Path):
    """An LFS file with git-lfs missing (the filter is required): nothing is committed raw instead."""
    git(repo, "config", "--global", "filter.lfs.clean", "cao-test-no-such-git-lfs clean -- %f")
    git(repo, "config", "--global", "filter.lfs.required", "true")
    term = make_worker(wt_core, repo)
    path = tree(term)
    (path / ".gitattributes").write_text("*.bin filter=lfs\n")
    (path / "model.bin").write_text("weights\n")
    state, note = retired(wt_core, term)
    assert state == "kept" and (path / "model.bin").read_text() == "weights\n"
    assert "could not be committed" in note and "model.bin" in note, note


class Index(NamedTuple):
    make: Callable[[Path], object]  # what the worker leaves in its worktree
    want: dict[str, str]  # file → its text on the branch after delete
    words: str


def _lock(path: Path) -> None:
    (path / "app.py").write_text("line 1\nlocked index\nline 3\n")
    Path(git(path, "rev-parse", "--path-format=absolute", "--git-dir"), "index.lock").write_text("")


def _hide(flag: str) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        git(path, "update-index", flag, "app.py")
        (path / "app.py").write_text("line 1\nhidden from git status\nline 3\n")

    return make


def _staged_then_changed(path: Path) -> None:
    (path / "app.py").write_text("line 1\nstaged\nline 3\n")
    git(path, "add", "app.py")
    (path / "app.py").write_text("line 1\nchanged after staging\nline 3\n")


INDEX = {
    "index.lock left behind": Index(_lock, {"app.py": "locked index"}, "index.lock"),
    "assume-unchanged": Index(
        _hide("--assume-unchanged"), {"app.py": "hidden from git status"}, "committed as"
    ),
    "skip-worktree": Index(_hide("--skip-worktree"), {"app.py": "hidden from git status"}, "committed as"),
    "staged, then changed": Index(_staged_then_changed, {"app.py": "changed after staging"}, "staged"),
}


@pytest.mark.parametrize("case", INDEX.values(), ids=INDEX.keys())
def test_the_workers_index_state_is_saved(wt_core: Cao, repo: Path, case: Index):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    case.make(path)
    state, note = retired(wt_core, term)
    assert state == "removed" and case.words in note, note
    for name, text in case.want.items():
        assert text in git(repo, "show", f"{branch}:{name}")
    if case is INDEX["staged, then changed"]:  # the staged version is a commit of its own, below
        assert "staged" in git(repo, "show", f"{branch}~1:app.py")


def test_stashes_stay_and_a_branch_only_a_stash_contains_is_kept(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    (path / "app.py").write_text("line 1\ncommitted\nline 3\n")
    committed = commit_all(path, "the worker's commit")
    (path / "app.py").write_text("line 1\nstashed\nline 3\n")
    git(path, "stash", "-q")
    state, note = retired(wt_core, term)
    assert state == "removed" and not path.exists()
    assert git(repo, "rev-parse", branch) == committed  # refs/stash is not a branch: kept
    assert "stash" in git(repo, "stash", "list") and "1 stash" in note, note


# -- nothing is ever lost: what a second hostile review found -----------------------------------------
def _copy_config(repo: Path) -> None:
    """A committed setup copying the directory config/ (with an untracked local.toml) and the
    ignored .env from the checkout."""
    (repo / ".cao").mkdir()
    (repo / ".cao" / "worktree.yaml").write_text('copy: ["config", ".env"]\n')
    (repo / "config").mkdir()
    (repo / "config" / "shared.toml").write_text("shared = true\n")
    commit_all(repo, "setup config")
    (repo / "config" / "local.toml").write_text("secret = 1\n")  # untracked, not ignored
    (repo / ".env").write_text("TOKEN=operator\n")  # ignored


def files_on(repo: Path, branch: str) -> list[str]:
    return git(repo, "ls-tree", "-r", "--name-only", branch).splitlines()


def test_new_files_in_a_copied_directory_are_the_workers(wt_core: Cao, repo: Path):
    _copy_config(repo)
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    assert (path / "config" / "local.toml").read_text() == "secret = 1\n"
    (path / "config" / "worker-new.toml").write_text("mine = 1\n")
    (path / "config" / "sub").mkdir()
    (path / "config" / "sub" / "deep.txt").write_text("deep\n")
    diff = wt_core.diff(term["id"])["diff"]
    assert "config/worker-new.toml" in diff and "config/sub/deep.txt" in diff, diff
    assert "local.toml" not in diff and ".env" not in diff  # what cao copied is not the worker's
    state, note = retired(wt_core, term)
    assert state == "removed" and "deleted (merged" not in note, note
    on_branch = files_on(repo, branch)
    assert "config/worker-new.toml" in on_branch and "config/sub/deep.txt" in on_branch
    assert "config/local.toml" not in on_branch and ".env" not in on_branch


class CopyEdit(NamedTuple):
    edit: Callable[[Path], object]  # what the worker does to the setup's copies
    state: str
    words: str


def _edit_and_commit(path: Path) -> None:
    (path / "config" / "local.toml").write_text("secret = 2\n")
    commit_all(path, "the worker commits the copy it changed")


COPY_EDITS = {
    "a copied file edited": CopyEdit(
        lambda p: (p / "config" / "local.toml").write_text("secret = 2\n"), "kept", "config/local.toml"
    ),
    "an ignored copied file edited": CopyEdit(
        lambda p: (p / ".env").write_text("TOKEN=the worker's\n"), "kept", ".env"
    ),
    "a copied file deleted": CopyEdit(lambda p: (p / "config" / "local.toml").unlink(), "removed", ""),
    "a copied file edited and committed by the worker": CopyEdit(_edit_and_commit, "removed", ""),
    "the copies untouched": CopyEdit(lambda p: None, "removed", ""),
}


@pytest.mark.parametrize("case", COPY_EDITS.values(), ids=COPY_EDITS.keys())
def test_a_workers_edit_of_a_copied_file_is_never_lost(wt_core: Cao, repo: Path, case: CopyEdit):
    """cao never commits its copies (they are often secrets), so a copy the worker changed and
    did not commit keeps the worktree, with the reason."""
    _copy_config(repo)
    term = make_worker(wt_core, repo)
    path = tree(term)
    case.edit(path)
    before = {f: f.read_text() for f in (path / "config" / "local.toml", path / ".env") if f.exists()}
    state, note = retired(wt_core, term)
    assert state == case.state and case.words in note, note
    if state == "kept":
        assert "changed" in note and "copied" in note, note
        assert {f: f.read_text() for f in before} == before


def test_setup_paths_are_literal_not_glob_patterns(wt_core: Cao, repo: Path):
    (repo / ".cao").mkdir()
    (repo / ".cao" / "worktree.yaml").write_text('copy: ["[id].env"]\n')
    commit_all(repo, "setup config")
    (repo / "[id].env").write_text("KEY=operator\n")
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    assert (path / "[id].env").read_text() == "KEY=operator\n"
    (path / "i.env").write_text("the worker's i\n")
    (path / "d.env").write_text("the worker's d\n")
    diff = wt_core.diff(term["id"])["diff"]
    assert "i.env" in diff and "d.env" in diff and "[id].env" not in diff, diff
    state, note = retired(wt_core, term)
    assert state == "removed", note
    assert sorted(f for f in files_on(repo, branch) if f.endswith(".env")) == ["d.env", "i.env"]


class DotGit(NamedTuple):
    make: Callable[[Path], Path]  # makes it in the worktree, returns a file that must survive
    where: str


def _dotgit_dir(path: Path) -> Path:
    (path / "fixtures" / ".git").mkdir(parents=True)
    (path / "fixtures" / ".git" / "notes.txt").write_text("precious\n")
    return path / "fixtures" / ".git" / "notes.txt"


def _dotgit_file(path: Path) -> Path:
    (path / "pkg").mkdir()
    (path / "pkg" / ".git").write_text("precious, and no gitdir: line\n")
    return path / "pkg" / ".git"


def _dotgit_upper(path: Path) -> Path:
    (path / "data" / ".GIT").mkdir(parents=True)
    (path / "data" / ".GIT" / "notes.txt").write_text("precious\n")
    return path / "data" / ".GIT" / "notes.txt"


DOTGITS = {
    "a .git directory that is no repository": DotGit(_dotgit_dir, "fixtures/.git"),
    "a .git file that is no repository": DotGit(_dotgit_file, "pkg/.git"),
    "a .GIT directory": DotGit(_dotgit_upper, "data/.GIT"),
}


@pytest.mark.parametrize("case", DOTGITS.values(), ids=DOTGITS.keys())
def test_a_dot_git_entry_that_is_no_repository_keeps_the_worktree(wt_core: Cao, repo: Path, case: DotGit):
    """git never stores a path named .git (nor looks inside one), so a wip commit can't save it."""
    term = make_worker(wt_core, repo)
    path = tree(term)
    precious = case.make(path)
    (path / "app.py").write_text("line 1\nchanged\nline 3\n")
    state, note = retired(wt_core, term)
    assert state == "kept" and case.where in note and "git never stores" in note, note
    assert precious.read_text().startswith("precious")


class Dropped(NamedTuple):
    drop: Callable[[Path, str], object]  # (worktree, cao's branch), after one commit on it


DROPPED = {
    "cao's branch deleted": Dropped(
        lambda p, b: (git(p, "checkout", "-q", "--detach", "main"), git(p, "branch", "-q", "-D", b))
    ),
    "reset --hard": Dropped(lambda p, b: git(p, "reset", "-q", "--hard", "HEAD~1")),
    "commit --amend": Dropped(lambda p, b: git(p, "commit", "-q", "--amend", "-m", "amended")),
}


@pytest.mark.parametrize("case", DROPPED.values(), ids=DROPPED.keys())
def test_a_commit_the_worker_dropped_from_every_branch_gets_one(wt_core: Cao, repo: Path, case: Dropped):
    term = make_worker(wt_core, repo)
    path, branch = tree(term), term["worktree"]["branch"]
    (path / "app.py").write_text("line 1\nC1\nline 3\n")
    c1 = commit_all(path, "C1")
    case.drop(path, branch)
    seen = set(git(path, "log", "-g", "--format=%H", "HEAD").split())
    assert c1 in seen and not on_a_branch(repo, c1)
    state, note = retired(wt_core, term)
    assert state == "removed", note
    assert all(on_a_branch(repo, c) for c in seen), note  # every commit the worker's HEAD had
    saved = f"{branch}-saved-{c1[:10]}"
    assert heads(repo, saved) == {saved: c1} and saved in note, note


def test_a_worktree_folder_replaced_by_a_symlink_is_not_followed(wt_core: Cao, repo: Path):
    """Worker B's folder made a symlink to live worker A's worktree: cao touches nothing of A's."""
    a, b = make_worker(wt_core, repo), make_worker(wt_core, repo)
    pa, pb = tree(a), tree(b)
    (pa / "app.py").write_text("line 1\nA's uncommitted work\nline 3\n")

    def seen() -> tuple[str, ...]:
        return (
            git(pa, "status", "--porcelain"),
            git(repo, "for-each-ref"),
            git(repo, "worktree", "list", "--porcelain"),
        )

    before = seen()
    pb.rename(pb.with_name(pb.name + ".bak"))
    pb.symlink_to(pa)
    assert wt_core.diff(b["id"])["includes_uncommitted"] is False  # review doesn't follow it either
    state, note = retired(wt_core, b)
    assert state == "kept" and "symlink" in note and "nothing was touched" in note, note
    assert seen() == before and pb.is_symlink()
    assert "A's uncommitted work" in (pa / "app.py").read_text()


def test_reviewing_and_merging_run_none_of_the_repositorys_config(wt_core: Cao, repo: Path, tmp_path: Path):
    """diff, diffstat, the listing and merge (merge-tree, and git merge in the supervisor's
    checkout) run no hook, fsmonitor, filter, merge driver or diff driver the repository's
    config names (a worker can write it), before and after the worker is deleted."""
    (repo / "notes.txt").write_text("a\nb\nc\nd\ne\n")
    (repo / ".gitattributes").write_text("*.txt merge=evil filter=evil diff=evil\n")
    commit_all(repo, "notes")
    a, b = make_worker(wt_core, repo), make_worker(wt_core, repo)
    (tree(a) / "notes.txt").write_text("a\nfrom the worker\nc\nd\ne\n")
    commit_all(tree(a), "the worker's line")
    (repo / "notes.txt").write_text("a\nb\nc\nd\nfrom main\n")
    commit_all(repo, "main's line")
    (tree(b) / "notes.txt").write_text("uncommitted\n")
    (tree(b) / "new.txt").write_text("new\n")
    (tree(b) / ".env").write_text("ignored: keeps b's worktree at delete\n")
    marks = tmp_path / "marks"
    marks.mkdir()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in ("post-merge", "pre-merge-commit", "reference-transaction", "post-index-change", "fsmonitor"):
        (hooks / name).write_text(f"#!/bin/sh\ntouch {marks / name}\nexit 0\n")
        (hooks / name).chmod(0o755)
    for key, value in {
        "core.hooksPath": str(hooks),
        "core.fsmonitor": str(hooks / "fsmonitor"),
        "filter.evil.clean": f"touch {marks / 'clean'}; cat",
        "filter.evil.smudge": f"touch {marks / 'smudge'}; cat",
        "merge.evil.driver": f"touch {marks / 'merge-driver'}; true",
        "diff.evil.textconv": f"touch {marks / 'textconv'}; cat",
        "diff.evil.command": f"touch {marks / 'diff-command'}; true",
        "diff.external": f"touch {marks / 'diff-external'}; true",
    }.items():
        git(repo, "config", key, value)
    client = TestClient(create_app(wt_core))

    def review(*live: dict[str, Any]) -> None:
        assert client.get("/worktrees").status_code == 200
        for term in live:
            assert client.get(f"/terminals/{term['id']}").status_code == 200  # the diffstat
        for term in (a, b):
            for full in ("false", "true"):
                got = client.get(f"/terminals/{term['id']}/diff", params={"full": full})
                assert got.status_code == 200, got.text

    review(a, b)
    assert "new.txt" in client.get(f"/terminals/{b['id']}/diff").json()["diff"]
    merged = client.post(f"/terminals/{a['id']}/merge", json={})
    assert merged.status_code == 200 and merged.json()["merged"] is True, merged.text
    assert (repo / "notes.txt").read_text() == "a\nfrom the worker\nc\nd\nfrom main\n"  # git's text merge
    wt_core.delete_terminal(b["id"])
    assert wt_core.store.get_worktree(b["id"]).state == "kept"  # type: ignore[union-attr]
    review(a)
    assert sorted(p.name for p in marks.iterdir()) == []


def test_a_huge_untracked_file_keeps_the_worktree_instead_of_being_committed(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path = tree(term)
    with open(path / "disk.img", "wb") as f:  # sparse: 150 MB on paper, nothing on disk
        f.truncate(150 * 1024 * 1024)
    (path / "small.txt").write_text("small\n")
    diff = wt_core.diff(term["id"])["diff"]
    assert "small.txt" in diff and "disk.img" in diff and "100 MB" in diff, diff
    state, note = retired(wt_core, term)
    assert state == "kept" and "disk.img" in note and "100 MB" in note, note
    assert (path / "disk.img").stat().st_size == 150 * 1024 * 1024
    assert git(repo, "rev-parse", term["worktree"]["branch"]) == git(repo, "rev-parse", "main")


def test_the_diffstat_counts_new_untracked_files(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path = tree(term)
    (path / "new.txt").write_text("one\ntwo\n")
    (path / "app.py").write_text("line 1\nline 2\nline 3\nline 4\n")
    want = {"files": 2, "insertions": 3, "deletions": 0, "untracked": 1}
    wait_until(lambda: wt_core.terminal_view(term["id"])["worktree"]["diffstat"] == want, timeout=5)


# -- review and merge ------------------------------------------------------------------------------
def test_diff_shows_stat_and_full_including_uncommitted(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    path = tree(term)
    (path / "app.py").write_text("line 1\nchanged\nline 3\n")
    commit_all(path, "change")
    (path / "notes.md").write_text("uncommitted note\n")
    stat = wt_core.diff(term["id"])
    assert stat["mode"] == "stat" and "app.py" in stat["diff"] and "notes.md" in stat["diff"]
    full = wt_core.diff(term["id"], stat=False)
    assert "+changed" in full["diff"] and "-line 2" in full["diff"] and "+uncommitted note" in full["diff"]
    assert git(path, "status", "--porcelain") == "?? notes.md"  # the worker's index is untouched


def test_merge_succeeds_and_a_conflicting_merge_stops_cleanly(wt_core: Cao, repo: Path):
    a, b = make_worker(wt_core, repo), make_worker(wt_core, repo)
    (tree(a) / "app.py").write_text("line 1\nA\nline 3\n")
    commit_all(tree(a), "A's change")
    (tree(b) / "app.py").write_text("line 1\nB\nline 3\n")
    commit_all(tree(b), "B's change")
    before = git(repo, "rev-parse", "HEAD")
    merged = wt_core.merge(a["id"])
    assert merged["merged"] and merged["target"] == "main" and merged["updated_checkout"] == str(repo)
    assert (repo / "app.py").read_text() == "line 1\nA\nline 3\n"
    assert git(repo, "rev-parse", "HEAD^1") == before and git(repo, "status", "--porcelain") == ""
    head = git(repo, "rev-parse", "HEAD")
    with pytest.raises(MergeConflict, match=r"would conflict in app\.py") as err:
        wt_core.merge(b["id"])
    assert err.value.status_code == 409
    [conflict] = err.value.fields["conflicts"]
    assert conflict["path"] == "app.py" and "<<<<<<<" in conflict["text"] and "B" in conflict["text"]
    # nothing changed: same HEAD, clean tree, no merge in progress
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    assert not (repo / ".git" / "MERGE_HEAD").exists()
    assert wt_core.merge(a["id"])["already_merged"] is True
    # after the merge, deleting A drops its branch (nothing unmerged); B's stays
    wt_core.delete_terminal(a["id"])
    wt_core.delete_terminal(b["id"])
    assert git(repo, "branch", "--list", a["worktree"]["branch"]) == ""
    assert git(repo, "branch", "--list", b["worktree"]["branch"]) != ""


def test_merge_into_a_branch_nobody_has_checked_out_and_refusals(wt_core: Cao, repo: Path):
    git(repo, "branch", "integration")
    term = make_worker(wt_core, repo)
    (tree(term) / "feature.py").write_text("print('hi')\n")
    with pytest.raises(NotMergeable, match="uncommitted changes"):
        wt_core.merge(term["id"])
    commit_all(tree(term), "feature")
    main_head = git(repo, "rev-parse", "main")
    out = wt_core.merge(term["id"], into="integration")
    assert out["merged"] and out["updated_checkout"] is None
    assert git(repo, "show", "integration:feature.py") == "print('hi')"
    assert git(repo, "rev-parse", "main") == main_head and not (repo / "feature.py").exists()
    with pytest.raises(InvalidInput, match="not a branch name"):
        wt_core.merge(term["id"], into="--upload-pack=evil")
    # the supervisor's checkout has uncommitted changes: refused, nothing changed
    (repo / "app.py").write_text("dirty\n")
    with pytest.raises(NotMergeable, match="uncommitted changes"):
        wt_core.merge(term["id"])
    assert git(repo, "rev-parse", "main") == main_head


def test_a_deleted_workers_branch_can_still_be_reviewed_and_merged(wt_core: Cao, repo: Path):
    term = make_worker(wt_core, repo)
    (tree(term) / "app.py").write_text("line 1\nleft uncommitted\nline 3\n")
    wt_core.delete_terminal(term["id"])  # → a wip commit on its branch
    assert "left uncommitted" in wt_core.diff(term["id"], stat=False)["diff"]
    assert wt_core.merge(term["id"])["merged"]
    assert "left uncommitted" in (repo / "app.py").read_text()


# -- restart -----------------------------------------------------------------------------------------
def test_restart_adopts_worktrees_of_live_terminals_and_lists_orphans(
    make_core: Callable[..., Cao], settings: Settings, repo: Path
):
    first = make_core(settings)
    write_rules(settings.home, "dev", ECHO)
    live, dead = make_worker(first, repo), make_worker(first, repo)
    (tree(dead) / "app.py").write_text("work in progress\n")
    first.stop()
    first.tmux.kill_checked(first.panes.ref(first.store.get_terminal(dead["id"])))  # its agent died
    stray = settings.worktrees_dir / "proj" / "leftover"
    stray.mkdir(parents=True)
    second = make_core(settings)
    assert second.terminal_view(live["id"])["state"] == "live"
    listing = {w["path"]: w for w in second.worktrees()}
    assert listing[str(tree(live))]["orphan"] is False
    assert listing[str(tree(dead))]["orphan"] is True and "gone" in str(listing[str(tree(dead))]["reason"])
    assert listing[str(stray)]["orphan"] is True
    # orphans are listed, never removed: the dead worker's work is still there
    assert (tree(dead) / "app.py").read_text() == "work in progress\n" and stray.is_dir()


# -- HTTP, CLI and MCP ---------------------------------------------------------------------------------
def test_http_routes(wt_core: Cao, repo: Path, tmp_path: Path):
    client = TestClient(create_app(wt_core))
    bad = client.post(
        "/sessions", json={"agent_profile": "dev", "working_directory": str(tmp_path), "use_worktree": True}
    )
    assert bad.status_code == 422 and "not inside a git repository" in bad.json()["detail"]
    resp = client.post(
        "/sessions", json={"agent_profile": "dev", "working_directory": str(repo), "use_worktree": True}
    )
    assert resp.status_code == 201, resp.text
    sup = resp.json()
    worker = client.post(
        f"/sessions/{sup['session_name']}/terminals",
        json={
            "agent_profile": "dev",
            "working_directory": str(repo),
            "use_worktree": "true",
            "supervisor_id": sup["id"],
        },
    ).json()
    (tree(worker) / "app.py").write_text("line 1\nworker\nline 3\n")
    commit_all(tree(worker), "work")
    diff = client.get(f"/terminals/{worker['id']}/diff", params={"full": "true"}).json()
    assert "+worker" in diff["diff"]
    assert client.get("/terminals/abcdef12/diff").status_code == 404
    merged = client.post(f"/terminals/{worker['id']}/merge", json={}).json()
    assert merged["merged"] is True and merged["target"] == "main"
    assert "worker" in (repo / "app.py").read_text()
    listing = client.get("/worktrees").json()
    assert {w["terminal_id"] for w in listing} == {sup["id"], worker["id"]}
    assert (
        client.get(f"/terminals/{worker['id']}").json()["worktree"]["branch"] == worker["worktree"]["branch"]
    )


def test_cli_launch_diff_merge_and_worktrees(wt_core: Cao, repo: Path):
    from click.testing import CliRunner

    from cao.cli import cli
    from cao.client import Client

    with TestClient(create_app(wt_core)) as http:
        client = Client("http://testserver", http=http)

        def run(*args: str) -> Any:
            return CliRunner().invoke(cli, list(args), obj={"client": client})

        made = []
        for name in ("w1", "w2"):
            res = run(
                "launch",
                "--headless",
                "--worktree",
                "--agents",
                "dev",
                "--session-name",
                name,
                "-w",
                str(repo),
            )
            assert res.exit_code == 0 and "on branch cao/dev-" in res.output, res.output
            made.append(json.loads(run("status", "--json", "--session", name).output)[0])
        for i, term in enumerate(made):
            (tree(term) / "app.py").write_text(f"line 1\nworker {i}\nline 3\n")
            commit_all(tree(term), f"worker {i}")
        stat = run("diff", made[0]["id"])
        assert stat.exit_code == 0 and "app.py | 2 +-" in stat.output
        assert "+worker 0" in run("diff", made[0]["id"], "--full").output
        merged = run("merge", made[0]["id"])
        assert merged.exit_code == 0 and "merged cao/dev-" in merged.output and "into main" in merged.output
        clash = run("merge", made[1]["id"])
        assert clash.exit_code == 1 and "conflict" in clash.output and "--- app.py" in clash.output
        assert "<<<<<<<" in clash.output
        assert git(repo, "status", "--porcelain") == ""
        rows = json.loads(run("worktrees", "--json").output)
        assert sorted(r["terminal_id"] for r in rows) == sorted(t["id"] for t in made)
        assert "cao/dev-" in run("worktrees").output
        assert run("diff", "abcdef12").exit_code == 1


def test_mcp_assign_handoff_diff_and_merge(make_server: Callable[..., Any], tmp_path: Path, repo: Path):
    """A supervisor agent's view: assign and handoff with use_worktree, then review and merge."""
    import anyio

    from tests.test_mcp import data, mcp_as

    home = tmp_path / "cao"
    write_rules(home, "boss", {"record": True})
    write_rules(home, "dev", {"rules": [{"match": ".", "delay": 0.2, "reply": "done"}]})
    srv = make_server(home)
    with srv.client() as http:
        boss = http.post(
            "/sessions", json={"agent_profile": "boss", "session_name": "wt", "working_directory": str(repo)}
        ).json()
        wait_until(lambda: http.get(f"/terminals/{boss['id']}").json()["status"] == "idle", what="boss idle")

        async def scenario() -> None:
            async with mcp_as(srv, boss["id"]) as mcp:
                one = data(
                    await mcp.call_tool(
                        "assign", {"agent_profile": "dev", "message": "a", "use_worktree": True}
                    )
                )
                two = data(
                    await mcp.call_tool(
                        "assign", {"agent_profile": "dev", "message": "b", "use_worktree": True}
                    )
                )
                assert one["branch"] == f"cao/dev-{one['worker_id']}" and "merge_worker" in one["note"]
                for i, w in enumerate((one, two)):
                    (Path(w["worktree"]) / "app.py").write_text(f"line 1\nfrom {i}\nline 3\n")
                    commit_all(Path(w["worktree"]), f"work {i}")
                workers = data(await mcp.call_tool("my_workers", {}))["workers"]
                assert {w["branch"] for w in workers} == {one["branch"], two["branch"]}
                diff = data(await mcp.call_tool("worker_diff", {"worker_id": one["worker_id"], "full": True}))
                assert "+from 0" in diff["diff"]
                merged = data(await mcp.call_tool("merge_worker", {"worker_id": one["worker_id"]}))
                assert merged["merged"] is True and merged["target"] == "main"
                clash = data(await mcp.call_tool("merge_worker", {"worker_id": two["worker_id"]}))
                assert clash["merged"] is False and clash["conflicts"][0]["path"] == "app.py"
                answer = await mcp.call_tool(
                    "handoff", {"agent_profile": "dev", "message": "c", "use_worktree": True}
                )
                text = answer.content[0].text  # type: ignore[union-attr]
                assert "done" in text and "worker_diff" in text and "cao/dev-" in text

        anyio.run(scenario)
    assert (repo / "app.py").read_text() == "line 1\nfrom 0\nline 3\n"
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.integration  # the demo starts its own cao-server and tmux server
def test_demo_with_worktrees_merges_both_workers_into_the_supervisors_branch(tmp_path: Path):
    import sys

    from tests.helpers import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAO_", "TMUX", "GIT_"))}
    env.update(HOME=str(tmp_path), TMPDIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "cao", "demo", "--worktrees", "--timeout", "60"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "5 messages, each delivered exactly once" in out
    assert out.count("merged cao/demo_worker-") == 2 and "into main" in out
    assert "files on main: README.md, parser.py, test_parser.py" in out
    assert "both workers' branches merged" in out
    assert list(tmp_path.glob("cao-demo-*")) == []  # its home, repository and worktrees are gone


def test_setup_paths_cannot_escape_through_committed_symlinks(wt_core: Cao, tmp_path: Path):
    """A repository's own symlinks must not carry copy/link setup outside it (found by a hostile
    review: a relative link to / plus `link: [r/<victim>]` replaced the victim with a symlink)."""
    victim = tmp_path / "victim" / "proj"
    victim.mkdir(parents=True)
    (victim / "secret.txt").write_text("KEEP")
    for setup in (f"link: [r{victim}]\n", f"copy: [r{victim}]\n", "copy: [passwd]\n"):
        repo = tmp_path / f"r{abs(hash(setup))}"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "README").write_text("hi\n")
        (repo / "r").symlink_to("../" * 12)  # relative: reaches / from anywhere
        (repo / "passwd").symlink_to("/etc/passwd")
        (repo / ".cao").mkdir()
        (repo / ".cao" / "worktree.yaml").write_text(setup)
        commit_all(repo, "init")
        with pytest.raises(InvalidInput, match=r"outside the checkout|through a symlink"):
            wt_core.create_terminal(agent_profile="dev", working_directory=str(repo), use_worktree=True)
        assert (victim / "secret.txt").read_text() == "KEEP" and not victim.is_symlink()
    assert wt_core.list_terminals() == []


def test_a_repositorys_setup_commands_run_only_when_the_operator_allows_it(wt_core: Cao, repo: Path):
    """A checkout someone else wrote must not run its commands on your machine by default."""
    (repo / ".cao").mkdir()
    (repo / ".cao" / "worktree.yaml").write_text("setup: ['echo ran > pwned.txt']\n")
    commit_all(repo, "setup config")
    term = make_worker(wt_core, repo)
    ready(wt_core, term["id"])
    assert not (tree(term) / "pwned.txt").exists()
    assert "CAO_WORKTREE_SETUP_COMMANDS=true" in wt_core.output(term["id"])
