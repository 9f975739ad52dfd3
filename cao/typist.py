"""Typing into agents: the one paste-and-submit path (``submit``), typed input (``POST
/terminals/{id}/input``, handoff), named keys and the exit command.

Everything here runs under the terminal's lock (cao/panes.py), so a status read and the paste
that depends on it never straddle another paste; inbox delivery (cao/delivery.py) submits through
:meth:`Typist.submit` too. Text is neutralised first (cao/paste.py): no escape sequence, paste
marker or control key survives. Nothing is ever typed over a person: not while their text sits in
the input box, not while they have the pane in a tmux mode (see cao/tmux/).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from cao.clock import SYSTEM, Clock
from cao.errors import (
    BoxOccupied,
    DiskFull,
    InvalidInput,
    NotReady,
    PaneGone,
    PaneInMode,
    PayloadTooLarge,
    StoreBusy,
    TmuxServerDown,
)
from cao.panes import Panes
from cao.paste import is_blank, neutralise
from cao.settings import Settings
from cao.states import READY, Status
from cao.status import StatusReader
from cao.store import MAX_BODY_BYTES, Store, Terminal
from cao.tmux import in_mode_error
from providers.base import Provider

logger = logging.getLogger(__name__)

# statuses whose screen shows an input box (the contract test checks every provider's): none seen
# there, or a screen matching nothing, means the box can't be proven empty
UNBOXED = (*READY, Status.UNKNOWN)


class Typist:
    def __init__(
        self, settings: Settings, store: Store, panes: Panes, status: StatusReader, *, clock: Clock = SYSTEM
    ) -> None:
        self.settings = settings
        self.store = store
        self.panes = panes
        self.status = status
        self.clock = clock

    # -- typed input -------------------------------------------------------------------------------
    def send_input(self, terminal: Terminal, text: str, *, ready_timeout: float | None = None) -> bool:
        """Type ``text`` into the agent (neutralised, bracketed paste + Enter), whatever its status
        once it is ready: input to an agent that is still starting is held until it first shows
        its prompt (and its cao MCP tools are up), at most ``ready_timeout`` seconds, else
        :class:`NotReady` and nothing is typed. Serialised with inbox delivery to the same agent.

        Never typed over a person: while the input box holds someone's text (or can't be found
        where it should be), or a person has the pane in a tmux mode (scrolling), it waits up to
        ``input_wait_timeout`` seconds, then :class:`BoxOccupied` / :class:`PaneInMode` (409) with
        nothing typed.

        Returns whether the submit was confirmed on screen (see :meth:`submit`).
        """
        if not text or is_blank(text):
            raise InvalidInput("message is empty (only whitespace or invisible characters); send some text")
        if (size := len(text.encode("utf-8", "surrogatepass"))) > MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"input is {size} bytes, over the {MAX_BODY_BYTES}-byte (256 KiB) limit of what cao types "
                "(the inbox's); nothing was typed; send it in parts, or point the agent at a file"
            )
        self.wait_ready(
            terminal, self.settings.input_ready_timeout if ready_timeout is None else ready_timeout
        )
        deadline = self.clock.monotonic() + self.settings.input_wait_timeout
        delay = 0.02
        while True:
            with self.panes.lock(terminal.id):
                screen, mode = self.panes.look(terminal)
                box = self.panes.provider(terminal).input_text(screen)
                # no box on a screen that should show one (ready, or matching nothing): a person's
                # text may run past it (a wrapped line), so it can't be proven empty
                hidden = box is None and self.status.read(terminal, screen).status.value in UNBOXED
                if not mode and not (box or "").strip() and not hidden:
                    left = max(0.5, deadline - self.clock.monotonic())
                    confirmed = self._typed(terminal, text, screen, left)
                    break
            if self.clock.monotonic() > deadline:
                raise self._refusal(terminal, mode, hidden)
            self.clock.sleep(delay)
            delay = min(delay * 2, 0.25)
        with contextlib.suppress(StoreBusy, DiskFull):  # typed already: a note must not undo that
            self.store.update_terminal(terminal.id, last_active=self.clock.now())
        return confirmed

    def _typed(self, terminal: Terminal, text: str, screen: str, mode_wait: float) -> bool:
        try:
            return self.submit(terminal, neutralise(text), before=screen, mode_wait=mode_wait)
        except PaneInMode as exc:
            if exc.typed:  # in the box, its Enter held back by a mode that didn't end
                raise PaneInMode(
                    f"{exc.message}; the text is in terminal {terminal.id}'s input box, not submitted "
                    "(press Enter there, or clear it)",
                    mode=exc.mode,
                    typed=True,
                ) from None
            raise

    @staticmethod
    def _refusal(terminal: Terminal, mode: str, hidden: bool) -> Exception:
        if mode:
            return in_mode_error(mode)
        look = f"`tmux attach -t {terminal.session_name}`"
        if hidden:
            return BoxOccupied(
                f"terminal {terminal.id}'s input box isn't where its provider looks (its screen matches "
                "nothing it knows, or someone's text runs past the box), so it can't be proven empty; "
                f"nothing was typed. Look at it with {look}, then retry"
            )
        return BoxOccupied(
            f"terminal {terminal.id}'s input box holds someone's text; nothing was typed (typing would "
            f"append to it and submit both as one turn). Clear the box or let them submit it ({look}), "
            "then retry"
        )

    def send_key(self, terminal: Terminal, key: str) -> None:
        """Press one named key (Escape, C-c, Enter, Up…) in the agent, serialised with delivery."""
        with self.panes.lock(terminal.id):
            self.panes.keys(terminal, key)

    def exit(self, terminal: Terminal) -> bool:
        """Type the provider's exit command; a pane that closes (or dies) once it is typed has
        exited (confirmed). A terminal that is gone already raises :class:`PaneGone` (410):
        nothing was there to exit."""
        return self.send_input(terminal, self.panes.provider(terminal).exit_command)

    def wait_ready(self, terminal: Terminal, timeout: float) -> None:
        """Until the agent has shown its prompt once (``ready_at``) and its MCP tools are up."""
        if terminal.ready_at is not None and self.status.mcp_ready(terminal):
            return  # ready before: no screen read here (the paste checks the pane anyway)
        deadline = self.clock.monotonic() + timeout
        delay = 0.01
        while True:
            status = self.status.status(terminal)
            if status == Status.GONE:
                raise PaneGone(
                    f"terminal {terminal.id} is gone ({terminal.gone_reason or 'its pane closed'}); "
                    "nothing was typed"
                )
            if terminal.ready_at is not None and self.status.mcp_ready(terminal):
                return
            if self.clock.monotonic() > deadline:
                raise NotReady(
                    f"terminal {terminal.id} did not become ready within {timeout:g} s (status {status}: "
                    "still starting, or a start-up dialog waits for an answer); nothing was typed. "
                    f"Look at it with `tmux attach -t {terminal.session_name}`, then retry"
                )
            self.clock.sleep(delay)
            delay = min(delay * 2, 0.1)
            terminal = self.store.get_terminal(terminal.id, include_deleted=True)

    # -- the one paste path ------------------------------------------------------------------------
    def submit(
        self,
        terminal: Terminal,
        text: str | None,
        *,
        before: str | None = None,
        after_paste: Callable[[], None] | None = None,
        fence: int | None = None,
        renew: Callable[[], None] | None = None,
        evidence: Callable[[], bool] | None = None,
        mode_wait: float = 0.0,
    ) -> bool:
        """Paste ``text``, press Enter, and confirm the agent took it (the one paste path; the
        caller holds the terminal's lock and has neutralised ``text``).

        ``before`` is the screen before the paste (captured when not given). The provider judges
        fresh screens (``submit_confirmed``); if the text still sits in the input box halfway
        through its ``submit_timeout``, Enter is pressed once more. ``fence``: the paste and that
        Enter happen only while the claim with this fence owns the pane (see cao/tmux/).
        ``renew`` is called while waiting (a delivery renews its lease). ``text=None``: the text
        is already in the box (cao's own, proven by its header): only press Enter. ``evidence``:
        a check that proves the submit without the screen (the CLI's hook reported a prompt with
        the message's own header). Returns whether confirmed.

        A tmux mode that begins between a paste and its delayed Enter holds the Enter back: with
        ``mode_wait`` the Enter is pressed once the mode ends (within that many seconds, else
        :class:`PaneInMode` with ``typed`` set: the text sits in the box, unsubmitted); without,
        the submit goes unconfirmed (a delivery's retry looks for its own text in the box).
        """
        prov = self.panes.provider(terminal)
        if before is None:
            before = self.panes.screen(terminal)
        if text is None:
            self.panes.keys(terminal, "Enter", fence=fence)
        else:
            try:
                self.panes.paste(terminal, text, fence=fence)
            except PaneInMode as exc:
                if not exc.typed:
                    raise  # nothing reached the pane
                # the text is in, its delayed Enter held back by the mode
                if mode_wait > 0 and not self._enter_after_mode(terminal, fence, mode_wait):
                    raise
        if after_paste is not None:
            after_paste()
        try:
            return self._confirm(terminal, prov, before, fence, renew, evidence)
        except (PaneGone, TmuxServerDown):
            # The agent took the input and its pane went away (an exit command, a crash) while we
            # looked: the input did reach it. (Its undelivered mail was failed by lose().)
            return True

    def _enter_after_mode(self, terminal: Terminal, fence: int | None, wait: float) -> bool:
        """Press the held-back Enter once the person leaves the mode (within ``wait`` seconds)."""
        deadline = self.clock.monotonic() + wait
        while self.clock.monotonic() < deadline:
            self.clock.sleep(0.1)
            if self.panes.look(terminal)[1]:
                continue
            try:
                self.panes.keys(terminal, "Enter", fence=fence)
            except PaneInMode:
                continue  # back in a mode already
            return True
        return False

    def _confirm(
        self,
        terminal: Terminal,
        prov: Provider,
        before: str,
        fence: int | None,
        renew: Callable[[], None] | None,
        evidence: Callable[[], bool] | None = None,
    ) -> bool:
        deadline = self.clock.monotonic() + prov.submit_timeout
        retried = False
        delay = 0.005
        # A screen the provider can't read (the hooks opened the gate) proves nothing either way:
        # only the evidence (the CLI's hook reporting the message's own header) confirms then.
        readable = prov.can_read(before)
        while True:
            self.clock.sleep(delay)
            delay = min(delay * 2, 0.05)
            screen = self.panes.screen(terminal)
            verdict = prov.submit_confirmed(before, screen) if readable else None
            if verdict is True or (evidence is not None and evidence()):
                return True
            if renew is not None:
                renew()
            now = self.clock.monotonic()
            if verdict is False and not retried and now > deadline - prov.submit_timeout / 2:
                logger.info("submit not seen; pressing Enter again", extra={"terminal_id": terminal.id})
                try:
                    self.panes.keys(terminal, "Enter", fence=fence)
                except PaneInMode:
                    return False  # a person scrolls: the text waits in the box (its header proves it)
                retried = True
            if now > deadline:
                return False
