"""One exception tree for cao.

    CaoError                     base; ``status_code`` is the HTTP code the API answers with
    ├── InvalidInput             400/422: a value the caller sent is wrong (names the field and the fix)
    ├── NotFound                 404: terminal, session or message unknown
    │   ├── ReceiverGone         404: the receiver was deleted
    │   └── FactMissing          404: no such fact on a session's board (current_version: where
    │                            a write goes on from: 0, or the version that deleted it)
    ├── Forbidden                403: the caller may not do this (a hook report without its terminal's key)
    ├── Conflict                 409: idempotency key reused with another intent, bad state change
    │   ├── VersionConflict      409: a board write's expected_version is not the fact's current
    │   │                        one (nothing written; current_version, current_value go along)
    │   └── BoardFull            409: a session's board holds as many keys as it may (delete some)
    ├── PayloadTooLarge          413: message body over the limit (nothing stored)
    ├── StoreBusy                503: the database stayed locked past the busy timeout (nothing written)
    │   ├── StoreUnreachable     503: the PostgreSQL server did not answer (nothing written, retry)
    │   │   └── (CommitUnknown   503: it went away mid-COMMIT: the write may have been kept; retry
    │   │                        with the same idempotency key; cao/store/backend.py)
    │   └── StoreUnwritable      503: the database file could not be written (an I/O error; retry)
    ├── SchemaTooNew             the database was written by a newer cao
    ├── TmuxError                tmux failed or is missing
    │   ├── PaneGone             the terminal's pane no longer exists
    │   │   └── PaneMismatch     a pane answers at that id, but it is not the terminal's (another
    │   │                        tmux server reused the id, or the program exited: pane_dead)
    │   ├── FenceLost            the paste was refused: another deliverer took over the claim
    │   ├── PaneInMode           409: a person has the pane in a tmux mode (copy mode: scrolling):
    │   │                        nothing is typed into it until they leave the mode
    │   └── TmuxServerDown       no tmux server answers on the socket
    ├── NotReady                 409: input held for an agent that never became ready (nothing typed)
    │   └── BoxOccupied          409: the agent's input box holds someone's text (nothing typed)
    ├── ForeignTerminal          409: the terminal's pane is on another host (only that host touches it)
    ├── HostUnreachable          503: another host's API did not answer (its terminals: held, not failed)
    ├── StoreGone                503: cao.db was deleted or replaced under the running server
    ├── DiskFull                 507: the disk is full (nothing was written)
    ├── Unwritable               503: a file can't be written (read-only mount, permissions; nothing written)
    ├── ProviderError            unknown provider or a provider could not start
    └── ServerUnavailable        the CLI could not reach cao-server

Every message says what is wrong and what to do about it.
"""

from __future__ import annotations


class CaoError(Exception):
    status_code = 500

    def __init__(self, message: str) -> None:
        # a file name read byte for byte (cao/worktrees/git.py) may carry non-UTF-8 bytes as
        # surrogates: an answer must be valid UTF-8
        message = message.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        super().__init__(message)
        self.message = message


class InvalidInput(CaoError):
    status_code = 422


class NotFound(CaoError):
    status_code = 404


class ReceiverGone(NotFound):
    pass


class Forbidden(CaoError):
    status_code = 403


class Conflict(CaoError):
    """``fields`` (the current version, the first receipt's id, …) go into the error body."""

    status_code = 409

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        if fields:
            self.fields = fields


class ReceiverBusy(Conflict):
    """``if_busy=refuse`` and the receiver is not ready: nothing was stored (its status goes along)."""

    def __init__(self, message: str, *, status: str) -> None:
        super().__init__(message)
        self.fields = {"receiver_status": status}


class FactMissing(NotFound):
    """No such fact on a session's board: never written, or deleted (``current_version`` is where a
    write goes on from: 0, or the version of the deletion)."""

    def __init__(self, message: str, *, current_version: int) -> None:
        super().__init__(message)
        self.fields = {"current_version": current_version}


class VersionConflict(Conflict):
    """A board write whose ``expected_version`` is not the fact's current one: nothing was written.
    The current version, value, writer and time go along, so the writer can look and retry."""

    def __init__(self, message: str, *, current: dict[str, object]) -> None:
        super().__init__(message)
        self.fields = {f"current_{k}": v for k, v in current.items()}


class BoardFull(Conflict):
    """A write would put one key too many on a session's board: nothing was written."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.fields = {"limit": limit}


class PayloadTooLarge(CaoError):
    status_code = 413


class StoreBusy(CaoError):
    status_code = 503


class HostFenced(CaoError):
    """This cao-server lost its host name (another process took it, or an operator failed it):
    it writes nothing more for that host and stops."""

    status_code = 503


class StoreUnreachable(StoreBusy):
    """The database server (PostgreSQL) could not be reached or dropped the connection: nothing was
    written; the same request may be retried once it is back."""


class StoreUnwritable(StoreBusy):
    """The database file could not be written (a disk I/O error, an immutable file): nothing was
    written; the same request may be retried once the cause is fixed."""


class SchemaTooNew(CaoError):
    status_code = 500


class TmuxError(CaoError):
    status_code = 502


class PaneGone(TmuxError):
    status_code = 410


class PaneMismatch(PaneGone):
    pass


class FenceLost(TmuxError):
    status_code = 409


class NotReady(CaoError):
    """Typed input waited for an agent that never became ready (nothing was typed)."""

    status_code = 409


class PaneInMode(TmuxError):
    """The pane is in a tmux mode (copy mode from scrolling or the mouse wheel, view mode, a
    chooser): tmux sends no bracketed-paste markers there and keys drive the mode, so nothing is
    typed. ``typed``: the text went in before the mode began and only its Enter was held back."""

    status_code = 409

    def __init__(self, message: str, *, mode: str = "", typed: bool = False) -> None:
        super().__init__(message)
        self.mode = mode
        self.typed = typed


class TmuxServerDown(TmuxError):
    status_code = 503


class BoxOccupied(NotReady):
    """Typed input found someone's text in the agent's input box (nothing was typed)."""


class ForeignTerminal(CaoError):
    """The terminal's pane runs on another host's tmux: this host never reads, types into or kills
    it (the API forwards such requests to that host, cao/hosts.py)."""

    status_code = 409

    def __init__(self, message: str, *, host: str) -> None:
        super().__init__(message)
        self.host = host


class HostUnreachable(CaoError):
    """Another host's API did not answer a forwarded request (nothing was done there that cao
    knows of; retry once it is back)."""

    status_code = 503


class StoreGone(CaoError):
    """cao.db is no longer the file this server opened (deleted, or replaced by another copy):
    nothing is written and nothing delivered until cao-server is restarted on the right file."""

    status_code = 503


class DiskFull(CaoError):
    """The disk (or the database's filesystem) is full: nothing was written; retry once there is room."""

    status_code = 507


class Unwritable(CaoError):
    """A file cao-server writes (under CAO_HOME, a worker's folder) can't be written: a read-only
    mount, its permissions. Nothing was written; retry once it is writable again."""

    status_code = 503


class ProviderError(CaoError):
    status_code = 422


class ServerUnavailable(CaoError):
    status_code = 503
