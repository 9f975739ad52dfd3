"""Files read from places cao doesn't control (a person's screen capture, rules, prices or budgets
file; an agent's own transcripts), read safely: without blocking and without bound on nothing."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cao.errors import InvalidInput


class MissingFile(InvalidInput):
    """The file isn't there (a caller for which that is fine catches this one)."""


def read_regular(path: Path, limit: int, *, follow: bool = True) -> bytes:
    """A regular file's first ``limit`` bytes. Opened without blocking and checked before any read:
    a FIFO would block the reader forever and a device (/dev/zero) never ends, so anything but a
    regular file raises ``OSError(EINVAL)``; ``follow=False``: a symlink raises too (ELOOP)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else getattr(os, "O_NOFOLLOW", 0)))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device?)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(limit)
    finally:
        os.close(fd)


def read_small_file(path: Path, limit: int, what: str) -> bytes:
    """A file a person points cao at, at most ``limit`` bytes (``read_regular``). Raises
    ``InvalidInput`` naming the file and the fix (``MissingFile`` when it isn't there)."""
    try:
        data = read_regular(path, limit + 1)
    except FileNotFoundError:
        raise MissingFile(f"can't read the {what} {path}: no such file") from None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise InvalidInput(
                f"the {what} {path} is not a regular file (a FIFO, a device?); give a text file"
            ) from None
        raise InvalidInput(f"can't read the {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        size = f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"
        raise InvalidInput(f"the {what} {path} is over {size}; a {what} is at most that")
    return data
