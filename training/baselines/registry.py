"""Name -> learner, and the one call that trains and exports any baseline."""

from __future__ import annotations

import time
from pathlib import Path

from training.baselines import BC_ALGORITHMS
from training.baselines.bc import BCLearner
from training.baselines.bcq import BCQLearner
from training.baselines.bear import BEARLearner
from training.baselines.config import BaselineConfig
from training.baselines.coptidice import COptiDICELearner
from training.baselines.cpq import CPQLearner
from training.baselines.export import export_baseline
from training.baselines.resume import PROGRESS_FILE, discard_progress
from training.baselines.trainer import LearnerFactory, TrainedBaseline, train_with
from training.data.dataset import OfflineDataset, load_dataset
from training.interrupt import TrainingInterrupted
from training.ledger import record_training, training_ending

LEARNERS: dict[str, LearnerFactory] = {
    **dict.fromkeys(BC_ALGORITHMS, BCLearner),
    "bcq-lag": BCQLearner,
    "bcq": BCQLearner,
    "bear-lag": BEARLearner,
    "bear": BEARLearner,
    "cpq": CPQLearner,
    "coptidice": COptiDICELearner,
}


def train_baseline(
    config: BaselineConfig, dataset: OfflineDataset, progress_file: Path | None = None
) -> TrainedBaseline:
    """Train `config.algo` on `dataset` (resumable through `progress_file`, see `trainer.fit`)."""
    return train_with(LEARNERS[config.algo], config, dataset, progress_file)


def train_and_export(config: BaselineConfig, dataset: OfflineDataset | None = None) -> Path:
    """Load the dataset (unless given), train (continuing the output folder's `progress.pt`),
    export and enter the run in the ledger, however it ends (`cdt train --algo` and `cdt
    report`'s grid both come here); returns the model directory."""
    dataset = dataset or load_dataset(config.dataset)
    out_dir = config.output_dir(dataset.task)
    progress_file = out_dir / PROGRESS_FILE
    started = time.perf_counter()

    def log(outcome: str, steps: int | None) -> None:
        record_training(
            str(out_dir),
            outcome,
            started=started,
            device=config.device,
            task=dataset.task,
            algorithm=config.algo,
            seed=config.seed,
            steps=steps,
        )

    try:
        trained = train_baseline(config, dataset, progress_file)
    except (Exception, TrainingInterrupted) as error:
        log(*training_ending(error))
        raise
    export_baseline(trained, dataset, out_dir)
    discard_progress(progress_file)
    resumed = "" if trained.resumed_from is None else f" (resumed at step {trained.resumed_from})"
    log(f"done{resumed}", config.steps)
    return out_dir
