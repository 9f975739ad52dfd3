"""Git worktrees for workers: one worktree on its own branch per worker, review and merge
(docs/worktrees.md). The only package that runs ``git``.

    service.py   Workspaces: what the terminal layer calls (plan, make, retire, adopt, view,
                 diff, merge) and the ``worktree`` rows it keeps
    git.py       Git: the one git runner and its guard (a repository's own config runs nothing),
                 a worktree's identity check (Pinned)
    setup.py     .cao/worktree.yaml: files copied and linked in, commands run in the pane, and
                 the record of exactly what cao put there
    scratch.py   a worker's tree read through a scratch index (what its work is, for all below)
    retire.py    a worker is deleted: every commit onto a named ref, or the worktree kept as it is
    review.py    diff, diffstat and merge

    create    Workspaces.plan(dir) → Git.inspect → git worktree add -b cao/<profile>-<id> … HEAD
              then the setup: files copied/linked from the checkout, commands run in the pane
    delete    Workspaces.retire → retire.retire: identify → holds → save → git worktree remove
    review    Workspaces.diff / merge → review.diff / review.merge
"""

from cao.worktrees.git import Git, Pinned, Repo, WorktreeError, validate_branch
from cao.worktrees.review import MergeConflict, MergeResult, NotMergeable
from cao.worktrees.service import Plan, Workspaces
from cao.worktrees.setup import SetupPlan, load_plan, setup_command

__all__ = [
    "Git",
    "MergeConflict",
    "MergeResult",
    "NotMergeable",
    "Pinned",
    "Plan",
    "Repo",
    "SetupPlan",
    "Workspaces",
    "WorktreeError",
    "load_plan",
    "setup_command",
    "validate_branch",
]
