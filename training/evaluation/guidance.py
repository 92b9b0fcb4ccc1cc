"""`cdt guidance MODEL_DIR`: choose how strongly an exported policy is guided by its cost token.

A CDT trained on a CPU budget may read its cost-to-go only weakly (CarCircle, AntRun: its cost
rises with the budget it is told, but well above it). Cost guidance (`runtime.card.CostGuidance`)
pushes the mean action away from what the policy would do with `shift` more cost-to-go. For each
candidate weight this runs the reported protocol (every budget, sampled and mean actions) on the
selection seeds, as the service serves it (budget guard on), and keeps the admissible weight of
the best score under the selection rule, with at most `--max-share-over` of episodes over budget.
Every measured weight goes to the card's `evaluation.guidance` (a rerun with the same shift and
episodes measures only new weights and chooses among all); the choice to `cost_guidance`,
with a version mark (an episode pinned to the old version keeps the old behaviour). Where no
weight is admissible the card is left as it was and the command exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.arguments import CommandParser, non_negative_float, positive_float, positive_int, share
from runtime.card import CostGuidance, ModelCard, update_card
from runtime.evaluation_protocol import (
    REPORTED_BUDGETS,
    BudgetRow,
    SelectionRule,
    describe,
    on_frontier,
)
from runtime.files import CARD_FILE, ONNX_FILE
from runtime.user_errors import exit_on_user_errors
from training.evaluation.inputs import load_policy
from training.evaluation.served_rows import served_selection_rows
from training.ledger import LedgerEntry, record

logger = logging.getLogger(__name__)

WEIGHTS = (0.0, 1.0, 2.0, 3.0)
"""Candidate weights. Measured reason (selection seeds, 10 mean-action episodes at kappa 10): a
CarCircle CDT cost 13 unguided, 0 at weight 1 (reward 242 of 321); an AntRun CDT 26 unguided,
18 at weight 1, 5 at weight 2 (reward 411 of 589); docs/decisions/cost-guidance.md."""

MAX_SHARE_OVER = 0.1
"""Share of selection episodes a weight may let over budget: half the selection rule's 20 %,
as for sampled calibration, since held-out seeds see more of the tail than the chosen ones."""

_GUIDED_MARK = re.compile(r"\+guided[0-9.]+$")


@dataclasses.dataclass(frozen=True)
class WeightResult:
    """One candidate weight measured on the selection seeds."""

    weight: float
    rows: list[BudgetRow]
    admissible: bool
    score: float
    failures: list[str]

    def as_json(self) -> dict[str, Any]:
        return {
            "weight": self.weight,
            "admissible": self.admissible,
            "score": self.score,
            "failures": self.failures,
            "rows": [dataclasses.asdict(row) for row in self.rows],
        }


def rule_for(card: ModelCard, max_share_over: float) -> SelectionRule:
    """The selection rule on this card's data (`on_frontier`), with `max_share_over`."""
    reward_range = card.reward_return_range
    span = 0.0 if reward_range is None else reward_range[1] - reward_range[0]
    rule = SelectionRule(max_share_over=max_share_over)
    return on_frontier(rule, card.default_targets or [], span)


def guided_version(version: str, weight: float) -> str:
    """The card's version marked with the guidance weight (replacing an earlier mark)."""
    return _GUIDED_MARK.sub("", version) + f"+guided{weight:g}"


def guidance_at(weight: float, shift: float) -> CostGuidance | None:
    """The card's guidance for `weight` (None for 0: the plain policy)."""
    return CostGuidance(weight=weight, shift=shift) if weight > 0 else None


def _guided_copy(model_dir: Path, into: Path, guidance: CostGuidance | None) -> Path:
    """A copy of the model whose card carries `guidance` (worker processes load it from disk)."""
    into.mkdir(parents=True)
    shutil.copy2(model_dir / ONNX_FILE, into / ONNX_FILE)
    card = json.loads((model_dir / CARD_FILE).read_text())
    card["cost_guidance"] = None if guidance is None else guidance.model_dump()
    (into / CARD_FILE).write_text(json.dumps(card))
    return into


def judged(weight: float, rows: list[BudgetRow], rule: SelectionRule) -> WeightResult:
    """One weight's rows under `rule`."""
    failures = rule.failures(rows)
    return WeightResult(weight, rows, not failures, rule.score(rows), failures)


def measure_weights(
    model_dir: Path,
    card: ModelCard,
    weights: Sequence[float],
    shift: float,
    episodes: int,
    workers: int,
    rule: SelectionRule,
) -> list[WeightResult]:
    """Each weight's protocol rows on the selection seeds, guard on (as served)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="cdt-guidance-") as scratch:
        for weight in weights:
            copy = _guided_copy(
                model_dir, Path(scratch) / f"w{weight:g}", guidance_at(weight, shift)
            )
            label = f"guidance weight {weight:g}"
            rows = served_selection_rows(copy, card, episodes, workers, label)
            result = judged(weight, rows, rule)
            logger.info(
                "weight %g: %s, score %.2f; %s",
                weight,
                "admissible" if result.admissible else "; ".join(result.failures),
                result.score,
                describe(rows),
            )
            results.append(result)
    return results


def earlier_results(
    card: ModelCard, shift: float, episodes: int, rule: SelectionRule
) -> dict[float, WeightResult]:
    """Weights an earlier run measured on the same shift and episode count (re-judged under
    `rule`): a rerun with more weights measures only the new ones, and loses none."""
    earlier = (card.evaluation or {}).get("guidance") or {}
    if earlier.get("shift") != shift or earlier.get("episodes_per_row") != episodes:
        return {}
    return {
        float(entry["weight"]): judged(
            float(entry["weight"]), [BudgetRow(**row) for row in entry["rows"]], rule
        )
        for entry in earlier.get("weights", [])
    }


def choose(results: Sequence[WeightResult]) -> WeightResult | None:
    """The admissible weight of the best score (ties: the smaller weight), or None."""
    admissible = [result for result in results if result.admissible]
    if not admissible:
        return None
    return max(admissible, key=lambda result: (result.score, -result.weight))


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt guidance", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported policy directory (models/NAME)")
    parser.add_argument(
        "--weights",
        type=non_negative_float,
        nargs="+",
        default=list(WEIGHTS),
        help="candidate guidance weights (0: none)",
    )
    parser.add_argument(
        "--shift",
        type=positive_float,
        default=max(REPORTED_BUDGETS),
        help="cost-to-go added in the contrast pass (default: the largest reported budget)",
    )
    parser.add_argument(
        "--episodes", type=positive_int, default=20, help="episodes per budget and action mode"
    )
    parser.add_argument("--max-share-over", type=share, default=MAX_SHARE_OVER)
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    return parser


def guide_model(
    model_dir: Path,
    weights: Sequence[float] = WEIGHTS,
    shift: float = max(REPORTED_BUDGETS),
    episodes: int = 20,
    max_share_over: float = MAX_SHARE_OVER,
    workers: int = 2,
) -> WeightResult | None:
    """Measure the weights not measured before, choose, and write the card (`evaluation.guidance`
    always, marked `finished`; `cost_guidance` and the version only when a weight is admissible).
    Returns the chosen weight's result, or None."""
    card = load_policy(model_dir, writes_card=True).card
    rule = rule_for(card, max_share_over)
    earlier = earlier_results(card, shift, episodes, rule)
    new = sorted(set(weights) - set(earlier))
    if len(new) < len(set(weights)):
        logger.info("measured before (the card's evaluation.guidance): %s", sorted(earlier))
    measured = measure_weights(model_dir, card, new, shift, episodes, workers, rule)
    results = sorted([*earlier.values(), *measured], key=lambda result: result.weight)
    evaluation = dict(card.evaluation or {})
    evaluation["guidance"] = {
        "split": "selection",
        "episodes_per_row": episodes,
        "shift": shift,
        "budget_guard": True,
        "weights": [result.as_json() for result in results],
        "finished": True,
    }
    chosen = choose(results)
    listed = [result.weight for result in results]
    if chosen is None:
        update_card(model_dir, evaluation=evaluation)
        outcome = "not admissible at any weight"
    else:
        guidance = guidance_at(chosen.weight, shift)
        update_card(
            model_dir,
            evaluation=evaluation,
            cost_guidance=None if guidance is None else guidance.model_dump(),
            version=guided_version(card.version, chosen.weight),
        )
        outcome = f"weight {chosen.weight:g}, score {chosen.score:.2f}"
    entry = LedgerEntry("guidance", str(model_dir), outcome, task=card.task, split="selection")
    record(dataclasses.replace(entry, details={"weights": listed}))
    return chosen


@exit_on_user_errors("cdt guidance")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt guidance`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    chosen = guide_model(
        args.model_dir, args.weights, args.shift, args.episodes, args.max_share_over, args.workers
    )
    if chosen is None:
        raise SystemExit(
            f"cdt guidance: no weight of {sorted(set(args.weights))} keeps the budgets on the"
            " selection seeds; the card's guidance is unchanged (its rows are in"
            " evaluation.guidance)"
        )
    print(f"cdt guidance: weight {chosen.weight:g} (score {chosen.score:.2f}) -> {args.model_dir}")


if __name__ == "__main__":
    main()
