"""`python -m training.baselines.cli` (and `cdt train --algo <baseline>`): train and export.

Example: `python -m training.baselines.cli --algo bc-safe --dataset datasets/SafetyCarRun-v0.hdf5
--out models/bc-safe-carrun/ --cost-limit 10 --steps 100000 --seed 0`. Every value, the dataset
and the output folder are checked before training, the model card's values among them (the
folder's name, the action bounds): a model already in `--out` (a shipped one, say) is replaced
only with `--force`. A run stopped (Ctrl-C, SIGTERM, a killed session) continues
from the output folder's `progress.pt` when the same command runs again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from runtime.arguments import (
    AT_LEAST_0,
    AT_LEAST_1,
    FINITE_AT_LEAST_0,
    OPEN_UNIT_INTERVAL,
    POSITIVE,
    unmet,
)
from runtime.files import CARD_FILE, ONNX_FILE, check_writable, refuse_overwrite
from runtime.user_errors import UserError, exit_on_user_errors
from training.baselines.config import BaselineConfig
from training.card_update import check_model_name
from training.data.dataset import OfflineDataset, load_dataset
from training.tyro_cli import parse


@dataclass(frozen=True)
class BaselineArgs:
    """Train one of the paper's baselines on a dataset and export it."""

    config: Annotated[BaselineConfig, tyro.conf.arg(name="")]
    force: bool = False
    """replace the model in the output folder when it holds one already."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def config_problems(config: BaselineConfig) -> list[str]:
    """Every setting no baseline can train with, one phrase each."""
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    found = [
        f"{_flag(name)} must be finite, got {value}"
        for name, value in values.items()
        if any(
            isinstance(v, float) and not math.isfinite(v)
            for v in (value if isinstance(value, tuple) else (value,))
        )
    ]
    if found:
        return found

    def pick(*names: str) -> dict[str, float | None]:
        return {_flag(name): values[name] for name in names}

    counts = ("steps", "batch_size", "threads", "vae_hidden", "num_critics", "episode_len")
    found += unmet(AT_LEAST_1, pick(*counts, "sample_action_num", "mmd_samples", "log_every"))
    rates = ("actor_lr", "critic_lr", "vae_lr", "scalar_lr", "reward_scale", "cost_scale")
    found += unmet(POSITIVE, pick(*rates))
    found += unmet(OPEN_UNIT_INTERVAL, pick("gamma", "tau"))
    found += unmet(FINITE_AT_LEAST_0, pick("cost_limit", "k_p", "k_i", "k_d"))
    found += unmet(AT_LEAST_0, pick("checkpoint_every"))
    return found


def bounds_problems(config: BaselineConfig, dataset: OfflineDataset) -> list[str]:
    """What the model card would refuse of the action bounds, from the flags or the dataset,
    only once the model is trained: one per problem."""
    from training.baselines.data import action_bounds  # torch: after the checks that need none

    given = (config.action_low is not None, config.action_high is not None)
    if any(given) and not all(given):  # one alone would be ignored for the dataset's pair
        return ["--action-low and --action-high go together"]
    source = "--action-low/--action-high" if all(given) else f"{config.dataset}'s action bounds"
    low, high = action_bounds(dataset, config)
    dim = int(dataset.episodes[0].actions.shape[1])
    if low.shape != (dim,) or high.shape != (dim,):
        return [f"{source}: {dim} values each (the data's action dim), got {low.size}, {high.size}"]
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
        return [f"{source}: each low must be at most its high, got {low.tolist()} {high.tolist()}"]
    return []


def check_card_fields(config: BaselineConfig, dataset: OfflineDataset, out_dir: Path) -> None:
    """Raise `UserError` before training for a value the export's model card would refuse after
    it: the model's name (the output folder's) and the action bounds."""
    check_model_name(out_dir.name, f"--out {out_dir}: the model's name {out_dir.name!r}")
    if problems := bounds_problems(config, dataset):
        raise UserError("; ".join(problems))


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (`cdt train`'s own check lives a layer up,
    in train_cli, which baselines may not import)."""
    import torch

    try:
        chosen = torch.device(device)
    except RuntimeError as error:
        raise UserError(f"--device {device}: {error}") from None
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: this machine has no CUDA GPU (use --device cpu)")


@exit_on_user_errors("cdt train")
def main(argv: list[str] | None = None) -> None:
    """Parse a `BaselineConfig`, check it, train, export, and print where the model went."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse(BaselineArgs, argv, "cdt train", default=BaselineArgs(BaselineConfig()))
    config = args.config
    if problems := config_problems(config):
        raise UserError("; ".join(problems))
    check_device(config.device)
    dataset = load_dataset(config.dataset)
    out_dir = config.output_dir(dataset.task)
    check_writable(out_dir, folder=True, option="--out")
    check_card_fields(config, dataset, out_dir)
    hint = "export to another --out, or pass --force to replace that model"
    refuse_overwrite([out_dir / ONNX_FILE, out_dir / CARD_FILE], args.force, hint)
    # Imported after parsing: the trainers load torch (~2 s), which --help never needs.
    from training.baselines.registry import train_and_export
    from training.baselines.resume import ProgressMismatch
    from training.interrupt import TrainingInterrupted

    try:
        out_dir = train_and_export(config, dataset)
    except ProgressMismatch as error:
        raise UserError(str(error)) from None
    except ValueError as error:
        raise UserError(f"--algo {config.algo}: {error}") from error
    except TrainingInterrupted as stopped:
        print(f"cdt train: {stopped} (progress in {stopped.checkpoint})", file=sys.stderr)
        raise SystemExit(130) from None
    print(f"{config.algo}: wrote {out_dir / ONNX_FILE} and {out_dir / CARD_FILE}")


if __name__ == "__main__":
    main()
