"""A git worktree per worker, on real git repositories in temp dirs: isolation, setup, nothing
lost at delete, review and merge (clean and conflicting), adoption after a restart, the HTTP
routes, the CLI and MCP tools over them. Workers' "edits" are files this test writes into their
worktrees (scripted agents don't edit files)."""

from __future__ import annotations

import json
import os
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
from tests.conftest import wait_until, write_rules

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
    want = {"files": 1, "insertions": 1, "deletions": 1}  # the dashboard's diffstat (cached for 2 s)
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
    first.tmux.kill_checked(first.terminals.ref(first.store.get_terminal(dead["id"])))  # its agent died
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

    from cao.cli import Client, cli

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

    from tests.conftest import REPO

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
