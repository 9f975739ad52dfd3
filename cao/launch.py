"""Planning a terminal's launch: which profile and provider, where it runs, with what environment.

Pure apart from reading the filesystem (the profile store, the working directory, a worktree's
repository): the plan says what to write and what to run, and cao/lifecycle.py carries it out
(row first, pane second). Provider choice is made here and nowhere else:

    the request's provider  >  the profile's pinned provider  >  the supervisor's provider  >  scripted
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import providers
from cao import profiles
from cao.errors import InvalidInput, NotFound, ProviderError
from cao.names import validate_name
from cao.profiles import Profile
from cao.settings import Settings
from cao.states import Status, TerminalState
from cao.store import Terminal
from cao.worktrees import Plan as WorktreePlan
from cao.worktrees import Workspaces
from providers.base import LaunchContext, LaunchSpec

# Host variables a pane may inherit; everything else is left out on purpose.
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR")
DEFAULT_PROFILE = "developer"


@dataclass(frozen=True)
class LaunchPlan:
    terminal: Terminal  # the row to write first (state ``starting``)
    spec: LaunchSpec  # what the pane runs, with exactly which environment, and the files to write
    home: Path  # the terminal's own throwaway directory (its CLI's config home)
    agent_dir: Path  # where the agent runs (in its worktree, when it has one)
    worktree: WorktreePlan | None  # the git worktree to make for it (docs/worktrees.md)


class LaunchPlanner:
    def __init__(
        self,
        settings: Settings,
        workspaces: Workspaces,
        *,
        environ: Mapping[str, str],
        clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.workspaces = workspaces
        self.environ = dict(environ)
        self.clock = clock

    def resolve_profile(self, name: str, provider: str | None) -> Profile | None:
        """The agent profile ``name`` (store, then built-ins); 422 naming the choices if unknown.

        A name that isn't a profile is still valid for a provider that takes rule files instead
        (the scripted agent: ``$CAO_HOME/scripted/<name>.json``; tests and the demo name their
        scripted agents that way)."""
        try:
            return profiles.load(name, self.settings.profiles_dir)
        except NotFound:
            pass
        rules = self.settings.scripted_dir / f"{name}.json"
        by_rules = providers.get(provider or providers.default_name()).takes_rule_files
        if by_rules and rules.is_file():
            return None
        raise InvalidInput(
            f"agent profile {name!r} not found; available: "
            f"{', '.join(profiles.names(self.settings.profiles_dir))}. Install one with `cao install PATH.md`"
            + (f" (or give the scripted agent rules at {rules})" if by_rules else "")
        )

    @staticmethod
    def choose_provider(requested: str | None, profile: Profile | None, supervisor: Terminal | None) -> str:
        """The one provider-choice policy (module docstring)."""
        return (
            requested
            or (profile.provider if profile else None)
            or (supervisor.provider if supervisor else None)
            or providers.default_name()
        )

    def working_directory(self, requested: str | None) -> Path:
        if requested is not None and (len(requested) > 4096 or "\x00" in requested):
            raise InvalidInput(
                "working_directory is not a usable path (too long or has a NUL); pass a directory"
            )
        workdir = Path(requested or os.getcwd()).expanduser()
        try:
            is_dir = workdir.is_dir()
        except OSError:
            is_dir = False
        if not is_dir:
            raise InvalidInput(f"working_directory {str(workdir)!r} is not a directory; pass an existing one")
        return workdir

    def plan(
        self,
        terminal_id: str,
        *,
        session: str,
        provider: str | None,
        agent_profile: str | None,
        working_directory: str | None,
        supervisor: Terminal | None,
        use_worktree: bool | None,
        hook_key: str,
    ) -> LaunchPlan:
        """Everything the launch needs, checked (422 naming the problem) before anything is made.

        ``use_worktree`` (default: the profile's ``use_worktree``): the agent runs in a new git
        worktree on its own branch; whether one can be made is checked here."""
        profile_name = validate_name(agent_profile or DEFAULT_PROFILE, "agent_profile")
        # a rules file stands in for a profile only for the CLI that will run: the request's, else
        # (a rules file pins nothing) the supervisor's, else the default
        loaded = self.resolve_profile(profile_name, provider or (supervisor.provider if supervisor else None))
        provider_name = self.choose_provider(provider, loaded, supervisor)
        prov = providers.get(provider_name)
        workdir = self.working_directory(working_directory)
        wants_worktree = use_worktree if use_worktree is not None else bool(loaded and loaded.use_worktree)
        worktree = self.workspaces.plan(workdir, profile_name, terminal_id) if wants_worktree else None
        agent_dir = worktree.agent_dir if worktree is not None else workdir
        home = self.settings.home / "terminals" / terminal_id
        ctx = LaunchContext(
            terminal_id=terminal_id,
            agent_profile=profile_name,
            working_directory=agent_dir.resolve(),
            cao_home=self.settings.home,
            server_url=self.settings.server_url,
            terminal_home=home,
            base_env=self._base_env(terminal_id, profile_name, home),
            settings_env=self._settings_env(),
            profile=loaded,
            hooks=self.settings.hooks,
            hook_key=hook_key,
        )
        try:
            spec = prov.launch(ctx)
        except ProviderError:
            raise
        except Exception as exc:  # a provider bug must not take the server down
            raise ProviderError(
                f"provider {provider_name} could not build its launch command: {exc}"
            ) from exc
        now = self.clock()
        terminal = Terminal(
            id=terminal_id,
            name=f"{profile_name}-{terminal_id[:4]}",
            session_name=session,
            provider=provider_name,
            agent_profile=profile_name,
            working_directory=str(agent_dir),
            state=TerminalState.STARTING.value,
            status=Status.PROCESSING.value,
            supervisor_id=supervisor.id if supervisor else None,
            created_at=now,
            last_active=now,
        )
        return LaunchPlan(terminal=terminal, spec=spec, home=home, agent_dir=agent_dir, worktree=worktree)

    def _base_env(self, terminal_id: str, profile: str, home: Path) -> dict[str, str]:
        env = {k: self.environ[k] for k in ENV_ALLOW if self.environ.get(k)}
        env.update(
            {
                "HOME": self.environ.get("HOME", str(home)),
                "TERM": "xterm-256color",
                "LANG": self.environ.get("LANG") or "C.UTF-8",
                "CAO_TERMINAL_ID": terminal_id,
                "CAO_SERVER_URL": self.settings.server_url,
                "CAO_AGENT_PROFILE": profile,
                "CAO_HOME": str(self.settings.home),
            }
        )
        return env

    def _settings_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.environ.items() if k.startswith("CAO_")}
        if self.settings.scripted_record:
            env["CAO_SCRIPTED_RECORD"] = "1"
        return env


def new_session_name() -> str:
    return secrets.token_hex(4)
