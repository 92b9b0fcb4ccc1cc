"""`cdt cut-ready MODEL_DIR`: choose whether a model's budget guard keeps episodes ready for a cut.

A budget cut from the largest reported budget to the smallest at mid-episode is kept only by an
episode that has not spent the smaller by then. The guard can hold a larger budget to that floor
through the first half of the episode (`cut_floor`), for every budget above the floor or only
for limits from `cut_ready_from` up, never above the cut's start (`cut_ready_to`: larger limits
are not measured here); what it holds back costs reward where the model earns more with more
budget (docs/decisions/budget-guard.md#ready-for-a-budget-cut-2026-11-29). For the
card's guard without a hold and with each candidate, this runs the reported budgets and the cut
in both action modes on 40 selection episodes each, as served (guard on; a hold's budgets it
leaves alone are no hold's episodes, and no hold that keeps every cut leaves nothing to hold
for). On a card with cost guidance each hold is measured again with each `--held-guidance`
weight while held (`cut_ready_guidance`: the guidance makes a model told the floor timid, where
the hold's shield and fallback keep the floor anyway). On a card with a cost critic each of
those is measured once more with the shield on through the whole of the largest budget at each
`--held-shield-risk` (after the hold, the card's shield may come too late: CarCircle's car
leaves its ring at the release, before 25 are left). Each setting is measured once more with the
model told its own budget while held and the fallback keeping the floor from each `--held-margin`
left of it (`cut_ready_tells_floor` false: told 10, CarRun's car drives slower all through the
first half). It keeps:

1. among the holds that give up at most `--max-reward-given-up` normalised reward points against
   no hold in every steady row, with no more episodes over in any steady row than no hold's
   worst share or 2.5 %, the one with the fewest episodes over after the cut (ties: the higher
   mean reward);
2. no hold, unless that one has fewer episodes over after the cut than no hold.

Every candidate's rows go to the card's `evaluation.cut_ready`; the chosen setting to its
`budget_guard` (which drops what the old guard measured, as `cdt guard` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.arguments import CommandParser, non_negative_float, positive_int
from runtime.budget_guard import BudgetGuard
from runtime.card import ModelCard, read_card
from runtime.evaluation_protocol import REPORTED_BUDGETS
from runtime.scores import normalised_reward, over_limit
from runtime.user_errors import exit_on_user_errors
from training.card_update import record_evaluation
from training.evaluation.inputs import load_policy
from training.evaluation.served_rows import (
    selection_reward_range,
    served_selection_results,
    served_selection_rows,
)
from training.evaluation.shield import (
    EPISODES,
    MAX_REWARD_GIVEN_UP,
    MAX_SHARE_OVER,
    MeasuredGuard,
    copy_with_guard,
    row_key,
)
from training.guard_cli import set_guard
from training.ledger import LedgerEntry, record

logger = logging.getLogger(__name__)

CUT = (max(REPORTED_BUDGETS), min(REPORTED_BUDGETS))
"""The cut measured: the largest reported budget to the smallest, at half the episode."""
READY_FROM = (0.0, (sorted(REPORTED_BUDGETS)[-2] + max(REPORTED_BUDGETS)) / 2)
"""Candidate `cut_ready_from`: every budget above the floor, or only the largest reported one
(DroneCircle spends little of 20 early and keeps a cut from it unheld)."""


HELD_GUIDANCE = (0.0,)
"""Candidate guidance weights while held, beside the card's own (a card with cost guidance)."""
HELD_SHIELD_RISKS = (1.5,)
"""Candidate risks of a shield on through the whole largest budget, beside the card's shield (a
card with a cost critic; CarCircle's choice, docs/decisions/budget-guard.md)."""
SHIELD_FROM = max(REPORTED_BUDGETS)
"""Such a shield's margin: it checks every step of an episode of the largest budget."""
HELD_MARGINS = (6.0,)
"""Candidate fallback margins of a hold that tells the model its own budget (CarRun-paper's
choice, docs/decisions/budget-guard.md)."""

Hold = tuple[float | None, float | None, float | None, float | None]
"""(cut_ready_from, guidance weight while held, shield risk from `SHIELD_FROM` left, the
fallback's margin of a hold that tells the model its own budget); None: no hold, the card's
guidance, the card's shield, the model told the floor."""


def describe_hold(
    ready_from: float | None,
    guidance: float | None = None,
    shield_risk: float | None = None,
    margin: float | None = None,
) -> str:
    """`hold to 10 from limit 30` (`, guidance 0 while held`, `, shield from 40 at risk 1.5`,
    `, told its own budget, fallback from 6 left`), or `no hold` (None)."""
    if ready_from is None:
        return "no hold"
    held = "" if guidance is None else f", guidance {guidance:g} while held"
    if shield_risk is not None:
        held += f", shield from {SHIELD_FROM:g} at risk {shield_risk:g}"
    if margin is not None:
        held += f", told its own budget, fallback from {margin:g} left"
    return f"hold to {CUT[1]:g} from limit {ready_from:g}{held}"


@dataclasses.dataclass(frozen=True)
class CutRow:
    """The cut's episodes in one action mode."""

    deterministic: bool
    episodes: int
    share_over: float
    """Episodes whose cost passed the floor, the limit in force at their end."""
    cost_mean: float
    normalised_reward: float


@dataclasses.dataclass(frozen=True)
class CutCandidate(MeasuredGuard):
    """One setting measured on the selection seeds (`ready_from` None: no hold)."""

    cut_rows: list[CutRow] = dataclasses.field(default_factory=list)
    ready_from: float | None = None
    guidance: float | None = None
    """The guidance weight while held (None: the card's)."""
    shield_risk: float | None = None
    """The risk of a shield from `SHIELD_FROM` left (None: the card's shield)."""
    margin: float | None = None
    """The fallback's margin of a hold that tells the model its own budget (None: told the
    floor)."""

    @property
    def hold(self) -> Hold:
        """This setting as `held_guard` and `describe_hold` take it."""
        return self.ready_from, self.guidance, self.shield_risk, self.margin

    @property
    def setting(self) -> str:
        return describe_hold(*self.hold)

    @property
    def cut_share_over(self) -> float:
        return max(row.share_over for row in self.cut_rows)

    def as_json(self, unheld: CutCandidate) -> dict[str, Any]:
        return {
            "cut_ready_from": self.ready_from,
            "cut_ready_guidance": self.guidance,
            "shield_risk": self.shield_risk,
            "cut_ready_margin": self.margin,
            "worst_share_over": self.worst_share_over,
            "cut_share_over": self.cut_share_over,
            "reward_mean": self.reward,
            "reward_given_up": self.reward_given_up(unheld),
            "rows": [dataclasses.asdict(row) for row in self.rows],
            "cut_rows": [dataclasses.asdict(row) for row in self.cut_rows],
        }


def held_guard(
    guard: BudgetGuard,
    ready_from: float | None,
    guidance: float | None = None,
    shield_risk: float | None = None,
    margin: float | None = None,
) -> BudgetGuard:
    """`guard` holding budgets from `ready_from` up to the cut's start to its floor (None: no
    hold; larger budgets are not measured here, and holding them cost AntRun 5-7 points), with
    `guidance` as the cost guidance's weight while held (None: the card's), the shield from
    `SHIELD_FROM` left at `shield_risk` (None: the card's shield), and the model told its own
    budget with the fallback from `margin` left of the floor (None: told the floor)."""
    floor = 0.0 if ready_from is None else CUT[1]
    held: dict[str, float | bool | None] = {
        "cut_floor": floor,
        "cut_ready_from": ready_from or 0.0,
        "cut_ready_to": 0.0 if ready_from is None else CUT[0],
        "cut_ready_guidance": guidance,
        "cut_ready_tells_floor": margin is None,
        "cut_ready_margin": margin,
    }
    if shield_risk is not None:
        held |= {"shield_margin": SHIELD_FROM, "shield_risk": shield_risk}
    return guard.model_copy(update=held)


def cut_rows(model_dir: Path, card: ModelCard, episodes: int, workers: int) -> list[CutRow]:
    """The cut in both action modes on the selection seeds, as served (guard on)."""
    schedule = ((card.max_episode_len // 2, CUT[1]),)
    label = f"cut {CUT[0]:g} -> {CUT[1]:g}"
    results = served_selection_results(
        model_dir, card, [CUT[0]], episodes, workers, label, schedule
    )
    reward_range = selection_reward_range(card)
    rows = []
    for deterministic in (False, True):
        mode = [result for result in results if result.spec.deterministic == deterministic]
        costs = np.array([result.cost for result in mode])
        reward = float(np.mean([result.reward for result in mode]))
        share_over = float(np.mean(over_limit(costs, CUT[1])))
        scored = normalised_reward(reward, reward_range)
        rows.append(CutRow(deterministic, len(mode), share_over, float(costs.mean()), scored))
    return rows


def held_budgets(hold: Hold) -> list[float]:
    """The reported budgets a hold acts on: with the card's shield, those above the floor and
    from its `cut_ready_from` up. At the others it leaves the guard as it is
    (`BudgetGuard.guarded_budget`), so their episodes are no hold's, step for step; a shield of
    its own acts on every budget."""
    ready_from, _, shield_risk, _ = hold
    if shield_risk is not None:
        return list(REPORTED_BUDGETS)
    return [
        budget for budget in REPORTED_BUDGETS if budget > CUT[1] and budget >= (ready_from or 0)
    ]


def holds(
    card: ModelCard,
    settings: Sequence[float],
    guidance: Sequence[float] = HELD_GUIDANCE,
    shield_risks: Sequence[float] = HELD_SHIELD_RISKS,
    margins: Sequence[float] = HELD_MARGINS,
) -> list[Hold]:
    """Every hold to measure: each setting with the card's guidance, then with each of
    `guidance` where the card has guidance to weigh; on a card with a cost critic, each of
    those again with the shield from `SHIELD_FROM` left at each of `shield_risks`; then each
    setting told its own budget, the fallback at each of `margins`."""
    weights: list[float | None] = [None]
    if card.cost_guidance is not None and card.cost_guidance.weight > 0:
        weights += [weight for weight in guidance if weight != card.cost_guidance.weight]
    shields: list[float | None] = [None]
    if card.cost_critic is not None:
        own = (card.guard.shield_margin, card.guard.shield_risk)
        shields += [risk for risk in shield_risks if own != (SHIELD_FROM, risk)]  # not twice
    told_floor: list[Hold] = [
        (ready_from, weight, risk, None)
        for risk in shields
        for weight in weights
        for ready_from in settings
    ]
    return told_floor + [(each, None, None, margin) for margin in margins for each in settings]


def measure(
    model_dir: Path,
    card: ModelCard,
    settings: Sequence[float],
    episodes: int,
    workers: int,
    guidance: Sequence[float] = HELD_GUIDANCE,
    shield_risks: Sequence[float] = HELD_SHIELD_RISKS,
    margins: Sequence[float] = HELD_MARGINS,
) -> list[CutCandidate]:
    """No hold's steady and cut rows on the selection seeds, then each hold's (`holds`),
    running only what the hold changes: no hold's steady rows stand for the budgets it leaves
    alone, and where no hold already keeps every cut no hold can keep more (`choose`), so none
    is run."""
    with tempfile.TemporaryDirectory(prefix="cdt-cut-ready-") as folder:
        scratch = Path(folder)
        unheld = _measured(
            model_dir, scratch, card, (None, None, None, None), REPORTED_BUDGETS, episodes, workers
        )
        if unheld.cut_share_over == 0:
            logger.info("no hold keeps every cut: the holds are not measured")
            return [unheld]
        measured = [unheld]
        for hold in holds(card, settings, guidance, shield_risks, margins):
            budgets = held_budgets(hold)
            held = _measured(model_dir, scratch, card, hold, budgets, episodes, workers)
            fresh = {row_key(row): row for row in held.rows}
            rows = [fresh.get(row_key(row), row) for row in unheld.rows]
            measured.append(dataclasses.replace(held, rows=rows))
    return measured


def _measured(
    model_dir: Path,
    scratch: Path,
    card: ModelCard,
    hold: Hold,
    budgets: Sequence[float],
    episodes: int,
    workers: int,
) -> CutCandidate:
    """One setting's rows at `budgets` and its cut rows, run on a copy of the model in `scratch`
    whose card holds as `hold` says (no hold included: the card on disk may hold)."""
    label = describe_hold(*hold)
    guard = held_guard(card.guard, *hold)
    copy = copy_with_guard(model_dir, scratch / label.replace(" ", "-").replace(",", ""), guard)
    rows = served_selection_rows(copy, card, episodes, workers, label, budgets)
    measured = CutCandidate(rows, cut_rows(copy, card, episodes, workers), *hold)
    logger.info("%s: %.0f %% over after the cut", label, 100 * measured.cut_share_over)
    return measured


def choose(
    candidates: Sequence[CutCandidate], max_share_over: float, max_reward_given_up: float
) -> CutCandidate:
    """The rule of the module's docstring; `candidates[0]` is no hold."""
    unheld = candidates[0]
    most_over = max(max_share_over, unheld.worst_share_over)
    admissible = [
        candidate
        for candidate in candidates[1:]
        if candidate.worst_share_over <= most_over
        and candidate.reward_given_up(unheld) <= max_reward_given_up
        and candidate.cut_share_over < unheld.cut_share_over
    ]
    if not admissible:
        return unheld
    return min(admissible, key=lambda candidate: (candidate.cut_share_over, -candidate.reward))


def cut_ready_model(
    model_dir: Path,
    settings: Sequence[float] = READY_FROM,
    episodes: int = EPISODES,
    max_reward_given_up: float = MAX_REWARD_GIVEN_UP,
    workers: int = 2,
    guidance: Sequence[float] = HELD_GUIDANCE,
    shield_risks: Sequence[float] = HELD_SHIELD_RISKS,
    margins: Sequence[float] = HELD_MARGINS,
) -> CutCandidate:
    """Measure no hold and each hold, choose, and write the card."""
    card = load_policy(model_dir, writes_card=True).card
    card = card.model_copy(update={"budget_guard": held_guard(card.guard, None)})
    candidates = measure(
        model_dir, card, settings, episodes, workers, guidance, shield_risks, margins
    )
    chosen = choose(candidates, MAX_SHARE_OVER, max_reward_given_up)
    choice = {
        "split": "selection",
        "episodes_per_row": episodes,
        "cut": list(CUT),
        "max_reward_given_up": max_reward_given_up,
        "candidates": [candidate.as_json(candidates[0]) for candidate in candidates],
        "chosen": {
            "cut_ready_from": chosen.ready_from,
            "cut_ready_guidance": chosen.guidance,
            "shield_risk": chosen.shield_risk,
            "cut_ready_margin": chosen.margin,
        },
        "finished": True,
    }
    record_evaluation(model_dir, "cut_ready", choice)
    chosen_guard = held_guard(card.guard, *chosen.hold)
    set_guard(model_dir, read_card(model_dir), chosen_guard)
    entry = LedgerEntry(
        "cut-ready", str(model_dir), chosen.setting, task=card.task, split="selection"
    )
    record(entry)
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt cut-ready", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported policy")
    parser.add_argument(
        "--ready-from",
        type=non_negative_float,
        nargs="+",
        default=list(READY_FROM),
        help="candidate cut_ready_from limits (0: every budget above the floor)",
    )
    parser.add_argument(
        "--held-guidance",
        type=non_negative_float,
        nargs="*",
        default=list(HELD_GUIDANCE),
        help="candidate guidance weights while held, beside the card's (a card with guidance)",
    )
    parser.add_argument(
        "--held-shield-risk",
        type=non_negative_float,
        nargs="*",
        default=list(HELD_SHIELD_RISKS),
        help=f"candidate risks of a shield from {SHIELD_FROM:g} left while held (a card with a "
        "cost critic)",
    )
    parser.add_argument(
        "--held-margin",
        type=non_negative_float,
        nargs="*",
        default=list(HELD_MARGINS),
        help="candidate fallback margins of a hold that tells the model its own budget",
    )
    parser.add_argument("--episodes", type=positive_int, default=EPISODES, help="episodes per row")
    parser.add_argument(
        "--max-reward-given-up", type=non_negative_float, default=MAX_REWARD_GIVEN_UP
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    return parser


@exit_on_user_errors("cdt cut-ready")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt cut-ready`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    chosen = cut_ready_model(
        args.model_dir,
        args.ready_from,
        args.episodes,
        args.max_reward_given_up,
        args.workers,
        args.held_guidance,
        args.held_shield_risk,
        args.held_margin,
    )
    print(
        f"cdt cut-ready: {chosen.setting} ({chosen.cut_share_over:.0%} over after the cut "
        f"{CUT[0]:g} -> {CUT[1]:g}) -> {args.model_dir}"
    )


if __name__ == "__main__":
    main()
