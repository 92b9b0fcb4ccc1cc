"""Name -> training function, and the one call that trains and exports any baseline."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from training.baselines import BC_ALGORITHMS
from training.baselines.bc import train_bc
from training.baselines.bcq import train_bcq
from training.baselines.bear import train_bear
from training.baselines.config import BaselineConfig
from training.baselines.coptidice import train_coptidice
from training.baselines.cpq import train_cpq
from training.baselines.export import export_baseline
from training.baselines.trainer import TrainedBaseline
from training.data.dataset import OfflineDataset, load_dataset
from training.ledger import record_training

TrainFunction = Callable[[BaselineConfig, OfflineDataset], TrainedBaseline]

TRAINERS: dict[str, TrainFunction] = {
    **dict.fromkeys(BC_ALGORITHMS, train_bc),
    "bcq-lag": train_bcq,
    "bcq": train_bcq,
    "bear-lag": train_bear,
    "bear": train_bear,
    "cpq": train_cpq,
    "coptidice": train_coptidice,
}


def train_baseline(config: BaselineConfig, dataset: OfflineDataset) -> TrainedBaseline:
    """Train `config.algo` on `dataset`."""
    return TRAINERS[config.algo](config, dataset)


def train_and_export(config: BaselineConfig, dataset: OfflineDataset | None = None) -> Path:
    """Load the dataset (unless given), train, export and enter the run in the ledger (`cdt
    train --algo` and `cdt report`'s grid both come here); returns the model directory."""
    dataset = dataset or load_dataset(config.dataset)
    started = time.perf_counter()
    trained = train_baseline(config, dataset)
    out_dir = export_baseline(trained, dataset, config.output_dir(dataset.task))
    record_training(
        str(out_dir),
        "done",
        started=started,
        device=config.device,
        task=dataset.task,
        algorithm=config.algo,
        seed=config.seed,
        steps=config.steps,
    )
    return out_dir
