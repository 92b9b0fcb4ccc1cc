"""Per-budget calibration of an exported policy's mean action (evaluation/budget_scales.py, the
search, and evaluation/calibrate.py, the command)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.card import BudgetScale, read_card, update_card
from runtime.evaluation_protocol import BudgetRow, SelectionRule
from training.evaluation import calibrate as calibrate_module
from training.evaluation.budget_scales import PacedRow, choose_scales
from training.evaluation.calibrate import calibrated_version, default_budgets, graph_version

GRAPH_SCALE = 0.8


def row(budget: float, cost: float, reward: float, share_over: float = 0.0) -> BudgetRow:
    return BudgetRow(
        target_reward=600.0,
        target_cost=budget,
        deterministic=True,
        episodes=60,
        reward_mean=reward,
        reward_std=60**0.5,  # a standard error of 1 on 60 episodes
        cost_mean=cost,
        cost_std=1.0,
        normalised_reward=reward / 10,
        normalised_cost=cost / budget,
        share_over_budget=share_over,
    )


class FakeMeasure:
    """Cost = fed budget x the budget's responsiveness; reward grows with the budget; by half
    the episode it has spent `front_loading(scale)` of its cost (default: nothing)."""

    def __init__(
        self,
        responsiveness: dict[float, float],
        reward: dict[float, float],
        front_loading: Callable[[float], float] = lambda scale: 0.0,
    ) -> None:
        self.responsiveness, self.reward = responsiveness, reward
        self.front_loading = front_loading
        self.calls: list[tuple[float, float]] = []

    def __call__(self, budget: float, scale: float) -> PacedRow:
        self.calls.append((budget, scale))
        cost = budget * scale * self.responsiveness[budget]
        return PacedRow(
            row(budget, cost, self.reward[budget] + scale), cost * self.front_loading(scale)
        )


@pytest.fixture
def model_dir(exported_policy: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the tiny exported policy, its card free to change."""
    copy = tmp_path / "model"
    shutil.copytree(exported_policy[1], copy)
    return copy


def measured_by(monkeypatch: pytest.MonkeyPatch, measure: FakeMeasure) -> None:
    """`cdt calibrate` measures with `measure` instead of the simulator."""
    monkeypatch.setattr(calibrate_module, "row_measurer", lambda policy, episodes, mode: measure)


def test_each_budget_gets_the_largest_scale_that_passes_loosest_first() -> None:
    # kappa 10 barely spends what it is fed, kappa 40 spends it all (CarRun's mean action)
    measure = FakeMeasure({10.0: 0.4, 20.0: 0.5, 40.0: 0.7}, {10.0: 500, 20.0: 520, 40.0: 540})
    chosen, measured = choose_scales(
        measure, [10.0, 20.0, 40.0], [2.0, 1.6, 1.2, 1.0], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [
        BudgetScale(budget=10.0, scale=2.0),  # spends 0.8 of kappa
        BudgetScale(budget=20.0, scale=1.6),  # 0.8; x2 spends all of it
        BudgetScale(budget=40.0, scale=1.2),  # 0.84; x1.6 spends 1.12 of it
    ]
    assert measure.calls[0] == (40.0, 2.0)  # loosest first, largest first
    assert [m.scale for m in measured if not m.failures] == [s.scale for s in reversed(chosen)]
    assert [m.scale for m in measured if m.row.target_cost == 40.0] == [2.0, 1.6, 1.2]


def test_a_tighter_budget_is_never_fed_more_than_a_looser_one() -> None:
    # kappa 20 only passes at x0.5 (fed 10), so kappa 10 may be fed at most 10: x1.0
    measure = FakeMeasure({10.0: 0.1, 20.0: 1.8}, {10.0: 400, 20.0: 500})
    chosen, _ = choose_scales(
        measure, [10.0, 20.0], [2.0, 1.5, 1.0, 0.5], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=10.0, scale=1.0), BudgetScale(budget=20.0, scale=0.5)]
    assert (10.0, 2.0) not in measure.calls and (10.0, 1.5) not in measure.calls


def test_a_tighter_budget_must_earn_clearly_less() -> None:
    # at kappa 10, x2 and x1.5 earn within a standard error of kappa 20's reward
    measure = FakeMeasure({10.0: 0.3, 20.0: 0.3}, {10.0: 501.0, 20.0: 502.0})
    chosen, measured = choose_scales(
        measure, [10.0, 20.0], [2.0, 1.5, 1.0, 0.5], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=10.0, scale=0.5), BudgetScale(budget=20.0, scale=2.0)]
    assert "not clearly below" in measured[1].failures[0]


def test_a_flat_reward_takes_the_largest_scale_not_earning_more() -> None:
    # every kappa 10 scale earns within a standard error of kappa 20's reward
    flat = FakeMeasure({10.0: 0.3, 20.0: 0.3}, {10.0: 500.0, 20.0: 500.5})
    chosen, _ = choose_scales(flat, [10.0, 20.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE)
    assert chosen == [BudgetScale(budget=10.0, scale=2.0), BudgetScale(budget=20.0, scale=2.0)]
    # but never one that earns clearly more than the looser budget
    above = FakeMeasure({10.0: 0.3, 20.0: 0.3}, {10.0: 510.0, 20.0: 500.0})
    chosen, measured = choose_scales(above, [10.0, 20.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE)
    assert chosen is None and len(measured) == 3


def test_a_scale_that_leaves_no_room_for_a_tightening_at_mid_episode_does_not_count() -> None:
    # above x1 the mean action spends 90 % of its cost in the first half (CarRun at kappa 40):
    # tightened to kappa 10 then, nothing would be left
    measure = FakeMeasure(
        {10.0: 0.4, 40.0: 0.7}, {10.0: 500, 40.0: 540}, lambda scale: 0.9 if scale > 1 else 0.1
    )
    chosen, measured = choose_scales(
        measure, [10.0, 40.0], [1.6, 1.2, 1.0, 0.8], SelectionRule(), 0.8
    )
    assert chosen == [BudgetScale(budget=10.0, scale=1.6), BudgetScale(budget=40.0, scale=1.0)]
    assert "by half the episode > 10.0" in measured[1].failures[-1]  # x1.6: 40.3 by then
    # the graph's own scale was measured once, as the pacing reference, and is marked so
    assert [(m.row.target_cost, m.scale) for m in measured if m.pace_reference] == [(40.0, 0.8)]
    assert len(measure.calls) == len(set(measure.calls))


def test_where_the_graph_itself_spends_early_a_scale_may_spend_as_much_but_no_more() -> None:
    measure = FakeMeasure({10.0: 0.4, 40.0: 0.7}, {10.0: 500, 40.0: 540}, lambda scale: 0.9)
    chosen, measured = choose_scales(
        measure, [10.0, 40.0], [1.2, 1.0, 0.8, 0.6], SelectionRule(), 0.8
    )
    # the graph's x0.8 spends 20.2 by half the episode, x1 25.2
    assert chosen == [BudgetScale(budget=10.0, scale=1.2), BudgetScale(budget=40.0, scale=0.8)]
    assert [m.scale for m in measured if m.row.target_cost == 40.0] == [0.8, 1.2, 1.0, 0.8]
    assert measure.calls.count((40.0, 0.8)) == 1  # the reference row serves as the candidate


def test_no_calibration_when_one_budget_has_no_scale_that_passes() -> None:
    measure = FakeMeasure({10.0: 0.1, 20.0: 0.01}, {10.0: 400, 20.0: 500})  # idle at 20
    chosen, measured = choose_scales(
        measure, [10.0, 20.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE
    )
    assert chosen is None
    assert {m.row.target_cost for m in measured} == {20.0}  # kappa 10 never measured
    assert all("(idle)" in m.failures[0] for m in measured)


def test_the_command_writes_the_scales_and_every_row_to_the_card(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = FakeMeasure({10.0: 0.4, 20.0: 0.4}, {10.0: 500, 20.0: 520})
    seen_mid_way: list[object] = []

    def watched(budget: float, scale: float) -> PacedRow:
        record = (read_card(model_dir).evaluation or {}).get("calibration")
        seen_mid_way.append(record and (record["finished"], len(record["rows"])))
        return measure(budget, scale)

    monkeypatch.setattr(calibrate_module, "row_measurer", lambda policy, episodes, mode: watched)
    version = read_card(model_dir).version
    calibrate_module.main([str(model_dir), "--budgets", "10", "20", "--scales", "2", "1"])
    card = read_card(model_dir)
    assert card.version == version + "+mean-calibrated"  # what a pinned episode started with
    assert calibrated_version(card.version, deterministic=True) == card.version
    assert card.mean_action_budget_scales == [
        BudgetScale(budget=10.0, scale=2.0),
        BudgetScale(budget=20.0, scale=2.0),
    ]
    record = (card.evaluation or {})["calibration"]
    assert record["finished"] is True
    assert seen_mid_way == [None, (False, 1)]  # each row written as measured, not yet finished
    assert record["chosen"] == [{"budget": 10.0, "scale": 2.0}, {"budget": 20.0, "scale": 2.0}]
    assert [(r["target_cost"], r["scale"]) for r in record["rows"]] == [(20.0, 2.0), (10.0, 2.0)]


def test_a_failed_calibration_keeps_the_cards_scales_and_its_rows(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = [{"budget": 10.0, "scale": 0.9}]
    update_card(model_dir, mean_action_budget_scales=before)
    measure = FakeMeasure({10.0: 0.1, 20.0: 0.01}, {10.0: 400, 20.0: 500})
    measured_by(monkeypatch, measure)
    version = read_card(model_dir).version
    with pytest.raises(SystemExit, match="unchanged"):
        calibrate_module.main([str(model_dir), "--budgets", "10", "20", "--scales", "2", "1"])
    card = read_card(model_dir)
    assert card.version == version
    assert card.mean_action_budget_scales == [BudgetScale(**before[0])]
    record = (card.evaluation or {})["calibration"]
    assert record["chosen"] is None and len(record["rows"]) == 2 and record["finished"] is True


def test_by_default_every_budget_the_card_promises_is_calibrated(
    model_dir: Path,
) -> None:
    curve = [
        {"target_cost": cost, "actual_cost": cost / 2} for cost in (0.0, 5.0, 10.0, 20.0, 80.0)
    ]
    card = update_card(model_dir, cost_curve=curve, validated_cost_range=[5.0, 20.0])
    assert default_budgets(card) == [5.0, 10.0, 20.0]
    assert default_budgets(update_card(model_dir, validated_cost_range=None)) == [10.0, 20.0, 40.0]


def test_a_card_without_default_targets_is_refused_with_what_to_do(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    update_card(model_dir, default_targets=None)
    with pytest.raises(SystemExit) as exit_info:
        calibrate_module.main([str(model_dir)])
    assert exit_info.value.code == 2
    assert re.search(
        r"^cdt calibrate: .*no default targets.*card-update.*\n$", capsys.readouterr().err
    )


def test_a_rerun_reuses_the_rows_measured_on_the_same_graph_and_episodes(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measure = FakeMeasure({10.0: 0.4, 20.0: 0.4}, {10.0: 500, 20.0: 520})
    measured_by(monkeypatch, measure)
    arguments = [str(model_dir), "--budgets", "10", "20", "--scales", "2", "1"]
    calibrate_module.main(arguments)
    first = read_card(model_dir)
    calibrate_module.main(arguments)  # e.g. after an interruption
    assert len(measure.calls) == 2
    assert read_card(model_dir).mean_action_budget_scales == first.mean_action_budget_scales
    calibrate_module.main([*arguments, "--episodes", "20"])  # rows of 60 episodes do not count
    assert len(measure.calls) == 4
    update_card(model_dir, version="a re-exported graph")
    calibrate_module.main([*arguments, "--episodes", "20"])
    assert len(measure.calls) == 6


def test_sampled_actions_are_calibrated_apart_with_a_margin_on_the_share_over(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    update_card(model_dir, mean_action_budget_scales=[{"budget": 10.0, "scale": 2.0}])

    def measure(budget: float, scale: float) -> PacedRow:
        share_over = 0.15 if scale > 1 else 0.05  # 15 %: within the mean action's 20 %
        return PacedRow(row(budget, budget * 0.7, 500 + budget, share_over), 0.0)

    modes: list[bool] = []

    def measurer(policy: object, episodes: int, deterministic: bool) -> Callable[..., PacedRow]:
        modes.append(deterministic)
        return measure

    monkeypatch.setattr(calibrate_module, "row_measurer", measurer)
    version = read_card(model_dir).version
    arguments = [str(model_dir), "--budgets", "10", "20", "--scales", "2", "1"]
    calibrate_module.main([*arguments, "--action-mode", "sampled"])
    assert modes == [False]  # the rows measured are sampled actions'
    card = read_card(model_dir)
    assert card.sampled_budget_scales == [
        BudgetScale(budget=10.0, scale=1.0),
        BudgetScale(budget=20.0, scale=1.0),
    ]
    assert card.mean_action_budget_scales == [BudgetScale(budget=10.0, scale=2.0)]  # untouched
    assert card.version == version + "+sampled-calibrated"
    evaluation = card.evaluation or {}
    assert evaluation["calibration_sampled"]["action_mode"] == "sampled"
    assert "calibration" not in evaluation
    calibrate_module.main([*arguments, "--action-mode", "sampled", "--max-share-over", "0.2"])
    assert read_card(model_dir).sampled_budget_scales == [
        BudgetScale(budget=10.0, scale=2.0),
        BudgetScale(budget=20.0, scale=2.0),
    ]


def test_the_version_marks_each_calibrated_mode_once() -> None:
    both = calibrated_version(calibrated_version("2026-11-26.14000", True), False)
    assert both == "2026-11-26.14000+mean-calibrated+sampled-calibrated"
    assert calibrated_version(both, True) == calibrated_version(both, False) == both
    assert graph_version(both) == "2026-11-26.14000"
