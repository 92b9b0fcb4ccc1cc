"""Per-budget calibration of an exported policy's mean action (evaluation/budget_scales.py, the
search, and evaluation/calibrate.py, the command)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.card import BudgetScale, read_card, update_card
from runtime.evaluation_protocol import BudgetRow, SelectionRule
from runtime.files import CARD_FILE
from training.evaluation import calibrate as calibrate_module
from training.evaluation.budget_scales import GRID_CAP, PacedRow, choose_scales
from training.evaluation.calibrate import (
    calibrated_version,
    calibration_online_episodes,
    default_budgets,
    graph_version,
)
from training.ledger import read_ledger

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
    """Cost = fed budget x the budget's responsiveness; reward grows with the budget, and by
    `reward_per_scale` per unit of scale (1: within the rows' standard errors of 1 between
    neighbouring scales, 15: clearly); by half the episode it has spent `front_loading(scale)` of
    its cost (default: nothing)."""

    def __init__(
        self,
        responsiveness: dict[float, float],
        reward: dict[float, float],
        front_loading: Callable[[float], float] = lambda scale: 0.0,
        reward_per_scale: float = 1.0,
    ) -> None:
        self.responsiveness, self.reward = responsiveness, reward
        self.front_loading = front_loading
        self.reward_per_scale = reward_per_scale
        self.calls: list[tuple[float, float]] = []

    def __call__(self, budget: float, scale: float) -> PacedRow:
        self.calls.append((budget, scale))
        cost = budget * scale * self.responsiveness[budget]
        return PacedRow(
            row(budget, cost, self.reward[budget] + self.reward_per_scale * scale),
            cost * self.front_loading(scale),
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


def test_each_budget_gets_a_scale_that_counts_loosest_first() -> None:
    # kappa 10 barely spends what it is fed, kappa 40 spends it all (CarRun's mean action); each
    # larger scale earns clearly more, so each budget gets the largest that counts
    measure = FakeMeasure(
        {10.0: 0.4, 20.0: 0.5, 40.0: 0.7}, {10.0: 500, 20.0: 520, 40.0: 540}, reward_per_scale=15
    )
    chosen, measured = choose_scales(
        measure, [10.0, 20.0, 40.0], [2.0, 1.6, 1.2, 1.0], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [
        BudgetScale(budget=10.0, scale=2.0),  # spends 0.8 of kappa; x2.5 would feed 25 > 24
        BudgetScale(budget=20.0, scale=1.2),  # 0.6; x1.6 passes but x2 beside it spends 1.0
        BudgetScale(budget=40.0, scale=1.0),  # 0.7; x1.2 passes but x1.6 beside it spends 1.12
    ]
    assert measure.calls[0] == (40.0, 2.0)  # loosest first, largest first
    counted = [m.scale for m in measured if not m.failures and not m.notes]
    assert counted == [s.scale for s in reversed(chosen)]
    assert [m.scale for m in measured if m.row.target_cost == 40.0] == [2.0, 1.6, 1.2, 1.0]


def test_a_larger_scale_is_chosen_only_where_it_earns_clearly_more() -> None:
    # the same costs, but a larger scale earns within the standard errors (1 per x1 of scale):
    # every budget keeps the counted scale nearest the graph's x0.8 from above
    measure = FakeMeasure({10.0: 0.4, 20.0: 0.5, 40.0: 0.7}, {10.0: 500, 20.0: 520, 40.0: 540})
    chosen, measured = choose_scales(
        measure, [10.0, 20.0, 40.0], [2.0, 1.6, 1.2, 1.0], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=budget, scale=1.0) for budget in (10.0, 20.0, 40.0)]
    passed_over = [(m.row.target_cost, m.scale) for m in measured if m.notes]
    assert passed_over == [(20.0, 1.2), (10.0, 2.0), (10.0, 1.6), (10.0, 1.2)]
    assert all(
        not m.failures and "not clearly more than x1" in m.notes[0] for m in measured if m.notes
    )
    # where the steps earn more, the choice climbs only as far as a scale earns clearly more
    # than the choice so far: at kappa 10, x1.2 and x1.6 do not beat x1 by 2, x2 does
    measure = FakeMeasure(
        {10.0: 0.4, 20.0: 0.5, 40.0: 0.7}, {10.0: 500, 20.0: 520, 40.0: 540}, reward_per_scale=3
    )
    chosen, _ = choose_scales(
        measure, [10.0, 20.0, 40.0], [2.0, 1.6, 1.2, 1.0], SelectionRule(), GRAPH_SCALE
    )
    assert [point.scale for point in chosen or []] == [2.0, 1.0, 1.0]


def test_where_nothing_is_spent_the_open_grid_climbs_but_the_graphs_scale_is_kept() -> None:
    # DroneRun: the mean action spends nothing whatever it is fed and earns the same, so every
    # scale counts up to the grid's cap; a feed of 80 for a budget of 10 buys nothing
    measure = FakeMeasure({10.0: 0.0}, {10.0: 400}, reward_per_scale=0)
    chosen, measured = choose_scales(measure, [10.0], [2.0, 1.0], SelectionRule(), 1.0)
    assert chosen == [BudgetScale(budget=10.0, scale=1.0)]
    assert [m.scale for m in measured] == [8.0, 7.6, 6.1, 4.9, 3.9, 3.1, 2.5, 2.0, 1.0]
    assert measured[0].notes[-1] == "the grid's cap (x8): no larger scale tried"
    assert all("nearer the graph's x1" in m.notes[0] for m in measured[:-1])
    assert measured[-1].notes == () and not measured[-1].failures


def test_a_tighter_budget_is_never_fed_more_than_a_looser_one() -> None:
    # kappa 20 only counts at x0.4 (fed 8), so kappa 10 may be fed at most 8: x0.6, whose
    # larger neighbour x1.0 is not a candidate there
    measure = FakeMeasure({10.0: 0.1, 20.0: 1.6}, {10.0: 400, 20.0: 500})
    chosen, _ = choose_scales(
        measure, [10.0, 20.0], [2.0, 1.0, 0.6, 0.5, 0.4], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=10.0, scale=0.6), BudgetScale(budget=20.0, scale=0.4)]
    assert (10.0, 2.0) not in measure.calls and (10.0, 1.0) not in measure.calls


def test_a_tighter_budget_must_earn_clearly_less() -> None:
    # kappa 20 counts at x1.5 (503.5 +- 1); at kappa 10, x2.5 to x1.5 earn within the
    # standard errors of it
    measure = FakeMeasure({10.0: 0.3, 20.0: 0.4}, {10.0: 500.0, 20.0: 502.0})
    chosen, measured = choose_scales(
        measure, [10.0, 20.0], [2.0, 1.5, 1.0, 0.5], SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=10.0, scale=1.0), BudgetScale(budget=20.0, scale=1.5)]
    at_10 = [m for m in measured if m.row.target_cost == 10.0]
    assert [m.scale for m in at_10] == [2.5, 2.0, 1.5, 1.0, 0.5]
    assert all("not clearly below" in m.failures[0] for m in at_10[:3])


def test_a_flat_reward_takes_the_largest_scale_not_earning_more() -> None:
    # every kappa 10 scale earns within a standard error of kappa 20's reward; the grid opens
    # to x3.1, which goes over, so its neighbour x2.5 does not count either
    flat = FakeMeasure({10.0: 0.3, 20.0: 0.3}, {10.0: 500.0, 20.0: 500.5})
    chosen, measured = choose_scales(flat, [10.0, 20.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE)
    assert chosen == [BudgetScale(budget=10.0, scale=2.0), BudgetScale(budget=20.0, scale=2.0)]
    x2_5 = next(m for m in measured if (m.row.target_cost, m.scale) == (10.0, 2.5))
    assert "neighbour x3.1 goes over" in x2_5.failures[-1]
    # but never one that earns clearly more than the looser budget (nor does the grid open)
    above = FakeMeasure({10.0: 0.3, 20.0: 0.3}, {10.0: 510.0, 20.0: 500.0})
    chosen, measured = choose_scales(above, [10.0, 20.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE)
    assert chosen is None
    assert [m.scale for m in measured if m.row.target_cost == 10.0] == [2.0, 1.0]


def test_a_scale_that_leaves_no_room_for_a_tightening_at_mid_episode_does_not_count() -> None:
    # above x1 the mean action spends 90 % of its cost in the first half (CarRun at kappa 40):
    # tightened to kappa 10 then, nothing would be left
    measure = FakeMeasure(
        {10.0: 0.4, 40.0: 0.7},
        {10.0: 500, 40.0: 540},
        lambda scale: 0.9 if scale > 1 else 0.1,
        reward_per_scale=15,
    )
    chosen, measured = choose_scales(
        measure, [10.0, 40.0], [1.6, 1.2, 1.0, 0.8], SelectionRule(), 0.8
    )
    assert chosen == [BudgetScale(budget=10.0, scale=1.6), BudgetScale(budget=40.0, scale=1.0)]
    assert "by half the episode > 10.0" in measured[1].failures[-1]  # x1.6: 40.3 by then
    # the graph's own scale was measured once, as the pacing reference, and is marked so (and
    # then reported again as x1's lower neighbour)
    assert [(m.row.target_cost, m.scale) for m in measured if m.pace_reference] == [(40.0, 0.8)]
    assert len(measure.calls) == len(set(measure.calls))


def test_where_the_graph_itself_spends_early_a_scale_may_spend_as_much_but_no_more() -> None:
    measure = FakeMeasure(
        {10.0: 0.4, 40.0: 0.7}, {10.0: 500, 40.0: 540}, lambda scale: 0.9, reward_per_scale=15
    )
    chosen, measured = choose_scales(
        measure, [10.0, 40.0], [1.2, 1.0, 0.8, 0.6], SelectionRule(), 0.8
    )
    # the graph's x0.8 spends 20.2 by half the episode, x1 25.2; at kappa 10 the grid opens
    # to x2.4, which goes over, so x1.9 beside it does not count
    assert chosen == [BudgetScale(budget=10.0, scale=1.5), BudgetScale(budget=40.0, scale=0.8)]
    assert [m.scale for m in measured if m.row.target_cost == 40.0] == [0.8, 1.2, 1.0, 0.8, 0.6]
    assert measure.calls.count((40.0, 0.8)) == 1  # the reference row serves as the candidate


def cliff(rows: dict[float, tuple[float, float]]) -> Callable[[float, float], PacedRow]:
    """A measure from scale -> (cost / budget, share of episodes over budget) at kappa 20; each
    step up earns clearly more (5 per x0.005)."""

    def measure(budget: float, scale: float) -> PacedRow:
        use, share_over = rows[scale]
        return PacedRow(row(budget, use * budget, 1000 * scale, share_over), 0.0)

    return measure


def test_a_scale_beside_one_that_goes_over_does_not_count() -> None:
    # BallRun's mean action at kappa 20: x0.89 passes, x0.895 beside it lets 32 % over
    ballrun = {0.9: (0.857, 0.58), 0.895: (0.746, 0.32), 0.89: (0.655, 0.05)}
    steady = {0.885: (0.6, 0.03), 0.88: (0.55, 0.02)}
    chosen, measured = choose_scales(
        cliff(ballrun | steady), [20.0], list(ballrun | steady), SelectionRule(), GRAPH_SCALE
    )
    assert chosen == [BudgetScale(budget=20.0, scale=0.885)]
    assert measured[2].scale == 0.89 and measured[2].failures == [
        "kappa 20 mean: neighbour x0.895 goes over (32% of episodes over budget > 20%)"
    ]
    assert measured[-1].scale == 0.88 and "lower neighbour" in measured[-1].notes[0]
    # nor one beside a smaller scale that goes over
    chosen, measured = choose_scales(
        cliff(ballrun | {0.885: (0.6, 0.03), 0.88: (0.95, 0.1)}),
        [20.0],
        list(ballrun | steady),
        SelectionRule(),
        GRAPH_SCALE,
    )
    assert chosen is None
    assert measured[3].scale == 0.885 and measured[3].failures == [
        "kappa 20 mean: neighbour x0.88 goes over (mean cost 0.950 x budget > 0.9)"
    ]


def test_the_grid_opens_above_its_largest_scale_while_it_passes() -> None:
    # x2 spends half of kappa 20 and a tenth of kappa 10
    measure = FakeMeasure({10.0: 0.05, 20.0: 0.26}, {10.0: 400, 20.0: 500}, reward_per_scale=15)
    chosen, measured = choose_scales(measure, [10.0, 20.0], [2.0, 1.0], SelectionRule(), 0.8)
    assert chosen == [
        BudgetScale(budget=10.0, scale=4.9),  # x6.1 would feed 61 > kappa 20's 50
        BudgetScale(budget=20.0, scale=2.5),  # x3.9 spends 1.01 of kappa 20, so not x3.1
    ]
    assert (10.0, 6.1) not in measure.calls
    # every row measured is reported once, the ones below the choice marked as such
    assert sorted((m.row.target_cost, m.scale) for m in measured) == sorted(measure.calls)
    # down to the graph's x0.8: x1 was measured as a candidate nearer it (idle at kappa 20)
    assert [m.scale for m in measured if m.row.target_cost == 20.0] == [3.9, 3.1, 2.5, 2.0, 1.0]
    at_20 = [m for m in measured if m.row.target_cost == 20.0]
    assert at_20[-1].notes == ("a candidate nearer the graph's x0.8, below the chosen x2.5",)


def test_the_grid_opens_no_further_than_its_cap() -> None:
    # kappa 10's cost barely follows what it is fed: x8 spends 0.4 of it
    measure = FakeMeasure({10.0: 0.05}, {10.0: 400}, reward_per_scale=15)
    chosen, measured = choose_scales(measure, [10.0], [2.0, 1.0], SelectionRule(), GRAPH_SCALE)
    assert chosen == [BudgetScale(budget=10.0, scale=GRID_CAP)]
    assert max(scale for _, scale in measure.calls) == GRID_CAP
    assert measured[0].scale == GRID_CAP and not measured[0].failures
    assert measured[0].notes == ("the grid's cap (x8): no larger scale tried",)
    assert [m.scale for m in measured] == [8.0, 7.6, 6.1, 4.9, 3.9, 3.1, 2.5, 2.0, 1.0]


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
    measure = FakeMeasure({10.0: 0.4, 20.0: 0.4}, {10.0: 500, 20.0: 520}, reward_per_scale=15)
    seen_mid_way: list[object] = []

    def watched(budget: float, scale: float) -> PacedRow:
        record = (read_card(model_dir).evaluation or {}).get("calibration")
        seen_mid_way.append(record and (record["finished"], len(record["rows"])))
        return measure(budget, scale)

    monkeypatch.setattr(calibrate_module, "row_measurer", lambda policy, episodes, mode: watched)
    version = read_card(model_dir).version
    calibrate_module.main([str(model_dir), "--budgets", "10", "20", "--scales", "2", "1.5", "1"])
    card = read_card(model_dir)
    assert card.version == version + "+mean-calibrated"  # what a pinned episode started with
    assert calibrated_version(card.version, deterministic=True) == card.version
    # at both budgets x2 passes, the grid opens to x2.5, which goes over: x1.5 is chosen
    assert card.mean_action_budget_scales == [
        BudgetScale(budget=10.0, scale=1.5),
        BudgetScale(budget=20.0, scale=1.5),
    ]
    record = (card.evaluation or {})["calibration"]
    assert record["finished"] is True
    # each row is written, not yet finished, once its verdict is final: x2 once x2.5 and x1.5
    # beside it are measured
    written = [None, None, (False, 1), (False, 2), (False, 4), (False, 4), (False, 5), (False, 6)]
    assert seen_mid_way == written
    assert record["chosen"] == [{"budget": 10.0, "scale": 1.5}, {"budget": 20.0, "scale": 1.5}]
    rows = [(r["target_cost"], r["scale"], r.get("notes")) for r in record["rows"]]
    lower = ["measured as the chosen x1.5's lower neighbour"]
    assert rows == [
        (budget, scale, lower if scale == 1.0 else None)
        for budget in (20.0, 10.0)
        for scale in (2.5, 2.0, 1.5, 1.0)
    ]


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
    arguments = [str(model_dir), "--budgets", "10", "20", "--scales", "2", "1.5", "1"]
    calibrate_module.main(arguments)
    first = read_card(model_dir)
    rows = len(measure.calls)
    calibrate_module.main(arguments)  # e.g. after an interruption
    assert len(measure.calls) == rows
    assert read_card(model_dir).mean_action_budget_scales == first.mean_action_budget_scales
    calibrate_module.main([*arguments, "--episodes", "20"])  # rows of 60 episodes do not count
    assert len(measure.calls) == 2 * rows
    update_card(model_dir, version="a re-exported graph")
    calibrate_module.main([*arguments, "--episodes", "20"])
    assert len(measure.calls) == 3 * rows


def test_the_card_records_how_many_online_episodes_the_calibration_used(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, private_ledger: Path
) -> None:
    assert read_card(model_dir).budget_scale == 1.0  # the graph's scale: a candidate below
    # x2 spends 14.4 of kappa 20 by half the episode: the graph's x1 is measured as the pacing
    # reference, and again reported as x1.5's lower neighbour
    measure = FakeMeasure(
        {10.0: 0.4, 20.0: 0.4},
        {10.0: 500, 20.0: 520},
        lambda scale: 0.9 if scale > 1.5 else 0.0,
        reward_per_scale=15,
    )
    measured_by(monkeypatch, measure)
    arguments = [str(model_dir), "--budgets", "10", "20", "--scales", "2", "1.5", "1"]
    calibrate_module.main(arguments)
    record = (read_card(model_dir).evaluation or {})["calibration"]
    rows = {(row["target_cost"], row["scale"]) for row in record["rows"]}
    assert len(rows) == len(set(measure.calls)) < len(record["rows"])
    assert any(row.get("pace_reference") for row in record["rows"])
    assert record["online_episodes"] == 60 * len(set(measure.calls))  # 60 per fake row
    assert record["new_online_episodes"] == record["online_episodes"]
    calibrate_module.main(arguments)  # every row reused: run online, but not by this run
    record = (read_card(model_dir).evaluation or {})["calibration"]
    assert record["online_episodes"] == 60 * len(set(measure.calls))
    assert record["new_online_episodes"] == 0
    card = json.loads((model_dir / CARD_FILE).read_text())  # as `cdt report` reads it
    assert calibration_online_episodes(card, deterministic=True) == record["online_episodes"]
    assert calibration_online_episodes(card, deterministic=False) is None  # not calibrated
    first, rerun = read_ledger(private_ledger)  # both runs are in the ledger, with their fate
    assert (first.command, first.split, first.subject) == ("calibrate", "selection", str(model_dir))
    assert first.outcome == rerun.outcome == "kappa 10 x1.5, kappa 20 x1.5"
    assert first.details["new_online_episodes"] == first.details["online_episodes"] > 0
    assert rerun.details["new_online_episodes"] == 0


def test_sampled_actions_are_calibrated_apart_with_a_margin_on_the_share_over(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    update_card(model_dir, mean_action_budget_scales=[{"budget": 10.0, "scale": 2.0}])

    def measure(budget: float, scale: float) -> PacedRow:
        share_over = 0.15 if scale > 1 else 0.05  # 15 %: within the mean action's 20 %
        use = 0.3 + 0.3 * scale  # x2.5 goes over
        return PacedRow(row(budget, budget * use, 500 + budget + 10 * scale, share_over), 0.0)

    modes: list[bool] = []

    def measurer(policy: object, episodes: int, deterministic: bool) -> Callable[..., PacedRow]:
        modes.append(deterministic)
        return measure

    monkeypatch.setattr(calibrate_module, "row_measurer", measurer)
    version = read_card(model_dir).version
    arguments = [str(model_dir), "--budgets", "10", "20", "--scales", "2", "1.5", "1", "0.8"]
    calibrate_module.main([*arguments, "--action-mode", "sampled"])
    assert modes == [False]  # the rows measured are sampled actions'
    card = read_card(model_dir)
    # x1 passes, but lies beside x1.5, which lets 15 % over
    assert card.sampled_budget_scales == [
        BudgetScale(budget=10.0, scale=0.8),
        BudgetScale(budget=20.0, scale=0.8),
    ]
    assert card.mean_action_budget_scales == [BudgetScale(budget=10.0, scale=2.0)]  # untouched
    assert card.version == version + "+sampled-calibrated"
    evaluation = card.evaluation or {}
    assert evaluation["calibration_sampled"]["action_mode"] == "sampled"
    assert "calibration" not in evaluation
    calibrate_module.main([*arguments, "--action-mode", "sampled", "--max-share-over", "0.2"])
    assert read_card(model_dir).sampled_budget_scales == [  # x2 lies beside x2.5, which goes over
        BudgetScale(budget=10.0, scale=1.5),
        BudgetScale(budget=20.0, scale=1.5),
    ]


def test_the_version_marks_each_calibrated_mode_once() -> None:
    both = calibrated_version(calibrated_version("2026-11-26.14000", True), False)
    assert both == "2026-11-26.14000+mean-calibrated+sampled-calibrated"
    assert calibrated_version(both, True) == calibrated_version(both, False) == both
    assert graph_version(both) == "2026-11-26.14000"
