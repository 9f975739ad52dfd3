"""Another host's signed request (cao/peerauth.py): what the receiver's verifier accepts, and for how long."""

from __future__ import annotations

import pytest

from cao import peerauth
from cao.testing.clock import FakeClock

TOKEN = "shared-token-of-the-hosts"
HOST = "10.0.0.2:9889"
TARGET = b"/terminals/0123abcd/input"
BODY = b'{"message": "ls"}'


def _verifier(clock: FakeClock) -> peerauth.Verifier:
    return peerauth.Verifier(TOKEN, clock.now, clock.monotonic)


def test_a_signature_is_accepted_once():
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    header = peerauth.sign(TOKEN, "POST", HOST, TARGET, BODY, clock.now())
    assert v.check(header, "POST", HOST, TARGET, BODY) is None
    assert "replayed" in str(v.check(header, "POST", HOST, TARGET, BODY))


@pytest.mark.parametrize(
    "changed",
    [
        {"method": "DELETE"},
        {"host": "10.0.0.3:9889"},
        {"target": b"/terminals/0123abcd/exit"},
        {"target": TARGET + b"?x=1"},
        {"body": b'{"message": "rm -rf ~"}'},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_signature_covers_the_method_host_path_query_and_body(changed: dict[str, object]):
    clock = FakeClock(start=1_000_000.0)
    header = peerauth.sign(TOKEN, "POST", HOST, TARGET, BODY, clock.now())
    request: dict[str, object] = {"method": "POST", "host": HOST, "target": TARGET, "body": BODY, **changed}
    why = _verifier(clock).check(header, **request)  # type: ignore[arg-type]
    assert why is not None and "bad peer signature" in why


def test_another_token_and_a_malformed_header_are_refused():
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    assert "bad peer signature" in str(
        v.check(peerauth.sign("other", "GET", HOST, TARGET, b"", clock.now()), "GET", HOST, TARGET, b"")
    )
    for bad in (
        "",
        "v1",
        "Bearer " + TOKEN,
        "v2 t=1 n=" + "0" * 32 + " h=" + "0" * 64 + " s=" + "0" * 64,
        "v1 t=-5 n=x s=y",
    ):
        assert "malformed" in str(v.check(bad, "GET", HOST, TARGET, b"")), bad


def test_a_signature_from_a_clock_off_by_more_than_the_window_is_refused_either_way():
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    for skew in (-peerauth.WINDOW - 2, peerauth.WINDOW + 2):
        header = peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", clock.now() + skew)
        assert "clocks disagree" in str(v.check(header, "GET", HOST, TARGET, b"")), skew
    inside = peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", clock.now() + peerauth.WINDOW - 2)
    assert v.check(inside, "GET", HOST, TARGET, b"") is None


def test_a_nonce_is_remembered_as_long_as_its_signature_could_pass_and_then_forgotten():
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    header = peerauth.sign(
        TOKEN, "GET", HOST, TARGET, b"", clock.now() + peerauth.WINDOW - 1
    )  # from the future
    assert v.check(header, "GET", HOST, TARGET, b"") is None
    clock.advance(2 * peerauth.WINDOW - 2)  # still inside the window seen from here: still a replay
    assert "replayed" in str(v.check(header, "GET", HOST, TARGET, b""))
    for _ in range(3):
        fresh = peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", clock.now())
        assert v.check(fresh, "GET", HOST, TARGET, b"") is None
    clock.advance(3 * peerauth.WINDOW)
    v.check(peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", clock.now()), "GET", HOST, TARGET, b"")
    assert len(v._seen) == 1  # the old ones were let go: memory stays bounded by the window


def test_a_database_clock_that_steps_back_never_makes_a_request_seen_before_new_again():
    """A nonce is let go only once its signature could pass no more on the clock as it is now: a
    database clock set back keeps it remembered, and fresh requests still pass meanwhile."""
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    captured = peerauth.sign(TOKEN, "POST", HOST, TARGET, BODY, clock.now())
    assert v.check(captured, "POST", HOST, TARGET, BODY) is None
    clock.advance(2 * peerauth.WINDOW + 2)  # long enough, by both clocks, to be let go...
    stepped = [1_000_000.0 + 10]
    v.clock = lambda: stepped[0]  # ...but the database's clock went back two minutes
    fresh = peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", stepped[0])
    assert v.check(fresh, "GET", HOST, TARGET, b"") is None  # traffic goes on
    assert "replayed" in str(v.check(captured, "POST", HOST, TARGET, BODY))
    for _ in range(5):  # while it catches up, every fresh request passes
        stepped[0] += 1
        clock.advance(1)
        assert (
            v.check(peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", stepped[0]), "GET", HOST, TARGET, b"")
            is None
        )
    stepped[0] += 3 * peerauth.WINDOW  # once the clock is past them, the old nonces go
    clock.advance(3 * peerauth.WINDOW)
    assert (
        v.check(peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", stepped[0]), "GET", HOST, TARGET, b"") is None
    )
    assert len(v._seen) == 1


def test_a_signed_header_is_refused_before_any_of_the_body_is_read():
    """Without the token, an X-Cao-Peer header gets a caller no further than no header does: the
    guard answers 401 before it reads a byte of the body (it would buffer up to 1 MiB otherwise)."""
    from cao.security import Guard, Policy

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the route ran")

    policy = Policy(
        port=9889,
        token=TOKEN,
        own_names=frozenset({"127.0.0.1"}),
        hosts=frozenset(),
        any_host=False,
        origins=frozenset(),
    )
    clock = FakeClock(start=1_000_000.0)
    guard = Guard(app, policy, _verifier(clock))
    forged = peerauth.sign("not-the-token", "POST", "127.0.0.1:9889", TARGET, b"x" * 65536, clock.now())
    for header in ("junk", forged):
        chunks, sent = _call(guard, header)
        assert sent[0]["status"] == 401
        assert chunks <= 1, header  # at most the refusal's own drain, never the body first


def _call(guard: object, header: str) -> tuple[int, list[dict[str, object]]]:
    """One chunked 1 MiB POST through the guard: how many chunks it read, what it sent."""
    import asyncio

    chunks: list[int] = []
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        chunks.append(1)
        return {"type": "http.request", "body": b"x" * 65536, "more_body": len(chunks) < 16}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": TARGET.decode(),
        "raw_path": TARGET,
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:9889"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
            (b"x-cao-peer", header.encode()),
        ],
    }
    asyncio.run(guard(scope, receive, send))  # type: ignore[operator]
    return len(chunks), sent


def test_a_request_signed_for_one_host_is_refused_by_another():
    clock = FakeClock(start=1_000_000.0)
    b3 = peerauth.Verifier(TOKEN, clock.now, clock.monotonic, name="b3")
    meant_for_b2 = peerauth.sign(TOKEN, "POST", HOST, TARGET, BODY, clock.now(), to="b2")
    assert "not signed for host b3" in str(b3.check(meant_for_b2, "POST", HOST, TARGET, BODY))
    for_b3 = peerauth.sign(TOKEN, "POST", HOST, TARGET, BODY, clock.now(), to="b3")
    assert b3.check(for_b3, "POST", HOST, TARGET, BODY) is None


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://10.0.0.2:9889", "http://10.0.0.2:9889"),
        ("HTTPS://Build-1.Internal/", "https://build-1.internal"),
        ("http://[fd00::2]:9889", "http://[fd00::2]:9889"),
        ("http://10.0.0.3:9889/terminals/0123abcd/input?x=", None),  # the rest of a request swallowed
        ("http://10.0.0.3:9889/sessions/victim", None),
        ("http://10.0.0.3:9889?x=", None),
        ("http://10.0.0.3:9889#", None),
        ("http://user:pw@10.0.0.3:9889", None),
        ("ftp://10.0.0.3", None),
        ("http://10.0.0.3:99999", None),
        ("http://10.0.0.3:9889\n", None),
        ("10.0.0.3:9889", None),
    ],
)
def test_a_host_address_is_a_plain_scheme_name_and_port(url: str, address: str | None):
    from cao.hosts import peer_address

    assert peer_address(url) == address
