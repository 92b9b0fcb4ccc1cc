"""The settings of `cdt collect`: an offline safe-RL dataset from PPO-Lagrangian and a rising
cost threshold.

The paper's appendix ("Dataset Collection") trains PPO-Lagrangian while the cost threshold
rises from eps_1 to eps_2 between epochs n_1 and n_2, keeps every rollout, then thins the data
with a grid filter over (cost return, reward return). A falling phase may follow the ramp
(`--fall-to`, ours, not the paper's): the threshold then falls to a tight value, so that an agent
that has learned the task learns to keep a tight budget too. A run directory holds the raw
rollouts of every epoch and a resumable learner state, so an interrupted run loses at most one
epoch (run the same command again to resume). A resumed run keeps the settings its epochs were
collected with (`check_resume`), so one dataset never mixes two collections. The output dataset
(and its summary and plot beside it) is never replaced without `--force`: that is checked, with
the task and every value, before the first epoch.
Here: the settings (schedules, thresholds, outputs); the command is `cli.py`, the run is
`collection.py`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.arguments import (
    AT_LEAST_0,
    AT_LEAST_1,
    FINITE_AT_LEAST_0,
    OPEN_UNIT_INTERVAL,
    unmet,
)
from runtime.user_errors import UserError


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
    fall_to: float | None = None
    """eps_3, not the paper's: after the last epoch of the ramp above, the threshold falls
    linearly from eps_2 to this over `fall_epochs` more epochs, then holds for `hold_epochs`
    (None: no falling phase). An agent that has learned the task at a loose threshold then
    learns to keep a tight one: the data gain episodes that are both rewarding and safe."""
    fall_epochs: int = 0
    """epochs over which the threshold falls from eps_2 to eps_3."""
    hold_epochs: int = 0
    """epochs at eps_3 after the fall."""

    @property
    def total_epochs(self) -> int:
        """Epochs of the whole run: the ramp's, then the falling phase's (0 without one)."""
        return self.epochs + self.fall_epochs + self.hold_epochs

    def threshold(self, epoch: int) -> float:
        """The cost threshold at `epoch`: the paper's ramp, then the falling phase."""
        if self.fall_to is None or epoch <= self.epochs:
            return cost_threshold(epoch, self.eps_1, self.eps_2, self.n_1, self.n_2)
        start = self.epochs
        return cost_threshold(epoch, self.eps_2, self.fall_to, start, start + self.fall_epochs)


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
    fall_to: float | None = None
    """eps_3 (not the paper's): after the schedule's last epoch, the threshold falls linearly
    from eps_2 to this over --fall-epochs more epochs, then holds for --hold-epochs. None: the
    paper's schedule alone."""
    fall_epochs: int = 0
    """epochs of the fall to --fall-to."""
    hold_epochs: int = 0
    """epochs at --fall-to after the fall."""
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
        epochs |= {"--fall-epochs": self.fall_epochs, "--hold-epochs": self.hold_epochs}
        epochs |= {"--seed": self.seed}  # numpy refuses a negative seed only at the filter
        numbers: dict[str, float | None] = {"--threshold-start": self.threshold_start}
        numbers |= {"--threshold-end": self.threshold_end, "--k-p": self.k_p}
        numbers |= {"--k-i": self.k_i, "--k-d": self.k_d, "--fall-to": self.fall_to}
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
        if self.fall_to is None and (self.fall_epochs or self.hold_epochs):
            found.append("--fall-epochs and --hold-epochs need --fall-to")
        if self.fall_to is not None and self.fall_epochs + self.hold_epochs == 0:
            found.append("--fall-to needs --fall-epochs or --hold-epochs (epochs after the ramp)")
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
            "fall_to": self.fall_to,
            "fall_epochs": self.fall_epochs,
            "hold_epochs": self.hold_epochs,
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


def output_paths(config: CollectConfig) -> list[Path]:
    """The dataset and the summary and plot written beside it."""
    path = config.output_path
    return [path, path.with_suffix(".json"), path.with_suffix(".png")]


# What a resumed run keeps (flag by config or schedule field): the data's seeds and the learner's
# settings. `--epochs` and the thresholds of epochs not yet collected may change (a run extended
# by a falling phase), and so may where it writes, its env processes and the grid filter.
KEPT_ON_RESUME = {"task": "--task", "seed": "--seed", "num_envs": "--num-envs"}
KEPT_ON_RESUME |= {"k_p": "--k-p", "k_i": "--k-i", "k_d": "--k-d"}
KEPT_SCHEDULE = {"steps_per_epoch": "--steps-per-epoch", "clip_ratio": "--clip-ratio"}
KEPT_SCHEDULE |= {"gae_lambda": "--gae-lambda", "gamma": "--gamma"}
THRESHOLD_FLAGS = {"eps_1": "--threshold-start", "eps_2": "--threshold-end", "epochs": "--epochs"}
THRESHOLD_FLAGS |= {"n_1": "--rise-start-epoch", "n_2": "--rise-end-epoch", "fall_to": "--fall-to"}
THRESHOLD_FLAGS |= {"fall_epochs": "--fall-epochs", "hold_epochs": "--hold-epochs"}


def run_settings(config: CollectConfig) -> dict[str, Any]:
    """The run folder's `config.json`: every setting and the resolved schedule, as JSON values."""
    settings = {**dataclasses.asdict(config), "schedule": dataclasses.asdict(config.schedule())}
    return dict(json.loads(json.dumps(settings, default=str)))


def collected_epochs(run_path: Path) -> int:
    """Epochs a run folder holds rollouts of: the last one's number + 1 (0: none)."""
    numbers = [int(path.stem.split("_")[1]) for path in (run_path / "raw").glob("epoch_*.npz")]
    return max(numbers) + 1 if numbers else 0


def _changes(saved: dict[str, Any], now: dict[str, Any], flags: dict[str, str]) -> list[str]:
    return [
        f"{flag} {saved.get(key)} -> {now.get(key)}"
        for key, flag in flags.items()
        if saved.get(key) != now.get(key)
    ]


def resume_changes(saved: dict[str, Any], config: CollectConfig, collected: int) -> list[str]:
    """The settings `config` changes of a run folder whose first `collected` epochs were
    collected with `saved` (its config.json) that its data would then mix, as `--flag old -> new`:
    a kept one (`KEPT_ON_RESUME`, `KEPT_SCHEDULE`), or the threshold of an epoch collected."""
    now = run_settings(config)
    old, new = saved.get("schedule") or {}, now["schedule"]
    changes = _changes(saved, now, KEPT_ON_RESUME) + _changes(old, new, KEPT_SCHEDULE)
    fields = {field.name for field in dataclasses.fields(TaskSchedule)}
    try:
        before = TaskSchedule(**{key: value for key, value in old.items() if key in fields})
    except TypeError:  # a schedule saved without its fields: no threshold to compare
        return [*changes, "the saved schedule is incomplete"]
    after = config.schedule()
    if any(before.threshold(epoch) != after.threshold(epoch) for epoch in range(collected)):
        changes += _changes(old, new, THRESHOLD_FLAGS)
    return changes


def check_resume(config: CollectConfig) -> None:
    """Refuse (a `UserError`) to continue, or finalize, a run folder with settings that differ
    from those its rollouts were collected with (`resume_changes`): the dataset would mix two
    collections under one recorded schedule and seed."""
    collected, saved_file = collected_epochs(config.run_path), config.run_path / "config.json"
    if collected == 0 or not saved_file.is_file():
        return
    try:
        saved = json.loads(saved_file.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"{saved_file}: not readable JSON ({error})") from None
    if changes := resume_changes(saved, config, collected):
        raise UserError(
            f"{config.run_path} holds {collected} epochs collected with other settings"
            f" ({', '.join(changes)}): collect with those, or give another --run-dir"
        )
