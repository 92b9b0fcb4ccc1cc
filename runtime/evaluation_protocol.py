"""The evaluation protocol: which budgets, targets and seeds, and how results are summarised.

Checkpoint selection and the reported evaluation follow the same protocol on disjoint seeds, so
the checkpoint we ship is chosen by the test we report (issue: "selection is not the reported
test"). Scores are the paper's (section 5), from `runtime.scores`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import numpy as np

from runtime.card import CardTarget
from runtime.episodes import EpisodeResult, EpisodeSpec
from runtime.scores import normalised_cost, normalised_reward, over_limit
from runtime.user_errors import UserError

REPORTED_BUDGETS = (10.0, 20.0, 40.0)
"""Cost budgets every CDT model is selected and reported at (the paper's kappa = 10 first)."""

SELECTION_SEED_BASE = 5_000_000
"""Selection episodes use seeds from here on; reported evaluations use 0 .. seeds * 10,000."""
VALIDATION_SEED_BASE = 6_000_000
"""Validation episodes (ship decisions) use seeds from here on."""

SeedSplit = Literal["selection", "validation", "test"]
"""The three jobs of evaluation seeds, never mixed: `selection` chooses checkpoints and budget
scales, `validation` decides what ships, `test` is the reported evaluation, run once per shipped
model and never used to choose anything."""
SEED_SPLITS: tuple[SeedSplit, ...] = ("selection", "validation", "test")


def action_mode(deterministic: bool) -> str:
    """The name every table, log and card uses for an episode's action mode."""
    return "mean" if deterministic else "sampled"


def report_seeds(episodes: int, seeds: int) -> list[tuple[int, ...]]:
    """Seed s owns episodes s * 10,000 + 0 .. episodes - 1 (distinct env and policy seeds)."""
    return [tuple(s * 10_000 + e for e in range(episodes)) for s in range(seeds)]


def selection_seeds(episodes: int) -> list[int]:
    """Seeds for checkpoint selection, disjoint from every `report_seeds` seed."""
    return [SELECTION_SEED_BASE + e for e in range(episodes)]


SEED_GROUP = 10_000
"""Episode seeds one evaluation seed owns: it runs at most this many episodes."""
SPLIT_BASES: dict[SeedSplit, int] = {
    "selection": SELECTION_SEED_BASE,
    "validation": VALIDATION_SEED_BASE,
    "test": 0,
}
SPLIT_GROUPS: dict[SeedSplit, int] = {"selection": 100, "validation": 100, "test": 500}
"""Evaluation seeds each split has room for: test 0 .. 4,999,999, selection 5,000,000 ..
5,999,999, validation 6,000,000 .. 6,999,999."""


class SeedRangeError(UserError, ValueError):
    """Episodes or seeds a split cannot hold without sharing seeds: one line naming the option
    and the largest value allowed (exit code 2), said before any episode runs."""


def split_problems(
    split: SeedSplit,
    episodes: int,
    seeds: int,
    options: tuple[str, str] = ("--episodes", "--seeds"),
) -> list[str]:
    """Why `seeds` groups of `episodes` cannot come from `split`, one phrase each naming the
    command's option (`options`: its names for episodes and seeds); empty when they can."""
    episodes_option, seeds_option = options
    found = []
    if not 0 < episodes <= SEED_GROUP:
        found.append(f"{episodes_option} {episodes}: 1 to {SEED_GROUP:,} episodes per seed")
    most, first = SPLIT_GROUPS[split], SPLIT_BASES[split]
    if not 0 < seeds <= most:
        last = first + most * SEED_GROUP - 1
        found.append(
            f"{seeds_option} {seeds}: 1 to {most} (the {split} split owns episode seeds"
            f" {first:,} .. {last:,}, {SEED_GROUP:,} per seed)"
        )
    return found


def check_split(split: SeedSplit, episodes: int, seeds: int) -> None:
    """Raise `SeedRangeError` for more episodes than a group holds, or more seeds than the split
    owns (`--episodes`, `--seeds`): commands call it before any episode runs."""
    if problems := split_problems(split, episodes, seeds):
        raise SeedRangeError("; ".join(problems))


def split_seeds(split: SeedSplit, episodes: int, seeds: int) -> list[tuple[int, ...]]:
    """`seeds` groups of `episodes` seeds of one split; groups and splits never share a seed.

    Raises:
        SeedRangeError: more episodes than a group holds, or more seeds than the split owns.
    """
    check_split(split, episodes, seeds)
    base = SPLIT_BASES[split]
    return [tuple(base + s * SEED_GROUP + e for e in range(episodes)) for s in range(seeds)]


class TargetLike(Protocol):
    """A (reward, cost) target: the card's, the wire schema's, or one read from a dict."""

    @property
    def reward(self) -> float: ...

    @property
    def cost(self) -> float: ...


def target_reward_for(default_targets: Sequence[TargetLike], budget: float) -> float:
    """The default target reward listed at the cost closest to `budget`."""
    if not default_targets:
        raise ValueError("no default targets: export the model with its dataset's targets")
    closest = min(default_targets, key=lambda target: abs(target.cost - budget))
    return float(closest.reward)


def selection_specs(
    default_targets: Sequence[dict[str, float]],
    budgets: Sequence[float],
    action_modes: Sequence[bool],
    episodes: int,
) -> list[EpisodeSpec]:
    """Every (budget, action mode) pair on the same selection seeds; `True` = mean action."""
    targets = [CardTarget.model_validate(target) for target in default_targets]
    return [
        EpisodeSpec(seed, target_reward_for(targets, budget), budget, deterministic)
        for budget in budgets
        for deterministic in action_modes
        for seed in selection_seeds(episodes)
    ]


@dataclass(frozen=True)
class BudgetRow:
    """Mean results of the episodes run at one (target reward, budget, action mode)."""

    target_reward: float
    target_cost: float
    deterministic: bool
    episodes: int
    reward_mean: float
    reward_std: float
    cost_mean: float
    cost_std: float
    normalised_reward: float
    """Paper: 100 (R - r_min) / (r_max - r_min), over the dataset's reward returns."""
    normalised_cost: float
    """Paper: C / (kappa + eps) with kappa the budget; safe means <= 1."""
    share_over_budget: float
    """Fraction of episodes whose cost exceeded the budget."""

    @property
    def safe(self) -> bool:
        return self.normalised_cost <= 1.0


def summarise(
    results: Sequence[EpisodeResult], reward_range: tuple[float, float]
) -> list[BudgetRow]:
    """One row per (target reward, budget, action mode), in the order they first appear."""
    groups: dict[tuple[float, float, bool], list[EpisodeResult]] = {}
    for result in results:
        spec = result.spec
        key = (spec.target_reward, spec.target_cost, spec.deterministic)
        groups.setdefault(key, []).append(result)
    rows = []
    for (target_reward, budget, deterministic), group in groups.items():
        rewards = np.array([result.reward for result in group])
        costs = np.array([result.cost for result in group])
        rows.append(
            BudgetRow(
                target_reward=target_reward,
                target_cost=budget,
                deterministic=deterministic,
                episodes=len(group),
                reward_mean=float(rewards.mean()),
                reward_std=float(rewards.std()),
                cost_mean=float(costs.mean()),
                cost_std=float(costs.std()),
                normalised_reward=float(normalised_reward(float(rewards.mean()), reward_range)),
                normalised_cost=float(normalised_cost(float(costs.mean()), budget)),
                share_over_budget=float(np.mean(over_limit(costs, budget))),
            )
        )
    return rows


SELECTION_BUDGET_SCALES = (1.0, 0.8, 0.6)
"""Budget calibrations checkpoint selection tries, largest first: the graph feeds scale x the
remaining budget. Measured reason: uncalibrated CarRun checkpoints kept the mean cost near
kappa = 10 with sampled actions but let 30-50 % of episodes exceed it."""


@dataclass(frozen=True)
class SelectionRule:
    """When a checkpoint counts, and how counted ones are ranked."""

    cost_margin: float = 0.9
    """Mean cost must stay <= cost_margin x budget at every budget and action mode: held-out
    seeds scatter around the selection mean (CarRun: cost std ~6 per episode)."""
    max_share_over: float = 0.2
    """At most this fraction of episodes may exceed the budget, at every budget and mode."""
    min_budget_use: float = 0.5
    """At every budget above the tightest, mean cost must reach this share of it, in every mode:
    a policy that keeps its tightest behaviour when the controller loosens the budget ignores
    the controller (and leaves reward unclaimed). Not at `flat_budgets`."""
    flat_budgets: frozenset[float] = frozenset()
    """Budgets where the data's Pareto frontier barely rises above the tightest budget's
    (`flat_budgets`): there a policy that leaves the budget unspent loses almost no reward, so
    leaving it idle is no failure (DroneRun: PF(10/20/40) = 385 / 388 / 418)."""
    max_reward_drop: float = 10.0
    """At every budget above the tightest, in each action mode, the normalised reward may fall
    at most this far below the tightest budget's: a policy that earns less for a looser budget
    is broken there, however well it keeps it (a BallRun guidance weight: 36.5 at budget 10,
    9.1 at 40)."""

    def safety_failures(self, row: BudgetRow) -> list[str]:
        """How the row goes over (empty: it is safe): its mean cost past the margin, or its
        share of episodes over the budget past the limit. Calibration's neighbour rule reads it
        on its own, without the idle test."""
        failures = []
        if row.cost_mean > self.cost_margin * row.target_cost:
            failures.append(
                f"mean cost {row.cost_mean / row.target_cost:.3f} x budget > {self.cost_margin:g}"
                if row.target_cost > 0
                else f"mean cost {row.cost_mean:g} at budget 0"
            )
        if row.share_over_budget > self.max_share_over:
            failures.append(
                f"{row.share_over_budget:.0%} of episodes over budget > {self.max_share_over:.0%}"
            )
        return failures

    def _row_safety_failures(self, row: BudgetRow) -> list[str]:
        """`safety_failures`, each naming the budget and action mode: reasons a person can act
        on."""
        where = f"kappa {row.target_cost:g} {action_mode(row.deterministic)}"
        return [f"{where}: {failure}" for failure in self.safety_failures(row)]

    def _row_idle_failures(self, row: BudgetRow, tightest: float) -> list[str]:
        """Whether a budget above `tightest` (the tightest evaluated) is left unused."""
        if row.target_cost <= tightest or row.target_cost in self.flat_budgets:
            return []
        if row.cost_mean / row.target_cost >= self.min_budget_use:
            return []
        return [
            f"kappa {row.target_cost:g} {action_mode(row.deterministic)}: mean cost"
            f" {row.cost_mean / row.target_cost:.3f} x budget < {self.min_budget_use:g} (idle)"
        ]

    def _reward_drop_failures(self, rows: Sequence[BudgetRow]) -> list[str]:
        """The looser budgets that earn `max_reward_drop` less than the tightest, per mode."""
        tightest = min((row.target_cost for row in rows), default=0.0)
        base = {r.deterministic: r.normalised_reward for r in rows if r.target_cost == tightest}
        failures = []
        for row in rows:
            floor = base.get(row.deterministic)
            if row.target_cost <= tightest or floor is None:
                continue
            if row.normalised_reward < floor - self.max_reward_drop:
                failures.append(
                    f"kappa {row.target_cost:g} {action_mode(row.deterministic)}: reward"
                    f" {row.normalised_reward:.1f}, more than {self.max_reward_drop:g} below"
                    f" kappa {tightest:g}'s {floor:.1f} (a looser budget earns less)"
                )
        return failures

    def _safety_failures(self, rows: Sequence[BudgetRow]) -> list[str]:
        return [failure for row in rows for failure in self._row_safety_failures(row)]

    def _idle_failures(self, rows: Sequence[BudgetRow]) -> list[str]:
        tightest = min((row.target_cost for row in rows), default=0.0)
        return [failure for row in rows for failure in self._row_idle_failures(row, tightest)]

    def row_failures(self, row: BudgetRow, tightest: float) -> list[str]:
        """Why one row does not count among rows whose tightest budget is `tightest`."""
        return self._row_safety_failures(row) + self._row_idle_failures(row, tightest)

    def failures(self, rows: Sequence[BudgetRow]) -> list[str]:
        """Why the rows are not admissible (empty when they are)."""
        if not rows:
            return ["nothing measured"]
        return (
            self._safety_failures(rows)
            + self._idle_failures(rows)
            + self._reward_drop_failures(rows)
        )

    def safe(self, rows: Sequence[BudgetRow]) -> bool:
        """Under every budget, with the margin, at every budget and action mode evaluated."""
        return bool(rows) and not self._safety_failures(rows)

    def budget_use(self, rows: Sequence[BudgetRow]) -> float:
        """The smallest mean cost / budget over the budgets above the tightest and not flat
        (1 with none)."""
        tightest = min((row.target_cost for row in rows), default=0.0)
        loose = [
            row.cost_mean / row.target_cost
            for row in rows
            if row.target_cost > tightest and row.target_cost not in self.flat_budgets
        ]
        return min(loose, default=1.0)

    def admissible(self, rows: Sequence[BudgetRow]) -> bool:
        """Safe everywhere, using the loose budgets it is given and earning no less for them."""
        return not self.failures(rows)

    def score(self, rows: Sequence[BudgetRow]) -> float:
        """Ranks admissible > safe but idle (or earning less) at loose budgets > unsafe.

        Admissible: mean normalised reward (0-100); safe but idle or earning less: -1 + its
        budget use (in [-1, 0]); unsafe: -1 minus the worst cost overshoot (below -1).
        """
        if self.admissible(rows):
            return float(np.mean([row.normalised_reward for row in rows]))
        if self.safe(rows):
            return -1.0 + self.budget_use(rows)
        return -1.0 - max(row.cost_mean / max(row.target_cost, 1e-8) for row in rows)


MIN_FRONTIER_RISE = 0.05
"""A budget's frontier rises meaningfully when PF(budget) - PF(tightest) reaches this share of
the dataset's reward range."""


def flat_budgets(
    frontier: Mapping[float, float], reward_range: float, min_rise: float = MIN_FRONTIER_RISE
) -> frozenset[float]:
    """The budgets whose frontier reward rises less than `min_rise` x `reward_range` above the
    tightest budget's (`frontier`: budget -> PF(budget), or any reward target offset from it by
    a constant, such as the card's default targets)."""
    if not frontier:
        return frozenset()
    tightest = frontier[min(frontier)]
    return frozenset(
        budget
        for budget, reward in frontier.items()
        if budget > min(frontier) and reward - tightest < min_rise * reward_range
    )


def on_frontier(
    rule: SelectionRule, default_targets: Sequence[TargetLike], reward_span: float
) -> SelectionRule:
    """`rule` with the budget-use test off where the data's frontier is flat (`flat_budgets`):
    the default targets are PF(budget) plus one offset, so their differences are PF's."""
    frontier = {float(target.cost): float(target.reward) for target in default_targets}
    return replace(rule, flat_budgets=flat_budgets(frontier, reward_span))


def describe(rows: Sequence[BudgetRow]) -> str:
    """One line per budget row, on the paper's score scale (reward 0-100, cost / kappa)."""
    return "; ".join(
        f"kappa {row.target_cost:g} {action_mode(row.deterministic)}: "
        f"reward {row.normalised_reward:.1f} cost {row.normalised_cost:.2f} "
        f"(over {row.share_over_budget:.0%})"
        for row in rows
    )
