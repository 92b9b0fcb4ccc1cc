"""`cdt guidance`: the weight choice, what the card records, and a short real run."""

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.evaluation_protocol import BudgetRow
from runtime.policy import Policy
from tests.service.toy_policy import write_test_policy
from training.evaluation import guidance as guidance_module
from training.evaluation.guidance import WeightResult, choose, guided_version, main

TASK = "SafetyBallRun-v0"  # obs_dim 7, act_dim 2, 100-step episodes


def _row(budget: float, deterministic: bool, cost: float, reward: float) -> BudgetRow:
    return BudgetRow(
        target_reward=50.0,
        target_cost=budget,
        deterministic=deterministic,
        episodes=10,
        reward_mean=reward,
        reward_std=1.0,
        cost_mean=cost,
        cost_std=1.0,
        normalised_reward=reward,
        normalised_cost=cost / budget,
        share_over_budget=0.0 if cost < budget else 0.5,
    )


def _result(weight: float, cost_share: float, reward: float) -> WeightResult:
    rows = [
        _row(budget, mode, cost_share * budget, reward)
        for budget in (10.0, 20.0, 40.0)
        for mode in (False, True)
    ]
    admissible = cost_share <= 0.9
    return WeightResult(weight, rows, admissible, reward if admissible else -2.0, [])


def test_choose_keeps_the_best_admissible_weight_or_none() -> None:
    over, kept, safer = _result(0.0, 1.5, 80.0), _result(1.0, 0.8, 70.0), _result(2.0, 0.6, 60.0)
    assert choose([over, kept, safer]) is kept  # the unguided policy earns more but breaks budgets
    assert choose([over]) is None
    assert guided_version("2026.8000", 2.0) == "2026.8000+guided2"
    assert guided_version("2026.8000+guided2", 1.0) == "2026.8000+guided1"


@pytest.fixture
def ballrun_policy(tmp_path: Path) -> Path:
    directory = write_test_policy(tmp_path / "toy", observation_dim=7, action_dim=2)
    card = json.loads((directory / "model.json").read_text())
    card["task"] = TASK
    card["default_targets"] = [{"reward": 50.0, "cost": budget} for budget in (10, 20, 40)]
    (directory / "model.json").write_text(json.dumps(card))
    return directory


def test_cdt_guidance_records_the_choice_and_leaves_a_refused_card_as_it_was(
    ballrun_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (ballrun_policy / "model.json").read_text()
    refused = [_result(0.0, 1.5, 80.0), _result(1.0, 1.2, 70.0)]
    monkeypatch.setattr(guidance_module, "measure_weights", lambda *args, **kw: refused)
    with pytest.raises(SystemExit, match="no weight"):
        main([str(ballrun_policy), "--weights", "0", "1"])
    card = json.loads((ballrun_policy / "model.json").read_text())
    assert card.get("cost_guidance") is None and card["version"] == json.loads(before)["version"]
    assert [entry["weight"] for entry in card["evaluation"]["guidance"]["weights"]] == [0.0, 1.0]

    kept: list[Any] = [_result(0.0, 1.5, 80.0), _result(2.0, 0.7, 65.0)]
    monkeypatch.setattr(guidance_module, "measure_weights", lambda *args, **kw: kept)
    main([str(ballrun_policy), "--weights", "0", "2", "--shift", "30"])
    policy = Policy.load(ballrun_policy)
    assert policy.card.cost_guidance is not None
    assert (policy.card.cost_guidance.weight, policy.card.cost_guidance.shift) == (2.0, 30.0)
    assert policy.card.version.endswith("+guided2")
    assert "weight 2" in capsys.readouterr().out


def test_cdt_guidance_refuses_a_negative_weight_before_any_episode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["models/not-there", "--weights", "-1"])
    assert exit_info.value.code == 2 and "--weights" in capsys.readouterr().err


@pytest.mark.slow
def test_measure_weights_runs_guided_episodes_on_the_selection_seeds(ballrun_policy: Path) -> None:
    card = Policy.load(ballrun_policy).card
    rule = guidance_module.rule_for(card, 0.1)
    results = guidance_module.measure_weights(ballrun_policy, card, [0.0, 3.0], 40.0, 1, 1, rule)
    assert [result.weight for result in results] == [0.0, 3.0]
    assert all(len(result.rows) == 6 for result in results)
    # the toy's action grows with the cost-to-go; guided, every episode acts otherwise
    plain, guided = ([row.reward_mean for row in result.rows] for result in results)
    assert plain != guided


def test_cdt_guidance_measures_only_new_weights_and_chooses_among_all(
    ballrun_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[float]] = []

    def measure(model_dir: Path, card: Any, weights: list[float], *args: Any) -> list[Any]:
        asked.append(list(weights))
        return [_result(w, {0.0: 1.5, 1.0: 0.8, 2.0: 0.6}[w], 80.0 - 10 * w) for w in weights]

    monkeypatch.setattr(guidance_module, "measure_weights", measure)
    main([str(ballrun_policy), "--weights", "0", "2"])
    main([str(ballrun_policy), "--weights", "0", "1", "2"])
    assert asked == [[0.0, 2.0], [1.0]]
    card = Policy.load(ballrun_policy).card
    assert card.cost_guidance is not None and card.cost_guidance.weight == 1.0  # 70 beats 60
    recorded = card.evaluation["guidance"]["weights"]  # type: ignore[index]
    assert [entry["weight"] for entry in recorded] == [0.0, 1.0, 2.0]
    main(
        [str(ballrun_policy), "--weights", "1", "--episodes", "5"]
    )  # another count: measured again
    assert asked[-1] == [1.0]
