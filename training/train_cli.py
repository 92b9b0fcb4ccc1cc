"""`cdt train`: parse and check the settings first, then import torch and train.

Parsing needs no torch, so `cdt train --help` and a missing dataset answer at once. Every value is
checked before the data is loaded (`check_config`), and a run directory that holds an earlier run
is never reused without `--resume` (`check_run_dir`): the command stops in one line instead, so a
rerun can never leave an older run's `best.pt` beside a newer `last.pt`.

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

from runtime.arguments import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    UNIT_INTERVAL,
    unmet,
)
from runtime.user_errors import UserError, exit_on_user_errors
from training.data.dataset import read_task
from training.learn.config import ConfigError, TrainConfig, parse_config
from training.run_lock import LOCK_FILE


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
    found += unmet(AT_LEAST_0, pick("eval_every", "warmup_steps", "fail_fast_step"))
    positive = ("learning_rate", "clip_grad", "reward_scale", "cost_scale", "selection_cost_margin")
    found += unmet(POSITIVE, pick(*positive, "association_beta"))
    shares = ("selection_max_share_over", "selection_min_budget_use", "min_lr_fraction")
    found += unmet(UNIT_INTERVAL, pick(*shares, "association_max_reward_drop"))
    found += unmet(AT_LEAST_0, pick("weight_decay", "entropy_weight", "augment_fraction"))
    if not all(0 <= beta < 1 for beta in config.betas):
        found.append(f"--betas must lie in [0, 1), got {config.betas}")
    first = {problem.split(" ", 1)[0]: problem for problem in reversed(found)}  # one per flag
    return [problem for problem in found if first[problem.split(" ", 1)[0]] == problem]


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
    config = parse_config(sys.argv[1:] if argv is None else argv)
    check_config(config)
    check_run_dir(config)
    # Deferred on purpose: these import torch (seconds), which parsing never needs.
    from training.checkpoint import CheckpointError
    from training.evaluation.checkpoint_scores import score_in_training
    from training.interrupt import TrainingInterrupted
    from training.learn.probe import BudgetIgnored
    from training.learn.recorded import train_and_record

    check_device(config.device)
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
