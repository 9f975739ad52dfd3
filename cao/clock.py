"""Time, as the library reads it: one object that tests can replace (cao/testing/clock.py).

``now()`` is the wall clock (stored in rows and shown to people), ``monotonic()`` measures waits
and deadlines (a wall clock stepped back must not stall them), ``sleep()`` waits.
"""

from __future__ import annotations

import time


class Clock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM = Clock()
