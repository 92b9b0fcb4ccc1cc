"""Checkpoint selection runs what the service serves (training/evaluation/selection.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from runtime.episodes import EpisodePolicy, EpisodeSpec, run_episodes
from runtime.protocol import selection_seeds
from service.config import Settings
from service.main import create_app
from service.policy import Policy
from tests.runtime.toy_env import ToyEnv, toy_env_factory
from training.data.windows import NormalisationStats
from training.evaluation.evaluate import onnx_episode_policy
from training.evaluation.selection import selection_specs, torch_episode_policy
from training.export import policy_from_checkpoint
from training.learn.checkpoint import load_checkpoint


def recorded(policy: EpisodePolicy, windows: list[dict[str, np.ndarray]]) -> EpisodePolicy:
    def predict(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        windows.append({name: value.copy() for name, value in batch.items()})
        return policy.predict(batch)

    return EpisodePolicy(
        predict, policy.context_len, policy.action_dim, policy.action_low, policy.action_high
    )


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
    settings = Settings(
        _env_file=None, models_dir=model_dir.parent, redis_url=None, api_tokens=frozenset()
    )
    env = ToyEnv()
    observation, _ = env.reset(seed=spec.seed)
    with TestClient(create_app(settings)) as client:
        answer = client.post(
            "/v1/episodes",
            json={
                "model": model_dir.name,
                "target_reward": spec.target_reward,
                "target_cost": spec.target_cost,
                "observation": observation.tolist(),
                "seed": spec.seed,
            },
        ).json()
        served_cost = 0.0
        for step in range(1, 13):
            action = np.asarray(answer["action"], dtype=np.float32)
            observation, reward, _, _, info = env.step(action)
            served_cost += info["cost"]
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
                answer["remaining_cost"], max(spec.target_cost - served_cost, 0.0), atol=1e-9
            )
    assert served_cost == by_onnx.cost


def test_selection_specs_cover_every_budget_and_mode_on_selection_seeds() -> None:
    targets = [{"reward": 500.0, "cost": 10.0}, {"reward": 560.0, "cost": 20.0}]
    specs = selection_specs(targets, (10.0, 20.0), (False, True), episodes=3)
    assert len(specs) == 12
    assert {(s.target_reward, s.target_cost) for s in specs} == {(500.0, 10.0), (560.0, 20.0)}
    assert {s.deterministic for s in specs} == {False, True}
    assert {s.seed for s in specs} == set(selection_seeds(3))
