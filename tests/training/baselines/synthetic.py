"""A seeded synthetic dataset small enough to train every baseline in a fraction of a second."""

from __future__ import annotations

import numpy as np

from training.data.dataset import Episode

OBSERVATION_DIM, ACTION_DIM, EPISODE_LEN, EPISODES = 3, 2, 12, 24
ACTION_LOW, ACTION_HIGH = (-1.0, -2.0), (1.0, 2.0)
COST_LIMIT = 4.0


def _episode(rng: np.random.Generator, index: int) -> Episode:
    """States drift; actions follow a fixed linear-tanh policy; costs rise with the index."""
    states = rng.normal(size=(EPISODE_LEN + 1, OBSERVATION_DIM)).astype(np.float32)
    weights = np.array([[0.8, -0.5], [0.3, 0.9], [-0.6, 0.2]], dtype=np.float32)
    unit = np.tanh(states[:-1] @ weights) * 0.9  # [T, act_dim] in (-1, 1)
    actions = unit * np.array(ACTION_HIGH, dtype=np.float32)
    costs = (rng.random(EPISODE_LEN) < index / EPISODES).astype(np.float32)
    rewards = (1.0 - np.abs(unit[:, 0] - 0.5) - 0.1 * costs).astype(np.float32)
    terminals = np.zeros(EPISODE_LEN, dtype=bool)
    timeouts = np.zeros(EPISODE_LEN, dtype=bool)
    timeouts[-1] = True
    return Episode(
        states[:-1], states[1:], actions.astype(np.float32), rewards, costs, terminals, timeouts
    )


def tiny_episodes(seed: int = 0) -> list[Episode]:
    """24 episodes of 12 steps whose cost returns spread from 0 to about 12."""
    rng = np.random.default_rng(seed)
    return [_episode(rng, index) for index in range(EPISODES)]
