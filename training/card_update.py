"""Write measured results into an exported policy's model card (`model.json`).

The card is what the service shows users: `evaluation` holds the measured scores, `cost_curve`
the target-cost -> actual-cost curve of the zero-shot sweep, and `validated_cost_range` the
targets at which the measured cost stayed within the target (the service warns outside it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from runtime.arguments import CommandParser, budget
from runtime.card import ModelCard, read_card, update_card
from runtime.evaluation_protocol import action_mode
from runtime.files import CARD_FILE, check_writable
from runtime.user_errors import UserError, exit_on_user_errors
from training.data.dataset import load_dataset, read_task
from training.data.frontiers import derive_default_targets


def record_evaluation(model_dir: Path, key: str, result: dict[str, Any]) -> None:
    """Store one evaluation result under `evaluation[key]` (e.g. "protocol")."""
    evaluation = dict(read_card(model_dir).evaluation or {})
    evaluation[key] = result
    update_card(model_dir, evaluation=evaluation)


def check_model_name(name: str, where: str) -> None:
    """Refuse, as a `UserError` before any work, a name the model card would refuse only once
    the model is trained (`ModelCard.name`: no path separators, no leading dot); `where` starts
    the message (e.g. "--name NAME")."""
    try:
        TypeAdapter(Annotated[str, ModelCard.model_fields["name"]]).validate_python(name)
    except ValidationError as error:
        reason = "; ".join(problem["msg"] for problem in error.errors())
        raise UserError(f"{where}: not a model name ({reason})") from None


def check_dataset_task(card: ModelCard, dataset: Path, option: str = "--dataset") -> None:
    """Refuse a dataset that names another task than the card's (a `UserError`, one line): what
    is derived from it would describe another task's data. A file naming no task (no `env_id`)
    cannot be told apart, and is taken as it is."""
    task = read_task(dataset)
    if task not in (card.task, "unknown"):
        raise UserError(
            f"{option} {dataset}: holds {task} data, the model is trained on {card.task}:"
            " give a dataset of its task"
        )


def validated_cost_range(curve: list[dict[str, float]]) -> list[float] | None:
    """The widest contiguous run of positive targets whose measured cost stayed <= target.

    A target of 0 is excluded: no measured mean cost of a stochastic policy is exactly 0, and a
    range must say where the policy honours its budget.
    """
    points = sorted((p for p in curve if p["target_cost"] > 0), key=lambda p: p["target_cost"])
    best: list[float] | None = None
    start: float | None = None
    for index, point in enumerate(points):
        honoured = point["actual_cost"] <= point["target_cost"]
        if honoured and start is None:
            start = point["target_cost"]
        if start is not None and (not honoured or index == len(points) - 1):
            end = point["target_cost"] if honoured else points[index - 1]["target_cost"]
            if best is None or end - start > best[1] - best[0]:
                best = [start, end]
            start = None
    return best


def record_sweep(model_dir: Path, zero_shot_rows: list[dict[str, Any]]) -> None:
    """Store the zero-shot cost curve, the validated budget range it implies and the action mode
    it was measured with (the rows' `deterministic`)."""
    curve = [
        {
            "target_cost": row["target_cost"],
            "actual_cost": row["cost_mean"],
            "actual_cost_std": row["cost_std"],
            "reward": row["reward_mean"],
        }
        for row in zero_shot_rows
    ]
    modes = {action_mode(bool(row.get("deterministic"))) for row in zero_shot_rows}
    update_card(
        model_dir,
        cost_curve=curve,
        validated_cost_range=validated_cost_range(curve),
        validated_action_mode=" and ".join(sorted(modes)),
    )


def record_default_targets(model_dir: Path, targets: list[dict[str, float]]) -> None:
    """Store the (reward, cost) target pairs users should start from."""
    update_card(model_dir, default_targets=targets)


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="cdt card-update",
        description="Re-derive a model card's default (reward, cost) targets from a dataset: "
        "reward PF(kappa) + 10 % of the reward range (at most the best reward return) at each "
        "cost threshold kappa.",
    )
    parser.add_argument("model_dir", type=Path, help=f"exported policy folder (its {CARD_FILE})")
    parser.add_argument("--dataset", type=Path, required=True, help="the model's training data")
    thresholds = [10.0, 20.0, 40.0]
    parser.add_argument("--thresholds", type=budget, nargs="+", default=thresholds, metavar="K")
    return parser


@exit_on_user_errors("cdt card-update")
def main(argv: list[str] | None = None) -> None:
    """`python -m training.card_update MODEL_DIR --dataset FILE`: record default targets."""
    args = _parser().parse_args(argv)
    card = read_card(args.model_dir)  # a missing or broken card: one line, before any data
    check_dataset_task(card, args.dataset)
    check_writable(args.model_dir / CARD_FILE)
    dataset = load_dataset(args.dataset)
    targets = derive_default_targets(
        dataset.cost_returns, dataset.reward_returns, tuple(args.thresholds)
    )
    record_default_targets(args.model_dir, targets)
    print(json.dumps(targets))


if __name__ == "__main__":
    main()
