"""Inbox rows: the send (one short transaction), reads, and the delivery lifecycle (claim, fence,
acknowledge, release, recovery's take-over)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from cao.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReceiverGone,
)
from cao.states import FailureKind, MessageStatus, TerminalState
from cao.store.base import Database, _row, body_digest
from cao.store.schema import MAX_BODY_BYTES, MESSAGE_STATUSES, Claim, Message, Terminal


class MessageRows(Database):
    # -- messages: send --------------------------------------------------------------------------
    def add_message(
        self,
        *,
        sender_id: str,
        receiver_id: str,
        body: str,
        idempotency_key: str | None = None,
        before_commit: Callable[[], None] | None = None,
        waiting_reason: str | None = None,
    ) -> tuple[Message, bool]:
        """Commit one message. Returns ``(message, duplicate)``.

        Checks the receiver inside the same transaction, so a send can't race a delete.
        """
        if not body:
            raise InvalidInput("message is empty; send some text")
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"message body is {size} bytes, over the {MAX_BODY_BYTES}-byte (256 KiB) limit; nothing was "
                "stored; split it into several messages or send a file path instead"
            )
        digest = body_digest(receiver_id, body)
        now = self.clock()
        nonce = secrets.token_hex(6)
        with self._write() as conn:
            if idempotency_key is not None:
                prior = conn.execute(
                    "SELECT * FROM message WHERE sender_id = ? AND idempotency_key = ?",
                    (sender_id, idempotency_key),
                ).fetchone()
                if prior is not None:
                    if prior["body_sha256"] != digest or prior["receiver_id"] != receiver_id:
                        raise Conflict(
                            f"idempotency key {idempotency_key!r} was already used by {sender_id} for a "
                            f"different message (#{prior['id']}); use a new key for a new message"
                        )
                    return _row(Message, prior), True
            recv = conn.execute("SELECT state FROM terminal WHERE id = ?", (receiver_id,)).fetchone()
            if recv is None:
                raise NotFound(f"receiver terminal {receiver_id} not found; list terminals with `cao status`")
            if recv[0] in (TerminalState.DELETING, TerminalState.DELETED):
                raise ReceiverGone(
                    f"receiver terminal {receiver_id} was deleted; send to a live terminal (`cao status`)"
                )
            if recv[0] == TerminalState.GONE:
                raise ReceiverGone(
                    f"receiver terminal {receiver_id} is gone (its agent exited or its pane was closed); "
                    f"nothing was stored; delete it with `cao shutdown {receiver_id}` and send to a live one"
                )
            cur = conn.execute(
                "INSERT INTO message (sender_id, receiver_id, body, body_sha256, idempotency_key, status, "
                "created_at, attempts, nonce, waiting_reason) VALUES (?, ?, ?, ?, ?, 'pending', ?, 0, ?, ?)",
                (sender_id, receiver_id, body, digest, idempotency_key, now, nonce, waiting_reason),
            )
            msg_id = cur.lastrowid
            if before_commit is not None:
                before_commit()
        return (
            Message(
                id=msg_id,
                sender_id=sender_id,
                receiver_id=receiver_id,
                body=body,
                body_sha256=digest,
                idempotency_key=idempotency_key,
                created_at=now,
                nonce=nonce,
                waiting_reason=waiting_reason,
            ),
            False,
        )

    # -- messages: read --------------------------------------------------------------------------
    def get_message(self, message_id: int) -> Message:
        with self._read() as conn:
            row = conn.execute("SELECT * FROM message WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
        return _row(Message, row)

    def list_messages(
        self,
        *,
        receiver_id: str | None = None,
        status: str | None = None,
        limit: int = 100,
        order: Literal["asc", "desc"] = "desc",
    ) -> list[Message]:
        sql = "SELECT * FROM message WHERE 1=1"
        args: list[Any] = []
        if receiver_id is not None:
            sql += " AND receiver_id = ?"
            args.append(receiver_id)
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        sql += f" ORDER BY id {'ASC' if order == 'asc' else 'DESC'} LIMIT ?"
        args.append(limit)
        with self._read() as conn:
            rows = conn.execute(sql, tuple(args)).fetchall()
        return [_row(Message, r) for r in rows]

    def has_pending(self, receiver_id: str) -> bool:
        return self.newest_pending(receiver_id) is not None

    def newest_pending(self, receiver_id: str) -> int | None:
        """The id of the newest pending message of ``receiver_id`` (None: nothing pending)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT max(id) FROM message WHERE receiver_id = ? AND status = 'pending'", (receiver_id,)
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def oldest_pending(self, receiver_id: str) -> Message | None:
        with self._read() as conn:
            row = conn.execute(
                "SELECT * FROM message WHERE receiver_id = ? AND status = 'pending' ORDER BY id LIMIT 1",
                (receiver_id,),
            ).fetchone()
        return None if row is None else _row(Message, row)

    def receivers_with_pending(self, *, older_than: float | None = None) -> list[str]:
        """Receivers with pending messages (created before ``older_than`` if given)."""
        sql = "SELECT DISTINCT receiver_id FROM message WHERE status = 'pending'"
        args: tuple[Any, ...] = ()
        if older_than is not None:
            sql += " AND created_at <= ?"
            args = (older_than,)
        with self._read() as conn:
            return [r[0] for r in conn.execute(sql, args).fetchall()]

    def pending_counts(self, receiver_ids: Sequence[str]) -> dict[str, int]:
        """How many pending messages each of ``receiver_ids`` has (receivers with none are left out)."""
        if not receiver_ids:
            return {}
        marks = ",".join("?" * len(receiver_ids))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT receiver_id, COUNT(*) FROM message WHERE status = 'pending' "
                f"AND receiver_id IN ({marks}) GROUP BY receiver_id",
                tuple(receiver_ids),
            ).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def counts_by_status(self) -> dict[str, int]:
        with self._read() as conn:
            rows = conn.execute("SELECT status, COUNT(*) FROM message GROUP BY status").fetchall()
        return {status: 0 for status in MESSAGE_STATUSES} | {r[0]: int(r[1]) for r in rows}

    # -- messages: the delivery lifecycle -------------------------------------------------------
    def claim(self, receiver_id: str, *, limit: int = 20, max_bytes: int = MAX_BODY_BYTES) -> Claim | None:
        """Atomically move the oldest pending messages of one receiver to ``delivering``.

        Wins only if no other claim on this receiver is outstanding; None when it lost or there was
        nothing to claim. If the oldest pending rows are marked ``recheck`` (an earlier paste of
        theirs may have arrived), exactly that batch is claimed again, nothing newer joins it. Else
        the batch stops before ``max_bytes`` of bodies (the first message is always taken). Each
        claim takes the receiver's next pane fence.
        """
        token = uuid.uuid4().hex
        now = self.clock()
        with self._write() as conn:
            busy = conn.execute(
                "SELECT 1 FROM message WHERE receiver_id = ? AND status = 'delivering' LIMIT 1",
                (receiver_id,),
            ).fetchone()
            if busy is not None:
                return None
            first = conn.execute(
                "SELECT id, recheck FROM message WHERE receiver_id = ? AND status = 'pending' "
                "ORDER BY id LIMIT 1",
                (receiver_id,),
            ).fetchone()
            if first is None:
                return None
            recheck = first["recheck"]
            if recheck is not None:
                rows = conn.execute(
                    "SELECT id FROM message WHERE receiver_id = ? AND status = 'pending' AND recheck = ? "
                    "ORDER BY id",
                    (receiver_id, recheck),
                ).fetchall()
                ids = [int(r[0]) for r in rows]
            else:
                rows = conn.execute(
                    "SELECT id, length(CAST(body AS BLOB)) FROM message WHERE receiver_id = ? "
                    "AND status = 'pending' AND recheck IS NULL ORDER BY id LIMIT ?",
                    (receiver_id, limit),
                ).fetchall()
                ids = []
                total = 0
                for msg_id, size in rows:
                    if ids and total + int(size) > max_bytes:
                        break
                    ids.append(int(msg_id))
                    total += int(size)
            fence_row = conn.execute(
                "UPDATE terminal SET fence = fence + 1 WHERE id = ? RETURNING fence", (receiver_id,)
            ).fetchone()
            marks = ",".join("?" * len(ids))
            conn.execute(
                f"UPDATE message SET status = 'delivering', claim = ?, claimed_at = ? "
                f"WHERE status = 'pending' AND id IN ({marks})",
                (token, now, *ids),
            )
            got = conn.execute(
                "SELECT * FROM message WHERE claim = ? AND status = 'delivering' ORDER BY id", (token,)
            ).fetchall()
        fence = int(fence_row[0]) if fence_row is not None else 0
        return Claim(token, fence, [_row(Message, r) for r in got], recheck is not None)

    def unclaim(self, token: str) -> int:
        """Give a claim back untouched (the gate closed again before the paste): pending, no attempt
        counted, its recheck mark and last error kept."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET status = 'pending', claim = NULL, claimed_at = NULL "
                "WHERE claim = ? AND status = 'delivering'",
                (token,),
            )
            return int(cur.rowcount)

    def delivery_view(self, receiver_id: str) -> tuple[Terminal, bool, int | None]:
        """The receiver's row and whether some claim on it is outstanding, in one read: a deliverer
        that sees no claim outstanding and later wins the claim with fence + 1 knows nobody else
        pasted into that pane in between (its screen read is still current)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT t.*, EXISTS(SELECT 1 FROM message m WHERE m.receiver_id = t.id "
                "AND m.status = 'delivering') AS outstanding, (SELECT max(id) FROM message m "
                "WHERE m.receiver_id = t.id AND m.status = 'pending') AS newest "
                "FROM terminal t WHERE t.id = ?",
                (receiver_id,),
            ).fetchone()
        if row is None:
            raise NotFound(f"terminal {receiver_id} not found; list terminals with `cao status`")
        extra = ("outstanding", "newest")
        fields = {k: row[k] for k in row.keys() if k not in extra}  # noqa: SIM118 (sqlite3.Row)
        newest = None if row["newest"] is None else int(row["newest"])
        return _row(Terminal, fields), bool(row["outstanding"]), newest

    def renew(self, token: str) -> bool:
        """Extend a claim's lease; False means the claim was lost (recovered by someone else)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET claimed_at = ? WHERE claim = ? AND status = 'delivering'",
                (self.clock(), token),
            )
            return cur.rowcount > 0

    def take_over(self, token: str) -> tuple[str, int] | None:
        """Recovery: own a stale claim under a new token and take the receiver's next pane fence.

        Returns ``(new token, fence)``, or None if the claim was resolved meanwhile.
        """
        new = uuid.uuid4().hex
        with self._write() as conn:
            row = conn.execute(
                "SELECT receiver_id FROM message WHERE claim = ? AND status = 'delivering' LIMIT 1", (token,)
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE message SET claim = ?, claimed_at = ? WHERE claim = ? AND status = 'delivering'",
                (new, self.clock(), token),
            )
            fence = conn.execute(
                "UPDATE terminal SET fence = fence + 1 WHERE id = ? RETURNING fence", (row[0],)
            ).fetchone()
        return new, int(fence[0]) if fence is not None else 0

    def mark_delivered(self, token: str, ids: Sequence[int] | None = None) -> int:
        """Acknowledge a paste. Conditional on the claim: returns how many rows this claim still
        owned (0 = ownership was lost; the caller must not report them delivered)."""
        now = self.clock()
        sql = (
            "UPDATE message SET status = 'delivered', delivered_at = ?, attempts = attempts + 1, "
            "last_error = NULL, waiting_reason = NULL, recheck = NULL "
            "WHERE claim = ? AND status = 'delivering'"
        )
        args: list[Any] = [now, token]
        if ids is not None:
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            args.extend(ids)
        with self._write() as conn:
            return int(conn.execute(sql, tuple(args)).rowcount)

    def release(
        self,
        token: str,
        error: str,
        *,
        max_attempts: int,
        count_attempt: bool = True,
        recheck: bool = False,
    ) -> dict[str, int]:
        """Return a claim to ``pending`` (attempts+1), or ``failed`` past the retry limit.

        ``recheck``: the paste may have arrived (unconfirmed submit, recovered crash), so the next
        attempt re-claims exactly these rows and looks before it pastes.
        """
        inc = 1 if count_attempt else 0
        with self._write() as conn:
            failed = conn.execute(
                "UPDATE message SET status = 'failed', attempts = attempts + ?, last_error = ?, "
                "failure = ?, claim = NULL, waiting_reason = NULL "
                "WHERE claim = ? AND status = 'delivering' AND attempts + ? >= ?",
                (inc, error, FailureKind.RETRIES_EXHAUSTED, token, inc, max_attempts),
            ).rowcount
            pending = conn.execute(
                "UPDATE message SET status = 'pending', attempts = attempts + ?, last_error = ?, "
                "claim = NULL, claimed_at = NULL, recheck = CASE WHEN ? THEN ? ELSE recheck END "
                "WHERE claim = ? AND status = 'delivering'",
                (inc, error, recheck, token, token),
            ).rowcount
        return {"failed": int(failed), "pending": int(pending)}

    def note_waiting(self, receiver_id: str, reason: str | None) -> int:
        """Store why a receiver's pending messages wait (shown by `cao inbox`, kept across restarts)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET waiting_reason = ? WHERE receiver_id = ? AND status = 'pending' "
                "AND waiting_reason IS NOT ?",
                (reason, receiver_id, reason),
            )
            return int(cur.rowcount)

    def stale_claims(self, *, older_than: float | None = None) -> list[tuple[str, list[Message]]]:
        """Outstanding claims (``delivering`` rows), grouped by claim, oldest first."""
        sql = "SELECT * FROM message WHERE status = 'delivering'"
        args: tuple[Any, ...] = ()
        if older_than is not None:
            sql += " AND claimed_at <= ?"
            args = (older_than,)
        sql += " ORDER BY id"
        with self._read() as conn:
            rows = conn.execute(sql, args).fetchall()
        groups: dict[str, list[Message]] = {}
        for r in rows:
            groups.setdefault(str(r["claim"]), []).append(_row(Message, r))
        return list(groups.items())

    def cancel(self, message_id: int) -> Message:
        with self._write() as conn:
            row = conn.execute("SELECT status FROM message WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
            if row[0] != MessageStatus.PENDING:
                raise Conflict(f"message {message_id} is {row[0]}; only a pending message can be cancelled")
            conn.execute(
                "UPDATE message SET status = 'cancelled', last_error = 'cancelled by operator', "
                "waiting_reason = NULL WHERE id = ?",
                (message_id,),
            )
        return self.get_message(message_id)
