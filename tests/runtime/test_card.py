"""The typed model card: read, validated writes, updates (runtime/card.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.card import CardError, GuardMeasurement, read_card, update_card, write_card
from runtime.user_errors import UserError

CARD = {
    "name": "m", "version": "1", "task": "SafetyCarRun-v0", "observation_dim": 7,
    "action_dim": 2, "action_low": [-1.0, -1.0], "action_high": [1.0, 1.0], "context_len": 10,
    "max_episode_len": 200, "training": {"kept": "extra keys survive"},
}  # fmt: skip


def test_write_then_read_keeps_typed_and_extra_keys(tmp_path: Path) -> None:
    write_card(tmp_path, CARD)
    card = read_card(tmp_path)
    assert card.budget_scale == 1.0 and card.git_commit is None
    assert card.model_extra == {"training": {"kept": "extra keys survive"}}
    assert update_card(tmp_path, budget_scale=0.8).budget_scale == 0.8
    assert json.loads((tmp_path / "model.json").read_text())["training"] == CARD["training"]


def test_a_mean_action_calibration_leaves_sampled_episodes_alone(tmp_path: Path) -> None:
    card = write_card(tmp_path, CARD | {"budget_scale": 0.8})
    assert card.cost_input_scale(True, 10.0) == card.cost_input_scale(False, 10.0) == 1.0
    card = update_card(tmp_path, mean_action_budget_scales=[{"budget": 10.0, "scale": 0.6}])
    for budget in (0.0, 5.0, 10.0, 60.0):  # one entry: the same scale at every budget
        assert card.cost_input_scale(True, budget) == pytest.approx(0.6 / 0.8)
        assert card.cost_input_scale(False, budget) == 1.0
    with pytest.raises(CardError, match="greater than 0"):
        update_card(tmp_path, mean_action_budget_scales=[{"budget": 10.0, "scale": 0.0}])


def test_each_action_mode_follows_its_own_calibration(tmp_path: Path) -> None:
    card = write_card(
        tmp_path,
        CARD
        | {
            "budget_scale": 0.8,
            "mean_action_budget_scales": [{"budget": 10.0, "scale": 2.0}],
            "sampled_budget_scales": [{"budget": 10.0, "scale": 0.6}],
        },
    )
    assert card.cost_input_scale(True, 10.0) == pytest.approx(2.0 / 0.8)
    assert card.cost_input_scale(False, 10.0) == pytest.approx(0.6 / 0.8)


def test_a_calibration_by_budget_feeds_a_budget_linear_between_its_entries(
    tmp_path: Path,
) -> None:
    points = [
        {"budget": 10.0, "scale": 1.4},  # fed 14
        {"budget": 20.0, "scale": 1.0},  # fed 20
        {"budget": 40.0, "scale": 0.8},  # fed 32
    ]
    card = write_card(tmp_path, CARD | {"mean_action_budget_scales": points})

    def fed(budget: float) -> float:
        return budget * card.cost_input_scale(True, budget)

    assert [fed(budget) for budget in (5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0)] == pytest.approx(
        [7.0, 14.0, 17.0, 20.0, 26.0, 32.0, 48.0]
    )
    assert card.cost_input_scale(False, 15.0) == 1.0


@pytest.mark.parametrize(
    ("points", "why"),
    [
        ([{"budget": 20.0, "scale": 1.0}, {"budget": 10.0, "scale": 1.0}], "increasing budgets"),
        ([{"budget": 10.0, "scale": 1.0}, {"budget": 10.0, "scale": 0.9}], "increasing budgets"),
        ([{"budget": 10.0, "scale": 2.5}, {"budget": 20.0, "scale": 1.0}], "never feed less"),
        ([], "at least 1 item"),
    ],
)
@pytest.mark.parametrize("field", ["mean_action_budget_scales", "sampled_budget_scales"])
def test_a_calibration_that_feeds_less_at_a_looser_budget_is_refused(
    tmp_path: Path, points: list[dict[str, float]], why: str, field: str
) -> None:
    with pytest.raises(CardError, match=why):
        write_card(tmp_path, CARD | {field: points})


def test_invalid_cards_are_refused_and_never_written(tmp_path: Path) -> None:
    write_card(tmp_path, CARD)
    before = (tmp_path / "model.json").read_text()
    with pytest.raises(CardError, match="action_low and action_high"):
        update_card(tmp_path, action_low=[-1.0])
    assert (tmp_path / "model.json").read_text() == before
    with pytest.raises(CardError, match=r"model\.json"):
        read_card(tmp_path / "missing")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ('"reward_scale": NaN', "reward_scale"),
        ('"validated_cost_range": [5, Infinity]', "validated_cost_range.1"),
        ('"default_targets": [{"reward": NaN, "cost": 10}]', "default_targets.0.reward"),
        ('"budget_guard": {"fallback_margin": Infinity}', "budget_guard.fallback_margin"),
        ('"cost_guidance": {"weight": 1, "shift": NaN}', "cost_guidance.shift"),
    ],
)
def test_a_card_stating_a_non_finite_number_is_refused_naming_the_field(
    tmp_path: Path, fields: str, named: str
) -> None:
    """JSON as Python writes it may hold NaN and Infinity; a card with them is refused as it is
    read (a reload keeps the old version), not served with nulls and warnings that never fire."""
    text = json.dumps(CARD)[:-1] + ", " + fields + "}"
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(CardError, match=rf"{named}: Input should be a finite number"):
        read_card(tmp_path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{not json", "not a valid model card: file: Invalid JSON"),
        ('{"name": "x"}', "not a valid model card: version: Field required; task: Field"),
        ("[]", "not a valid model card: file: Input should be an object"),
    ],
)
def test_a_broken_card_is_one_line_naming_each_problem(
    tmp_path: Path, text: str, said: str
) -> None:
    (tmp_path / "model.json").write_text(text)
    with pytest.raises(CardError) as error:
        read_card(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'model.json'}: {said}") and "\n" not in message
    assert isinstance(error.value, UserError)  # `cdt` answers it in one line, exit 2


def guard_row(
    budget: float, share_over: float, schedule: str = "", floor: float | None = None
) -> GuardMeasurement:
    figures = {"share_over_budget": share_over, "cost_mean": budget / 2}
    return GuardMeasurement.model_validate({
        "budget": budget, "action_mode": "mean", "cost_schedule": schedule, "cut_floor": floor,
        "episodes": 20, "first_seed": 7, "guarded": figures,
        "unguarded": figures | {"share_over_budget": 0.5},
    })  # fmt: skip


def test_a_card_warns_of_cuts_without_notice_only_where_it_was_measured_to_miss_them(
    tmp_path: Path,
) -> None:
    card = write_card(tmp_path, CARD)
    assert card.measured_cut(guarded=True) is None and card.cut_warnings(guarded=True) == []
    cut = "0:40,150:10"
    rows = [guard_row(10.0, 0.0), guard_row(40.0, 0.95, cut), guard_row(40.0, 0.0, cut, 10.0)]
    missed = card.model_copy(update={"budget_guard_measured": rows})
    measured = missed.measured_cut(guarded=True)
    assert measured is not None and (measured.unannounced, measured.announced) == (0.95, 0.0)
    (warning,) = missed.cut_warnings(guarded=True)
    assert f"{card.name} {card.version} ended over the new limit in 95% of 20 episodes" in warning
    assert f"(step:limit {cut}); 0% when they named the floor" in warning and "cut_floor" in warning
    assert missed.cut_warnings(guarded=False)[0].count("50% of 20")  # the unguarded figures
    kept = card.model_copy(update={"budget_guard_measured": [guard_row(40.0, 0.1, cut)]})
    assert kept.cut_warnings(guarded=True) == []  # within the 10 % a cut may let over


def test_a_guarded_episode_is_not_warned_within_the_budgets_the_guard_kept(
    tmp_path: Path,
) -> None:
    measured = [guard_row(10.0, 0.0), guard_row(40.0, 0.05), guard_row(40.0, 0.9, "0:40,150:10")]
    card = write_card(tmp_path, CARD | {"validated_cost_range": [30.0, 60.0]})
    guarded = card.model_copy(update={"budget_guard_measured": measured})
    assert guarded.guard_validated_range() == (10.0, 40.0)  # a cut's row is not a steady budget
    assert guarded.budget_warnings(10.0, guarded=True) == []
    assert "validated range [30, 60]" in guarded.budget_warnings(10.0)[0]  # the model alone
    assert "[30, 60] or [10, 40]" in guarded.budget_warnings(5.0, guarded=True)[0]
    missed = [guard_row(10.0, 0.1), guard_row(40.0, 0.0)]
    broken = card.model_copy(update={"budget_guard_measured": missed})
    assert broken.guard_validated_range() is None and broken.budget_warnings(10.0, guarded=True)


def test_a_guarded_episode_is_warned_at_a_budget_the_guard_was_measured_to_miss(
    tmp_path: Path,
) -> None:
    card = write_card(tmp_path, CARD)  # no validated range: no range to warn of
    missed = [guard_row(10.0, 0.1), guard_row(20.0, 0.05), guard_row(40.0, 0.5, "0:40,150:10")]
    measured = card.model_copy(update={"budget_guard_measured": missed})
    (warning,) = measured.budget_warnings(10.0, guarded=True)
    assert f"{card.name} {card.version} with the budget guard ended over a budget of 10" in warning
    assert "in 10% of 20 episodes measured from outside" in warning and "target: 5%" in warning
    assert measured.budget_warnings(10.0) == []  # unguarded: the guard's rows say nothing
    assert measured.budget_warnings(20.0, guarded=True) == []  # at the target: kept
    assert measured.budget_warnings(40.0, guarded=True) == []  # a cut's row is not a budget
    ranged = measured.model_copy(update={"validated_cost_range": (30.0, 60.0)})
    outside, miss = ranged.budget_warnings(10.0, guarded=True)
    assert "validated range [30, 60]" in outside and "ended over a budget of 10" in miss
