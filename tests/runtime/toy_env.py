"""A tiny deterministic env with the Bullet-Safety-Gym interface (cost in `info`)."""

from __future__ import annotations

from typing import Any

import numpy as np


class ToyEnv:
    """Observations from a seeded generator; reward and cost follow the action; fixed length."""

    def __init__(self, observation_dim: int = 7, action_dim: int = 2, length: int = 12) -> None:
        self.observation_dim, self.action_dim, self.length = observation_dim, action_dim, length
        self.rng = np.random.default_rng(0)
        self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        return self.rng.normal(size=self.observation_dim).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        reward = float(np.sum(action))
        cost = float(abs(action[0]) > 0.5)
        observation = self.rng.normal(size=self.observation_dim).astype(np.float32)
        return observation, reward, False, self.steps >= self.length, {"cost": cost}

    def close(self) -> None:
        pass


def toy_env_factory(task: str) -> ToyEnv:
    return ToyEnv()
