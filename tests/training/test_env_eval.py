"""In-simulator evaluation during training (training/env_eval.py)."""

from __future__ import annotations

import pytest
import torch

from training.data import NormalisationStats
from training.env_eval import EpisodeResult, rollout, summarise
from training.model import ConstrainedDecisionTransformer, ModelConfig, PolicyOutput

TASK = "SafetyBallRun-v0"  # obs_dim 7, act_dim 2
SEQ_LEN, MAX_LEN = 4, 12


class RecordingPolicy(ConstrainedDecisionTransformer):
    """The real network, remembering every window it is asked about."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__(
            ModelConfig(7, 2, SEQ_LEN, MAX_LEN, embedding_dim=8, num_layers=1, num_heads=2)
        )
        self.calls: list[dict[str, torch.Tensor]] = []
        self.modes: list[bool] = []

    def forward(self, **inputs: torch.Tensor) -> PolicyOutput:  # type: ignore[override]
        self.calls.append(inputs)
        self.modes.append(self.training)
        return super().forward(**inputs)


@pytest.fixture
def stats() -> NormalisationStats:
    return NormalisationStats([0.0] * 7, [1.0] * 7, [-1.0] * 2, [1.0] * 2, 0.1, 1.0, MAX_LEN)


def test_rollout_follows_algorithm_2(stats: NormalisationStats):
    policy = RecordingPolicy()
    targets = [(50.0, 2.0), (80.0, 0.5)]
    results = rollout(policy, stats, TASK, targets=targets, seeds=[0, 1])
    assert [(r.target_reward, r.target_cost) for r in results] == targets
    assert all(0 < r.length <= MAX_LEN for r in results)
    first = policy.calls[0]
    assert first["padding_mask"][0].tolist() == [True] * (SEQ_LEN - 1) + [False]
    assert first["returns_to_go"][:, -1].tolist() == pytest.approx([5.0, 8.0])  # R_0 * scale
    assert first["actions"][:, -1].abs().sum() == 0  # the newest action is not taken yet
    for call in policy.calls:
        assert call["costs_to_go"].min() >= 0  # C_{t+1} = max(C_t - c_t, 0)
    last = policy.calls[-1]
    assert not last["padding_mask"].any()
    assert not any(policy.modes)  # evaluated without dropout
    assert policy.training  # and handed back in the mode it came in


def test_summarise_normalises_reward_by_dataset_range_and_cost_by_target():
    results = [
        EpisodeResult(100.0, 10.0, reward=60.0, cost=5.0, length=10),
        EpisodeResult(100.0, 10.0, reward=80.0, cost=15.0, length=10),
        EpisodeResult(100.0, 20.0, reward=20.0, cost=0.0, length=10),
    ]
    summary = summarise(results, reward_range=(20.0, 120.0))
    assert summary["r100_c10/normalised_reward"] == pytest.approx(0.5)
    assert summary["r100_c10/normalised_cost"] == pytest.approx(1.0)
    assert summary["normalised_reward"] == pytest.approx(0.25)
    assert summary["normalised_cost"] == pytest.approx(0.5)
