"""One process at a time per run folder.

Two processes writing one run folder (two `cdt pipeline --name X` side by side, a `cdt train
--resume` beside the run it resumes, two collections into one run directory) overwrite each
other's checkpoints and logs and leave neither run usable; until its first checkpoint a run's
folder shows nothing that a second one could check. So each command holds an exclusive lock on
`<folder>/.lock` while it writes there, and a second one stops at once, naming the first. The lock
is the kernel's (`flock`): a killed process never leaves it held.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.user_errors import UserError

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"
"""The lock's file in a run folder; it says which command holds it (the folder's other files are
the run's)."""

_held: dict[Path, int] = {}
"""Folders this process holds, with their depth: the pipeline's training stage re-enters the lock
the pipeline holds."""


@contextmanager
def run_folder_lock(folder: Path, command: str) -> Iterator[None]:
    """Hold `folder`'s lock (creating the folder) for the block.

    Raises:
        UserError: another process holds it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    descriptor = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip()
            raise UserError(
                f"{folder} is in use by {holder or 'another process'}: wait for it to end, or"
                " write elsewhere (another --name, --run-name or --run-dir)"
            ) from None
        except OSError as error:  # a file system without locks (some network mounts)
            logger.warning("%s: not locked (%s); run one process on it at a time", folder, error)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{command} (pid {os.getpid()})\n".encode(), 0)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
    finally:
        os.close(descriptor)  # releases the lock
