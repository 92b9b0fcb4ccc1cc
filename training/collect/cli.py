"""`cdt collect`: build an offline safe-RL dataset with PPO-Lagrangian and a rising cost threshold.

The paper's appendix ("Dataset Collection") trains PPO-Lagrangian while the cost threshold
rises from eps_1 to eps_2 between epochs n_1 and n_2, keeps every rollout, then thins the data
with a grid filter over (cost return, reward return). A run directory holds the raw rollouts of
every epoch and a resumable learner state, so an interrupted run loses at most one epoch (run the
same command again to resume). The output dataset (and its summary and plot beside it) is never
replaced without `--force`: that is checked, with the task and every value, before the first epoch.
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
import tyro
from tqdm import tqdm

from runtime.arguments import (
    AT_LEAST_0,
    AT_LEAST_1,
    FINITE_AT_LEAST_0,
    OPEN_UNIT_INTERVAL,
    unmet,
)
from runtime.files import check_writable, refuse_overwrite, write_atomic
from runtime.sim import check_task
from runtime.user_errors import UserError, exit_on_user_errors
from training.collect.env_workers import open_envs
from training.collect.ppo_lagrangian import ActorCritic, PpoSettings, RunningNormaliser, ppo_update
from training.collect.rollout_collector import EpisodeRecorder, collect_epoch
from training.data.dataset import REQUIRED_KEYS, Episode, load_dataset, save_dataset, split_episodes
from training.data.grid_filter import grid_filter
from training.data.summary import plot_returns, write_summary
from training.pid_lagrangian import PidLagrangian

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskSchedule:
    """One task's collection schedule: the threshold ramp and the PPO settings that differ."""

    epochs: int
    """n: PPO epochs."""
    steps_per_epoch: int
    """env steps per epoch, over all envs."""
    eps_1: float
    """cost threshold up to epoch n_1."""
    eps_2: float
    """cost threshold from epoch n_2 on."""
    n_1: int
    """epoch at which the threshold starts rising."""
    n_2: int
    """epoch at which the threshold reaches eps_2."""
    clip_ratio: float
    """PPO clip ratio eps_clip."""
    gae_lambda: float
    """GAE lambda, for both critics."""
    gamma: float
    """discount, for both critics."""


# The paper's table "hyperparameters for CPPO" (appendix, tab:dataset-hyperparameters) gives
# every field but steps per epoch. Ours give each task 1.2-2M env steps (the authors used about
# 2M) and every env at least one whole episode per epoch (time limits 200-300 steps, 8 envs).
# Fields: epochs, steps/epoch, eps_1, eps_2, n_1, n_2, clip, GAE lambda, gamma.
TASK_SCHEDULES: dict[str, TaskSchedule] = {
    "SafetyCarRun-v0": TaskSchedule(400, 5_000, 5.0, 80.0, 50, 400, 0.2, 0.97, 0.99),
    "SafetyAntRun-v0": TaskSchedule(210, 8_000, 5.0, 80.0, 45, 200, 0.2, 0.97, 0.99),
    "SafetyCarCircle-v0": TaskSchedule(210, 6_000, 5.0, 80.0, 50, 200, 0.2, 0.97, 0.99),
    "SafetyDroneCircle-v0": TaskSchedule(570, 3_000, 10.0, 80.0, 20, 550, 0.15, 0.95, 0.98),
    "SafetyDroneRun-v0": TaskSchedule(160, 8_000, 5.0, 80.0, 10, 150, 0.15, 0.95, 0.98),
    # Not in the paper: ours, 1.0M steps in about 17 min on 2 cores.
    "SafetyBallRun-v0": TaskSchedule(50, 20_000, 5.0, 80.0, 5, 40, 0.2, 0.95, 0.99),
}
DEFAULT_SCHEDULE = TaskSchedule(60, 20_000, 5.0, 100.0, 5, 45, 0.2, 0.95, 0.99)


@dataclass(frozen=True)
class CollectConfig:
    """Settings of one collection run."""

    task: str = "SafetyCarRun-v0"
    """gymnasium env id (Bullet-Safety-Gym task, or any env with a `cost` in `info`)."""
    out: Path | None = None
    """output HDF5 file (default datasets/<task>.hdf5)."""
    run_dir: Path | None = None
    """where raw rollouts and the resumable learner state live (default runs/collect/<task>)."""
    epochs: int | None = None
    """PPO epochs (default: the task's schedule)."""
    steps_per_epoch: int | None = None
    """env steps per epoch, over all envs (default: the task's schedule)."""
    threshold_start: float | None = None
    """eps_1: the cost threshold before epoch n_1."""
    threshold_end: float | None = None
    """eps_2: the cost threshold after epoch n_2."""
    rise_start_epoch: int | None = None
    """n_1: the epoch at which the threshold starts rising."""
    rise_end_epoch: int | None = None
    """n_2: the epoch at which the threshold reaches eps_2."""
    num_envs: int = 8
    """envs stepped together (the policy runs batched)."""
    env_workers: int = 1
    """processes that step the envs (1: this process). More pay on machines with spare cores; on
    2 cores the gain was within the machine's noise. The data depends on it (each process seeds
    its own simulator noise), so it is never taken from the machine's core count."""
    clip_ratio: float | None = None
    """PPO clip ratio (default: the task's schedule)."""
    gae_lambda: float | None = None
    """GAE lambda (default: the task's schedule)."""
    gamma: float | None = None
    """discount for both critics (default: the task's schedule)."""
    k_p: float = 0.1
    """PID multiplier: proportional gain."""
    k_i: float = 0.003
    """PID multiplier: integral gain."""
    k_d: float = 0.001
    """PID multiplier: derivative gain."""
    cost_bins: int = 25
    """grid filter: cells along the cost-return axis."""
    reward_bins: int = 25
    """grid filter: cells along the reward-return axis."""
    max_per_cell: int = 10
    """grid filter: most trajectories kept per cell."""
    seed: int = 0
    """seed of envs, policy and filter."""
    finalize_only: bool = False
    """skip learning: filter the raw rollouts already in run_dir and write the dataset."""
    force: bool = False
    """replace the output dataset (and its .json summary and .png plot) when it exists already,
    e.g. a shipped `datasets/<task>.hdf5`; without it the command stops before any work."""

    def __post_init__(self) -> None:
        """Refuse values no collection can run with (a `UserError`: one line, exit 2)."""
        if problems := self.problems():
            raise UserError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every value no collection can run with, one phrase each."""
        counts: dict[str, int | None] = {"--num-envs": self.num_envs}
        counts |= {"--env-workers": self.env_workers}
        counts |= {"--epochs": self.epochs, "--steps-per-epoch": self.steps_per_epoch}
        counts |= {"--cost-bins": self.cost_bins, "--reward-bins": self.reward_bins}
        counts |= {"--max-per-cell": self.max_per_cell}
        epochs: dict[str, int | None] = {"--rise-start-epoch": self.rise_start_epoch}
        epochs |= {"--rise-end-epoch": self.rise_end_epoch}
        numbers: dict[str, float | None] = {"--threshold-start": self.threshold_start}
        numbers |= {"--threshold-end": self.threshold_end, "--k-p": self.k_p}
        numbers |= {"--k-i": self.k_i, "--k-d": self.k_d}
        shares: dict[str, float | None] = {"--clip-ratio": self.clip_ratio}
        shares |= {"--gae-lambda": self.gae_lambda}
        shares |= {"--gamma": self.gamma}
        found = unmet(AT_LEAST_1, counts) + unmet(AT_LEAST_0, epochs)
        found += unmet(FINITE_AT_LEAST_0, numbers) + unmet(OPEN_UNIT_INTERVAL, shares)
        schedule = None if found else self.schedule()
        if schedule is not None and schedule.n_1 > schedule.n_2:
            found.append(
                f"the threshold must start rising (epoch {schedule.n_1}) no later than it"
                f" reaches its end value (epoch {schedule.n_2})"
            )
        return found

    def schedule(self) -> TaskSchedule:
        """The task's schedule, with each field given on the command line in its place."""
        given: dict[str, Any] = {
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "eps_1": self.threshold_start,
            "eps_2": self.threshold_end,
            "n_1": self.rise_start_epoch,
            "n_2": self.rise_end_epoch,
            "clip_ratio": self.clip_ratio,
            "gae_lambda": self.gae_lambda,
            "gamma": self.gamma,
        }
        default = TASK_SCHEDULES.get(self.task, DEFAULT_SCHEDULE)
        return dataclasses.replace(default, **{k: v for k, v in given.items() if v is not None})

    @property
    def output_path(self) -> Path:
        return self.out or Path("datasets") / f"{self.task}.hdf5"

    @property
    def run_path(self) -> Path:
        return self.run_dir or Path("runs") / "collect" / self.task


def cost_threshold(epoch: int, eps1: float, eps2: float, n1: int, n2: int) -> float:
    """The paper's rising threshold: eps_1 before n_1, linear to eps_2 at n_2, eps_2 after."""
    if epoch <= n1:
        return eps1
    if epoch >= n2:
        return eps2
    return eps1 + (eps2 - eps1) * (epoch - n1) / (n2 - n1)


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
    threshold = cost_threshold(epoch, schedule.eps_1, schedule.eps_2, schedule.n_1, schedule.n_2)
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
    schedule = config.schedule()
    config.run_path.mkdir(parents=True, exist_ok=True)
    settings = {**dataclasses.asdict(config), "schedule": dataclasses.asdict(schedule)}
    text = json.dumps(settings, default=str)
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
            range(learner.first_epoch, schedule.epochs),
            desc=f"collect {config.task}",
            unit="epoch",
            initial=learner.first_epoch,
            total=schedule.epochs,
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
    attrs = {
        "env_id": config.task,
        "collector": "PPO-Lagrangian (PID multiplier), rising cost threshold",
        "schedule": dataclasses.asdict(config.schedule()),
        "grid_filter": {
            "cost_bins": config.cost_bins,
            "reward_bins": config.reward_bins,
            "max_per_cell": config.max_per_cell,
        },
        "raw_episodes": len(episodes),
        "seed": config.seed,
    }
    path = save_dataset(config.output_path, kept, attrs)
    dataset = load_dataset(path)
    write_summary(dataset, path.with_suffix(".json"))
    plot_returns(dataset, path.with_suffix(".png"), thresholds=(10.0, 20.0, 40.0))
    logger.info("kept %d of %d episodes -> %s", len(kept), len(episodes), path)
    return path


def output_paths(config: CollectConfig) -> list[Path]:
    """The dataset and the summary and plot written beside it."""
    path = config.output_path
    return [path, path.with_suffix(".json"), path.with_suffix(".png")]


def check_before_collecting(config: CollectConfig) -> None:
    """The task exists and the outputs may be written (none replaced without --force)."""
    try:
        check_task(config.task)
    except ValueError as error:
        raise UserError(str(error)) from None
    check_writable(config.output_path, option="--out")
    hint = "give another --out, or pass --force to replace it"
    refuse_overwrite(output_paths(config), config.force, hint)
    check_writable(config.run_path, folder=True, option="--run-dir")


@exit_on_user_errors("cdt collect")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt collect`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = tyro.cli(CollectConfig, args=argv, prog="cdt collect")
    check_before_collecting(config)
    if not config.finalize_only:
        learn(config)
    path = finalize(config)
    print(f"dataset written: {path}")


if __name__ == "__main__":
    main()
