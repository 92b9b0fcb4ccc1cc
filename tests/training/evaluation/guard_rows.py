"""Synthetic selection rows and a toy model for the tests of the guard choices (`cdt shield`,
`cdt cut-ready`) and the rows they measure."""

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from runtime.evaluation_protocol import BudgetRow
from tests.service.toy_policy import write_test_policy
from training.evaluation.served_rows import served_selection_rows

TASK = "SafetyBallRun-v0"  # obs_dim 7, act_dim 2, 100-step episodes
CRITIC = {
    "discount": 0.9, "dataset": "toy.hdf5", "update_steps": 10, "validation_mse": 0.1,
    "target_variance": 1.0,
}  # fmt: skip
"""The card record of a toy cost critic (`tests.runtime.toy_critic.write_test_critic`)."""


def write_selection_toy(directory: Path, **card_fields: Any) -> Path:
    """The toy policy as a BallRun model whose card names default targets at 10, 20 and 40 and
    `card_fields`, so that selection rows can run it."""
    directory = write_test_policy(directory, observation_dim=7, action_dim=2)
    card = json.loads((directory / "model.json").read_text())
    card |= {"task": TASK, "budget_guard_measured": None} | card_fields
    card["default_targets"] = [{"reward": 50.0, "cost": budget} for budget in (10, 20, 40)]
    (directory / "model.json").write_text(json.dumps(card))
    return directory


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


def record_measured_rows(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType
) -> list[tuple[str, list[float]]]:
    """The label and budgets of every `served_selection_rows` call `module` makes from now on,
    each still run."""
    ran: list[tuple[str, list[float]]] = []

    def recorded(*args: Any) -> list[BudgetRow]:
        ran.append((args[4], list(args[5])))
        return served_selection_rows(*args)

    monkeypatch.setattr(module, "served_selection_rows", recorded)
    return ran
