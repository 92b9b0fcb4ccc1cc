"""Every shipped CDT card says how its budget guard did at every budget it claims.

Issue 28's bar holds at every budget in a card's validated range (at least 10, 20 and 40) and
for a cut from 40 to 10 at mid-episode. `bench/budget_guard.py --record` writes what it measured
from outside into the card (`budget_guard_measured`); `cdt guard --set` drops those rows. So a
card shipped with a guard changed after its measurement, or with a range wider than the budgets
measured, fails here. The shares themselves are 20-episode figures, read in the bench's output
and docs/decisions/budget-guard.md, not asserted here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.card import ModelCard, read_card

MODELS = Path(__file__).resolve().parents[1] / "models"
CDT_CARDS = sorted(path.parent for path in MODELS.glob("cdt-*/model.json"))
ISSUE_BUDGETS = (10.0, 20.0, 40.0)


@pytest.fixture(params=CDT_CARDS, ids=lambda path: path.name)
def card(request: pytest.FixtureRequest) -> ModelCard:
    return read_card(request.param)


def test_there_are_shipped_cdt_cards() -> None:
    assert CDT_CARDS, f"no cdt-* model under {MODELS}"


def test_the_guard_was_measured_at_every_budget_the_card_claims(card: ModelCard) -> None:
    rows = card.budget_guard_measured or []
    claimed = set(ISSUE_BUDGETS) | set(card.validated_cost_range or ())
    for budget in sorted(claimed):
        for mode in ("sampled", "mean"):
            measured = [r for r in rows if r.budget == budget and r.action_mode == mode]
            assert any(not r.cost_schedule for r in measured), f"{budget:g} {mode} unmeasured"


def test_the_unannounced_cut_was_measured_in_both_action_modes(card: ModelCard) -> None:
    cuts = [row for row in card.budget_guard_measured or [] if row.cost_schedule]
    unannounced = {row.action_mode for row in cuts if row.cut_floor is None}
    assert unannounced == {"sampled", "mean"}
