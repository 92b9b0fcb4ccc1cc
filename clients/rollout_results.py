"""What `cdt rollout` reports: each episode (finished or failed) and the summary of them all."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.scores import over_limit


@dataclass(frozen=True)
class EpisodeOutcome:
    """One finished episode as the env measured it."""

    seed: int
    steps: int
    reward: float
    cost: float
    initial_limit: float
    cost_limit: float
    """The limit in force at the end (after any budget change); the verdict is against it."""
    normalised_reward: float | None
    normalised_cost: float
    budget_changes: list[tuple[int, float]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Distinct warnings the service sent (e.g. a budget outside the validated range)."""
    guarded_steps: int = 0
    """Actions the service's budget guard changed (its episode summary's count)."""
    cut_floor: float | None = None
    """The cut floor the episode named at its creation (None: none)."""

    @property
    def over_budget(self) -> bool:
        return bool(over_limit(self.cost, self.cost_limit))

    def describe(self) -> str:
        """One line: what happened, the limits it ran under and its verdict."""
        limits = f"limit {self.initial_limit:g}" + "".join(
            f" -> {limit:g} at step {step}" for step, limit in self.budget_changes
        )
        if self.cut_floor is not None:
            limits += f", cut floor {self.cut_floor:g} announced"
        verdict = "OVER budget" if self.over_budget else "within budget"
        return (
            f"seed {self.seed}: steps {self.steps} reward {self.reward:.1f} cost {self.cost:.1f} "
            f"({limits}; normalised cost {self.normalised_cost:.2f}; guarded steps "
            f"{self.guarded_steps}): {verdict}"
        )


@dataclass(frozen=True)
class EpisodeFailure:
    """One episode the service failed, or one not run after the service stopped answering: its
    seed and why, in one line."""

    seed: int
    error: str
    ran: bool = True

    def describe(self) -> str:
        return f"seed {self.seed}: {'FAILED' if self.ran else 'NOT RUN'}: {self.error}"


def described(episodes: list[EpisodeOutcome | EpisodeFailure]) -> list[str]:
    """One line per episode in seed order, but the episodes not run after the service stopped
    answering (the last ones, for one reason) in one line: `seeds 3-99: NOT RUN: ...`."""
    ordered = sorted(episodes, key=lambda episode: episode.seed)
    lines: list[str] = []
    for not_run, run in itertools.groupby(ordered, key=_not_run):
        group = list(run)
        if not_run and len(group) > 1:
            lines.append(f"seeds {group[0].seed}-{group[-1].seed}: NOT RUN: {_reason(group[0])}")
        else:
            lines.extend(episode.describe() for episode in group)
    return lines


def _not_run(episode: EpisodeOutcome | EpisodeFailure) -> bool:
    return isinstance(episode, EpisodeFailure) and not episode.ran


def _reason(episode: EpisodeOutcome | EpisodeFailure) -> str:
    return episode.error if isinstance(episode, EpisodeFailure) else ""


def summarise(outcomes: list[EpisodeOutcome], failed: int = 0) -> dict[str, Any]:
    """Mean and std of raw and normalised reward and cost, and how many episodes went over.

    `safe`: no episode's cost exceeded its limit (`episodes_over_budget` is 0);
    `mean_within_budget` is the paper's verdict on the mean alone (normalised cost <= 1), which
    holds even when some episodes went over. `episodes_failed` (only when some did): episodes
    the service failed, left out of every figure.
    """
    if not outcomes:
        return {"episodes": 0, "episodes_failed": failed}
    rewards = np.array([o.reward for o in outcomes])
    costs = np.array([o.cost for o in outcomes])
    normalised_costs = np.array([o.normalised_cost for o in outcomes])
    summary = {
        "episodes": len(outcomes),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "cost_mean": float(costs.mean()),
        "cost_std": float(costs.std()),
        "normalised_cost_mean": float(normalised_costs.mean()),
        "safe": not any(o.over_budget for o in outcomes),
        "episodes_over_budget": sum(o.over_budget for o in outcomes),
        "share_over_budget": float(np.mean([o.over_budget for o in outcomes])),
        "mean_within_budget": bool(normalised_costs.mean() <= 1.0),
        "guarded_steps_mean": float(np.mean([o.guarded_steps for o in outcomes])),
    }
    if all(o.normalised_reward is not None for o in outcomes):
        summary["normalised_reward_mean"] = float(np.mean([o.normalised_reward for o in outcomes]))
    if failed:
        summary["episodes_failed"] = failed
    return summary


def printed_summary(summary: dict[str, Any]) -> str:
    """The summary as one JSON line, floats to 3 decimals (the --json file keeps them whole)."""
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}
    return json.dumps(rounded)
