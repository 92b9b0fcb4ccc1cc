"""The search behind `cdt calibrate`: per budget, the counted scale nearest the graph's own,
unless a larger counted scale earns clearly more.

Pure: a `Measure` ((budget, scale) -> the action mode's paced row) is all it runs, so the rules
are tested on hand-made rows. `calibrate.py` measures with the served forward pass and writes the
card. The rules (loosest budget first): a scale counts when its row passes the selection rule,
a tighter budget is fed no more than a looser one and earns clearly less (or, on a flat reward,
no more), and it leaves a mid-episode tightening to the tightest budget room to be kept.

Preference: from the largest scale that counts, the search goes on down to the graph's own
scale, and the choice starts at the smallest counted scale there; it moves to a larger counted
one only where that one earns clearly more than the choice so far. A budget fed far from what it
is is an input the data rarely show, and one that buys nothing measurable is not worth the risk.

Neighbour rule: a scale counts only when the next larger and the next smaller candidate at that
budget (where they exist and may be fed) are safe too, so that no choice sits on a cliff edge.
Open grid: while the largest candidate passes, the grid grows above it by GRID_GROWTH up to
GRID_CAP, so that the grid does not make the choice.
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

GRID_GROWTH = 1.25
"""Above the largest candidate scale, each step of the open grid is this much larger: a little
coarser than the default grid's top steps (x1.6 -> 1.8 -> 2.0), so that few rows reach the cap."""

GRID_CAP = 8.0
"""The open grid's largest scale: a budget whose cost does not follow what it is fed would grow
the grid for ever. From x2.0 the steps are x2.5, 3.1, 3.9, 4.9, 6.1, 7.6 and 8: at most 7 rows."""

CAP_NOTE = f"the grid's cap (x{GRID_CAP:g}): no larger scale tried"
"""The note on a row at the cap, which has no upper neighbour to check."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One (budget, scale) tried and why it does not count (empty: it does, unless a note says
    it was measured beside the choice). A pace reference is the graph's own scale, measured for
    the pacing limit rather than tried."""

    scale: float
    paced: PacedRow
    failures: list[str]
    pace_reference: bool = False
    notes: tuple[str, ...] = ()
    """What its failures do not say: that the grid's cap stopped the search there, or that it
    lies below the chosen scale, measured as its lower neighbour or as the grid opened upward."""

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


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """One scale's row judged on its own, before the neighbour rule."""

    paced: PacedRow
    failures: list[str]
    plateau: bool
    """Its one failure is a reward not clearly below the looser budget's, nor clearly above it:
    the plateau fallback may take it."""

    @property
    def acceptable(self) -> bool:
        """It counts, or the plateau fallback may take it, if its neighbours are safe."""
        return not self.failures or self.plateau


def grid_step_up(scale: float) -> float:
    """The open grid's next scale above `scale`: GRID_GROWTH larger, to two significant digits
    (a readable card), and no larger than GRID_CAP."""
    return min(GRID_CAP, float(f"{scale * GRID_GROWTH:.2g}"))


def neighbours(candidates: Sequence[float], i: int) -> list[float]:
    """Candidate i's neighbours in a grid sorted largest first: the next larger and the next
    smaller candidate, where they exist."""
    return [*candidates[max(i - 1, 0) : i], *candidates[i + 1 : i + 2]]


def choose_scales(
    measure: Measure,
    budgets: Sequence[float],
    scales: Sequence[float],
    rule: SelectionRule,
    graph_scale: float,
    on_measured: Callable[[Measurement], object] = lambda measurement: None,
) -> tuple[list[BudgetScale] | None, list[Measurement]]:
    """The chosen scale per budget (None when a budget has none that counts) and every row.

    `on_measured` sees each row once its verdict is final, that is once its neighbours are
    measured too."""
    tightest = min(budgets)
    chosen: list[tuple[BudgetScale, BudgetRow]] = []
    measured: list[Measurement] = []
    rows: dict[tuple[float, float], PacedRow] = {}

    def report(measurement: Measurement) -> None:
        measured.append(measurement)
        on_measured(measurement)

    def paced_row(budget: float, scale: float, pace_reference: bool = False) -> PacedRow:
        if (budget, scale) not in rows:
            rows[budget, scale] = measure(budget, scale)
            if pace_reference:
                report(Measurement(scale, rows[budget, scale], [], pace_reference=True))
        return rows[budget, scale]

    def pace_limit(budget: float) -> float:
        # Measured reason: unpaced, CarRun's mean action was fed x1.1 at kappa 60 and spent 53.6
        # by step 100 of 200 (the graph's x0.8: 27.8, x0.7: 18.9, at the same reward), so a
        # controller's 60 -> 10 at mid-episode found the budget gone.
        return max(tightest, paced_row(budget, graph_scale, pace_reference=True).cost_by_half)

    def judge(
        budget: float, scale: float, looser: tuple[BudgetScale, BudgetRow] | None
    ) -> _Verdict:
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
        plateau = False
        if looser is not None and not clearly_below(row, looser[1]):
            plateau = not failures and not clearly_above(row, looser[1])
            failures.append(
                f"kappa {budget:g} {action_mode(row.deterministic)}: reward"
                f" {row.reward_mean:.1f} not clearly below"
                f" kappa {looser[0].budget:g}'s {looser[1].reward_mean:.1f}"
            )
        return _Verdict(paced, failures, plateau)

    def grid(budget: float, looser: tuple[BudgetScale, BudgetRow] | None) -> list[float]:
        """The candidate scales at `budget`, largest first. While the largest passes on its
        own (or the plateau fallback may take it), the next step up joins them, up to GRID_CAP
        and as long as it feeds no more than the looser budget."""

        def may_feed(scale: float) -> bool:  # a tighter budget is fed no more than a looser one
            return looser is None or scale * budget <= looser[0].fed

        candidates = [scale for scale in sorted(set(scales), reverse=True) if may_feed(scale)]
        if not candidates or candidates[0] < max(scales):
            return candidates  # the looser budget's feed caps the choice, not the grid
        while candidates[0] < GRID_CAP and judge(budget, candidates[0], looser).acceptable:
            larger = grid_step_up(candidates[0])
            if not may_feed(larger):
                break
            candidates.insert(0, larger)
        return candidates

    def unsafe_neighbours(budget: float, beside: Sequence[float]) -> list[str]:
        """Why a neighbour's row is a cliff edge next to the scale (empty: none is)."""
        failures = []
        for scale in beside:
            row = paced_row(budget, scale).row
            if reasons := rule.safety_failures(row):
                failures.append(
                    f"kappa {budget:g} {action_mode(row.deterministic)}: neighbour x{scale:g}"
                    f" goes over ({'; '.join(reasons)})"
                )
        return failures

    def assess(
        budget: float,
        candidates: Sequence[float],
        i: int,
        looser: tuple[BudgetScale, BudgetRow] | None,
    ) -> tuple[_Verdict, list[str]]:
        """Candidate i's verdict on its own, and why a neighbour makes it a cliff edge (checked
        only where the verdict is acceptable)."""
        verdict = judge(budget, candidates[i], looser)
        if not verdict.acceptable:
            return verdict, []
        return verdict, unsafe_neighbours(budget, neighbours(candidates, i))

    def nearest_the_graph(
        budget: float,
        candidates: Sequence[float],
        largest: int,
        looser: tuple[BudgetScale, BudgetRow] | None,
    ) -> tuple[int, dict[int, tuple[_Verdict, list[str]]]]:
        """The chosen candidate's index, given that candidate `largest` is the largest that
        counts, and the verdicts of the candidates judged: down to the graph's own scale, the
        smallest that counts, unless a larger counted one earns clearly more."""
        judged = {largest: assess(budget, candidates, largest, looser)}
        for j in range(largest + 1, len(candidates)):
            if candidates[j] < graph_scale:
                break
            judged[j] = assess(budget, candidates, j, looser)
        counted = [j for j, (verdict, cliff) in judged.items() if not verdict.failures + cliff]
        choice = counted[-1]
        for j in reversed(counted[:-1]):  # from smaller scales to larger ones
            if clearly_below(judged[choice][0].paced.row, judged[j][0].paced.row):
                choice = j
        return choice, judged

    def settle(
        budget: float,
        candidates: Sequence[float],
        largest: int,
        looser: tuple[BudgetScale, BudgetRow] | None,
    ) -> tuple[BudgetScale, BudgetRow]:
        """Chooses at `budget` once candidate `largest` counts, and reports the rows from it down:
        the counted ones passed over with a note, then each row measured below the choice."""
        choice, judged = nearest_the_graph(budget, candidates, largest, looser)
        chosen = candidates[choice]
        for j in range(largest, choice + 1):
            verdict, cliff = judged[j]
            notes: tuple[str, ...] = ()
            if j < choice and not verdict.failures + cliff:
                notes = (
                    f"counts, but earns not clearly more than x{chosen:g},"
                    f" nearer the graph's x{graph_scale:g}",
                )
            if j == 0 and candidates[j] >= GRID_CAP:
                notes += (CAP_NOTE,)
            report(Measurement(candidates[j], verdict.paced, verdict.failures + cliff, notes=notes))
        for j in range(choice + 1, len(candidates)):
            lower = candidates[j]
            if (budget, lower) not in rows:
                continue
            verdict = judge(budget, lower, looser)
            if j == choice + 1:
                note = f"measured as the chosen x{chosen:g}'s lower neighbour"
            elif j in judged:
                note = (
                    f"a candidate nearer the graph's x{graph_scale:g}, below the chosen x{chosen:g}"
                )
            else:
                note = (
                    f"measured below the chosen x{chosen:g}, as the grid opened upward or as"
                    " a candidate's neighbour"
                )
            report(Measurement(lower, verdict.paced, verdict.failures, notes=(note,)))
        return BudgetScale(budget=budget, scale=chosen), judged[choice][0].paced.row

    def choose(
        budget: float, looser: tuple[BudgetScale, BudgetRow] | None
    ) -> tuple[BudgetScale, BudgetRow] | None:
        candidates = grid(budget, looser)
        plateau = None
        for i, scale in enumerate(candidates):
            verdict, cliff = assess(budget, candidates, i, looser)
            if verdict.acceptable and not verdict.failures + cliff:
                return settle(budget, candidates, i, looser)
            notes: tuple[str, ...] = ()
            if verdict.acceptable and i == 0 and scale >= GRID_CAP:
                notes = (CAP_NOTE,)
            report(Measurement(scale, verdict.paced, verdict.failures + cliff, notes=notes))
            if verdict.acceptable and not cliff:
                plateau = plateau or (BudgetScale(budget=budget, scale=scale), verdict.paced.row)
        # Where no scale earns clearly less, the reward is flat in the budget (BallRun's mean
        # action earns 236-242 at kappa 5 whatever it is fed, 236.7 at 10): take the largest
        # scale that earns no more than the looser budget does.
        return plateau

    for budget in sorted(budgets, reverse=True):
        found = choose(budget, chosen[-1] if chosen else None)
        if found is None:
            return None, measured
        chosen.append(found)
    return [scale for scale, _ in reversed(chosen)], measured
