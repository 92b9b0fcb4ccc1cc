"""One rank of test_ddp.py (started as torchrun starts it): train a few steps, then save this
rank's weights."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from tests.training.cdt_synthetic import tiny_config
from training.learn.distributed import shutdown_distributed
from training.learn.train import prepare_training, run_training


def main() -> None:
    dataset, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    config = tiny_config(dataset, out_dir, update_steps=3, dropout=0.1, checkpoint_every=3)
    state = prepare_training(config)
    run_training(state)
    torch.save(state.model.state_dict(), out_dir / f"rank{state.context.rank}.pt")
    shutdown_distributed(state.context)


if __name__ == "__main__":
    main()
