"""Simulator construction shared by the rollout runner and the offline evaluator.

Needs the `[sim]` extra (gymnasium, bullet-safety-gym); nothing here is imported by the service.
A task id no simulator knows is an `UnknownTask` wherever an env is made (`make_env`,
`check_task`): one line naming the task and the known ones, exit code 2, in every command; so is
a command's run of more envs at once than the memory left holds (`check_memory_for`, before its
first episode), which the kernel would kill without a word.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from runtime.user_errors import UserError

ENV_MEMORY_BYTES = 90 * 2**20
"""The most one running Bullet-Safety-Gym env holds: 29 MB (AntRun, BallRun) to 85 MB (CarCircle,
CarRun), measured over 20 envs each 50 steps in (docs/training.md, Evaluation)."""
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
"""A container's memory limit (cgroup v2): /proc/meminfo there reports the host's memory."""


class UnknownTask(UserError, ValueError):
    """No simulator env has this id: a user's mistake (one line, exit code 2), and a ValueError
    for the callers of `check_task` that catch one. What `make_env` and `check_task` raise is
    also gymnasium's own error for an unregistered id (`unknown_task`), so code that catches
    gymnasium's errors around `make_env` (a baseline reading action bounds) keeps working."""

    def __init__(self, task: str, message: str) -> None:
        super().__init__(message)
        self.task = task

    def __reduce__(self) -> tuple[Any, ...]:
        # A pickle (a worker process' error, sent to its parent) cannot name the class
        # `unknown_task` makes; rebuilt through it instead.
        return _rebuilt, (self.task, str(self))


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
    """A gymnasium env for `task`; Bullet-Safety-Gym ids are registered first.

    Raises:
        UnknownTask: no env has that id.
    """
    import gymnasium as gym

    _register(task)
    with _fd_named_std_streams() if _is_bullet_task(task) else contextlib.nullcontext():
        try:
            return gym.make(task)
        except gym.error.UnregisteredEnv as error:  # NameNotFound, VersionNotFound, ...
            raise unknown_task(task, error) from None


def check_task(task: str) -> None:
    """Raise `UnknownTask`, naming the task, gymnasium's guess and the known tasks, when no env
    has that id: long commands check before their first minute of work, not when they first
    build an env."""
    import gymnasium as gym

    _register(task)
    try:
        gym.spec(task)
    except gym.error.Error as error:
        raise unknown_task(task, error) from None


def unknown_task(task: str, error: Exception) -> UnknownTask:
    """The error for an id gymnasium does not know (`error`, its own, says why and may guess)."""
    reason = str(error).strip()
    reason += "" if reason.endswith((".", "?")) else "."
    known = ", ".join(_bullet_tasks())
    return _rebuilt(task, f"no simulator task {task!r}: {reason} Known tasks: {known}")


def _bullet_tasks() -> list[str]:
    """Bullet-Safety-Gym's ids (this project's tasks; gymnasium's classics are not listed)."""
    import gymnasium as gym

    _register("Safety")
    return sorted(name for name in gym.registry if _is_bullet_task(name))


def _rebuilt(task: str, message: str) -> UnknownTask:
    return _gymnasium_unknown_task()(task, message)


@functools.cache
def _gymnasium_unknown_task() -> type[UnknownTask]:
    """`UnknownTask` that is also gymnasium's `UnregisteredEnv` (made once gymnasium is needed:
    importing it here at the top would load the simulator for every `--help`)."""
    import gymnasium as gym

    bases = (UnknownTask, gym.error.UnregisteredEnv)
    return cast(type[UnknownTask], type("UnknownTask", bases, {"__module__": __name__}))


def seed_simulator(seed: int) -> None:
    """Seed the global RNGs Bullet-Safety-Gym draws from on reset (it ignores `reset(seed=...)`
    for its agent and obstacle placement noise), so that seeded episodes repeat exactly."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)


class NotEnoughMemory(UserError):
    """More simulator envs at once than the memory left holds: a user's choice of episodes."""


def available_memory(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int | None:
    """Bytes the kernel says new work can take (`MemAvailable`), no more than a cgroup v2
    limit leaves (`memory.max` less `memory.current`); None where neither says."""
    free = [_meminfo_available(meminfo), _cgroup_left(cgroup)]
    known = [value for value in free if value is not None]
    return min(known) if known else None


def _meminfo_available(meminfo: Path) -> int | None:
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024  # "12345 kB"
    return None


def _cgroup_left(cgroup: Path) -> int | None:
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        used = int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def check_memory_for(envs: int, processes: int = 1, available: int | None = None) -> None:
    """Raise `NotEnoughMemory` where `envs` envs in each of `processes` processes at once need
    more than the memory available (`available_memory` unless given; unknown: no check)."""
    available = available_memory() if available is None else available
    need = envs * processes * ENV_MEMORY_BYTES
    if available is None or need <= available:
        return
    each = f" in each of {processes} processes" if processes > 1 else ""
    raise NotEnoughMemory(
        f"{envs} episodes stepped together{each} need about {need / 2**30:.1f} GiB "
        f"({ENV_MEMORY_BYTES // 2**20} MB per simulator env) and {available / 2**30:.1f} GiB is "
        "available: run fewer episodes at once (fewer per seed or per call, or fewer workers)"
    )
