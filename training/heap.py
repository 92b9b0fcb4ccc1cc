"""Keep freed memory in the process's heap, so large temporary tensors reuse pages.

glibc hands every allocation above its mmap threshold (128 KiB to 32 MiB) to a fresh `mmap` and
returns it on free, so a training step that allocates the same large buffers each time
page-faults on all of them again. The baselines' critic targets push 5,120 rows through five
networks per step; there this is a fifth of the step (docs/decisions/training-speed.md). Same
arithmetic, only where the bytes live changes. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**30  # bytes: the heap keeps up to 1 GiB of freed memory


def keep_freed_memory() -> bool:
    """Allocate every block from the heap and keep what is freed there; False where the C
    library is not glibc (nothing changes then)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    kept = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
    if not kept:
        logger.debug("mallopt refused; freed memory goes back to the system")
    return kept
