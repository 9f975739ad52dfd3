"""Files a person points cao at (a screen capture, a rules, prices or budgets file), read safely."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cao.errors import InvalidInput


def read_small_file(path: Path, limit: int, what: str, *, missing_ok: bool = False) -> bytes | None:
    """A regular file a person points cao at (a screen capture, a rules or prices file), read
    without blocking and at most ``limit`` bytes: a FIFO or a device (/dev/zero never ends) is
    refused before any read, so nothing hangs and nothing is read without bound. ``missing_ok``:
    None for a file that isn't there. Raises ``InvalidInput`` naming the file and the fix."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise InvalidInput(f"can't read the {what} {path}: no such file") from None
    except OSError as exc:
        raise InvalidInput(f"can't read the {what} {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(
                f"the {what} {path} is not a regular file (a FIFO, a device?); give a text file"
            )
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"can't read the {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        size = f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"
        raise InvalidInput(f"the {what} {path} is over {size}; a {what} is at most that")
    return data
