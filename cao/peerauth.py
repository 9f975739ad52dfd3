"""How one cao-server proves to another that a forwarded request comes from a host sharing its token.

Hosts sharing a store forward pane operations to each other (cao/forward.py, cao/hosts.py). The
address of a peer comes from its row in the shared database, so a request of ours goes wherever
that row says. The token itself therefore never travels: each request carries a signature, the
HMAC-SHA256 with the token of exactly what is sent::

    X-Cao-Peer: v1 t=<unix time> n=<32 hex nonce> s=<64 hex signature>

    signed = "cao-peer-v1\\n" METHOD "\\n" Host "\\n" path?query (as sent) "\\n" t "\\n" n "\\n" sha256(body)

A signature read off the wire, or handed to a server that a forged row pointed at, is good for that
one request to that one Host, within ``WINDOW`` seconds of the database's clock (every host corrects
its own clock by it, cao/hosts.py), once: the receiver remembers every nonce until it is too old to
be accepted anyway. A request that fails any of these is refused (401) before any route sees it —
and before its body is read: the signature covers the body's hash given in the header, checked
against the body once the rest has passed, so a caller without the token can't make a host buffer
a body at all.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable

HEADER = "x-cao-peer"
WINDOW = 60.0  # seconds either side of the receiver's (database-corrected) clock
MAX_REMEMBERED = 200_000  # nonces; a flood of valid signatures beyond this is refused, not forgotten

_FORMAT = re.compile(
    r"^v1 t=(?P<t>[0-9]{1,12}) n=(?P<n>[0-9a-f]{32}) h=(?P<h>[0-9a-f]{64}) s=(?P<s>[0-9a-f]{64})$"
)


def _signed(
    token: str, to: str, method: str, host: str, target: bytes, at: int, nonce: str, digest: str
) -> str:
    message = b"\n".join(
        (
            b"cao-peer-v1",
            to.encode("utf-8"),
            method.upper().encode("ascii"),
            host.lower().encode("latin-1"),
            target,
            str(at).encode("ascii"),
            nonce.encode("ascii"),
            digest.encode("ascii"),
        )
    )
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def sign(token: str, method: str, host: str, target: bytes, body: bytes, now: float, *, to: str = "") -> str:
    """The header value for one request: ``target`` is the path and query exactly as sent; ``to``
    the name of the host it is meant for (only that host accepts it, wherever it is sent)."""
    at, nonce, digest = int(now), secrets.token_hex(16), hashlib.sha256(body).hexdigest()
    return f"v1 t={at} n={nonce} h={digest} s={_signed(token, to, method, host, target, at, nonce, digest)}"


class Refusal(Exception):
    """Why a signed request is refused (said to the caller)."""


class Verifier:
    """Checks signed requests; remembers the nonces it accepted (thread-safe). A nonce is let go
    only once its signature could pass no more: two windows of this host's monotonic time went by
    *and* the (database-corrected) clock is past its time plus the window. A database clock set
    back never makes a request seen before new again, and fresh requests (fresh nonces) still
    pass; meanwhile the nonces are kept, at most ``MAX_REMEMBERED``."""

    def __init__(
        self,
        token: str,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
        *,
        name: str = "",
    ):
        self.token = token
        self.name = name  # this host's: a request signed for another host is refused here
        self.clock = clock
        self.monotonic = monotonic
        self._seen: dict[str, tuple[float, int]] = {}  # nonce -> (forgotten at, monotonic; its t)
        self._order: deque[str] = deque()  # the nonces in the order they came (forgotten in it)
        self._lock = threading.Lock()

    def check_head(self, value: str, method: str, host: str, target: bytes) -> str:
        """Everything but the body: the signature, its time, its nonce (remembered from now on).
        Returns the body's hash the signature covers; :class:`Refusal` says why not."""
        m = _FORMAT.match(value.strip())
        if m is None:
            raise Refusal("malformed X-Cao-Peer header (expected `v1 t=… n=… h=… s=…`)")
        at, nonce, digest, given = int(m["t"]), m["n"], m["h"], m["s"]
        if not hmac.compare_digest(
            _signed(self.token, self.name, method, host, target, at, nonce, digest), given
        ):
            raise Refusal(
                f"bad peer signature: not signed for host {self.name or '?'} with this host's token "
                "(every host sharing a store needs the same CAO_API_TOKEN, and a request meant for "
                "another host is refused)"
            )
        now = self.clock()
        if abs(now - at) > WINDOW:
            raise Refusal(
                f"peer signature {now - at:+.0f} s old (at most {WINDOW:.0f} s either way): the two hosts' "
                "clocks disagree; each follows the database's, so one of them could not reach it lately"
            )
        mono = self.monotonic()
        with self._lock:
            while self._order:
                until, signed_at = self._seen[self._order[0]]
                if until >= mono or now <= signed_at + WINDOW:
                    break
                del self._seen[self._order.popleft()]
            if nonce in self._seen:
                raise Refusal("replayed peer signature (each forwarded request is accepted once)")
            if len(self._seen) >= MAX_REMEMBERED:
                raise Refusal("too many peer requests in the last two minutes; retry in a moment")
            self._seen[nonce] = (mono + 2 * WINDOW + 1.0, at)
            self._order.append(nonce)
        return digest

    def check(self, value: str, method: str, host: str, target: bytes, body: bytes) -> str | None:
        """The whole request at once: None when it is good, else why not."""
        try:
            digest = self.check_head(value, method, host, target)
        except Refusal as refusal:
            return str(refusal)
        return body_refusal(digest, body)


def body_refusal(digest: str, body: bytes) -> str | None:
    """None when ``body`` is the one whose hash was signed."""
    if hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
        return None
    return "bad peer signature: the body is not the one signed"
