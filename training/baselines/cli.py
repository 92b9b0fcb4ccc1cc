"""`python -m training.baselines.cli` (and `cdt train --algo <baseline>`): train and export.

Example: `python -m training.baselines.cli --algo bc-safe --dataset datasets/SafetyCarRun-v0.hdf5
--out models/bc-safe-carrun/ --cost-limit 10 --steps 100000 --seed 0`.
"""

from __future__ import annotations

import logging

import tyro

from training.baselines.config import BaselineConfig
from training.baselines.registry import train_and_export
from training.data.dataset import DatasetError


def main(argv: list[str] | None = None) -> None:
    """Parse a `BaselineConfig`, train, export, and print where the model went."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = tyro.cli(BaselineConfig, args=argv, prog="cdt train")
    try:
        out_dir = train_and_export(config)
    except (DatasetError, ValueError) as error:
        raise SystemExit(f"cdt train --algo {config.algo}: {error}") from error
    print(f"{config.algo}: wrote {out_dir / 'model.onnx'} and {out_dir / 'model.json'}")


if __name__ == "__main__":
    main()
