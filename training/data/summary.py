"""A dataset's summary (counts, return ranges, frontiers) as JSON, and its cost-reward scatter.

`cdt dataset inspect` prints and writes them; `cdt collect` writes both beside every dataset it
makes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.files import write_atomic
from training.data.dataset import OfflineDataset
from training.data.frontiers import (
    DEFAULT_COST_BIN_WIDTH,
    DEFAULT_THRESHOLDS,
    FrontierSummary,
    pareto_indices,
    pareto_points,
    reward_frontier_curve,
    summarise_frontiers,
)


def _json_number(value: float) -> float | None:
    """JSON has no NaN: an undefined frontier value is written as null."""
    return float(value) if math.isfinite(value) else None


def _stats(values: np.ndarray) -> dict[str, float]:
    low, high, mean, std = values.min(), values.max(), values.mean(), values.std()
    return {"min": float(low), "max": float(high), "mean": float(mean), "std": float(std)}


def _json_row(summary: FrontierSummary) -> dict[str, Any]:
    row = summary._asdict()
    return {
        key: _json_number(value) if isinstance(value, float) else value
        for key, value in row.items()
    }


def summarise_dataset(
    dataset: OfflineDataset,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
    bin_width: float = DEFAULT_COST_BIN_WIDTH,
) -> dict[str, Any]:
    """Counts, return ranges and the frontiers at each threshold, as JSON-ready values."""
    costs, rewards = dataset.cost_returns, dataset.reward_returns
    lengths = np.array([episode.length for episode in dataset.episodes], dtype=np.float64)
    rows = summarise_frontiers(costs, rewards, thresholds, bin_width)
    return {
        "task": dataset.task,
        "episodes": len(dataset.episodes),
        "transitions": dataset.transitions,
        "observation_dim": dataset.observation_dim,
        "action_dim": dataset.action_dim,
        "reward_return": _stats(rewards),
        "cost_return": _stats(costs),
        "episode_length": _stats(lengths),
        "pareto_episodes": int(pareto_indices(costs, rewards).size),
        "cost_bin_width": bin_width,
        "frontiers": [_json_row(row) for row in rows],
    }


def write_summary(
    dataset: OfflineDataset,
    path: str | Path,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> Path:
    """Write `summarise_dataset(dataset, thresholds)` as JSON, atomically."""
    text = json.dumps(summarise_dataset(dataset, thresholds), indent=2) + "\n"
    return write_atomic(path, lambda temporary: temporary.write_text(text))


def plot_returns(
    dataset: OfflineDataset,
    path: str | Path,
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> Path:
    """PNG scatter of cost return vs reward return, with RF, PF and the threshold lines."""
    # Deferred on purpose: matplotlib takes ~0.5 s to import and only plotting needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    costs, rewards = dataset.cost_returns, dataset.reward_returns
    figure = Figure(figsize=(7.0, 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(figure)  # the Agg backend, without pyplot's global state
    axes = figure.add_subplot()
    axes.scatter(costs, rewards, s=8, alpha=0.35, color="tab:blue", label="trajectories")
    centres, best = reward_frontier_curve(costs, rewards)
    axes.plot(centres, best, color="tab:orange", linewidth=1.0, label="reward frontier RF")
    frontier_costs, frontier_rewards = pareto_points(costs, rewards)
    # PF(kappa) is a step function: the reward of the last Pareto point at or below kappa
    step_costs = np.append(frontier_costs, costs.max())
    step_rewards = np.append(frontier_rewards, frontier_rewards[-1])
    axes.step(step_costs, step_rewards, where="post", color="tab:red", linewidth=1.5)
    axes.scatter(
        frontier_costs, frontier_rewards, s=22, color="tab:red", label="Pareto frontier PF"
    )
    for threshold in thresholds:
        axes.axvline(threshold, linestyle="--", linewidth=1.0, color="0.4")
        axes.annotate(
            rf"$\kappa$={threshold:g}",
            (threshold, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -4),
            textcoords="offset points",
            fontsize=8,
            rotation=90,  # upright labels: thresholds 10 and 20 sit close on a wide cost axis
            verticalalignment="top",
        )
    axes.set_xlabel("cost return")
    axes.set_ylabel("reward return")
    axes.set_title(f"{dataset.task}: {len(costs)} episodes, {dataset.transitions} transitions")
    axes.legend(loc="lower right", fontsize=8)
    return write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
