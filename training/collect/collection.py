"""One `cdt collect` run: PPO-Lagrangian epochs that keep every rollout, then the dataset.

`learn` runs (or resumes) the epochs, saving each epoch's raw rollouts and the learner state in
the run directory; `finalize` grid-filters the raw rollouts and writes the HDF5 file with its
summary and plot. The settings and the command are `cli.py`'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from runtime.files import write_atomic
from runtime.user_errors import UserError
from training.collect.env_workers import open_envs
from training.collect.ppo_lagrangian import ActorCritic, PpoSettings, RunningNormaliser, ppo_update
from training.collect.rollout_collector import EpisodeRecorder, collect_epoch
from training.collect.settings import (
    CollectConfig,
    TaskSchedule,
    check_resume,
    collected_epochs,
    run_settings,
)
from training.data.dataset import REQUIRED_KEYS, Episode, load_dataset, save_dataset, split_episodes
from training.data.grid_filter import grid_filter
from training.data.summary import plot_returns, write_summary
from training.pid_lagrangian import PidLagrangian

logger = logging.getLogger(__name__)


def _learner_state(
    model: ActorCritic,
    optimiser: torch.optim.Optimizer,
    pid: PidLagrangian,
    normaliser: RunningNormaliser,
    epoch: int,
) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimiser": optimiser.state_dict(),
        "pid": dataclasses.asdict(pid),
        "normaliser": {
            "mean": torch.as_tensor(normaliser.mean),
            "var": torch.as_tensor(normaliser.var),
            "count": normaliser.count,
        },
        "epoch": epoch,
    }


def _restore(
    path: Path,
    model: ActorCritic,
    optimiser: torch.optim.Optimizer,
    normaliser: RunningNormaliser,
) -> tuple[PidLagrangian, int]:
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["model"])
    optimiser.load_state_dict(state["optimiser"])
    normaliser.mean = state["normaliser"]["mean"].numpy()
    normaliser.var = state["normaliser"]["var"].numpy()
    normaliser.count = float(state["normaliser"]["count"])
    return PidLagrangian(**state["pid"]), int(state["epoch"]) + 1


def _save_raw_epoch(run_path: Path, epoch: int, episodes: list[Episode], threshold: float) -> None:
    raw = run_path / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    if not episodes:
        return
    arrays = {key: np.concatenate([getattr(e, key) for e in episodes]) for key in REQUIRED_KEYS}
    temporary = raw / f".epoch_{epoch:04d}.tmp.npz"
    np.savez_compressed(temporary, threshold=np.float64(threshold), **arrays)  # type: ignore[arg-type]
    os.replace(temporary, raw / f"epoch_{epoch:04d}.npz")


def load_raw_episodes(run_path: Path) -> tuple[list[Episode], list[int]]:
    """All episodes kept in a run's raw folder, with the epoch each came from."""
    episodes: list[Episode] = []
    epochs: list[int] = []
    for chunk in sorted((run_path / "raw").glob("epoch_*.npz")):
        with np.load(chunk) as data:
            found = split_episodes({key: data[key] for key in REQUIRED_KEYS})
        episodes += found
        epochs += [int(chunk.stem.split("_")[1])] * len(found)
    return episodes, epochs


@dataclass
class _Learner:
    """Everything one collection run updates from epoch to epoch."""

    model: ActorCritic
    optimiser: torch.optim.Optimizer
    normaliser: RunningNormaliser
    pid: PidLagrangian
    first_epoch: int


def _make_learner(config: CollectConfig, observation_dim: int, action_dim: int) -> _Learner:
    """A fresh learner, or the one saved in the run directory (resume)."""
    model = ActorCritic(observation_dim, action_dim)
    optimiser = torch.optim.Adam(model.parameters(), lr=PpoSettings().learning_rate)
    normaliser = RunningNormaliser(observation_dim)
    state_path = config.run_path / "learner.pt"
    if not state_path.exists():
        pid = PidLagrangian(config.k_p, config.k_i, config.k_d)
        return _Learner(model, optimiser, normaliser, pid, 0)
    pid, first_epoch = _restore(state_path, model, optimiser, normaliser)
    logger.info("resuming %s at epoch %d", config.run_path, first_epoch)
    return _Learner(model, optimiser, normaliser, pid, first_epoch)


def _run_epoch(
    config: CollectConfig,
    schedule: TaskSchedule,
    learner: _Learner,
    recorder: EpisodeRecorder,
    epoch: int,
) -> dict[str, str]:
    """Roll out, update the multiplier and policy, save raw data and learner; progress fields."""
    threshold = schedule.threshold(epoch)
    result = collect_epoch(
        recorder,
        learner.model,
        learner.normaliser,
        schedule.steps_per_epoch,
        schedule.gamma,
        schedule.gae_lambda,
    )
    mean_cost = result.mean_cost if result.episodes else learner.pid.previous_cost
    multiplier = learner.pid.update(mean_cost, threshold)
    generator = torch.Generator().manual_seed(config.seed * 10_000 + epoch)
    settings = PpoSettings(clip_ratio=schedule.clip_ratio)
    ppo_update(learner.model, learner.optimiser, result.batch, multiplier, settings, generator)
    _save_raw_epoch(config.run_path, epoch, result.episodes, threshold)
    state = _learner_state(learner.model, learner.optimiser, learner.pid, learner.normaliser, epoch)
    write_atomic(config.run_path / "learner.pt", lambda temporary: torch.save(state, temporary))
    return {
        "threshold": f"{threshold:.1f}",
        "reward": f"{result.mean_reward:.1f}",
        "cost": f"{result.mean_cost:.1f}",
        "lam": f"{multiplier:.3f}",
    }


def learn(config: CollectConfig) -> None:
    """Run (or resume) PPO-Lagrangian, keeping every finished episode as raw data."""
    check_resume(config)  # the pipeline's collect stage comes here without the command's checks
    schedule = config.schedule()
    config.run_path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(run_settings(config))
    write_atomic(config.run_path / "config.json", lambda temporary: temporary.write_text(text))
    torch.manual_seed(config.seed)
    # The networks are tiny: extra intra-op threads only fight the simulator for the cores. The
    # count is restored after, or a `cdt pipeline` would train in the same process on one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    envs = open_envs(config.task, config.num_envs, config.env_workers)
    try:
        observation_dim = int(np.prod(envs.observation_space.shape or (1,)))
        action_dim = int(np.prod(envs.action_space.shape or (1,)))
        learner = _make_learner(config, observation_dim, action_dim)
        recorder = EpisodeRecorder(envs, seed=config.seed * 10_000 + learner.first_epoch)
        progress = tqdm(
            range(learner.first_epoch, schedule.total_epochs),
            desc=f"collect {config.task}",
            unit="epoch",
            initial=learner.first_epoch,
            total=schedule.total_epochs,
        )
        for epoch in progress:
            started = time.perf_counter()
            fields = _run_epoch(config, schedule, learner, recorder, epoch)
            speed = schedule.steps_per_epoch / (time.perf_counter() - started)
            progress.set_postfix(**fields, steps_s=f"{speed:.0f}")
    finally:
        envs.close()
        torch.set_num_threads(threads)


def finalize(config: CollectConfig) -> Path:
    """Grid-filter the raw rollouts, write the HDF5 file, its JSON summary and scatter plot."""
    episodes, _ = load_raw_episodes(config.run_path)
    if not episodes:
        raise UserError(f"no raw rollouts in {config.run_path / 'raw'}")
    rewards = np.array([e.reward_return for e in episodes])
    costs = np.array([e.cost_return for e in episodes])
    keep = grid_filter(
        costs,
        rewards,
        config.cost_bins,
        config.reward_bins,
        config.max_per_cell,
        rng=np.random.default_rng(config.seed),
    )
    kept = [episodes[i] for i in sorted(keep)]
    schedule, collected = config.schedule(), collected_epochs(config.run_path)
    if collected < schedule.total_epochs:  # a stopped run, finalized as it stands
        logger.warning(
            "%s holds %d of the schedule's %d epochs: the dataset records epochs_collected %d",
            config.run_path, collected, schedule.total_epochs, collected,
        )  # fmt: skip
    falling = "" if schedule.fall_to is None else f", then falling to {schedule.fall_to:g}"
    attrs = {
        "env_id": config.task,
        "collector": f"PPO-Lagrangian (PID multiplier), rising cost threshold{falling}",
        "schedule": dataclasses.asdict(schedule),
        "grid_filter": {
            "cost_bins": config.cost_bins,
            "reward_bins": config.reward_bins,
            "max_per_cell": config.max_per_cell,
        },
        "raw_episodes": len(episodes),
        "epochs_collected": collected,
        "seed": config.seed,
    }
    path = save_dataset(config.output_path, kept, attrs)
    dataset = load_dataset(path)
    write_summary(dataset, path.with_suffix(".json"))
    plot_returns(dataset, path.with_suffix(".png"), thresholds=(10.0, 20.0, 40.0))
    logger.info("kept %d of %d episodes -> %s", len(kept), len(episodes), path)
    return path
