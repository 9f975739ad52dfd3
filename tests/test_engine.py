"""The engine's housekeeping on real files and a real tmux pane."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from cao.core import Cao
from cao.settings import Settings
from tests.conftest import wait_until


def test_a_flooding_pane_log_is_capped_as_it_grows_not_once_a_sweep(
    make_core: Callable[..., Cao], settings: Settings
):
    """An agent printing in a loop: its log is truncated within one cap interval of passing the cap,
    while the sweep (60 s here) never runs."""
    cap = 256 * 1024
    s = settings.with_(log_cap_bytes=cap, log_cap_interval=0.2, sweep_interval=60.0)
    core = make_core(s)
    log = core.terminals.log_path("f100d000")
    core.tmux.create_window(
        session_name="cao-flood",
        window_name="flood",
        command=["sh", "-c", "yes 'printing in a loop, forever'"],
        env={"PATH": "/usr/bin:/bin"},
        cwd=s.home,
        log_path=log,
    )
    sizes: list[int] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        sizes.append(log.stat().st_size)
        time.sleep(0.01)
    wait_until(lambda: core.engine.stats["logs_capped"] >= 3, timeout=5, what="repeated truncation")
    assert core.engine.stats["sweeps"] == 0
    growth = max(b - a for a, b in itertools.pairwise(sizes) if b >= a)  # bytes per 10 ms sample
    per_interval = growth * (s.log_cap_interval / 0.01)
    assert max(sizes) <= cap + per_interval + 64 * 1024, (max(sizes), per_interval)
    assert max(sizes) < 50 * cap  # without the ticker it grows without bound until a sweep
