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
    return peerauth.Verifier(TOKEN, clock.now)


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
    for bad in ("", "v1", "Bearer " + TOKEN, "v2 t=1 n=" + "0" * 32 + " s=" + "0" * 64, "v1 t=-5 n=x s=y"):
        assert "malformed" in str(v.check(bad, "GET", HOST, TARGET, b"")), bad


def test_a_signature_from_a_clock_off_by_more_than_the_window_is_refused_either_way():
    clock = FakeClock(start=1_000_000.0)
    v = _verifier(clock)
    for skew in (-peerauth.WINDOW - 2, peerauth.WINDOW + 2):
        header = peerauth.sign(TOKEN, "GET", HOST, TARGET, b"", clock.now() + skew)
        assert "clock is off" in str(v.check(header, "GET", HOST, TARGET, b"")), skew
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
