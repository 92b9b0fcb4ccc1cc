"""Synthetic selection rows for the tests of the guard choices (`cdt shield`, `cdt cut-ready`)."""

from runtime.evaluation_protocol import BudgetRow


def steady_rows(share_over: float, reward: float) -> list[BudgetRow]:
    """Rows at budgets 10, 20 and 40 in both action modes, each with this share over budget
    and this normalised reward."""
    return [
        BudgetRow(
            target_reward=50.0,
            target_cost=budget,
            deterministic=mode,
            episodes=20,
            reward_mean=reward,
            reward_std=1.0,
            cost_mean=budget / 2,
            cost_std=1.0,
            normalised_reward=reward,
            normalised_cost=0.5,
            share_over_budget=share_over,
        )
        for budget in (10.0, 20.0, 40.0)
        for mode in (False, True)
    ]
