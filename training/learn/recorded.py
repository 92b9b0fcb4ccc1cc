"""A training run and its ledger entry, written in one place.

`cdt train` and `cdt report`'s grid both train through `train_and_record`, so every run, however
it ends (done, stopped by the probe, interrupted, failed), is a line in the ledger with its
recipe, and no caller can forget it.
"""

from __future__ import annotations

import time
from pathlib import Path

from training.checkpoint import CheckpointError
from training.data.dataset import read_task
from training.interrupt import TrainingInterrupted
from training.learn.checks import out_of_memory
from training.learn.config import TrainConfig
from training.learn.probe import BudgetIgnored
from training.learn.state import EvaluateCheckpoint
from training.learn.train import train
from training.ledger import record_training, training_ending
from training.run_lock import run_folder_lock


def train_and_record(
    config: TrainConfig, evaluate_checkpoint: EvaluateCheckpoint | None = None
) -> Path:
    """`train(config, evaluate_checkpoint)`, recorded in the ledger; exceptions pass through,
    but a step out of memory becomes a one-line `UserError` naming the batch size.

    A `CheckpointError` (a `--resume` that cannot be read) is not recorded: no run started, nor
    is a run folder that another process is writing (`UserError`, `training.run_lock`).
    """
    task = read_task(config.dataset)
    started = time.perf_counter()

    def log(outcome: str, steps: int | None) -> None:
        record_training(
            str(config.run_dir(task)),
            outcome,
            started=started,
            device=config.device,
            task=task,
            algorithm=config.algo,
            seed=config.seed,
            steps=steps,
            recipe=config.recipe(),
        )

    with run_folder_lock(config.run_dir(task), "cdt train"):
        try:
            path = train(config, evaluate_checkpoint=evaluate_checkpoint)
        except (Exception, TrainingInterrupted) as error:
            if isinstance(error, BudgetIgnored):
                log(f"stopped: {error}", error.step)
            elif not isinstance(error, CheckpointError):  # a --resume that cannot be read: no run
                log(*training_ending(error))
            if (refusal := out_of_memory(error, config)) is not None:
                raise refusal from None
            raise
        log("done", config.update_steps)
    return path
