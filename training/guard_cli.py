"""`cdt guard MODEL_DIR`: show or set the budget guard a model card asks the service for.

The guard's defaults (`runtime.budget_guard`) suit most models; a card may set its own thresholds
where measurement says so (docs/decisions/budget-guard.md: AntRun and CarCircle spend less with
no fallback and no reserve). This command is how a card gets them: the settings are validated as
the service will read them, and what was measured with the old guard is dropped from the card
(`budget_guard_measured`), so the card never shows figures of a guard it no longer asks for.
The service applies the new guard at an episode's next step after a reload.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from runtime.arguments import CommandParser
from runtime.budget_guard import DEFAULT_GUARD, BudgetGuard
from runtime.card import ModelCard, read_card, update_card
from runtime.files import CARD_FILE, check_writable
from runtime.user_errors import UserError, exit_on_user_errors


def parse_guard(text: str) -> BudgetGuard:
    """`--set`'s JSON object as a `BudgetGuard`; a `UserError` naming what is wrong."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"--set: not JSON ({error.msg}): {text!r}") from None
    if not isinstance(values, dict):
        raise UserError(f"--set: a JSON object of guard settings, got {text!r}")
    try:
        return BudgetGuard(**values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors()
        )
        raise UserError(f"--set: {problems}") from None


def check_guard_fits(card: ModelCard, guard: BudgetGuard | None) -> None:
    """Raise a `UserError` naming the setting where the card cannot take `guard` (a shield
    without a cost critic): the card on disk is valid, the setting is not, for this card."""
    wanted = None if guard is None else guard.model_dump()
    try:
        ModelCard.model_validate(card.model_dump() | {"budget_guard": wanted})
    except ValidationError as error:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
        raise UserError(f"--set: {problems}; the card is unchanged") from None


def set_guard(model_dir: Path, card: ModelCard, guard: BudgetGuard | None) -> ModelCard | None:
    """Write `guard` into `model_dir`'s card, read as `card` (None: the defaults); the new card,
    or None where the card already asks for that guard.

    A change drops `budget_guard_measured`, which was measured with the old guard.
    """
    if card.guard == (guard or DEFAULT_GUARD):
        return None
    changes: dict[str, object] = {"budget_guard": guard}
    if card.budget_guard_measured is not None:
        changes["budget_guard_measured"] = None
    return update_card(model_dir, **changes)


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="cdt guard",
        description="Show a model card's budget guard, or set it: --set takes the settings that "
        'differ from the defaults as JSON, e.g. \'{"fallback_margin": 0, "hidden_reserve": 0}\'.',
    )
    parser.add_argument("model_dir", type=Path, help=f"exported policy folder (its {CARD_FILE})")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--set", dest="settings", metavar="JSON", help="the card's own guard")
    choice.add_argument("--default", action="store_true", help="back to the defaults")
    return parser


@exit_on_user_errors("cdt guard")
def main(argv: list[str] | None = None) -> None:
    """`cdt guard MODEL_DIR [--set JSON | --default]`: print the guard the card asks for."""
    args = _parser().parse_args(argv)
    card = read_card(args.model_dir)  # a missing or broken card: one line
    if args.settings is not None or args.default:
        guard = None if args.default else parse_guard(args.settings)
        check_guard_fits(card, guard)
        check_writable(args.model_dir / CARD_FILE)
        changed = set_guard(args.model_dir, card, guard)
        if changed is not None:
            card = changed
            print(
                "guard changed; measure it again: cdt evaluate MODEL_DIR --convention protocol "
                "--split validation, then python bench/budget_guard.py --models NAME --record"
            )
    own = "its own" if card.budget_guard is not None else "the defaults"
    print(json.dumps({"guard": own, **card.guard.model_dump()}))


if __name__ == "__main__":
    main()
