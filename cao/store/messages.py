"""Inbox rows: the send (one short transaction), reads, and the delivery lifecycle (claim, fence,
acknowledge, release, recovery's take-over)."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

from cao.attention import Attention, priority_name
from cao.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    ReceiverGone,
)
from cao.names import TERMINAL_ID_RE
from cao.states import (
    PRIORITY_RANK,
    Channel,
    Event,
    FailureKind,
    IfBusy,
    Kind,
    MessageStatus,
    TerminalState,
    WorkState,
)
from cao.store.backend import ERRORS
from cao.store.base import Database, _row, body_digest, open_task_window
from cao.store.schema import MAX_BODY_BYTES, MESSAGE_STATUSES, Claim, Message, MessageEvent, Terminal
from cao.timefmt import iso

# a pending row that may be handed out now: not deferred, deadline not passed (args: now, now)
CLAIMABLE = "(not_before IS NULL OR not_before <= ?) AND (expires_at IS NULL OR expires_at > ?)"
EXPIRED_REASON = "its deadline passed while it waited"


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
        attention: Attention | None = None,
    ) -> tuple[Message, bool]:
        """Commit one message. Returns ``(message, duplicate)``.

        Checks the receiver inside the same transaction, so a send can't race a delete. A
        ``notice`` with a topic supersedes the same sender's pending notices on that topic, in the
        same transaction.
        """
        if not body:
            raise InvalidInput("message is empty; send some text")
        # a NUL can reach no terminal (the paste shows it as ␀) and no PostgreSQL text column: it
        # is stored as the picture the paste would show, on both backends (the API refuses it)
        body = body.replace("\x00", "\u2400")
        size = len(body.encode("utf-8", "surrogatepass"))
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge(
                f"message body is {size} bytes, over the {MAX_BODY_BYTES}-byte (256 KiB) limit; nothing was "
                "stored; split it into several messages or send a file path instead"
            )
        digest = body_digest(receiver_id, body)
        now = self.clock()
        nonce = secrets.token_hex(6)
        # keyed by its receiver: on PostgreSQL sends to different receivers commit side by side.
        # Two sends racing with one sender's idempotency key to *different* receivers meet at the
        # unique index instead; the loser runs again alone and finds the winner's row.
        for keys in ((receiver_id,), ()):
            try:
                got = self._add_message_once(
                    keys,
                    sender_id=sender_id,
                    receiver_id=receiver_id,
                    body=body,
                    digest=digest,
                    idempotency_key=idempotency_key,
                    now=now,
                    nonce=nonce,
                    waiting_reason=waiting_reason,
                    attention=attention,
                    before_commit=before_commit,
                )
                break
            except ERRORS.unique:
                if not keys or idempotency_key is None:
                    raise
        if isinstance(got, Message):
            return got, True
        msg_id, fields, told = got
        self._told(told)
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
                **fields,
            ),
            False,
        )

    def _add_message_once(
        self,
        keys: tuple[str, ...],
        *,
        sender_id: str,
        receiver_id: str,
        body: str,
        digest: str,
        idempotency_key: str | None,
        now: float,
        nonce: str,
        waiting_reason: str | None,
        attention: Attention | None,
        before_commit: Callable[[], None] | None,
    ) -> Message | tuple[int, dict[str, Any], list[MessageEvent]]:
        """One try of a send's transaction: the earlier message of the same idempotent send, or the
        new one's id, attention fields and events."""
        with self._write(*keys) as conn:
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
                    return _row(Message, prior)
            out = self._insert_message(
                conn,
                sender_id=sender_id,
                receiver_id=receiver_id,
                body=body,
                digest=digest,
                idempotency_key=idempotency_key,
                now=now,
                nonce=nonce,
                waiting_reason=waiting_reason,
                attention=attention,
            )
            if before_commit is not None:
                before_commit()
        return out

    def _insert_message(
        self,
        conn: Any,
        *,
        sender_id: str,
        receiver_id: str,
        body: str,
        digest: str,
        idempotency_key: str | None,
        now: float,
        nonce: str,
        waiting_reason: str | None,
        attention: Attention | None,
    ) -> tuple[int, dict[str, Any], list[MessageEvent]]:
        """Insert one message inside the caller's transaction (the receiver checked there too);
        returns its id, its attention fields and the timeline events to publish after the commit."""
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
        a = attention
        fields: dict[str, Any] = {
            "priority": a.rank if a else PRIORITY_RANK["normal"],
            "kind": a.kind.value if a else Kind.MESSAGE.value,
            "if_busy": a.if_busy.value if a else "wait",
            "expires_at": a.expires_at if a else None,
            "not_before": a.not_before if a else None,
            "topic": a.topic if a else None,
        }
        cur = conn.execute(
            "INSERT INTO message (sender_id, receiver_id, body, body_sha256, idempotency_key, status, "
            "created_at, attempts, nonce, waiting_reason, priority, kind, if_busy, expires_at, "
            "not_before, topic) VALUES (?, ?, ?, ?, ?, 'pending', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                sender_id,
                receiver_id,
                body,
                digest,
                idempotency_key,
                now,
                nonce,
                waiting_reason,
                *fields.values(),
            ),
        )
        msg_id = int(cur.fetchone()[0])
        label = f"{a.priority.value} {a.kind.value}" if a else None
        self._timeline(conn, Event.QUEUED, receiver_id, [msg_id], reason=label, actor=sender_id)
        told: list[MessageEvent] = []  # the event stream has message.queued for it (cao/core.py)
        if a is not None and a.kind == Kind.NOTICE and a.topic is not None:
            older = [
                int(r[0])
                for r in conn.execute(
                    "UPDATE message SET status = 'superseded', superseded_by = ?, closed_reason = ?, "
                    "waiting_reason = NULL WHERE receiver_id = ? AND sender_id = ? AND kind = 'notice' "
                    "AND topic = ? AND status = 'pending' AND recheck IS NULL AND id < ? RETURNING id",
                    (
                        msg_id,
                        f"a newer notice on {a.topic!r}: #{msg_id}",
                        receiver_id,
                        sender_id,
                        a.topic,
                        msg_id,
                    ),
                ).fetchall()
            ]
            told += self._timeline(
                conn,
                Event.SUPERSEDED,
                receiver_id,
                sorted(older),
                reason=f"by #{msg_id}",
                actor=sender_id,
            )
        return msg_id, fields, told

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

    def last_delivered(self, receiver_id: str) -> Message | None:
        """The message delivered to ``receiver_id`` most recently (served by priority, it need not
        be the newest id)."""
        with self._read() as conn:
            # its timeline says (newest event first, on its index); pruned: the newest id
            row = (
                conn.execute(
                    "SELECT m.* FROM message_event e JOIN message m ON m.id = e.message_id "
                    "WHERE e.receiver_id = ? AND e.event = 'delivered' AND m.status = 'delivered' "
                    "ORDER BY e.id DESC LIMIT 1",
                    (receiver_id,),
                ).fetchone()
                or conn.execute(
                    "SELECT * FROM message WHERE receiver_id = ? AND status = 'delivered' "
                    "ORDER BY id DESC LIMIT 1",
                    (receiver_id,),
                ).fetchone()
            )
        return None if row is None else _row(Message, row)

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
        """The message the next claim starts with: a batch being rechecked (it may have arrived),
        else the first claimable one by priority, then commit order."""
        now = self.clock()
        with self._read() as conn:
            row = (
                conn.execute(
                    "SELECT * FROM message WHERE receiver_id = ? AND status = 'pending' "
                    "AND recheck IS NOT NULL ORDER BY id LIMIT 1",
                    (receiver_id,),
                ).fetchone()
                or conn.execute(
                    f"SELECT * FROM message WHERE receiver_id = ? AND status = 'pending' AND {CLAIMABLE} "
                    "ORDER BY priority, id LIMIT 1",
                    (receiver_id, now, now),
                ).fetchone()
            )
        return None if row is None else _row(Message, row)

    def queue(self, receiver_id: str, *, limit: int = 500) -> list[Message]:
        """A receiver's pending messages in the order they will be served: rechecks first, then the
        claimable ones by priority and commit order, then the deferred ones by when they're due."""
        now = self.clock()
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM message WHERE receiver_id = ? AND status IN ('pending', 'delivering') "
                "ORDER BY status = 'pending', recheck IS NULL, "
                "(not_before IS NOT NULL AND not_before > ?), "
                "CASE WHEN not_before > ? THEN not_before ELSE 0 END, priority, id LIMIT ?",
                (receiver_id, now, now, limit),
            ).fetchall()
        return [_row(Message, r) for r in rows]

    def receivers_with_pending(self, *, older_than: float | None = None) -> list[str]:
        """Receivers with pending messages (created before ``older_than`` if given)."""
        mine, args = self._own_receivers()
        sql = f"SELECT DISTINCT receiver_id FROM message WHERE status = 'pending'{mine}"
        if older_than is not None:
            sql += " AND created_at <= ?"
            args += (older_than,)
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
    def claim(
        self,
        receiver_id: str,
        *,
        limit: int = 20,
        max_bytes: int = MAX_BODY_BYTES,
        handing: Literal["interrupts", "all"] | None = None,
        skip_tasks: bool = False,
    ) -> Claim | None:
        """Atomically move the oldest pending messages of one receiver to ``delivering``.

        Wins only if no other claim on this receiver is outstanding; None when it lost or there was
        nothing to claim. If the oldest pending rows are marked ``recheck`` (an earlier paste of
        theirs may have arrived), exactly that batch is claimed again, nothing newer joins it. Else
        the batch stops before ``max_bytes`` of bodies (the first message is always taken). Each
        claim takes the receiver's next pane fence. ``handing``: for a hand-over into the running
        turn (a hook): nothing while a batch is being rechecked, and with ``"interrupts"`` only the
        messages heading the queue that asked to interrupt (``if_busy=interrupt``). ``skip_tasks``:
        the receiver is over a budget (cao/usage.py): its tasks stay pending, other mail goes.
        """
        token = uuid.uuid4().hex
        now = self.clock()
        with self._write(receiver_id) as conn:  # only this receiver's rows (cao/store/backend.py)
            if not self._holds_receiver(conn, receiver_id):
                return None
            busy = conn.execute(
                "SELECT 1 FROM message WHERE receiver_id = ? AND status = 'delivering' LIMIT 1",
                (receiver_id,),
            ).fetchone()
            if busy is not None:
                return None
            # a deadline passed: expired in the transaction that would otherwise hand it out
            told = self._expire(conn, now, receiver_id)
            won = self._claim_rows(conn, receiver_id, token, now, limit, max_bytes, handing, skip_tasks)
        self._told(told)
        if won is None:
            return None
        fence, got, recheck = won
        return Claim(token, fence, got, recheck)

    @staticmethod
    def _claim_rows(
        conn: Any,
        receiver_id: str,
        token: str,
        now: float,
        limit: int,
        max_bytes: int,
        handing: str | None,
        skip_tasks: bool = False,
    ) -> tuple[int, list[Message], bool] | None:
        kinds = " AND kind != 'task'" if skip_tasks else ""
        first = (
            conn.execute(
                "SELECT id, recheck FROM message WHERE receiver_id = ? AND status = 'pending' "
                "AND recheck IS NOT NULL ORDER BY id LIMIT 1",
                (receiver_id,),
            ).fetchone()
            or conn.execute(
                "SELECT id, recheck FROM message WHERE receiver_id = ? AND status = 'pending' "
                f"AND {CLAIMABLE}{kinds} ORDER BY priority, id LIMIT 1",
                (receiver_id, now, now),
            ).fetchone()
        )
        if first is None or (handing and first["recheck"] is not None):
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
                "SELECT id, length(CAST(body AS BLOB)), if_busy FROM message WHERE receiver_id = ? "
                f"AND status = 'pending' AND recheck IS NULL AND {CLAIMABLE}{kinds} "
                "ORDER BY priority, id LIMIT ?",
                (receiver_id, now, now, limit),
            ).fetchall()
            ids = []
            total = 0
            for msg_id, size, if_busy in rows:
                if handing == "interrupts" and if_busy != IfBusy.INTERRUPT:
                    break  # only the interrupting head of the queue goes into a running turn
                if ids and total + int(size) > max_bytes:
                    break
                ids.append(int(msg_id))
                total += int(size)
            if not ids:
                return None
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
            "SELECT * FROM message WHERE claim = ? AND status = 'delivering' ORDER BY priority, id", (token,)
        ).fetchall()
        fence = int(fence_row[0]) if fence_row is not None else 0
        return fence, [_row(Message, r) for r in got], recheck is not None

    def _expire(self, conn: Any, now: float, receiver_id: str | None = None) -> list[MessageEvent]:
        """Pending messages whose deadline passed become ``expired`` (never a batch being rechecked:
        its earlier paste may have arrived; its claim decides)."""
        sql = (
            "UPDATE message SET status = 'expired', closed_reason = ?, waiting_reason = NULL "
            "WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= ? AND recheck IS NULL"
        )
        args: list[Any] = [EXPIRED_REASON, now]
        if receiver_id is not None:
            sql += " AND receiver_id = ?"
            args.append(receiver_id)
        rows = conn.execute(sql + " RETURNING id, receiver_id", tuple(args)).fetchall()
        told: list[MessageEvent] = []
        for mid, rid in sorted(rows):
            told += self._timeline(conn, Event.EXPIRED, rid, [int(mid)], reason=EXPIRED_REASON, at=now)
        return told

    def expire_due(self) -> list[MessageEvent]:
        """Expire every pending message whose deadline passed (the housekeeping tick)."""
        now = self.clock()
        with self._read() as conn:
            due = conn.execute(
                "SELECT 1 FROM message WHERE status = 'pending' AND expires_at IS NOT NULL "
                "AND expires_at <= ? LIMIT 1",
                (now,),
            ).fetchone()
        if due is None:
            return []  # the common case: no write at all
        with self._write() as conn:
            told = self._expire(conn, now)
        self._told(told)
        return told

    def expire_claimed(self, token: str, ids: Sequence[int]) -> int:
        """A claimed batch being rechecked: the rows not found in the pane whose deadline passed
        become ``expired`` instead of being pasted again (conditional on the claim)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self._write() as conn:
            rows = conn.execute(
                "UPDATE message SET status = 'expired', closed_reason = ?, claim = NULL, "
                "waiting_reason = NULL, recheck = NULL WHERE claim = ? AND status = 'delivering' "
                f"AND id IN ({marks}) "
                "RETURNING id, receiver_id",
                (EXPIRED_REASON, token, *ids),
            ).fetchall()
            told: list[MessageEvent] = []
            for mid, rid in sorted(rows):
                told += self._timeline(conn, Event.EXPIRED, rid, [int(mid)], reason=EXPIRED_REASON)
        self._told(told)
        return len(rows)

    def claimed(self, token: str) -> list[Message]:
        """The rows a claim still owns (``delivering`` under it), in serving order."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM message WHERE claim = ? AND status = 'delivering' ORDER BY priority, id",
                (token,),
            ).fetchall()
        return [_row(Message, r) for r in rows]

    def note_handed(self, token: str, event: str) -> None:
        """A claim's rows were given to the CLI's hook (``event``) to hand to the running turn."""
        with self._write() as conn:
            rows = conn.execute(
                "SELECT id, receiver_id FROM message WHERE claim = ? AND status = 'delivering' ORDER BY id",
                (token,),
            ).fetchall()
            # a claim for a hand-over: found later by its evidence, it was handed, never pasted
            conn.execute(
                "UPDATE message SET channel = 'hook' WHERE claim = ? AND status = 'delivering'", (token,)
            )
            ids = [int(r[0]) for r in rows]
            told = self._timeline(conn, Event.HANDED, rows[0][1], ids, reason=f"{event} hook") if rows else []
        self._told(told)

    def unclaim(self, token: str) -> int:
        """Give a claim back untouched (the gate closed again before the paste): pending, no attempt
        counted, its recheck mark and last error kept."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET status = 'pending', claim = NULL, claimed_at = NULL, channel = NULL "
                "WHERE claim = ? AND status = 'delivering'",
                (token,),
            )
            return int(cur.rowcount)

    def delivery_view(self, receiver_id: str) -> tuple[Terminal, bool, int | None, float | None, bool]:
        """The receiver's row, whether some claim on it is outstanding, the newest message that may
        be handed out now (None: none) and when the next deferred one falls due, in one read: a
        deliverer that sees no claim outstanding and later wins the claim with fence + 1 knows
        nobody else pasted into that pane in between (its screen read is still current); and whether an
        urgent interrupting message waits (only then does a busy look ask what heads the queue)."""
        now = self.clock()
        with self._read() as conn:
            # newest: the newest pending id, if any pending row may be handed out now (not only
            # deferred ones; one past its deadline counts: the claim expires it); each part is
            # one index lookup however long the queue is
            row = conn.execute(
                "SELECT t.*, EXISTS(SELECT 1 FROM message m WHERE m.receiver_id = t.id "
                "AND m.status = 'delivering') AS outstanding, CASE WHEN EXISTS(SELECT 1 FROM message m "
                "WHERE m.receiver_id = t.id AND m.status = 'pending' AND (m.not_before IS NULL "
                "OR m.not_before <= ? OR m.recheck IS NOT NULL)) THEN (SELECT max(id) FROM message m "
                "WHERE m.receiver_id = t.id AND m.status = 'pending') END AS newest, "
                "(SELECT min(not_before) FROM message m WHERE m.receiver_id = t.id "
                "AND m.status = 'pending' AND m.not_before > ?) AS due, EXISTS(SELECT 1 FROM message m "
                "WHERE m.receiver_id = t.id AND m.status = 'pending' AND m.if_busy = 'interrupt') "
                "AS interrupting FROM terminal t WHERE t.id = ?",
                (now, now, receiver_id),
            ).fetchone()
        if row is None:
            raise NotFound(f"terminal {receiver_id} not found; list terminals with `cao status`")
        extra = ("outstanding", "newest", "due", "interrupting")
        fields = {k: row[k] for k in row.keys() if k not in extra}  # noqa: SIM118 (sqlite3.Row)
        newest = None if row["newest"] is None else int(row["newest"])
        due = None if row["due"] is None else float(row["due"])
        return _row(Terminal, fields), bool(row["outstanding"]), newest, due, bool(row["interrupting"])

    def renew(self, token: str) -> bool:
        """Extend a claim's lease; False means the claim was lost (recovered by someone else)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET claimed_at = ? WHERE claim = ? AND status = 'delivering'",
                (self.clock(), token),
            )
            return bool(cur.rowcount > 0)

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

    def mark_delivered(
        self,
        token: str,
        ids: Sequence[int] | None = None,
        *,
        channel: str = Channel.PASTE,
        found: bool = False,
    ) -> int:
        """Acknowledge a paste (or a hook's hand-over: ``channel``). Conditional on the claim:
        returns how many rows this claim still owned (0 = ownership was lost; the caller must not
        report them delivered)."""
        now = self.clock()
        sql = (
            "UPDATE message SET status = 'delivered', delivered_at = ?, attempts = attempts + 1, "
            "last_error = NULL, waiting_reason = NULL, recheck = NULL, "
            # found by its evidence: it came the way it was last sent (a hand-over: 'hook')
            "channel = CASE WHEN ? THEN coalesce(channel, ?) ELSE ? END "
            "WHERE claim = ? AND status = 'delivering'"
        )
        args: list[Any] = [now, found, str(channel), str(channel), token]
        if ids is not None:
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            args.extend(ids)
        how = f"{channel}, found in the pane" if found else str(channel)
        tasked = None
        with self._write() as conn:
            rows = conn.execute(
                sql + " RETURNING id, receiver_id, kind, sender_id, claimed_at", tuple(args)
            ).fetchall()
            if rows:  # one statement for the batch's timeline rows (the hot path)
                conn.executemany(
                    "INSERT INTO message_event (receiver_id, message_id, at, event, reason) "
                    "VALUES (?, ?, ?, ?, ?)",
                    sorted((r[1], int(r[0]), now, Event.DELIVERED.value, how) for r in rows),
                )
                tasked = self._note_tasked(conn, rows, now)
        if tasked is not None and self.on_tasked is not None:
            self.on_tasked(tasked)
        # the event stream has message.delivered for these (cao/delivery.py): no timeline copy
        return len(rows)

    def _note_tasked(self, conn: Any, rows: Sequence[Any], now: float) -> str | None:
        """A delivery that gives the receiver work starts a new task attempt (``task_id`` = the
        message) and makes its work state ``tasked`` (coordination follows its turn from there):
        any message but a notice from its own supervisor, or a task from a person (a name, not a
        terminal). A peer terminal's message is not its task. Returns the receiver when it was."""
        senders = {str(r[3]) for r in rows if r[2] != Kind.NOTICE}
        if not any(r[2] == Kind.TASK for r in rows) and not any(TERMINAL_ID_RE.fullmatch(x) for x in senders):
            return None  # (the hot path: a person's or a tool's mail is no task; no read for it)
        rid = str(rows[0][1])
        term = conn.execute("SELECT supervisor_id, state FROM terminal WHERE id = ?", (rid,)).fetchone()
        if term is None or term[1] != TerminalState.LIVE:
            return None
        supervisor = term[0]
        given = [
            r
            for r in rows
            if r[2] != Kind.NOTICE
            and (r[3] == supervisor or (r[2] == Kind.TASK and not TERMINAL_ID_RE.fullmatch(str(r[3]))))
        ]
        if not given:
            return None
        task = f"m{max(int(r[0]) for r in given)}"
        # it began when the paste did (its CLI may answer before the paste is confirmed)
        began = min((float(r[4]) for r in given if r[4] is not None), default=now)
        conn.execute(
            "UPDATE terminal SET work_state = ?, task_at = ?, task_id = ? WHERE id = ?",
            (WorkState.TASKED.value, now, task, rid),
        )
        # when this attempt began: its CLI's responses from here on are its cost (cao/usage.py)
        open_task_window(conn, rid, task, began)
        return rid

    def release(
        self,
        token: str,
        error: str,
        *,
        max_attempts: int,
        count_attempt: bool = True,
        recheck: bool = False,
        pasted: bool = False,
    ) -> dict[str, int]:
        """Return a claim to ``pending`` (attempts+1), or ``failed`` past the retry limit.

        ``recheck``: the paste may have arrived (unconfirmed submit, recovered crash), so the next
        attempt re-claims exactly these rows and looks before it pastes.
        """
        inc = 1 if count_attempt else 0
        with self._write() as conn:
            gave_up = conn.execute(
                "UPDATE message SET status = 'failed', attempts = attempts + ?, last_error = ?, "
                "failure = ?, claim = NULL, waiting_reason = NULL "
                "WHERE claim = ? AND status = 'delivering' AND attempts + ? >= ? RETURNING id, receiver_id",
                (inc, error, FailureKind.RETRIES_EXHAUSTED, token, inc, max_attempts),
            ).fetchall()
            failed = len(gave_up)
            told = (
                self._timeline(
                    conn, Event.FAILED, gave_up[0][1], sorted(int(r[0]) for r in gave_up), reason=error
                )
                if gave_up
                else []
            )
            pending = conn.execute(
                "UPDATE message SET status = 'pending', attempts = attempts + ?, last_error = ?, "
                # rechecked later: found by its evidence, it came the way it was last sent (a
                # hand-over keeps 'hook' unless a paste followed); otherwise the next send decides
                "claim = NULL, claimed_at = NULL, channel = CASE WHEN ? THEN "
                "(CASE WHEN ? THEN 'paste' ELSE channel END) ELSE NULL END, "
                "recheck = CASE WHEN ? THEN ? ELSE recheck END WHERE claim = ? AND status = 'delivering'",
                (inc, error, recheck, pasted, recheck, token, token),
            ).rowcount
        self._told(told)
        return {"failed": int(failed), "pending": int(pending)}

    def note_waiting(self, receiver_id: str, reason: str | None, *, changed: bool = True) -> int:
        """Store why a receiver's pending messages wait (shown by `cao inbox`, kept across restarts);
        ``changed``: the reason is new for this receiver, so its timeline gets a ``held`` event
        (not once more for each message that arrives while it stays the same)."""
        told: list[MessageEvent] = []
        with self._write() as conn:
            # a task held by the receiver's budget keeps that reason: the gate opening won't send it
            cur = conn.execute(
                "UPDATE message SET waiting_reason = ? WHERE receiver_id = ? AND status = 'pending' "
                "AND waiting_reason IS DISTINCT FROM ? AND (kind != ? OR "
                "(SELECT budget_hold FROM terminal WHERE id = ?) IS NULL)",
                (reason, receiver_id, reason, Kind.TASK.value, receiver_id),
            )
            n = int(cur.rowcount)
            if n and reason is not None and changed:
                told = self._timeline(conn, Event.HELD, receiver_id, [None], reason=reason)
        self._told(told)
        return n

    def stale_claims(self, *, older_than: float | None = None) -> list[tuple[str, list[Message]]]:
        """Outstanding claims (``delivering`` rows), grouped by claim, oldest first."""
        mine, args = self._own_receivers()
        sql = f"SELECT * FROM message WHERE status = 'delivering'{mine}"
        if older_than is not None:
            sql += " AND claimed_at <= ?"
            args += (older_than,)
        sql += " ORDER BY id"
        with self._read() as conn:
            rows = conn.execute(sql, args).fetchall()
        groups: dict[str, list[Message]] = {}
        for r in rows:
            groups.setdefault(str(r["claim"]), []).append(_row(Message, r))
        return list(groups.items())

    def cancel(self, message_id: int, *, actor: str = "operator") -> Message:
        return self.manage(
            message_id, Event.CANCELLED, actor=actor, as_agent=False, reason="cancelled by operator"
        )

    def manage(
        self,
        message_id: int,
        action: Event,
        *,
        actor: str,
        as_agent: bool,
        reason: str,
        until: float | None = None,
        priority: int | None = None,
    ) -> Message:
        """Cancel, drop, defer (``until``) or re-prioritise (``priority``) a pending message, with who
        and why on its timeline. ``as_agent``: the receiving agent manages its own queue: only its
        own messages, never a person's chat (403)."""
        verb = {
            Event.CANCELLED: "cancelled",
            Event.DROPPED: "dropped",
            Event.DEFERRED: "deferred",
            Event.PRIORITIZED: "re-prioritised",
        }[action]
        with self._write() as conn:
            row = conn.execute("SELECT * FROM message WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
            if as_agent and row["receiver_id"] != actor:
                raise Forbidden(
                    f"message {message_id} is in terminal {row['receiver_id']}'s queue, not {actor}'s: an "
                    "agent manages its own queue only"
                )
            if as_agent and row["kind"] == Kind.CHAT:
                raise Forbidden(
                    f"message {message_id} is a person's chat ({row['sender_id']}): an agent can't have it "
                    f"{verb}; only the operator can (cao inbox, the dashboard)"
                )
            if row["status"] != MessageStatus.PENDING:
                raise Conflict(
                    f"message {message_id} is {row['status']}; only a pending message can be {verb}"
                )
            if row["recheck"] is not None and action != Event.CANCELLED:
                raise Conflict(
                    f"message {message_id} may already have arrived (an earlier paste of it is being "
                    f"checked); it can't be {verb} now: look again in a few seconds"
                )
            now = self.clock()
            if action == Event.DEFERRED:
                assert until is not None
                if row["expires_at"] is not None and until >= row["expires_at"]:
                    raise InvalidInput(
                        f"message {message_id} expires before then; defer it to an earlier time or drop it"
                    )
                conn.execute("UPDATE message SET not_before = ? WHERE id = ?", (until, message_id))
                note = f"until {_iso(until)}: {reason}"
            elif action == Event.PRIORITIZED:
                assert priority is not None
                conn.execute("UPDATE message SET priority = ? WHERE id = ?", (priority, message_id))
                note = f"{_priority(row['priority'])} → {_priority(priority)}: {reason}"
            else:
                status = MessageStatus.CANCELLED if action == Event.CANCELLED else MessageStatus.DROPPED
                conn.execute(
                    "UPDATE message SET status = ?, closed_by = ?, closed_reason = ?, last_error = ?, "
                    "waiting_reason = NULL WHERE id = ?",
                    (status, actor, reason, reason if action == Event.CANCELLED else None, message_id),
                )
                note = reason
            told = self._timeline(
                conn, action, row["receiver_id"], [message_id], reason=note, actor=actor, at=now
            )
        self._told(told)
        return self.get_message(message_id)

    def mark_read(self, message_id: int, reader: str) -> Message:
        """The receiver fetched the message (``read_message``): its first read is kept, each read is
        on the timeline. Reading never acknowledges anything."""
        with self._write() as conn:
            row = conn.execute("SELECT receiver_id FROM message WHERE id = ?", (message_id,)).fetchone()
            if row is None:
                raise NotFound(f"message {message_id} not found; list messages with `cao inbox`")
            conn.execute(
                "UPDATE message SET read_at = coalesce(read_at, ?) WHERE id = ?", (self.clock(), message_id)
            )
            told = self._timeline(conn, Event.READ, row[0], [message_id], actor=reader)
        self._told(told)
        return self.get_message(message_id)

    def mark_interrupt(self, message_id: int) -> bool:
        """Record that the interrupt key is being sent for this message; False if it was already
        (at most once per message, even across a crash: recorded before the key goes)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE message SET interrupt_at = ? WHERE id = ? AND status = 'pending' "
                "AND interrupt_at IS NULL RETURNING receiver_id",
                (self.clock(), message_id),
            ).fetchone()
            told = (
                self._timeline(
                    conn, Event.INTERRUPTED, cur[0], [message_id], reason="the CLI's interrupt key"
                )
                if cur
                else []
            )
        self._told(told)
        return cur is not None

    def prune_timeline(self, *, older_than: float) -> int:
        """Drop timeline events older than ``older_than`` (the messages themselves stay). Events
        are appended as they happen, so their ids follow their times: the first id to keep is found
        by a binary search of primary-key lookups (no index on the time to keep up on every write)."""
        with self._read() as conn:
            lo, hi = conn.execute("SELECT min(id), max(id) FROM message_event").fetchone()
            if (
                lo is None
                or conn.execute("SELECT at FROM message_event WHERE id = ?", (lo,)).fetchone()[0]
                >= older_than
            ):
                return 0
            hi += 1
            while lo < hi:
                mid = (lo + hi) // 2
                at = conn.execute(
                    "SELECT at FROM message_event WHERE id >= ? ORDER BY id LIMIT 1", (mid,)
                ).fetchone()
                if at is not None and at[0] < older_than:
                    lo = mid + 1
                else:
                    hi = mid
        with self._write() as conn:
            return int(conn.execute("DELETE FROM message_event WHERE id < ?", (lo,)).rowcount)

    def timeline(
        self, receiver_id: str, *, limit: int = 200, message_id: int | None = None
    ) -> list[MessageEvent]:
        """A receiver's timeline (or one message's), newest last."""
        sql = "SELECT * FROM message_event WHERE receiver_id = ?"
        args: list[Any] = [receiver_id]
        if message_id is not None:
            sql += " AND message_id = ?"
            args.append(message_id)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT ?) AS newest ORDER BY id", (*args, limit)
            ).fetchall()
        return [_row(MessageEvent, r) for r in rows]


def _iso(ts: float) -> str:
    return str(iso(ts))


def _priority(rank: int) -> str:
    return priority_name(int(rank))
