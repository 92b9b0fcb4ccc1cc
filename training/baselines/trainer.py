"""The loop every baseline shares: select data, build a learner, take gradient steps.

A learner is an `nn.Module` with `update(batch) -> stats` (one gradient step on every network
it owns) and `policy_head() -> nn.Module`, the part that is exported. A head maps normalised
states [B, obs_dim] and the MT-BC condition [B] to (mean in [-1, 1], log-std in those units),
or (mean, None) for a deterministic policy.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from training.baselines.config import BaselineConfig
from training.baselines.data import (
    Normaliser,
    TransitionBatch,
    TransitionData,
    action_bounds,
    make_normaliser,
    select_episodes,
)
from training.data.dataset import OfflineDataset
from training.heap import keep_freed_memory

logger = logging.getLogger(__name__)


class Learner(Protocol):
    """What the shared loop needs from an algorithm."""

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One gradient step; returns scalar statistics (losses, multipliers)."""
        ...

    def policy_head(self) -> nn.Module:
        """The module to export (see the module docstring)."""
        ...


@dataclass(frozen=True)
class TrainingContext:
    """What a learner factory may read: the config, the data and the episode length."""

    config: BaselineConfig
    data: TransitionData
    episode_len: int


LearnerFactory = Callable[[TrainingContext], Learner]


@dataclass
class TrainedBaseline:
    """A trained baseline: its learner, the exported head's inputs and the training record."""

    config: BaselineConfig
    learner: Learner
    normaliser: Normaliser
    episode_len: int
    episodes_used: int
    history: list[dict[str, float]]
    """mean statistics of each `log_every` window of steps."""
    train_seconds: float
    """wall-clock time of the gradient steps (the compute budget the report states)."""

    @property
    def observation_dim(self) -> int:
        return int(self.normaliser.state_mean.shape[0])

    @property
    def action_dim(self) -> int:
        return int(self.normaliser.action_low.shape[0])


def fit(learner: Learner, data: TransitionData, config: BaselineConfig) -> list[dict[str, float]]:
    """Run `config.steps` updates on uniform batches; return per-window mean statistics."""
    generator = torch.Generator().manual_seed(config.seed)
    history: list[dict[str, float]] = []
    window: defaultdict[str, list[float]] = defaultdict(list)
    progress = tqdm(range(config.steps), desc=config.algo, unit="step", mininterval=5.0)
    for step in progress:
        stats = learner.update(data.sample(config.batch_size, generator))
        for key, value in stats.items():
            window[key].append(value)
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            means = {key: float(np.mean(values)) for key, values in window.items()}
            history.append({"step": float(step + 1), **means})
            progress.set_postfix({key: f"{value:.3g}" for key, value in means.items()})
            window.clear()
    return history


def train_with(
    factory: LearnerFactory, config: BaselineConfig, dataset: OfflineDataset
) -> TrainedBaseline:
    """Select the algorithm's data, build its learner with `factory`, and fit it."""
    torch.manual_seed(config.seed)
    keep_freed_memory()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    episodes = select_episodes(dataset.episodes, config.algo, config.cost_limit)
    normaliser = make_normaliser(episodes, action_bounds(dataset, config), config.cost_limit)
    data = TransitionData(episodes, normaliser, config)
    episode_len = config.episode_len or max(episode.length for episode in dataset.episodes)
    learner = factory(TrainingContext(config=config, data=data, episode_len=episode_len))
    started = time.perf_counter()
    history = fit(learner, data, config)
    return TrainedBaseline(
        config=config,
        learner=learner,
        normaliser=normaliser,
        episode_len=episode_len,
        episodes_used=len(episodes),
        history=history,
        train_seconds=time.perf_counter() - started,
    )


def adam(module: nn.Module | list[nn.Parameter], learning_rate: float) -> torch.optim.Adam:
    """Adam over a module's parameters or an explicit parameter list."""
    parameters = module.parameters() if isinstance(module, nn.Module) else module
    return torch.optim.Adam(parameters, lr=learning_rate)


def step(optimiser: torch.optim.Optimizer, loss: torch.Tensor) -> float:
    """zero_grad, backward, step; returns the loss as a float."""
    optimiser.zero_grad()
    torch.autograd.backward(loss)
    optimiser.step()
    return float(loss.detach())
