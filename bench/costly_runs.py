"""How a dataset's episodes spend their cost: in how many costly runs, and how long the longest.

    python bench/costly_runs.py datasets/SafetyDroneCircle-v0.hdf5 datasets/SafetyCarCircle-v0.hdf5

A costly run is a stretch of consecutive steps that each cost something. Grouped by the
episode's cost return, it prints the episodes, costly runs per episode, the median longest run
and the share of steps spent with the agent's x position beyond the Circle tasks' band (|x| > 6;
Bullet-Safety-Gym's observation starts with 0.1 x the agent's x). A budget of 10 can be kept
by episodes that leave the band and come straight back only if the data show such returns: short
runs in the cheap groups.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from training.data.dataset import load_dataset

COST_GROUPS = ((0, 0), (1, 10), (11, 20), (21, 40), (41, 80), (81, np.inf))
BAND_X = 0.6  # 0.1 x the Circle tasks' x limit of 6


def costly_runs(costs: np.ndarray) -> list[int]:
    """Lengths of the stretches of consecutive costly steps."""
    costly = np.concatenate([[False], costs > 0, [False]])
    edges = np.flatnonzero(np.diff(costly.astype(np.int8)))
    return list(edges[1::2] - edges[::2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("datasets", type=Path, nargs="+")
    args = parser.parse_args()
    for path in args.datasets:
        dataset = load_dataset(path)
        episodes, returns = dataset.episodes, dataset.cost_returns
        print(f"{path}: {len(episodes)} episodes")
        print(
            f"{'cost return':>12} {'episodes':>9} {'runs/episode':>13} "
            f"{'longest run':>12} {'out of band':>12}"
        )
        for low, high in COST_GROUPS:
            group = [e for e, c in zip(episodes, returns, strict=True) if low <= c <= high]
            if not group:
                continue
            runs = [costly_runs(episode.costs) for episode in group]
            longest = np.median([max(r, default=0) for r in runs])
            out = np.mean([np.mean(np.abs(e.observations[:, 0]) > BAND_X) for e in group])
            label = f"{low}-{high:g}" if np.isfinite(high) else f"{low}+"
            print(
                f"{label:>12} {len(group):>9} {np.mean([len(r) for r in runs]):>13.1f} "
                f"{longest:>12.0f} {out:>12.1%}"
            )


if __name__ == "__main__":
    main()
