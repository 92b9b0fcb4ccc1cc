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


def _is_bullet_task(task: str) -> bool:
    """Whether `task` may be a Bullet-Safety-Gym id (they all start with "Safety")."""
    return task.startswith("Safety")


def _register(task: str) -> None:
    """Register Bullet-Safety-Gym's ids when `task` may be one of them."""
    if _is_bullet_task(task):
        with _fd_named_std_streams():
            importlib.import_module("bullet_safety_gym")


def make_env(task: str) -> Any:
    """A gymnasium env for `task`; Bullet-Safety-Gym ids are registered first."""
    import gymnasium as gym

    _register(task)
    with _fd_named_std_streams() if _is_bullet_task(task) else contextlib.nullcontext():
        return gym.make(task)


def check_task(task: str) -> None:
    """Raise ValueError, naming the task and gymnasium's guess, when no env has that id: long
    commands check before their first minute of work, not when they first build an env."""
    import gymnasium as gym

    _register(task)
    try:
        gym.spec(task)
    except gym.error.Error as error:
        raise ValueError(f"no simulator task {task!r}: {error}") from None


def seed_simulator(seed: int) -> None:
    """Seed the global RNGs Bullet-Safety-Gym draws from on reset (it ignores `reset(seed=...)`
    for its agent and obstacle placement noise), so that seeded episodes repeat exactly."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
