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
from pathlib import Path
from typing import Protocol, cast

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
from training.baselines.resume import Progress, resume_progress, write_progress
from training.data.dataset import OfflineDataset
from training.heap import keep_freed_memory
from training.interrupt import StopRequest, TrainingInterrupted

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
    """wall-clock time of the gradient steps (the compute budget the report states), over every
    part of a resumed run."""
    resumed_from: int | None = None
    """the step the last part of a resumed run started from (None: one part)."""

    @property
    def observation_dim(self) -> int:
        return int(self.normaliser.state_mean.shape[0])

    @property
    def action_dim(self) -> int:
        return int(self.normaliser.action_low.shape[0])


def fit(
    learner: Learner, data: TransitionData, config: BaselineConfig, progress_file: Path | None
) -> Progress:
    """Take the updates left of `config.steps` on uniform batches, continuing `progress_file`
    where it holds a run with these settings and writing it every `config.checkpoint_every`
    steps. Ctrl-C or SIGTERM stops after the current step: the file is written, then
    `TrainingInterrupted` raised. Without a file, nothing is saved and a signal acts at once."""
    sampler = torch.Generator().manual_seed(config.seed)
    module = cast(nn.Module, learner)  # every learner is one (the module docstring)
    progress = Progress()
    if progress_file is not None:
        progress = resume_progress(progress_file, config, module, sampler)
    window: defaultdict[str, list[float]] = defaultdict(list, progress.window)
    bar = tqdm(
        total=config.steps, initial=progress.step, desc=config.algo, unit="step", mininterval=5.0
    )
    started = time.perf_counter() - progress.seconds  # earlier parts of a resumed run count

    def save() -> None:
        assert progress_file is not None
        progress.seconds, progress.window = time.perf_counter() - started, dict(window)
        write_progress(progress_file, config, module, progress, sampler)

    with StopRequest(enabled=progress_file is not None) as stop:
        while progress.step < config.steps and not stop.requested:
            for key, value in learner.update(data.sample(config.batch_size, sampler)).items():
                window[key].append(value)
            progress.step += 1
            bar.update(1)
            if progress.step % config.log_every == 0 or progress.step == config.steps:
                means = {key: float(np.mean(values)) for key, values in window.items()}
                progress.history.append({"step": float(progress.step), **means})
                bar.set_postfix({key: f"{value:.3g}" for key, value in means.items()})
                window.clear()
            every = config.checkpoint_every
            if progress_file and every and progress.step % every == 0 and not stop.requested:
                save()
    bar.close()
    progress.seconds = time.perf_counter() - started
    if stop.requested:
        save()
        assert progress_file is not None
        hint = "run the same command again to continue"
        raise TrainingInterrupted(progress_file, progress.step, hint)
    return progress


def train_with(
    factory: LearnerFactory,
    config: BaselineConfig,
    dataset: OfflineDataset,
    progress_file: Path | None = None,
) -> TrainedBaseline:
    """Select the algorithm's data, build its learner with `factory`, and fit it (see `fit` for
    `progress_file`)."""
    torch.manual_seed(config.seed)
    keep_freed_memory()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    episodes = select_episodes(dataset.episodes, config.algo, config.cost_limit)
    normaliser = make_normaliser(episodes, action_bounds(dataset, config), config.cost_limit)
    data = TransitionData(episodes, normaliser, config)
    episode_len = config.episode_len or max(episode.length for episode in dataset.episodes)
    learner = factory(TrainingContext(config=config, data=data, episode_len=episode_len))
    progress = fit(learner, data, config, progress_file)
    return TrainedBaseline(
        config=config,
        learner=learner,
        normaliser=normaliser,
        episode_len=episode_len,
        episodes_used=len(episodes),
        history=progress.history,
        train_seconds=progress.seconds,
        resumed_from=progress.resumed_from,
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
