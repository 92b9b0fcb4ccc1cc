"""`cdt train`: parse and check the settings first, then import torch and train.

Parsing needs no torch, so `cdt train --help` and a missing dataset answer at once. Every value is
checked before the data is loaded (`check_config`), and a run directory that holds an earlier run
is never reused without `--resume` (`check_run_dir`): the command stops in one line instead, so a
rerun can never leave an older run's `best.pt` beside a newer `last.pt`. Then, still before a run
folder or a ledger line exists, the settings are checked against the dataset and this machine
(`check_inputs`: context length, the memory of one step, and the simulator that in-loop evaluation
needs). A resumed run is checked, and recorded, with its own settings (`parse_config`).

This command sits above learn/ and evaluation/: it hands the training loop
(`training.learn.train.train`) the checkpoint evaluation in the simulator
(`checkpoint_scores.score_in_training`), so learn/ never imports evaluation code. Baselines
(`--algo bc-safe`, ...) go to `training.baselines.cli`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from typing import Any

from runtime.arguments import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    UNIT_INTERVAL,
    unmet,
)
from runtime.sim import make_env
from runtime.user_errors import (
    UserError,
    exit_on_user_errors,
    install_hint,
    missing_extra,
    user_error_types,
)
from training.data.dataset import OfflineDataset, load_dataset, read_task
from training.learn.checks import SEED_RANGE, THREADS_PER_CORE, check_training_data, thread_cap
from training.learn.config import ConfigError, TrainConfig, parse_config
from training.run_lock import LOCK_FILE

logger = logging.getLogger(__name__)

RESUME_FLAGS = ("--resume", "--update-steps")
"""The flags a resumed run reads; it takes every other setting from its checkpoint."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _non_finite(config: TrainConfig) -> list[str]:
    """Every float setting (or entry of a tuple of floats) that is NaN or infinite."""
    found = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            found.append(f"{_flag(field.name)} must be finite, got {value}")
    return found


def config_problems(config: TrainConfig) -> list[str]:
    """Every setting no run can train with, one phrase each (TrainConfig checks a few more)."""
    values = {
        _flag(field.name): getattr(config, field.name) for field in dataclasses.fields(config)
    }

    def pick(*names: str) -> dict[str, float | None]:
        return {_flag(name): values[_flag(name)] for name in names}

    found = _non_finite(config)
    found += unmet(
        AT_LEAST_1,
        pick("update_steps", "eval_episodes", "log_every", "checkpoint_every", "num_threads"),
    )
    found += unmet(AT_LEAST_1, pick("embedding_dim", "num_layers", "num_heads"))
    found += unmet(SEED_RANGE, pick("seed"))
    found += unmet(AT_LEAST_0, pick("eval_every", "warmup_steps", "fail_fast_step"))
    positive = ("learning_rate", "clip_grad", "reward_scale", "cost_scale", "selection_cost_margin")
    found += unmet(POSITIVE, pick(*positive, "association_beta"))
    shares = ("selection_max_share_over", "selection_min_budget_use", "min_lr_fraction")
    found += unmet(UNIT_INTERVAL, pick(*shares, "association_max_reward_drop"))
    found += unmet(AT_LEAST_0, pick("weight_decay", "entropy_weight", "augment_fraction"))
    if not all(0 <= beta < 1 for beta in config.betas):
        found.append(f"--betas must lie in [0, 1), got {config.betas}")
    found += _shape_problems(config) + _machine_problems(config) + _compile_problems(config)
    first = {problem.split(" ", 1)[0]: problem for problem in reversed(found)}  # one per flag
    return [problem for problem in found if first[problem.split(" ", 1)[0]] == problem]


def _shape_problems(config: TrainConfig) -> list[str]:
    """Sizes the model and the data pipeline cannot be built with."""
    found = []
    width, heads = config.embedding_dim, config.num_heads
    if width >= 1 and heads >= 1 and width % heads:
        # each head attends over an equal slice of the embedding (CausalSelfAttention)
        found.append(
            f"--embedding-dim must be a multiple of --num-heads ({config.num_heads}), "
            f"got {config.embedding_dim}"
        )
    if not config.eval_budgets:
        # not only selection: the relabelled cost cap, the token ranges, the probe and the model
        # card's default targets all read them, so an empty list cannot mean "no evaluation"
        found.append(
            "--eval-budgets must name at least one budget, got none "
            "(to train without in-loop evaluation, pass --eval-every 0)"
        )
    if any(bins < 1 for bins in config.outlier_grid):
        found.append(f"--outlier-grid must be at least 1 bin each way, got {config.outlier_grid}")
    return found


def _machine_problems(config: TrainConfig) -> list[str]:
    """Settings this machine cannot run. Not for a resumed run: its thread count came from the
    machine it started on, and `prepare_training` caps it to this one's instead."""
    cap = thread_cap()
    if config.resume is not None or config.num_threads is None or config.num_threads <= cap:
        return []
    cores = cap // THREADS_PER_CORE
    return [
        f"--num-threads must be at most {cap} ({THREADS_PER_CORE} per CPU core, {cores} here), "
        f"got {config.num_threads}"
    ]


def _compile_problems(config: TrainConfig) -> list[str]:
    """`--compile` on a CPU: torch 2.13's generated CPU code corrupted the heap of a `cpu-budget`
    training on an Intel Xeon (docs/decisions/training-speed.md), so it is for GPUs only."""
    if not config.compile or config.device.startswith("cuda"):
        return []
    return [
        f"--compile is for CUDA devices, not {config.device}: torch.compile's CPU code crashed "
        "this model's training (torch 2.13, docs/decisions/training-speed.md)"
    ]


def check_config(config: TrainConfig) -> None:
    """Raise `UserError` naming every setting no run can train with."""
    if problems := config_problems(config):
        raise UserError("; ".join(problems))


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (imports torch)."""
    import torch

    try:
        chosen = torch.device(device)
    except RuntimeError as error:
        raise UserError(f"--device {device}: {error}") from None
    if chosen.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise UserError(f"--device {device}: this machine has no CUDA GPU (use --device cpu)")
    if chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} GPUs")


def warn_ignored_flags(config: TrainConfig, argv: list[str]) -> None:
    """A resumed run trains with its own settings (`parse_config` reads them): name the flags
    given in vain."""
    if config.resume is None:
        return
    given = [arg.split("=")[0] for arg in argv if arg.startswith("--")]
    if ignored := [flag for flag in given if flag not in RESUME_FLAGS]:
        logger.warning("--resume continues the run as it was: ignored %s", " ".join(ignored))


def _size(space: Any) -> int:
    return int(math.prod(getattr(space, "shape", None) or (1,)))


def _env_sizes(task: str) -> tuple[int, int]:
    """(observation size, action size) of `task`'s env: made once and closed (~0.3 s); an id no
    env has raises `UnknownTask`."""
    env = make_env(task)
    try:
        return _size(env.observation_space), _size(env.action_space)
    finally:
        env.close()


def check_simulator(config: TrainConfig, dataset: OfflineDataset) -> None:
    """With in-loop evaluation on, refuse a dataset whose task the simulator cannot run: without
    this the run trains, then fails at its first evaluation and leaves a folder with no last.pt."""
    if config.eval_every == 0:
        return
    off = "pass --eval-every 0 to train without in-loop evaluation"
    if "env_id" not in dataset.attrs:
        raise UserError(f"--dataset {config.dataset} names no task (no env_id attribute): {off}")
    try:
        sizes = _env_sizes(dataset.task)
    except ModuleNotFoundError as error:
        extra = missing_extra(error)
        if extra is None:
            raise
        hint = install_hint(error.name or "", extra)
        raise UserError(f"in-loop evaluation {hint}; or {off}") from None
    except Exception as error:
        if not isinstance(error, (ValueError, *user_error_types("gymnasium.error.Error"))):
            raise
        raise UserError(
            f"--dataset {config.dataset} names a task the simulator cannot make, and in-loop "
            f"evaluation needs it ({off}): {error}"
        ) from None
    data = (dataset.observation_dim, dataset.action_dim)
    if sizes != data:
        raise UserError(
            f"--dataset {config.dataset} has {data[0]} observations and {data[1]} actions, but "
            f"its task {dataset.task} has {sizes[0]} and {sizes[1]}, so in-loop evaluation "
            f"cannot run it: {off}"
        )


def check_inputs(config: TrainConfig) -> None:
    """Load the dataset once and check the settings against it and this machine (after
    `check_device`; the loaded copy is dropped before training loads its own)."""
    dataset = load_dataset(config.dataset)
    check_training_data(config, dataset)
    check_simulator(config, dataset)


def check_run_dir(config: TrainConfig) -> None:
    """Refuse to start a new run (no --resume) in a folder that holds an earlier one."""
    if config.resume is not None:
        return
    run_dir = config.run_dir(read_task(config.dataset))
    if run_dir.is_dir() and any(path.name != LOCK_FILE for path in run_dir.iterdir()):
        raise UserError(
            f"{run_dir} holds an earlier run: continue it with --resume {run_dir / 'last.pt'},"
            " or start a new one with --run-name NAME (or another --out-dir)"
        )


@exit_on_user_errors("cdt train", ConfigError)
def main(argv: list[str] | None = None) -> None:
    """`cdt train --dataset FILE --preset cpu|paper [...]`."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("training").setLevel(logging.INFO)
    args = sys.argv[1:] if argv is None else argv
    config = parse_config(args)
    warn_ignored_flags(config, args)
    check_config(config)
    check_run_dir(config)
    # Deferred on purpose: these import torch (seconds), which parsing never needs.
    from training.checkpoint import CheckpointError
    from training.evaluation.checkpoint_scores import score_in_training
    from training.interrupt import TrainingInterrupted
    from training.learn.probe import BudgetIgnored
    from training.learn.recorded import train_and_record

    check_device(config.device)
    check_inputs(config)
    try:
        path = train_and_record(config, evaluate_checkpoint=score_in_training)
    except CheckpointError as error:
        raise UserError(str(error)) from None
    except BudgetIgnored as stopped:
        print(f"cdt train: {stopped}", file=sys.stderr)
        raise SystemExit(3) from None
    except TrainingInterrupted as stopped:
        print(
            f"interrupted at step {stopped.step}; continue with: "
            f"cdt train --resume {stopped.checkpoint}",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    print(f"checkpoint: {path}")


if __name__ == "__main__":
    main()
