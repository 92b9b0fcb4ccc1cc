"""Model-card updates: evaluation results, cost curve and validated budget range."""

import json
from pathlib import Path

import numpy as np

from training.card_update import record_evaluation, record_sweep, validated_cost_range
from training.data.frontiers import derive_default_targets

CARD = {
    "name": "m", "version": "1", "task": "SafetyCarRun-v0", "observation_dim": 7,
    "action_dim": 2, "action_low": [-1, -1], "action_high": [1, 1], "context_len": 10,
    "max_episode_len": 200, "evaluation": None,
}  # fmt: skip


def _curve(pairs: list[tuple[float, float]]) -> list[dict[str, float]]:
    return [{"target_cost": t, "actual_cost": a} for t, a in pairs]


def test_validated_cost_range_is_the_widest_honoured_run() -> None:
    curve = _curve([(0, 1.0), (5, 6.0), (10, 8.0), (20, 15.0), (40, 30.0), (60, 70.0)])
    assert validated_cost_range(curve) == [10, 40]


def test_validated_cost_range_none_when_never_honoured() -> None:
    assert validated_cost_range(_curve([(5, 9.0), (10, 12.0)])) is None


def test_record_functions_rewrite_the_card(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text(json.dumps(CARD))
    record_evaluation(tmp_path, "kappa_10", {"safe": True})
    rows = [
        {"target_cost": 10.0, "cost_mean": 7.0, "cost_std": 1.0, "reward_mean": 400.0},
        {"target_cost": 20.0, "cost_mean": 15.0, "cost_std": 2.0, "reward_mean": 450.0},
    ]
    record_sweep(tmp_path, rows)
    card = json.loads((tmp_path / "model.json").read_text())
    assert card["evaluation"] == {"kappa_10": {"safe": True}}
    assert card["validated_cost_range"] == [10.0, 20.0]
    assert card["validated_action_mode"] == "sampled"  # rows without `deterministic` sampled
    assert card["cost_curve"][1]["actual_cost"] == 15.0
    assert card["name"] == "m"


def test_derive_default_targets_sits_above_the_pareto_frontier() -> None:
    costs = np.array([0.0, 5.0, 15.0, 30.0])
    rewards = np.array([100.0, 200.0, 300.0, 600.0])  # range 500: +50 above PF
    targets = derive_default_targets(costs, rewards, (10.0, 20.0))
    assert targets == [{"reward": 250.0, "cost": 10.0}, {"reward": 350.0, "cost": 20.0}]


def test_derive_default_targets_never_exceed_the_best_return_in_the_data() -> None:
    costs = np.array([0.0, 5.0, 15.0])
    rewards = np.array([100.0, 480.0, 470.0])  # PF(10) is the best return: +38 would pass it
    targets = derive_default_targets(costs, rewards, (10.0, 20.0))
    assert targets == [{"reward": 480.0, "cost": 10.0}, {"reward": 480.0, "cost": 20.0}]
