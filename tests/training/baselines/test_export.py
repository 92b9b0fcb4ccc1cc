"""Every baseline exports a checked ONNX graph that matches torch and stays inside the bounds."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from runtime.context import WINDOW_NAMES
from runtime.policy import OUTPUT_NAMES
from tests.training.baselines.synthetic import ACTION_HIGH, ACTION_LOW, COST_LIMIT
from training.baselines import ALGORITHMS, DETERMINISTIC_ALGORITHMS
from training.baselines.config import BaselineConfig
from training.baselines.export import OnnxBaselinePolicy, export_baseline
from training.baselines.registry import train_baseline
from training.baselines.trainer import TrainedBaseline
from training.data.dataset import OfflineDataset

REQUIRED_CARD_KEYS = (
    "name",
    "version",
    "task",
    "observation_dim",
    "action_dim",
    "action_low",
    "action_high",
    "context_len",
    "max_episode_len",
)


def _feed(batch_size: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (batch_size, 1)
    return {
        "states": (5.0 * rng.normal(size=(*shape, 3))).astype(np.float32),  # far off the data too
        "actions": rng.normal(size=(*shape, 2)).astype(np.float32),
        "returns_to_go": rng.uniform(0, 20, size=shape).astype(np.float32),
        "costs_to_go": rng.uniform(0, 12, size=shape).astype(np.float32),
        "time_steps": rng.integers(0, 12, size=shape),
        "padding_mask": np.zeros(shape, dtype=bool),
    }


def _torch_outputs(trained: TrainedBaseline, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    policy = OnnxBaselinePolicy(trained.learner.policy_head(), trained.normaliser).eval()
    with torch.no_grad():
        outputs = policy(*(torch.as_tensor(feed[name]) for name in WINDOW_NAMES))
    return [output.numpy() for output in outputs]


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_export_onnx_matches_torch_inside_bounds(
    algo: str, tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    config = tiny_config(algo, steps=5)
    trained = train_baseline(config, tiny_dataset)
    out_dir = export_baseline(trained, tiny_dataset, config.output_dir("TinyTask-v0"))
    model = onnx.load(str(out_dir / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [value.name for value in model.graph.input] == list(WINDOW_NAMES)
    assert model.opset_import[0].version == 17
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [output.name for output in session.get_outputs()] == list(OUTPUT_NAMES)
    feed = _feed(batch_size=7, seed=1)
    mean, log_std = session.run(None, feed)
    expected_mean, expected_log_std = _torch_outputs(trained, feed)
    np.testing.assert_allclose(mean, expected_mean, atol=1e-5)
    np.testing.assert_allclose(log_std, expected_log_std, atol=1e-5)
    assert mean.shape == log_std.shape == (7, 2)
    assert np.all(mean >= np.array(ACTION_LOW)) and np.all(mean <= np.array(ACTION_HIGH))
    assert np.all(np.isfinite(log_std))
    if algo in DETERMINISTIC_ALGORITHMS:
        assert np.all(log_std == -5.0)
    card = json.loads((out_dir / "model.json").read_text())
    assert all(key in card for key in REQUIRED_CARD_KEYS)
    assert (card["algo"], card["context_len"], card["onnx_opset"]) == (algo, 1, 17)


def test_export_card_describes_data_and_training(
    tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    config = tiny_config("bc-safe", steps=3)
    out_dir = export_baseline(train_baseline(config, tiny_dataset), tiny_dataset, config.out)
    card = json.loads((out_dir / "model.json").read_text())
    returns = tiny_dataset.reward_returns
    assert card["name"] == out_dir.name and card["task"] == "TinyTask-v0"
    assert (card["observation_dim"], card["action_dim"]) == (3, 2)
    assert card["action_low"] == list(ACTION_LOW) and card["action_high"] == list(ACTION_HIGH)
    assert card["max_episode_len"] == 12 and card["cost_limit"] == COST_LIMIT
    assert card["dataset"]["episodes"] == 24
    assert card["dataset"]["reward_return_max"] == pytest.approx(float(returns.max()))
    assert card["training_config"]["steps"] == 3 and card["training_config"]["algo"] == "bc-safe"
    assert card["default_targets"][0]["cost"] == COST_LIMIT
    assert card["git_commit"] and card["evaluation"] is None


def test_export_mt_bc_reads_the_cost_to_go(
    tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    config = tiny_config("mt-bc", steps=20)
    out_dir = export_baseline(train_baseline(config, tiny_dataset), tiny_dataset, config.out)
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    low, high = _feed(batch_size=4, seed=2), _feed(batch_size=4, seed=2)
    low["costs_to_go"][:] = 0.0
    high["costs_to_go"][:] = 12.0
    assert not np.allclose(session.run(None, low)[0], session.run(None, high)[0])
