"""Checkpoint scores run what the service serves (training/evaluation/checkpoint_scores.py)."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtime.card import update_card
from runtime.episodes import EpisodePolicy, EpisodeSpec, run_episodes
from runtime.evaluation_protocol import SelectionRule, selection_seeds, selection_specs
from runtime.policy import Policy
from service.config import Settings
from service.main import create_app
from tests.runtime.toy_env import ToyEnv, toy_env_factory
from training.checkpoint import load_checkpoint
from training.data.windows import NormalisationStats
from training.evaluation.checkpoint_scores import for_data, torch_episode_policy
from training.evaluation.evaluate import onnx_episode_policy
from training.export import policy_from_checkpoint


def recorded(
    policy: EpisodePolicy,
    windows: list[dict[str, np.ndarray]],
    means: list[np.ndarray] | None = None,
) -> EpisodePolicy:
    """`policy`, keeping each forward pass's windows (and mean actions, when asked)."""

    def predict(
        batch: dict[str, np.ndarray], weights: Sequence[float | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        windows.append({name: value.copy() for name, value in batch.items()})
        mean, log_std = policy.predict(batch, weights)
        if means is not None:
            means.append(mean[0].copy())
        return mean, log_std

    return dataclasses.replace(policy, predict=predict)


def test_selection_and_service_see_the_same_windows_and_actions(
    exported_policy: tuple[Path, Path],
) -> None:
    checkpoint_path, model_dir = exported_policy
    checkpoint = load_checkpoint(checkpoint_path)
    model = policy_from_checkpoint(checkpoint).model
    torch_policy = torch_episode_policy(model, NormalisationStats(**checkpoint["stats"]))
    onnx_policy = onnx_episode_policy(Policy.load(model_dir))
    spec = EpisodeSpec(seed=11, target_reward=30.0, target_cost=2.0)  # sampled actions
    torch_windows: list[dict[str, np.ndarray]] = []
    onnx_windows: list[dict[str, np.ndarray]] = []
    run = {"env_factory": toy_env_factory, "record_steps": True}
    (by_torch,) = run_episodes(recorded(torch_policy, torch_windows), "toy", [spec], **run)
    (by_onnx,) = run_episodes(recorded(onnx_policy, onnx_windows), "toy", [spec], **run)
    assert len(torch_windows) == len(onnx_windows) == 12
    for ours, theirs in zip(torch_windows, onnx_windows, strict=True):
        for name in ours:
            np.testing.assert_allclose(ours[name], theirs[name], atol=1e-4, err_msg=name)
    assert by_torch.cost == by_onnx.cost and by_torch.step_costs == by_onnx.step_costs

    # The service, stepped by hand with the same env, answers the same actions.
    served_cost, _ = served_episode(model_dir, spec)
    assert served_cost == by_onnx.cost


def served_episode(model_dir: Path, spec: EpisodeSpec) -> tuple[float, list[np.ndarray]]:
    """(cost, actions) of one ToyEnv episode stepped through the REST service by hand, its
    budget changes sent as PATCHes before the step they apply to."""
    settings = Settings(
        _env_file=None, models_dir=model_dir.parent, redis_url=None, api_tokens=frozenset()
    )
    env = ToyEnv()
    observation, _ = env.reset(seed=spec.seed)
    served_cost, actions, cost_limit = 0.0, [], spec.target_cost
    schedule = dict(spec.cost_schedule)
    with TestClient(create_app(settings)) as client:
        answer = client.post(
            "/v1/episodes",
            json={
                "model": model_dir.name,
                "target_reward": spec.target_reward,
                "target_cost": spec.target_cost,
                "observation": observation.tolist(),
                "seed": spec.seed,
                "deterministic": spec.deterministic,
                "budget_guard": spec.budget_guard,  # the offline loop's setting (default off)
            },
        ).json()
        for step in range(1, env.length + 1):
            action = np.asarray(answer["action"], dtype=np.float32)
            actions.append(action)
            observation, reward, _, _, info = env.step(action)
            served_cost += info["cost"]
            if step in schedule:
                cost_limit = schedule[step]
                path = f"/v1/episodes/{answer['episode_id']}/budget"
                assert client.patch(path, json={"cost_limit": cost_limit}).status_code == 200
            answer = client.post(
                f"/v1/episodes/{answer['episode_id']}/step",
                json={
                    "observation": observation.tolist(),
                    "reward": reward,
                    "cost": info["cost"],
                    "step": step,
                },
            ).json()
            np.testing.assert_allclose(
                answer["remaining_cost"], max(cost_limit - served_cost, 0.0), atol=1e-9
            )
    return served_cost, actions


def test_a_mean_action_calibration_reaches_the_network_in_every_loop(
    exported_policy: tuple[Path, Path], tmp_path: Path
) -> None:
    """A card whose mean action is calibrated apart (x20 here, sampled actions x1) acts as the
    checkpoint does with the graph feeding 20 x the budget, offline and served; sampled
    episodes are untouched."""
    checkpoint_path, model_dir = exported_policy
    calibrated = tmp_path / "models" / model_dir.name
    shutil.copytree(model_dir, calibrated)
    card = update_card(calibrated, mean_action_budget_scales=[{"budget": 3.0, "scale": 20.0}])
    assert card.budget_scale == 1.0 and card.cost_input_scale(True, 3.0) == 20.0
    checkpoint = load_checkpoint(checkpoint_path)
    model = policy_from_checkpoint(checkpoint).model
    stats = NormalisationStats(**checkpoint["stats"])
    onnx_policy = onnx_episode_policy(Policy.load(calibrated))
    run = {"env_factory": toy_env_factory, "record_steps": True}
    spec = EpisodeSpec(seed=5, target_reward=30.0, target_cost=3.0, deterministic=True)
    uncalibrated: list[np.ndarray] = []
    run_episodes(
        recorded(torch_episode_policy(model, stats), [], uncalibrated), "toy", [spec], **run
    )
    for deterministic, graph_scale in ((True, 20.0), (False, 1.0)):
        spec = dataclasses.replace(spec, deterministic=deterministic)
        torch_windows: list[dict[str, np.ndarray]] = []
        onnx_windows: list[dict[str, np.ndarray]] = []
        torch_means: list[np.ndarray] = []
        onnx_means: list[np.ndarray] = []
        torch_policy = recorded(
            torch_episode_policy(model, stats, graph_scale), torch_windows, torch_means
        )
        (by_torch,) = run_episodes(torch_policy, "toy", [spec], **run)
        (by_onnx,) = run_episodes(
            recorded(onnx_policy, onnx_windows, onnx_means), "toy", [spec], **run
        )
        assert by_onnx.step_costs == by_torch.step_costs
        np.testing.assert_allclose(onnx_means, torch_means, atol=1e-5)
        for ours, theirs in zip(torch_windows, onnx_windows, strict=True):
            np.testing.assert_allclose(
                theirs["costs_to_go"],
                ours["costs_to_go"] * card.cost_input_scale(deterministic, 3.0),
            )
        served_cost, served_actions = served_episode(calibrated, spec)
        assert served_cost == by_onnx.cost
        # each served action is the one the offline loop took (its next window's previous step)
        offline_actions = [window["actions"][0, -2] for window in onnx_windows[1:]]
        np.testing.assert_allclose(served_actions[:-1], offline_actions, atol=1e-5)
        if deterministic:  # and the calibration changed what the mean action is
            assert np.abs(np.asarray(onnx_means) - np.asarray(uncalibrated)).max() > 1e-4


@pytest.mark.parametrize(
    ("deterministic", "field"),
    [(True, "mean_action_budget_scales"), (False, "sampled_budget_scales")],
)
def test_a_calibration_by_budget_follows_a_budget_change_offline_and_served(
    exported_policy: tuple[Path, Path], tmp_path: Path, deterministic: bool, field: str
) -> None:
    """An action mode calibrated x1 at budget 3 and x10 at 6 switches factor when the budget
    moves from 3 to 6 mid-episode, in the episode loop and through REST alike."""
    _, model_dir = exported_policy
    calibrated = tmp_path / "models" / model_dir.name
    shutil.copytree(model_dir, calibrated)
    points = [{"budget": 3.0, "scale": 1.0}, {"budget": 6.0, "scale": 10.0}]
    update_card(calibrated, **{field: points})
    spec = EpisodeSpec(5, 30.0, 3.0, deterministic=deterministic, cost_schedule=((4, 6.0),))
    windows: list[dict[str, np.ndarray]] = []
    plain = onnx_episode_policy(Policy.load(model_dir))
    (offline,) = run_episodes(
        recorded(onnx_episode_policy(Policy.load(calibrated)), windows),
        "toy",
        [spec],
        env_factory=toy_env_factory,
        record_steps=True,
    )
    spent = np.concatenate([[0.0], np.cumsum(offline.step_costs)[:-1]])
    limits = np.where(np.arange(len(windows)) < 4, 3.0, 6.0)
    factors = np.where(limits == 3.0, 1.0, 10.0)
    newest = [window["costs_to_go"][0, -1] for window in windows]
    np.testing.assert_allclose(newest, factors * np.maximum(limits - spent, 0.0), rtol=1e-6)
    served_cost, served_actions = served_episode(calibrated, spec)
    assert served_cost == offline.cost
    offline_actions = [window["actions"][0, -2] for window in windows[1:]]
    np.testing.assert_allclose(served_actions[:-1], offline_actions, atol=1e-5)
    (uncalibrated,) = run_episodes(plain, "toy", [spec], env_factory=toy_env_factory)
    assert uncalibrated.cost != offline.cost or uncalibrated.reward != offline.reward


def test_selection_specs_cover_every_budget_and_mode_on_selection_seeds() -> None:
    targets = [{"reward": 500.0, "cost": 10.0}, {"reward": 560.0, "cost": 20.0}]
    specs = selection_specs(targets, (10.0, 20.0), (False, True), episodes=3)
    assert len(specs) == 12
    assert {(s.target_reward, s.target_cost) for s in specs} == {(500.0, 10.0), (560.0, 20.0)}
    assert {s.deterministic for s in specs} == {False, True}
    assert {s.seed for s in specs} == set(selection_seeds(3))


def test_selection_on_flat_frontier_data_does_not_ask_for_idle_budgets_to_be_spent() -> None:
    drone_run_like = {
        "default_targets": [
            {"reward": 481.0, "cost": 10.0},
            {"reward": 484.0, "cost": 20.0},
            {"reward": 514.0, "cost": 40.0},
        ],
        "reward_return_min": -351.0,
        "reward_return_max": 609.0,
    }
    assert for_data(SelectionRule(), drone_run_like).flat_budgets == {20.0, 40.0}
    targets = [
        {"reward": reward, "cost": cost} for reward, cost in ((300, 10), (420, 20), (560, 40))
    ]
    rising = {**drone_run_like, "default_targets": targets}
    assert for_data(SelectionRule(), rising).flat_budgets == frozenset()
