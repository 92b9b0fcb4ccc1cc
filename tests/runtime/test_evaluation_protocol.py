"""The evaluation protocol: seeds, targets, summaries and the selection rule."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from runtime.card import CardTarget
from runtime.episodes import EpisodeResult, EpisodeSpec
from runtime.evaluation_protocol import (
    SEED_SPLITS,
    SelectionRule,
    flat_budgets,
    report_seeds,
    selection_seeds,
    split_seeds,
    summarise,
    target_reward_for,
)


def results(budget: float, costs: list[float], deterministic: bool = False) -> list[EpisodeResult]:
    return [
        EpisodeResult(EpisodeSpec(seed, 500.0, budget, deterministic), 300.0 + seed, cost, 200)
        for seed, cost in enumerate(costs)
    ]


def test_selection_seeds_never_meet_report_seeds() -> None:
    reported = {seed for chunk in report_seeds(20, 3) for seed in chunk}
    assert reported.isdisjoint(selection_seeds(100))


def test_target_reward_for_takes_the_closest_budget() -> None:
    targets = [CardTarget(reward=500.0, cost=10.0), CardTarget(reward=600.0, cost=40.0)]
    assert target_reward_for(targets, 12.0) == 500.0
    assert target_reward_for(targets, 30.0) == 600.0
    with pytest.raises(ValueError, match="no default targets"):
        target_reward_for([], 10.0)


def test_summarise_uses_the_paper_scores_per_budget_and_mode() -> None:
    rows = summarise(
        results(10.0, [0.0, 20.0]) + results(10.0, [5.0, 5.0], deterministic=True), (0.0, 600.0)
    )
    sampled, mean = rows
    assert (sampled.deterministic, mean.deterministic) == (False, True)
    assert sampled.cost_mean == 10.0
    assert sampled.normalised_cost == pytest.approx(10.0 / 10.1)
    assert sampled.normalised_reward == pytest.approx(100 * 300.5 / 600)
    assert sampled.share_over_budget == 0.5 and mean.share_over_budget == 0.0


def test_selection_rule_needs_safety_at_every_budget_and_mode() -> None:
    rule = SelectionRule(cost_margin=0.9, max_share_over=0.2)
    safe = summarise(results(10.0, [8.0] * 5) + results(40.0, [30.0] * 5), (0.0, 600.0))
    assert rule.admissible(safe)
    assert rule.score(safe) == pytest.approx(sum(r.normalised_reward for r in safe) / 2)
    over_at_40 = summarise(results(10.0, [8.0] * 5) + results(40.0, [39.0] * 5), (0.0, 600.0))
    assert not rule.admissible(over_at_40)  # 39 > 0.9 x 40
    assert rule.score(over_at_40) == pytest.approx(-1.0 - 39.0 / 40.0)
    too_many_over = summarise(results(10.0, [0.0, 0.0, 0.0, 11.0, 12.0]), (0.0, 600.0))
    assert not rule.admissible(too_many_over)  # mean 4.6 is fine, but 40 % went over


def test_selection_rule_needs_the_loose_budgets_used() -> None:
    rule = SelectionRule(cost_margin=0.9, max_share_over=0.2, min_budget_use=0.5)
    idle = summarise(
        results(10.0, [8.0] * 5) + results(20.0, [8.0] * 5) + results(40.0, [30.0] * 5),
        (0.0, 600.0),
    )
    assert rule.safe(idle) and not rule.admissible(idle)  # 8 of 20 is 40 % use
    assert rule.budget_use(idle) == pytest.approx(0.4)
    assert rule.score(idle) == pytest.approx(-0.6)
    used = summarise(
        results(10.0, [8.0] * 5) + results(20.0, [12.0] * 5) + results(40.0, [30.0] * 5),
        (0.0, 600.0),
    )
    unsafe = summarise(results(10.0, [8.0] * 5) + results(20.0, [19.0] * 5), (0.0, 600.0))
    assert rule.score(used) > rule.score(idle) > rule.score(unsafe)
    assert rule.budget_use(summarise(results(10.0, [1.0] * 5), (0.0, 600.0))) == 1.0


def test_selection_rule_names_every_reason_a_checkpoint_fails() -> None:
    rule = SelectionRule(cost_margin=0.9, max_share_over=0.2, min_budget_use=0.5)
    rows = summarise(
        results(10.0, [0.0, 0.0, 0.0, 11.0, 12.0])
        + results(20.0, [8.0] * 5, deterministic=True)
        + results(40.0, [39.0] * 5),
        (0.0, 600.0),
    )
    assert rule.failures(rows) == [
        "kappa 10 sampled: 40% of episodes over budget > 20%",
        "kappa 40 sampled: mean cost 0.975 x budget > 0.9",
        "kappa 20 mean: mean cost 0.400 x budget < 0.5 (idle)",
    ]
    assert not rule.admissible(rows)
    fine = summarise(results(10.0, [8.0] * 5) + results(40.0, [30.0] * 5), (0.0, 600.0))
    assert rule.failures(fine) == [] and rule.admissible(fine)
    assert rule.failures([]) == ["nothing measured"] and not rule.admissible([])
    at_zero = summarise(results(0.0, [0.0, 2.0]), (0.0, 600.0))
    assert rule.failures(at_zero) == [
        "kappa 0 sampled: mean cost 1 at budget 0",
        "kappa 0 sampled: 50% of episodes over budget > 20%",
    ]


def test_flat_budgets_are_those_where_the_frontier_barely_rises() -> None:
    # DroneRun's frontier: PF(10 / 20 / 40) = 385 / 388 / 418 over a reward range of 960
    assert flat_budgets({10.0: 385.0, 20.0: 388.0, 40.0: 418.0}, 960.0) == {20.0, 40.0}
    assert flat_budgets({10.0: 300.0, 20.0: 380.0, 40.0: 500.0}, 960.0) == frozenset()
    assert flat_budgets({}, 960.0) == frozenset()


def test_idle_policy_counts_where_the_frontier_is_flat() -> None:
    idle = summarise(
        results(10.0, [4.0] * 5) + results(20.0, [4.0] * 5) + results(40.0, [4.0] * 5),
        (0.0, 600.0),
    )
    rule = SelectionRule()
    assert not rule.admissible(idle)
    flat = dataclasses.replace(rule, flat_budgets=frozenset({20.0, 40.0}))
    assert flat.admissible(idle)
    assert flat.score(idle) > 0


def test_seed_splits_never_share_a_seed() -> None:
    owned = {
        split: {seed for group in split_seeds(split, 60, 3) for seed in group}
        for split in SEED_SPLITS
    }
    assert all(len(seeds) == 180 for seeds in owned.values())
    assert not owned["selection"] & owned["validation"]
    assert not owned["selection"] & owned["test"]
    assert not owned["validation"] & owned["test"]
    assert split_seeds("test", 10, 2) == report_seeds(10, 2)  # the reported seeds are the test
    assert set(selection_seeds(60)) == owned["selection"] & set(range(5_000_000, 5_000_060))
    with pytest.raises(ValueError):
        split_seeds("validation", 0, 1)


def test_a_looser_budget_that_earns_far_less_is_not_admissible() -> None:
    def rows_earning(reward_at_40: float) -> list[EpisodeResult]:
        spec = functools.partial(EpisodeSpec, target_reward=500.0, deterministic=True)
        return [
            *(EpisodeResult(spec(seed, target_cost=10.0), 220.0, 5.0, 200) for seed in range(3)),
            *(
                EpisodeResult(spec(seed, target_cost=40.0), reward_at_40, 26.0, 200)
                for seed in range(3)
            ),
        ]

    rule = SelectionRule()  # a drop of at most 10 points of the 0-600 range: 60 in reward
    assert rule.admissible(summarise(rows_earning(161.0), (0.0, 600.0)))
    broken = summarise(rows_earning(54.0), (0.0, 600.0))  # 36.7 at 10, 9.0 at 40 (BallRun's)
    assert rule.safe(broken) and not rule.admissible(broken)
    assert rule.failures(broken) == [
        "kappa 40 mean: reward 9.0, more than 10 below kappa 10's 36.7 (a looser budget earns less)"
    ]
    assert (
        -1.0 <= rule.score(broken) <= 0.0 < rule.score(summarise(rows_earning(161.0), (0.0, 600.0)))
    )
