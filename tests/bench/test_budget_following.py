"""The budget-following issue's criteria, as the outside check applies them to one action mode."""

from __future__ import annotations

from bench.budget_following import BudgetResult, failed_checks


def result(budget: float, rewards: list[float], costs: list[float]) -> BudgetResult:
    """Sampled-action episodes at one budget, summed as `cdt rollout` sums them."""
    share_over = sum(cost > budget for cost in costs) / len(costs)
    return BudgetResult(
        budget, False, sum(rewards) / len(rewards), sum(costs) / len(costs), share_over
    )


def results(*rows: tuple[float, list[float], list[float]]) -> list[BudgetResult]:
    """(budget, rewards, costs) per budget."""
    return [result(*row) for row in rows]


FOLLOWS = results(
    (10.0, [400.0, 410.0], [6.0, 8.0]),
    (20.0, [420.0, 430.0], [12.0, 18.0]),
    (40.0, [450.0, 450.0], [30.0, 36.0]),
)


def test_a_policy_that_follows_its_budgets_passes() -> None:
    assert failed_checks(FOLLOWS) == []
    assert failed_checks(list(reversed(FOLLOWS))) == []  # budgets are taken in order


def test_a_mean_cost_over_any_budget_fails() -> None:
    over = [*FOLLOWS[:2], result(40.0, [450.0, 450.0], [38.0, 44.0])]
    assert failed_checks(over) == ["mean cost 41.0 over budget 40"]


def test_an_unused_loose_budget_fails_but_the_tightest_may_stay_idle() -> None:
    idle = [result(10.0, [400.0], [0.0]), *FOLLOWS[1:]]
    assert failed_checks(idle) == []
    unused = [FOLLOWS[0], result(20.0, [420.0], [9.9]), FOLLOWS[2]]
    assert failed_checks(unused) == ["budget 20 left unused: mean cost 9.9 < 0.5 x budget"]


def test_more_than_a_fifth_of_episodes_over_the_tightest_budget_fails() -> None:
    # mean 8.4 keeps the budget, but 2 of 5 episodes exceed it
    tail = [result(10.0, [400.0] * 5, [0.0, 11.0, 12.0, 10.0, 9.0]), *FOLLOWS[1:]]
    assert failed_checks(tail) == ["40% of episodes over the tightest budget 10"]
    one_in_five = [result(10.0, [400.0] * 5, [0, 11, 9, 10, 9]), *FOLLOWS[1:]]
    assert failed_checks(one_in_five) == []


def test_reward_that_falls_as_the_budget_grows_fails() -> None:
    falls = [FOLLOWS[0], result(20.0, [404.0], [15.0]), FOLLOWS[2]]
    assert failed_checks(falls) == ["reward falls from 405.0 at budget 10 to 404.0 at 20"]
