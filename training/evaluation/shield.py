"""`cdt shield MODEL_DIR`: choose the budget guard's shield for a model with a cost critic.

The shield (`runtime.cost_critic`) replaces an action its critic calls costly once the budget
left is at most `shield_margin`; how much it helps, and what it costs, depends on the model
(docs/decisions/budget-guard.md: CarCircle needed a margin of 25, DroneCircle 15). For the card's
guard without a shield and with each candidate (margin, risk), this runs the reported budgets
in both action modes on 40 selection episodes each, as served (guard on), and keeps:

0. where the unshielded guard lets no episode over in any row, no shield: none is run (one
   could only trade reward by chance there, and it asks the critic at every step it watches);
1. among the candidates with at most `--max-share-over` of episodes over budget in every row
   and at most `--max-reward-given-up` normalised reward points below the unshielded guard's in
   every row (the unshielded guard itself is such a candidate when it keeps the share), the one
   of the highest mean normalised reward;
2. where none is, the one with the smallest worst share over (ties: the higher reward), since
   an episode's budget comes first.

Every candidate's rows go to the card's `evaluation.shield`; the chosen setting to its
`budget_guard` (which drops what the old guard measured, as `cdt guard` does). A budget no larger
than two settings' margins is shielded from the first step under both, so with the same risk their
episodes there are the same: the later setting takes the earlier one's rows (with the default
settings, the margin-25 settings' rows at budget 10: a seventh of the stage's episodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.arguments import CommandParser, non_negative_float, positive_int, share
from runtime.budget_guard import DEFAULT_GUARD, GUARD_TARGET_SHARE_OVER, BudgetGuard
from runtime.card import ModelCard, read_card, update_card
from runtime.evaluation_protocol import REPORTED_BUDGETS, BudgetRow
from runtime.files import CARD_FILE
from runtime.user_errors import UserError, exit_on_user_errors
from training.card_update import record_evaluation
from training.evaluation.inputs import load_policy
from training.evaluation.served_rows import served_selection_rows
from training.guard_cli import set_guard
from training.ledger import LedgerEntry, record

logger = logging.getLogger(__name__)

SHIELDS = ((15.0, 0.5), (25.0, 0.5), (15.0, 1.0), (25.0, 1.0), (15.0, 2.0), (25.0, 2.0))
"""Candidate (shield_margin, shield_risk): the margins that kept CarCircle's and DroneCircle's
budgets on their selection seeds, at the risk DroneCircle's card asks for (0.5), the one
CarCircle's does (1) and a looser one (docs/decisions/budget-guard.md)."""
EPISODES = 40
"""Selection episodes per budget and action mode: with 20, CarCircle's margin of 15 showed no
episode over at 20, with 40 two (docs/decisions/budget-guard.md); the target is one in twenty."""
MAX_SHARE_OVER = GUARD_TARGET_SHARE_OVER / 2
"""Half the guard's target, as `cdt guidance` halves the selection rule's share: held-out seeds
see more of the tail than the seeds that chose."""
MAX_REWARD_GIVEN_UP = 3.0
"""Normalised reward points the shield may cost in any row (the budget guard issue's bar)."""


def describe_setting(margin: float, risk: float) -> str:
    """`margin M, risk R`, or `no shield` (margin 0)."""
    return f"margin {margin:g}, risk {risk:g}" if margin else "no shield"


@dataclasses.dataclass(frozen=True)
class MeasuredGuard:
    """A budget guard setting's rows on the selection seeds: every reported budget and action
    mode (`cdt shield` and `cdt cut-ready` choose among these)."""

    rows: list[BudgetRow]

    @property
    def worst_share_over(self) -> float:
        return max(row.share_over_budget for row in self.rows)

    @property
    def reward(self) -> float:
        """Mean normalised reward over the rows."""
        return float(np.mean([row.normalised_reward for row in self.rows]))

    def reward_given_up(self, base: MeasuredGuard) -> float:
        """The most normalised reward points below `base`'s, row by row: each row against
        `base`'s of the same target, budget and action mode (the rows' order is not theirs)."""
        base_rows = {row_key(row): row for row in base.rows}
        if set(base_rows) != {row_key(row) for row in self.rows}:
            raise ValueError("the guards were measured on different rows")
        return max(
            base_rows[row_key(row)].normalised_reward - row.normalised_reward for row in self.rows
        )


def row_key(row: BudgetRow) -> tuple[float, float, bool]:
    """What makes a selection row the same row in two measurements: its target, budget and
    action mode."""
    return row.target_reward, row.target_cost, row.deterministic


@dataclasses.dataclass(frozen=True)
class ShieldCandidate(MeasuredGuard):
    """One shield setting measured on the selection seeds (margin 0: no shield)."""

    margin: float = 0.0
    risk: float = 0.0

    @property
    def setting(self) -> str:
        return describe_setting(self.margin, self.risk)

    def as_json(self, unshielded: ShieldCandidate) -> dict[str, Any]:
        return {
            "shield_margin": self.margin,
            "shield_risk": self.risk,
            "worst_share_over": self.worst_share_over,
            "reward_mean": self.reward,
            "reward_given_up": self.reward_given_up(unshielded),
            "rows": [dataclasses.asdict(row) for row in self.rows],
        }


def shielded_guard(guard: BudgetGuard, margin: float, risk: float) -> BudgetGuard:
    """`guard` with this shield (margin 0: none)."""
    return guard.model_copy(update={"shield_margin": margin, "shield_risk": risk})


def copy_with_guard(model_dir: Path, into: Path, guard: BudgetGuard) -> Path:
    """A copy of the model (graphs included) whose card asks for `guard`, for the workers."""
    shutil.copytree(model_dir, into)
    update_card(into, budget_guard=guard.model_dump(), budget_guard_measured=None)
    return into


def measure_shields(
    model_dir: Path,
    card: ModelCard,
    settings: Sequence[tuple[float, float]],
    episodes: int,
    workers: int,
) -> list[ShieldCandidate]:
    """The unshielded guard's rows on the selection seeds, every reported budget and action
    mode, then each setting's; none of the settings where the guard alone let no episode over."""
    measured: list[ShieldCandidate] = []
    with tempfile.TemporaryDirectory(prefix="cdt-shield-") as scratch:
        for margin, risk in [(0.0, 0.0), *settings]:
            label = describe_setting(margin, risk)
            rows = shared_rows(measured, margin, risk)
            covered = {row.target_cost for row in rows}
            budgets = [budget for budget in REPORTED_BUDGETS if budget not in covered]
            if budgets:
                copy = copy_with_guard(
                    model_dir, Path(scratch) / f"m{margin:g}-r{risk:g}",
                    shielded_guard(card.guard, margin, risk),
                )  # fmt: skip
                rows += served_selection_rows(copy, card, episodes, workers, label, budgets)
            rows.sort(key=lambda row: (row.target_cost, row.deterministic))
            measured.append(ShieldCandidate(rows, margin, risk))
            logger.info("%s: worst share over %.0f %%", label, 100 * measured[-1].worst_share_over)
            if measured[0].worst_share_over == 0:
                logger.info("no episode went over without a shield: no shield is tried")
                break
    return measured


def shared_rows(measured: Sequence[ShieldCandidate], margin: float, risk: float) -> list[BudgetRow]:
    """The most rows an earlier setting with the same risk measured at budgets no larger than
    its margin and `margin`: the same episodes, shielded from the first step under both."""
    shared: list[BudgetRow] = []
    for earlier in measured:
        if earlier.margin and earlier.risk == risk:
            cover = min(earlier.margin, margin)
            rows = [row for row in earlier.rows if row.target_cost <= cover]
            shared = rows if len(rows) > len(shared) else shared
    return shared


def choose(
    candidates: Sequence[ShieldCandidate], max_share_over: float, max_reward_given_up: float
) -> ShieldCandidate:
    """The rule of the module's docstring; `candidates[0]` is the unshielded guard, which wins
    ties (no shield where one buys nothing)."""
    unshielded = candidates[0]
    admissible = [
        candidate
        for candidate in candidates
        if candidate.worst_share_over <= max_share_over
        and candidate.reward_given_up(unshielded) <= max_reward_given_up
    ]
    if admissible:
        return max(admissible, key=lambda candidate: candidate.reward)
    return min(candidates, key=lambda candidate: (candidate.worst_share_over, -candidate.reward))


def shield_model(
    model_dir: Path,
    settings: Sequence[tuple[float, float]] = SHIELDS,
    episodes: int = EPISODES,
    max_share_over: float = MAX_SHARE_OVER,
    max_reward_given_up: float = MAX_REWARD_GIVEN_UP,
    workers: int = 2,
) -> ShieldCandidate:
    """Measure the unshielded guard and each setting, choose, and write the card."""
    card = load_policy(model_dir, writes_card=True).card
    if card.cost_critic is None:
        raise UserError(f"{model_dir / CARD_FILE}: no cost critic; run `cdt critic {model_dir}`")
    candidates = measure_shields(model_dir, card, settings, episodes, workers)
    chosen = choose(candidates, max_share_over, max_reward_given_up)
    choice = {
        "split": "selection",
        "episodes_per_row": episodes,
        "max_share_over": max_share_over,
        "max_reward_given_up": max_reward_given_up,
        "candidates": [candidate.as_json(candidates[0]) for candidate in candidates],
        "chosen": {"shield_margin": chosen.margin, "shield_risk": chosen.risk},
        "finished": True,
    }
    record_evaluation(model_dir, "shield", choice)
    risk = chosen.risk if chosen.margin else DEFAULT_GUARD.shield_risk  # unread without a margin
    set_guard(model_dir, read_card(model_dir), shielded_guard(card.guard, chosen.margin, risk))
    entry = LedgerEntry("shield", str(model_dir), chosen.setting, task=card.task, split="selection")
    record(entry)
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt shield", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported policy with a cost critic")
    parser.add_argument(
        "--margins", type=non_negative_float, nargs="+", help="candidate shield margins"
    )
    parser.add_argument("--risks", type=non_negative_float, nargs="+", help="candidate risks")
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=EPISODES,
        help="episodes per budget and action mode",
    )
    parser.add_argument("--max-share-over", type=share, default=MAX_SHARE_OVER)
    parser.add_argument(
        "--max-reward-given-up", type=non_negative_float, default=MAX_REWARD_GIVEN_UP
    )
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    return parser


@exit_on_user_errors("cdt shield")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt shield`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    settings = list(SHIELDS)
    if args.margins or args.risks:
        margins = args.margins or sorted({margin for margin, _ in SHIELDS})
        risks = args.risks or sorted({risk for _, risk in SHIELDS})
        settings = [(margin, risk) for margin in margins for risk in risks if margin > 0]
    chosen = shield_model(
        args.model_dir, settings, args.episodes, args.max_share_over, args.max_reward_given_up,
        args.workers,
    )  # fmt: skip
    met = chosen.worst_share_over <= args.max_share_over
    print(
        f"cdt shield: {chosen.setting} (worst share over {chosen.worst_share_over:.0%}"
        f"{'' if met else ', above the target: no setting kept it'}) -> {args.model_dir}"
    )


if __name__ == "__main__":
    main()
