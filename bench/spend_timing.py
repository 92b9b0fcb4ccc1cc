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
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
from training.data.dataset import Episode, load_dataset


class SpendTiming(NamedTuple):
    episodes: int
    share_by_mid: float
    kept_cut: float
    reward_kept: str  # "mean / p90" of the episodes within the cut by mid-episode
    reward_spent: str  # the same for the others


def _reward_summary(rewards: np.ndarray) -> str:
    if rewards.size == 0:
        return "-"
    return f"{rewards.mean():.1f} / {np.percentile(rewards, 90):.1f}"


def spend_timing(episodes: list[Episode], costs: tuple[float, float], cut: float) -> SpendTiming:
    """Full-length episodes with cost return in `costs`: their count, the pooled share of their
    cost spent by mid-episode, the share of them that had spent at most `cut` by then, and the
    normalised reward of those that had and of those that had not."""
    longest = max(episode.length for episode in episodes)
    all_rewards = np.array([episode.reward_return for episode in episodes])
    low_reward, reward_range = all_rewards.min(), max(np.ptp(all_rewards), 1e-9)
    low, high = costs
    chosen = [
        episode
        for episode in episodes
        if episode.length == longest and low <= episode.cost_return <= high
    ]
    if not chosen:
        return SpendTiming(0, float("nan"), float("nan"), "-", "-")
    totals = np.array([episode.cost_return for episode in chosen])
    by_mid = np.array([episode.costs[: longest // 2].sum() for episode in chosen])
    rewards = np.array([episode.reward_return for episode in chosen])
    normalised = 100 * (rewards - low_reward) / reward_range
    kept = by_mid <= cut
    return SpendTiming(
        len(chosen),
        float(by_mid.sum() / max(totals.sum(), 1e-9)),
        float(np.mean(kept)),
        _reward_summary(normalised[kept]),
        _reward_summary(normalised[~kept]),
    )


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
          f"| at most {args.cut:g} by mid-episode | their reward (mean / p90) "
          f"| the others' reward |\n|---|---|---|---|---|---|")  # fmt: skip
    for path in args.datasets:
        timing = spend_timing(load_dataset(path).episodes, (low, high), args.cut)
        print(f"| {path.name} | {timing.episodes} | {timing.share_by_mid:.0%} | "
              f"{timing.kept_cut:.0%} | {timing.reward_kept} | {timing.reward_spent} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
