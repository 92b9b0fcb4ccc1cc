"""`cdt train`: parse and check the settings first, then import torch and train.

Parsing needs no torch, so `cdt train --help` and a missing dataset answer at once.
"""

from __future__ import annotations

import logging
import sys

from training.learn.config import ConfigError, parse_config


def main(argv: list[str] | None = None) -> None:
    """`cdt train --dataset FILE --preset cpu|paper [...]`."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("training").setLevel(logging.INFO)
    try:
        config = parse_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"cdt train: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    from training.data.dataset import DatasetError
    from training.learn.checkpoint import CheckpointError
    from training.learn.interrupt import TrainingInterrupted
    from training.learn.train import train

    try:
        path = train(config)
    except (DatasetError, CheckpointError) as error:
        print(f"cdt train: {error}", file=sys.stderr)
        raise SystemExit(2) from None
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
