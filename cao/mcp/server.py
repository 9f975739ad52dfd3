"""``cao-mcp-server``'s MCP side: the tools as the agents see them (names, descriptions, argument
schemas), served over stdio, and the command itself. What each tool does is cao/mcp/tools.py."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any, Literal

import anyio
import click
import httpx
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

import cao
from cao import apitoken
from cao.errors import CaoError
from cao.mcp.tools import HTTP_TIMEOUT, INSTRUCTIONS, MAX_TIMEOUT, AgentTools
from cao.settings import Settings

logger = logging.getLogger("cao.mcp")

TerminalId = Annotated[str, Field(description="A terminal id: 8 hex digits, e.g. 1a2b3c4d.")]
BoardKey = Annotated[
    str,
    Field(description="A fact's key: 1-200 of A-Z a-z 0-9 . _ : / - , e.g. build/status or owner:parser."),
]
ProfileName = Annotated[
    str,
    Field(description="Agent profile of the worker, e.g. developer or reviewer (`cao profiles` lists them)."),
]


def build_server(tools: AgentTools) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("cao", instructions=INSTRUCTIONS, version=cao.__version__)

    @server.tool()
    async def send_message(
        message: Annotated[str, Field(description="The text to send.")],
        receiver_id: Annotated[
            str | None, Field(description="Terminal id of the receiver; leave out to reach your supervisor.")
        ] = None,
        priority: Annotated[
            Literal["urgent", "high", "normal", "low"] | None,
            Field(description="Served by priority, then order (default: normal; a notice: low)."),
        ] = None,
        if_busy: Annotated[
            Literal["wait", "refuse", "interrupt"] | None,
            Field(
                description="If the receiver is working: wait (default), refuse (nothing sent: you are told "
                "it's busy), interrupt (urgent only: reach it inside its turn)."
            ),
        ] = None,
        ttl_seconds: Annotated[
            float | None, Field(description="Drop it if still undelivered after this many seconds.", gt=0)
        ] = None,
        kind: Annotated[
            Literal["message", "task", "notice"] | None,
            Field(description="What it is (default: message). Notices on one topic replace each other."),
        ] = None,
        topic: Annotated[
            str | None, Field(description="For a notice: a newer one on it replaces this.")
        ] = None,
    ) -> dict[str, Any]:
        """Put a message in another agent's inbox; it is pasted into that agent's terminal when it is ready.

        Returns at once with the message id. Without receiver_id the message goes to your supervisor
        (the agent that assigned you your task). Retrying an identical call doesn't send it twice.
        """
        return await tools.send_message(
            message,
            receiver_id,
            priority=priority,
            if_busy=if_busy,
            ttl_seconds=ttl_seconds,
            kind=kind,
            topic=topic,
        )

    @server.tool()
    async def check_inbox() -> dict[str, Any]:
        """See your mail without changing anything: what waits for you, in the order it will reach you,
        and what reached you that you have not acknowledged yet (ids, senders, priorities, previews),
        with your ack cursor. Read a whole message with read_message; acknowledge with ack."""
        return await tools.check_inbox()

    @server.tool()
    async def ack(
        through_message_id: Annotated[
            int | None,
            Field(description="Acknowledge everything that reached you up to this message id.", ge=0),
        ] = None,
        expected: Annotated[
            int | None,
            Field(
                description="Your ack cursor as check_inbox showed it: if it moved meanwhile, nothing is "
                "acknowledged and you are told its value (ack again with it).",
                ge=0,
            ),
        ] = None,
        message_ids: Annotated[
            list[int] | None, Field(description="Or acknowledge just these messages (the cursor stays).")
        ] = None,
    ) -> dict[str, Any]:
        """Say you have handled messages that reached you (delivered is not acted on). Acknowledging
        something not delivered yet is refused; repeating an ack already done succeeds. Nothing is
        pasted again if you don't ack: it only tells others what you acted on."""
        return await tools.ack(through_message_id, expected, message_ids)

    @server.tool()
    async def report_result(
        status: Annotated[Literal["done", "failed", "blocked"], Field(description="How your task ended.")],
        summary: Annotated[
            str, Field(description="What came of it, for your supervisor (at most 4000 characters).")
        ],
        details: Annotated[
            dict[str, Any] | None,
            Field(
                description="Optional: branch, commit (texts), files, artifacts (lists of texts), tests, "
                "notes (texts). Other fields are refused."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """As a worker: report your task's result to your supervisor (it arrives there as a result
        message; a handoff returns it). One result per task: the same call again returns the first
        receipt, a different one is refused. Use send_message for anything further."""
        return await tools.report_result(status, summary, details)

    @server.tool()
    async def schedule_wakeup(
        message: Annotated[str, Field(description="What the wake-up should tell you.")],
        in_minutes: Annotated[
            float | None, Field(description="In this many minutes (or give at).", ge=0)
        ] = None,
        at: Annotated[
            str | None, Field(description="At this time, ISO 8601 with a zone (or give in_minutes).")
        ] = None,
        every_minutes: Annotated[
            float | None, Field(description="Then again every this many minutes (default: once).", gt=0)
        ] = None,
    ) -> dict[str, Any]:
        """Schedule a message to yourself: once, or every N minutes. It survives restarts and comes
        once per slot; list yours with my_wakeups, cancel with cancel_wakeup."""
        return await tools.schedule_wakeup(message, in_minutes, at, every_minutes)

    @server.tool()
    async def cancel_wakeup(
        schedule_id: Annotated[int, Field(description="The wake-up's id (schedule_wakeup gave it).", gt=0)],
    ) -> dict[str, Any]:
        """Cancel one of your wake-ups (its slots still waiting are cancelled too)."""
        return await tools.cancel_wakeup(schedule_id)

    @server.tool()
    async def my_wakeups() -> dict[str, Any]:
        """List your active wake-ups."""
        return await tools.my_wakeups()

    @server.tool()
    async def read_message(
        message_id: Annotated[
            int, Field(description="The message's id (from its header or check_inbox).", gt=0)
        ],
    ) -> dict[str, Any]:
        """Read one of your messages whole (a long one arrives as a preview that names this tool)."""
        return await tools.read_message(message_id)

    @server.tool()
    async def defer_message(
        message_id: Annotated[int, Field(description="A message waiting in your queue.", gt=0)],
        seconds: Annotated[float, Field(description="Not before this many seconds from now.", gt=0)],
        reason: Annotated[str | None, Field(description="Why (kept on your timeline).")] = None,
    ) -> dict[str, Any]:
        """Put off one waiting message of yours until later (not a person's chat)."""
        return await tools.manage(message_id, "defer", seconds=seconds, reason=reason)

    @server.tool()
    async def drop_message(
        message_id: Annotated[int, Field(description="A message waiting in your queue.", gt=0)],
        reason: Annotated[str, Field(description="Why you drop it (shown to whoever looks).", min_length=1)],
    ) -> dict[str, Any]:
        """Drop one waiting message of yours: it is never delivered (not a person's chat)."""
        return await tools.manage(message_id, "drop", reason=reason)

    @server.tool()
    async def prioritize_message(
        message_id: Annotated[int, Field(description="A message waiting in your queue.", gt=0)],
        priority: Annotated[
            Literal["urgent", "high", "normal", "low"], Field(description="Its new priority.")
        ],
        reason: Annotated[str | None, Field(description="Why (kept on your timeline).")] = None,
    ) -> dict[str, Any]:
        """Change the priority of one waiting message of yours (not a person's chat)."""
        return await tools.manage(message_id, "prioritize", priority=priority, reason=reason)

    @server.tool()
    async def assign(
        agent_profile: ProfileName,
        message: Annotated[str, Field(description="The task: everything the worker needs to do it.")],
        working_directory: Annotated[
            str | None, Field(description="Directory the worker starts in (default: yours).")
        ] = None,
        use_worktree: Annotated[
            bool | None,
            Field(
                description="Give the worker its own git worktree on a new branch from your HEAD, so "
                "parallel workers don't edit the same files (default: its profile's setting)."
            ),
        ] = None,
        notify: Annotated[
            bool | None,
            Field(
                description="Get a notice when the worker finishes, waits at a permission prompt, fails or "
                "exits (default: true)."
            ),
        ] = None,
        host: Annotated[
            str | None,
            Field(
                description="The machine to run the worker on, when several cao-servers share one store "
                "(a host name; default: yours). Its working_directory must exist there."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a new worker agent on a task and return its terminal id at once (don't wait for it).

        The worker gets the task through its inbox, with a note saying you are its supervisor. It
        reports its result with report_result; the result arrives in your input as a cao message, and
        notices tell you when it finishes, waits at a permission prompt, fails or exits (no polling).
        Use it for parallel or long tasks; use handoff when you need the answer before going on.
        """
        return await tools.assign(agent_profile, message, working_directory, use_worktree, notify, host)

    @server.tool()
    async def handoff(
        agent_profile: ProfileName,
        message: Annotated[str, Field(description="The task: everything the worker needs to do it.")],
        timeout: Annotated[
            float,
            Field(description="Seconds to wait for the answer (start-up included).", gt=0, le=MAX_TIMEOUT),
        ] = 600.0,
        use_worktree: Annotated[
            bool | None,
            Field(description="Run the worker in its own git worktree (its branch stays for merge_worker)."),
        ] = None,
        notify: Annotated[
            bool | None,
            Field(description="Get a notice if the worker waits at a permission prompt, fails or exits."),
        ] = None,
        ctx: Context[Any, Any] | None = None,
    ) -> str:
        """Start a new worker agent, give it one task, wait for it to finish and return its answer.

        Returns the result the worker reported (report_result), or, when it reported none, its last
        answer on the screen (the answer says which). The worker is stopped and removed afterwards,
        also on error or timeout. Use it for self-contained tasks whose result you need now; use
        assign for work that takes long.
        """
        report = ctx.report_progress if ctx is not None else None
        return await tools.handoff(agent_profile, message, timeout, report, use_worktree, notify)

    @server.tool()
    async def worker_diff(
        worker_id: TerminalId,
        full: Annotated[bool, Field(description="The whole patch instead of the stat.")] = False,
    ) -> dict[str, Any]:
        """Show what a worker with its own git worktree changed: its branch's commits and what it
        has not committed yet, against the branch it was made from (stat, or the full patch)."""
        return await tools.worker_diff(worker_id, full)

    @server.tool()
    async def merge_worker(
        worker_id: TerminalId,
        into: Annotated[
            str | None, Field(description="Branch to merge into (default: the one it was made from).")
        ] = None,
    ) -> dict[str, Any]:
        """Merge a worker's branch into yours (or `into`). On a conflict nothing changes: you get
        merged=false and the conflicted files' text; resolve it in the worker and merge again."""
        return await tools.merge_worker(worker_id, into)

    @server.tool()
    async def my_inbox(
        status: Annotated[
            str | None,
            Field(
                description="Only messages in this status: pending, delivering, delivered, failed, cancelled."
            ),
        ] = None,
    ) -> dict[str, Any]:
        """List the newest messages sent to you (sender, status, text), newest first."""
        return await tools.my_inbox(status)

    @server.tool()
    async def my_workers() -> dict[str, Any]:
        """List the workers you started (assign or handoff) that still exist, with their live status."""
        return await tools.my_workers()

    @server.tool()
    async def board_get(key: BoardKey) -> dict[str, Any]:
        """Read one fact from your session's shared board: its value, version, writer and time.

        A key that isn't there says exists=false and the version to write it with (0)."""
        return await tools.board_get(key)

    @server.tool()
    async def board_list(
        prefix: Annotated[str, Field(description="Only keys starting with this, e.g. 'build/'.")] = "",
    ) -> dict[str, Any]:
        """List the facts on your session's shared board (current versions), sorted by key."""
        return await tools.board_list(prefix)

    @server.tool()
    async def board_set(
        key: BoardKey,
        value: Annotated[
            Any,
            Field(description="Any JSON value but null (a string, number, list, object), at most 64 KiB."),
        ],
        expected_version: Annotated[
            int,
            Field(description="The version you read (board_get); 0 means the key must not exist yet.", ge=0),
        ],
    ) -> dict[str, Any]:
        """Write a fact to your session's shared board, if it is still at expected_version.

        If someone wrote it since you read it, nothing is written: you get written=false with the
        current version and value; retry with current_version if your change still applies. Writing
        never interrupts anyone: no agent is sent anything, they see it when they read the board."""
        return await tools.board_set(key, value, expected_version)

    @server.tool()
    async def whoami() -> dict[str, Any]:
        """Your terminal id, session, profile, provider, status and supervisor (if any)."""
        return await tools.whoami()

    return server


async def serve(server_url: str, terminal_id: str | None, auth: httpx.Auth | None = None) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=HTTP_TIMEOUT, auth=auth) as http:
        if terminal_id:  # tell cao-server this agent's tools are up: it holds input until then
            try:
                await http.post(f"/terminals/{terminal_id}/mcp-ready")
            except httpx.HTTPError as exc:
                logger.warning("could not report in to cao-server: %s", exc)
        await build_server(AgentTools(http, terminal_id)).run_stdio_async()


EPILOG = """\b
Example (an agent CLI's MCP configuration; cao's providers write it for you):
  {"mcpServers": {"cao": {"command": "cao-mcp-server",
                          "env": {"CAO_TERMINAL_ID": "1a2b3c4d",
                                  "CAO_SERVER_URL": "http://127.0.0.1:9889",
                                  "CAO_HOME": "/home/me/.cao"}}}}

\b
Try it by hand:
  CAO_TERMINAL_ID=1a2b3c4d cao-mcp-server     # then speak MCP (JSON-RPC) on stdin
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option(
    "--terminal-id",
    envvar="CAO_TERMINAL_ID",
    default=None,
    help="The terminal whose agent this server speaks for (default: $CAO_TERMINAL_ID).",
)
@click.option(
    "--server-url", default=None, help="cao-server URL (default: $CAO_SERVER_URL or http://127.0.0.1:9889)."
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
    help="Log level (logs go to stderr; stdout carries the protocol).",
)
@click.version_option(cao.__version__, "--version", prog_name="cao-mcp-server")
def main(terminal_id: str | None, server_url: str | None, log_level: str) -> None:
    """MCP server (stdio) with the tools agents use to work together.

    Tools: send_message, check_inbox, read_message, ack, defer_message, drop_message,
    prioritize_message, report_result, schedule_wakeup, cancel_wakeup, my_wakeups, assign, handoff,
    worker_diff, merge_worker, my_inbox, my_workers, whoami, board_get, board_list, board_set.
    Each agent CLI started by cao runs one; it acts as that agent (CAO_TERMINAL_ID) against
    cao-server (CAO_SERVER_URL), sending the server's API token if it has one (CAO_API_TOKEN,
    else $CAO_HOME/api-token).
    """
    logging.basicConfig(
        stream=sys.stderr, level=log_level.upper(), format="%(levelname)s %(name)s %(message)s"
    )
    try:
        settings = Settings.from_env()
    except CaoError as exc:
        raise click.ClickException(exc.message) from None
    url = server_url or settings.server_url
    anyio.run(serve, url.rstrip("/"), terminal_id, apitoken.BearerAuth(settings))


if __name__ == "__main__":
    main()
