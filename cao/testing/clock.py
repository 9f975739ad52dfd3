"""A clock for tests: time moves only when something sleeps (or the test says so)."""

from __future__ import annotations

import threading

from cao.clock import Clock


class FakeClock(Clock):
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._wall = start
        self._mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._wall += max(0.0, seconds)
            self._mono += max(0.0, seconds)
