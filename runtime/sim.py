"""Simulator construction shared by the rollout runner and the offline evaluator.

Needs the `[sim]` extra (gymnasium, bullet-safety-gym); nothing here is imported by the service.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _fd_named_std_streams() -> Iterator[None]:
    """Point sys.stdout/sys.stderr at fds 1/2 through streams whose `name` is an integer.

    Bullet-Safety-Gym silences pybullet by flushing the C stream named by `sys.stdout.name` (and
    `sys.stderr.name` at import). That fails whenever the streams are replaced (pytest capture,
    notebooks); with an integer name it skips the flush and still redirects the fd.
    """
    saved = sys.stdout, sys.stderr
    with open(1, "w", closefd=False) as out, open(2, "w", closefd=False) as err:
        saved[0].flush()
        saved[1].flush()
        sys.stdout, sys.stderr = out, err
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


def make_env(task: str) -> Any:
    """A gymnasium env for `task`; Bullet-Safety-Gym ids are registered first."""
    import gymnasium as gym

    if not task.startswith("Safety"):
        return gym.make(task)
    with _fd_named_std_streams():
        importlib.import_module("bullet_safety_gym")
        return gym.make(task)


def seed_simulator(seed: int) -> None:
    """Seed the global RNGs Bullet-Safety-Gym draws from on reset (it ignores `reset(seed=...)`
    for its agent and obstacle placement noise), so that seeded episodes repeat exactly."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
