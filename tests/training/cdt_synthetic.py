"""Small synthetic datasets for the CDT tests (seeded, built from Episode objects)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data.dataset import Episode, save_dataset
from training.learn.config import TrainConfig

STATE_DIM, ACTION_DIM = 7, 2


def make_episode(rng: np.random.Generator, length: int, cost_rate: float) -> Episode:
    """An episode whose actions depend on its states, so a policy has something to learn."""
    observations = rng.normal(size=(length + 1, STATE_DIM)).astype(np.float32)
    actions = np.tanh(observations[:-1, :ACTION_DIM] + 0.1 * rng.normal(size=(length, ACTION_DIM)))
    rewards = rng.uniform(0.0, 2.0, size=length).astype(np.float32)
    costs = (rng.uniform(size=length) < cost_rate).astype(np.float32)
    timeouts = np.zeros(length, dtype=bool)
    timeouts[-1] = True
    return Episode(
        observations=observations[:-1],
        next_observations=observations[1:],
        actions=actions.astype(np.float32),
        rewards=rewards,
        costs=costs,
        terminals=np.zeros(length, dtype=bool),
        timeouts=timeouts,
    )


def make_episodes(count: int = 24, seed: int = 0, max_length: int = 30) -> list[Episode]:
    rng = np.random.default_rng(seed)
    return [
        make_episode(rng, int(rng.integers(3, max_length)), float(rng.uniform(0.0, 0.6)))
        for _ in range(count)
    ]


def write_dataset(path: Path, count: int = 24, seed: int = 0) -> Path:
    return save_dataset(path, make_episodes(count, seed), {"env_id": "SafetyBallRun-v0"})


def tiny_config(dataset: Path, out_dir: Path, **overrides: object) -> TrainConfig:
    """A model and run small enough for a test: a handful of steps, no simulator."""
    values: dict[str, object] = {
        "dataset": dataset,
        "out_dir": out_dir,
        "run_name": "run",
        "embedding_dim": 16,
        "num_layers": 2,
        "num_heads": 2,
        "batch_size": 4,
        "update_steps": 2,
        "eval_every": 0,
        "log_every": 1,
        "checkpoint_every": 1000,
        "tensorboard": False,
        "num_threads": 1,
    }
    values.update(overrides)
    return TrainConfig(**values)  # type: ignore[arg-type]
