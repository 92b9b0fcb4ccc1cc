"""`cdt critic MODEL_DIR`: train a model's cost critic, the budget guard's shield, and write it
beside the model (`cost_critic.onnx`) with its record in the card (`cost_critic`).

The critic learns from the model's own training dataset by default (the card's `dataset.path`,
relative to the current folder); a `--dataset` of another task is refused. A model's critic is
replaced only with `--force`, and then the shield chosen with the old critic is switched off and
what the guard measured with it dropped (as `cdt guard` drops it): its margin and risk were
tuned to the old critic's predictions, and `cdt shield` chooses them again. The arguments are
parsed and checked here, apart from the trainer (`cost_critic.py`), so that `--help` and a
mistake answer before torch loads (~2 s).
"""

from __future__ import annotations

import logging
import time
from argparse import ArgumentTypeError
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.arguments import CommandParser, non_negative_int, positive_int
from runtime.budget_guard import DEFAULT_GUARD
from runtime.card import CostCriticCard, ModelCard, read_card, update_card
from runtime.files import CARD_FILE, COST_CRITIC_FILE, check_writable
from runtime.user_errors import UserError, exit_on_user_errors
from training.card_update import check_dataset_task
from training.ledger import LedgerEntry
from training.ledger import record as ledger_record

if TYPE_CHECKING:
    from training.cost_critic import CriticConfig, CriticFit


def discount(text: str) -> float:
    """A discount: a number in (0, 1)."""
    value = float(text)
    if not 0 < value < 1:  # NaN fails too
        raise ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return value


def dataset_path(card: ModelCard, model_dir: Path, given: Path | None) -> Path:
    """The dataset to learn from: `given`, else the card's; a `UserError` when there is none."""
    path = given
    if path is None:
        recorded = (card.dataset or {}).get("path")
        if not isinstance(recorded, str) or not recorded:
            raise UserError(f"{model_dir / CARD_FILE}: names no dataset path; pass --dataset PATH")
        path = Path(recorded)
    if not path.is_file():
        where = "--dataset" if given is not None else f"{model_dir / CARD_FILE}'s dataset"
        raise UserError(f"{where}: no such file: {path} (pass --dataset PATH)")
    return path


def refuse_replacing(model_dir: Path, card: ModelCard, force: bool) -> None:
    """Raise `UserError` where the model has a critic already (its graph or the card's record),
    unless `force`: a shorter fit would silently replace a better one."""
    path = model_dir / COST_CRITIC_FILE
    if force or (card.cost_critic is None and not path.exists()):
        return
    old, fit = card.cost_critic, ""
    if old is not None:
        fit = f" ({old.update_steps} steps, validation MSE {old.validation_mse:.3g})"
    raise UserError(
        f"{path}: the model has a cost critic already{fit}: pass --force to replace it (the"
        " shield chosen with it is then switched off, for `cdt shield` to choose again)"
    )


def replaced_critic_changes(card: ModelCard) -> dict[str, Any]:
    """The card changes beside a new critic's record where `card` has one already: the shield
    is switched off (its margin and risk were tuned to the old critic's predictions) and what
    the guard measured with it dropped, as `cdt guard` drops it; the shield stage's record goes
    too, so that `cdt shield` or the pipeline's shield stage chooses again."""
    if card.cost_critic is None:
        return {}
    changes: dict[str, Any] = {}
    if card.guard.shield_margin > 0:
        off = {"shield_margin": 0.0, "shield_risk": DEFAULT_GUARD.shield_risk}
        guard = card.guard.model_copy(update=off)
        changes["budget_guard"] = None if guard == DEFAULT_GUARD else guard.model_dump()
        changes["budget_guard_measured"] = None
    evaluation = dict(card.evaluation or {})
    if evaluation.pop("shield", None) is not None:
        changes["evaluation"] = evaluation
    return changes


def replaced_note(model_dir: Path, card: ModelCard) -> str:
    """The line `cdt critic --force` prints where it replaced a critic (empty where none)."""
    old = card.cost_critic
    if old is None:
        return ""
    guard = card.guard
    reset = "the shield choice made with it is dropped"
    if guard.shield_margin > 0:
        reset = (
            f"its shield (shield_margin {guard.shield_margin:g}, shield_risk "
            f"{guard.shield_risk:g}) is off and what the guard measured with it dropped"
        )
    return (
        f"replaced the cost critic of {old.update_steps} steps (validation MSE "
        f"{old.validation_mse:.4g}); {reset}: choose the shield again with `cdt shield {model_dir}`"
    )


def write_critic(
    model_dir: Path, card: ModelCard, dataset: Path, config: CriticConfig
) -> CriticFit:
    """Train the critic on `dataset`, write `cost_critic.onnx`, then the card's record (it names
    the graph, so it comes second); `cdt critic` and the pipeline's critic stage. A critic the
    card had is replaced, with the shield chosen for it (`replaced_critic_changes`)."""
    from training.cost_critic import export_cost_critic, train_cost_critic
    from training.data.dataset import load_dataset
    from training.export import quiet_exporter_logs

    episodes = load_dataset(dataset).episodes
    dims = (episodes[0].observations.shape[1], episodes[0].actions.shape[1])
    if dims != (card.observation_dim, card.action_dim):
        raise UserError(
            f"{dataset}: observation and action dims {dims}, the model's are "
            f"{(card.observation_dim, card.action_dim)}"
        )
    result = train_cost_critic(episodes, config)
    quiet_exporter_logs()
    export_cost_critic(result.critic, model_dir / COST_CRITIC_FILE)
    record = CostCriticCard(
        discount=config.discount,
        dataset=str(dataset),
        update_steps=config.update_steps,
        validation_mse=result.validation_mse,
        target_variance=result.target_variance,
    )
    # Read again: the card as it is now, not as it was before the fit, is the one changed.
    changes = replaced_critic_changes(read_card(model_dir))
    update_card(model_dir, cost_critic=record.model_dump(), **changes)
    outcome = (
        f"validation MSE {result.validation_mse:.3g} (target variance {result.target_variance:.3g})"
    )
    ledger_record(
        LedgerEntry(
            "critic", str(model_dir), outcome, task=card.task, seed=config.seed,
            steps=config.update_steps,
        )
    )  # fmt: skip
    return result


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="cdt critic",
        description="Train an exported model's cost critic (the budget guard's shield): it "
        "predicts the discounted cost that follows an action, and is written beside the model.",
    )
    parser.add_argument("model_dir", type=Path, help=f"exported policy folder (its {CARD_FILE})")
    parser.add_argument(
        "--dataset", type=Path, help="DSRL HDF5 file to learn from (default: the card's dataset)"
    )
    parser.add_argument(
        "--discount", type=discount, default=0.9, help="weight per step of later costs, in (0, 1)"
    )
    parser.add_argument("--steps", type=positive_int, default=20_000, help="update steps")
    parser.add_argument("--batch-size", type=positive_int, default=1024, help="transitions/step")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="numpy and torch seed")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace the model's cost critic (its shield is off until `cdt shield` chooses)",
    )
    return parser


@exit_on_user_errors("cdt critic")
def main(argv: list[str] | None = None) -> None:
    """`cdt critic MODEL_DIR [--dataset PATH] [--discount D] [--steps N] ...`."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    card = read_card(args.model_dir)  # a missing or broken card: one line
    dataset = dataset_path(card, args.model_dir, args.dataset)
    if args.dataset is not None:  # the card's own dataset is the model's by definition
        check_dataset_task(card, dataset)
    refuse_replacing(args.model_dir, card, args.force)
    check_writable(args.model_dir / COST_CRITIC_FILE)
    check_writable(args.model_dir / CARD_FILE)
    # Imported after the checks: torch and onnx load in seconds, which a mistake never needs.
    from training.cost_critic import CriticConfig

    config = CriticConfig(
        discount=args.discount,
        update_steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        threads=args.threads,
    )
    started = time.perf_counter()
    result = write_critic(args.model_dir, card, dataset, config)
    path = args.model_dir / COST_CRITIC_FILE
    print(
        f"cost critic: validation MSE {result.validation_mse:.4g} vs target variance "
        f"{result.target_variance:.4g} on {result.validation_episodes} held-out episodes "
        f"({time.perf_counter() - started:.0f} s); wrote {path} and {args.model_dir / CARD_FILE}"
    )
    if note := replaced_note(args.model_dir, card):
        print(note)


if __name__ == "__main__":
    main()
