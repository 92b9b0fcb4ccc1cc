"""Fixtures for the baseline tests: a seeded synthetic dataset and tiny configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.training.baselines.synthetic import ACTION_HIGH, ACTION_LOW, COST_LIMIT, tiny_episodes
from training.baselines.config import BaselineConfig
from training.data.dataset import OfflineDataset


@pytest.fixture(scope="session")
def tiny_dataset() -> OfflineDataset:
    """24 seeded episodes of 12 steps, cost returns spread from 0 to about 12."""
    return OfflineDataset(episodes=tiny_episodes(), attrs={"env_id": "TinyTask-v0"})


@pytest.fixture
def tiny_config(tmp_path: Path) -> Callable[..., BaselineConfig]:
    """A factory of small, fast configs: `tiny_config("bcq-lag", steps=50)`."""

    def make(algo: str, **overrides: object) -> BaselineConfig:
        config = BaselineConfig(
            algo=algo,  # type: ignore[arg-type]
            dataset=tmp_path / "tiny.hdf5",
            out=tmp_path / algo,
            cost_limit=COST_LIMIT,
            steps=60,
            batch_size=32,
            actor_hidden=(16, 16),
            critic_hidden=(16, 16),
            vae_hidden=16,
            sample_action_num=4,
            mmd_samples=4,
            gamma=0.5,
            action_low=ACTION_LOW,
            action_high=ACTION_HIGH,
            log_every=10,
        )
        return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]

    return make


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny networks run fastest (and do not fight other processes) on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
