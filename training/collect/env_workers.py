"""The collector's envs, stepped side by side in worker processes (or in this one).

The simulator is most of a collector epoch and runs on one core per process, so on a machine with
spare cores the envs can be split over `workers` processes (on 2 cores the gain was within the
machine's noise). A finished episode's env is reset where it runs; the step answers with the
episode's true last observation and the first one of the next, so nobody waits for a reset.

Bullet-Safety-Gym draws its placement noise from the process's global RNGs, so each process seeds
its own (worker 0 exactly as a single process does): the data depends on the number of workers,
and repeats for a given seed and number.
"""

from __future__ import annotations

import multiprocessing
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np

from runtime.sim import make_env, seed_simulator

# Worker w seeds its global RNGs with seed + w * WORKER_SEED_STRIDE, far from the per-env seeds.
WORKER_SEED_STRIDE = 1_000_000


@dataclass
class EnvSteps:
    """One step of every env, each array [n_envs, ...]."""

    observations: np.ndarray
    """what the step returned (the true last observation where an episode ended)."""
    rewards: np.ndarray
    costs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_observations: np.ndarray
    """where each env goes on from: the first observation of a new episode where one ended."""

    @property
    def done(self) -> np.ndarray:
        done: np.ndarray = self.terminated | self.truncated
        return done

    @staticmethod
    def concatenate(parts: list[EnvSteps]) -> EnvSteps:
        fields = EnvSteps.__dataclass_fields__
        return EnvSteps(
            **{name: np.concatenate([getattr(p, name) for p in parts]) for name in fields}
        )


class LocalEnvs:
    """`count` envs of a task in this process; env i is reset with seed + first_index + i."""

    def __init__(self, task: str, count: int, first_index: int = 0, worker: int = 0) -> None:
        self.envs = [make_env(task) for _ in range(count)]
        self.first_index, self.worker = first_index, worker
        self.observation_space: gym.Space[Any] = self.envs[0].observation_space
        self.action_space: gym.Space[Any] = self.envs[0].action_space

    @property
    def count(self) -> int:
        return len(self.envs)

    def reset(self, seed: int) -> np.ndarray:
        seed_simulator(seed + self.worker * WORKER_SEED_STRIDE)
        first = [env.reset(seed=seed + self.first_index + i)[0] for i, env in enumerate(self.envs)]
        return np.stack(first).astype(np.float64)

    def step(self, actions: np.ndarray) -> EnvSteps:
        count, shape = self.count, self.observation_space.shape or ()
        steps = EnvSteps(
            observations=np.zeros((count, *shape)),
            rewards=np.zeros(count),
            costs=np.zeros(count),
            terminated=np.zeros(count, bool),
            truncated=np.zeros(count, bool),
            next_observations=np.zeros((count, *shape)),
        )
        for i, env in enumerate(self.envs):
            observation, reward, terminated, truncated, info = env.step(actions[i])
            steps.observations[i] = steps.next_observations[i] = observation
            steps.rewards[i], steps.costs[i] = reward, float(info.get("cost", 0.0))
            steps.terminated[i], steps.truncated[i] = terminated, truncated
            if terminated or truncated:
                steps.next_observations[i] = env.reset()[0]
        return steps

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _serve(connection: Connection, task: str, count: int, first_index: int, worker: int) -> None:
    """A worker process: build its envs, then answer reset / step / close commands."""
    try:
        envs = LocalEnvs(task, count, first_index, worker)
        connection.send(("ready", (envs.observation_space, envs.action_space)))
        while True:
            command, payload = connection.recv()
            if command == "close":
                envs.close()
                return
            connection.send(
                ("ok", envs.reset(payload) if command == "reset" else envs.step(payload))
            )
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent cleans up
        return
    except Exception:
        connection.send(("error", traceback.format_exc()))


class WorkerEnvs:
    """`count` envs of a task split over `workers` processes, stepped in parallel."""

    def __init__(self, task: str, count: int, workers: int) -> None:
        # spawn: a fork would copy torch's thread pools and the parent's simulator state.
        context = multiprocessing.get_context("spawn")
        self.sizes = sizes = [len(part) for part in np.array_split(np.arange(count), workers)]
        self.connections: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for worker, size in enumerate(sizes):
            parent, child = context.Pipe()
            first_index = sum(sizes[:worker])
            process = context.Process(
                target=_serve, args=(child, task, size, first_index, worker), daemon=True
            )
            process.start()
            child.close()
            self.connections.append(parent)
            self.processes.append(process)
        try:
            spaces = [self._receive(worker) for worker in range(workers)]
        except BaseException:
            self.close()
            raise
        self.observation_space, self.action_space = spaces[0]

    @property
    def count(self) -> int:
        return sum(self.sizes)

    def _receive(self, worker: int) -> Any:
        try:
            status, payload = self.connections[worker].recv()
        except EOFError:
            self.processes[worker].join(timeout=1)
            code = self.processes[worker].exitcode
            raise RuntimeError(f"env worker {worker} exited (code {code})") from None
        if status == "error":
            raise RuntimeError(f"env worker {worker} failed:\n{payload}")
        return payload

    def reset(self, seed: int) -> np.ndarray:
        for connection in self.connections:
            connection.send(("reset", seed))
        return np.concatenate([self._receive(w) for w in range(len(self.connections))])

    def step(self, actions: np.ndarray) -> EnvSteps:
        bounds = np.cumsum([0, *self.sizes])
        for worker, connection in enumerate(self.connections):
            connection.send(("step", actions[bounds[worker] : bounds[worker + 1]]))
        return EnvSteps.concatenate([self._receive(w) for w in range(len(self.connections))])

    def close(self) -> None:
        for connection, process in zip(self.connections, self.processes, strict=True):
            if process.is_alive():
                try:
                    connection.send(("close", None))
                except (BrokenPipeError, OSError):
                    pass
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
            connection.close()


EnvGroup = LocalEnvs | WorkerEnvs


def open_envs(task: str, count: int, workers: int) -> EnvGroup:
    """The envs in this process when workers <= 1, else split over min(workers, count) processes."""
    if workers <= 1 or count == 1:
        return LocalEnvs(task, count)
    return WorkerEnvs(task, count, min(workers, count))
