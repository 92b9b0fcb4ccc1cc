"""The search behind `cdt calibrate`: per budget, the largest scale whose measured row counts.

Pure: a `Measure` ((budget, scale) -> the action mode's paced row) is all it runs, so the rules
are tested on hand-made rows. `calibrate.py` measures with the served forward pass and writes the
card. The rules (loosest budget first): a scale counts when its row passes the selection rule,
a tighter budget is fed no more than a looser one and earns clearly less (or, on a flat reward,
no more), and it leaves a mid-episode tightening to the tightest budget room to be kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from runtime.card import BudgetScale
from runtime.evaluation_protocol import BudgetRow, SelectionRule, action_mode


@dataclasses.dataclass(frozen=True)
class PacedRow:
    """The action mode's row at one (budget, scale), and its mean cost by half the episode."""

    row: BudgetRow
    cost_by_half: float


Measure = Callable[[float, float], PacedRow]
"""(budget, scale) -> the action mode's paced row on the selection seeds."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One (budget, scale) tried and why it does not count (empty: it does). A pace reference
    is the graph's own scale, measured for the pacing limit rather than tried."""

    scale: float
    paced: PacedRow
    failures: list[str]
    pace_reference: bool = False

    @property
    def row(self) -> BudgetRow:
        return self.paced.row


def _reward_interval(row: BudgetRow) -> tuple[float, float]:
    """The row's mean reward plus and minus one standard error."""
    error = row.reward_std / math.sqrt(row.episodes)
    return row.reward_mean - error, row.reward_mean + error


def clearly_below(tighter: BudgetRow, looser: BudgetRow) -> bool:
    """Whether the tighter budget's reward lies below the looser one's by more than their
    standard errors: so that fresh seeds still see the reward grow with the budget. Measured
    reason: BallRun's mean action earned 252.7 +- 10.3 at kappa 10 (x1.1) and 257.7 +- 36.1 at
    20 on 60 selection episodes, and 251.7 vs 250.8 on 10 fresh seeds."""
    return _reward_interval(tighter)[1] < _reward_interval(looser)[0]


def clearly_above(tighter: BudgetRow, looser: BudgetRow) -> bool:
    """Whether the tighter budget's reward lies above the looser one's beyond their errors."""
    return _reward_interval(tighter)[0] > _reward_interval(looser)[1]


def choose_scales(
    measure: Measure,
    budgets: Sequence[float],
    scales: Sequence[float],
    rule: SelectionRule,
    graph_scale: float,
    on_measured: Callable[[Measurement], object] = lambda measurement: None,
) -> tuple[list[BudgetScale] | None, list[Measurement]]:
    """The chosen scale per budget (None when a budget has none that counts) and every row."""
    tightest = min(budgets)
    chosen: list[tuple[BudgetScale, BudgetRow]] = []
    measured: list[Measurement] = []
    rows: dict[tuple[float, float], PacedRow] = {}

    def paced_row(budget: float, scale: float, pace_reference: bool = False) -> PacedRow:
        if (budget, scale) not in rows:
            rows[budget, scale] = measure(budget, scale)
            if pace_reference:
                measured.append(Measurement(scale, rows[budget, scale], [], pace_reference=True))
                on_measured(measured[-1])
        return rows[budget, scale]

    def pace_limit(budget: float) -> float:
        # Measured reason: unpaced, CarRun's mean action was fed x1.1 at kappa 60 and spent 53.6
        # by step 100 of 200 (the graph's x0.8: 27.8, x0.7: 18.9, at the same reward), so a
        # controller's 60 -> 10 at mid-episode found the budget gone.
        return max(tightest, paced_row(budget, graph_scale, pace_reference=True).cost_by_half)

    for budget in sorted(budgets, reverse=True):
        looser = chosen[-1] if chosen else None
        found = plateau = None
        for scale in sorted(scales, reverse=True):
            if looser is not None and scale * budget > looser[0].fed:
                continue  # a tighter budget must not be fed more than a looser one
            paced = paced_row(budget, scale)
            row = paced.row
            failures = rule.row_failures(row, tightest)
            # the graph's row is measured only when a candidate spends past the tightest budget
            limit = pace_limit(budget) if paced.cost_by_half > tightest else tightest
            if paced.cost_by_half > limit:
                failures.append(
                    f"kappa {budget:g} {action_mode(row.deterministic)}: spent"
                    f" {paced.cost_by_half:.1f} by half the episode"
                    f" > {limit:.1f} (a tightening to kappa {tightest:g} then)"
                )
            if looser is not None and not clearly_below(row, looser[1]):
                if not failures and not clearly_above(row, looser[1]):
                    plateau = plateau or (BudgetScale(budget=budget, scale=scale), row)
                failures.append(
                    f"kappa {budget:g} {action_mode(row.deterministic)}: reward"
                    f" {row.reward_mean:.1f} not clearly below"
                    f" kappa {looser[0].budget:g}'s {looser[1].reward_mean:.1f}"
                )
            measured.append(Measurement(scale, paced, failures))
            on_measured(measured[-1])
            if not failures:
                found = (BudgetScale(budget=budget, scale=scale), row)
                break
        # Where no scale earns clearly less, the reward is flat in the budget (BallRun's mean
        # action earns 236-242 at kappa 5 whatever it is fed, 236.7 at 10): take the largest
        # scale that earns no more than the looser budget does.
        found = found or plateau
        if found is None:
            return None, measured
        chosen.append(found)
    return [scale for scale, _ in reversed(chosen)], measured
