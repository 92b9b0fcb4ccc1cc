"""Files written whole or not at all: every artifact (card, checkpoint, dataset, graph) uses it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Run `write(temporary)` beside `path`, then rename it over `path`.

    A crash or an error leaves the old file (or none), never a half-written one; the temporary
    file is removed when writing failed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path
