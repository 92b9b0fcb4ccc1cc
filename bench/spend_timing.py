"""When a dataset's episodes spend their cost: the share spent by mid-episode.

    python bench/spend_timing.py datasets/SafetyCarCircle-v0.hdf5 datasets/SafetyAntRun-v0.hdf5

A budget cut at mid-episode finds spent what an episode spent in its first half. This prints, per
dataset, over its full-length episodes whose cost return lies in `--costs` (default 15-40, the
episodes a model told about 40 imitates): how many there are, the share of their cost spent in
the first half (pooled) and the share of them that had spent at most `--cut` by then. Compare it
with a model's own figure (`bench/guard_alternatives.py`, column "cost by mid-episode").
Figures only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
from training.data.dataset import Episode, load_dataset


def spend_timing(
    episodes: list[Episode], costs: tuple[float, float], cut: float
) -> tuple[int, float, float]:
    """Full-length episodes with cost return in `costs`: their count, the pooled share of their
    cost spent by mid-episode, and the share of them that had spent at most `cut` by then."""
    longest = max(episode.length for episode in episodes)
    low, high = costs
    chosen = [
        episode
        for episode in episodes
        if episode.length == longest and low <= episode.cost_return <= high
    ]
    if not chosen:
        return 0, float("nan"), float("nan")
    totals = np.array([episode.cost_return for episode in chosen])
    by_mid = np.array([episode.costs[: longest // 2].sum() for episode in chosen])
    return len(chosen), float(by_mid.sum() / max(totals.sum(), 1e-9)), float(np.mean(by_mid <= cut))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", type=Path, nargs="+", help="HDF5 files in the DSRL layout")
    parser.add_argument(
        "--costs", type=float, nargs=2, default=[15.0, 40.0], metavar=("LOW", "HIGH")
    )
    parser.add_argument("--cut", type=float, default=10.0, help="the budget a cut goes down to")
    args = parser.parse_args(argv)
    low, high = args.costs
    print(f"| dataset | episodes of cost {low:g}-{high:g} | share spent by mid-episode "
          f"| at most {args.cut:g} by mid-episode |\n|---|---|---|---|")  # fmt: skip
    for path in args.datasets:
        count, share, kept = spend_timing(load_dataset(path).episodes, (low, high), args.cut)
        print(f"| {path.name} | {count} | {share:.0%} | {kept:.0%} |", flush=True)


if __name__ == "__main__":
    main()
