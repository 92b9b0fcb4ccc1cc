"""Synthetic DSRL episodes and raw files shared by the data tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from training.data.dataset import Episode

OBS_DIM, ACT_DIM = 3, 2


def make_episode(rewards: Sequence[float], costs: Sequence[float], timeout: bool = True) -> Episode:
    """A synthetic episode whose observations count the steps (so order is checkable)."""
    length = len(rewards)
    steps = np.arange(length, dtype=np.float32)
    observations = np.repeat(steps[:, None], OBS_DIM, axis=1)  # [T, obs_dim]
    ends = np.zeros(length, dtype=bool)
    ends[-1] = True
    return Episode(
        observations=observations,
        next_observations=observations + 1.0,
        actions=np.full((length, ACT_DIM), 0.5, dtype=np.float32),
        rewards=np.asarray(rewards, dtype=np.float32),
        costs=np.asarray(costs, dtype=np.float32),
        terminals=ends & (not timeout),
        timeouts=ends & timeout,
    )


def raw_arrays(length: int = 6) -> dict[str, np.ndarray]:
    """Flat DSRL arrays of two episodes: rows 0-2 end in a terminal, rows 3-5 in a timeout."""
    terminals = np.zeros(length, dtype=bool)
    timeouts = np.zeros(length, dtype=bool)
    terminals[2], timeouts[length - 1] = True, True
    return {
        "observations": np.arange(length * OBS_DIM, dtype=np.float32).reshape(length, OBS_DIM),
        "next_observations": np.ones((length, OBS_DIM), dtype=np.float32),
        "actions": np.zeros((length, ACT_DIM), dtype=np.float32),
        "rewards": np.arange(1, length + 1, dtype=np.float32),  # 1 2 3 | 4 5 6
        "costs": np.array([0, 1, 0, 1, 1, 1][:length], dtype=np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
    }


def write_raw(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    with h5py.File(path, "w") as file:
        for key, array in arrays.items():
            file.create_dataset(key, data=array)
    return path
