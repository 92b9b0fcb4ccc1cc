"""A run folder whose lock another holder has, for the tests of the commands that take it."""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from training.run_lock import LOCK_FILE


@contextmanager
def held_elsewhere(folder: Path, holder: str = "") -> Iterator[None]:
    """Hold `folder`'s lock through another open file (to the kernel, as another process would),
    saying `holder` in it, for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    other = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(other, 0)
        os.pwrite(other, f"{holder}\n".encode() if holder else b"", 0)
        yield
    finally:
        os.close(other)
