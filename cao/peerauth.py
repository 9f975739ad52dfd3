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
be accepted anyway. A request that fails any of these is refused (401) before any route sees it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections import deque
from collections.abc import Callable

HEADER = "x-cao-peer"
WINDOW = 60.0  # seconds either side of the receiver's (database-corrected) clock
MAX_REMEMBERED = 200_000  # nonces; a flood of valid signatures beyond this is refused, not forgotten

_FORMAT = re.compile(r"^v1 t=(?P<t>[0-9]{1,12}) n=(?P<n>[0-9a-f]{32}) s=(?P<s>[0-9a-f]{64})$")


def _signed(token: str, method: str, host: str, target: bytes, at: int, nonce: str, body: bytes) -> str:
    message = b"\n".join(
        (
            b"cao-peer-v1",
            method.upper().encode("ascii"),
            host.lower().encode("latin-1"),
            target,
            str(at).encode("ascii"),
            nonce.encode("ascii"),
            hashlib.sha256(body).hexdigest().encode("ascii"),
        )
    )
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def sign(token: str, method: str, host: str, target: bytes, body: bytes, now: float) -> str:
    """The header value for one request: ``target`` is the path and query exactly as sent."""
    at, nonce = int(now), secrets.token_hex(16)
    return f"v1 t={at} n={nonce} s={_signed(token, method, host, target, at, nonce, body)}"


class Verifier:
    """Checks signed requests; remembers the nonces it accepted (thread-safe)."""

    def __init__(self, token: str, clock: Callable[[], float]) -> None:
        self.token = token
        self.clock = clock
        self._seen: dict[str, float] = {}  # nonce -> when it may be forgotten
        self._order: deque[str] = deque()  # the nonces in the order they came (forgotten in it)
        self._lock = threading.Lock()

    def check(self, value: str, method: str, host: str, target: bytes, body: bytes) -> str | None:
        """None when the request is good; else why it is refused (said to the caller)."""
        m = _FORMAT.match(value.strip())
        if m is None:
            return "malformed X-Cao-Peer header (expected `v1 t=… n=… s=…`)"
        at, nonce, given = int(m["t"]), m["n"], m["s"]
        expected = _signed(self.token, method, host, target, at, nonce, body)
        if not hmac.compare_digest(expected, given):
            return "bad peer signature: every host sharing a store needs the same CAO_API_TOKEN"
        now = self.clock()
        if abs(now - at) > WINDOW:
            return (
                f"peer signature {now - at:+.0f} s old (at most {WINDOW:.0f} s either way): the sending "
                "host's clock is off and it could not correct it by the database's (is the store reachable?)"
            )
        with self._lock:
            while self._order and self._seen[self._order[0]] < now:
                del self._seen[self._order.popleft()]
            if nonce in self._seen:
                return "replayed peer signature (each forwarded request is accepted once)"
            if len(self._seen) >= MAX_REMEMBERED:
                return "too many peer requests in the last two minutes; retry in a moment"
            self._seen[nonce] = at + WINDOW + 1.0
            self._order.append(nonce)
        return None
