"""A tiny ONNX policy built with `onnx.helper` (no torch), shared by service, client and
evaluation tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LOG_STD = -1.0


def build_test_graph(
    observation_dim: int, action_dim: int, context_len: int, cost_weight: float = 0.1
) -> onnx.ModelProto:
    """A policy honouring docs/ARTIFACT.md.

    `action_mean = tanh(states[:, K-1] @ W + cost_weight * costs_to_go[:, K-1]
    + 0.01 * returns_to_go[:, K-1])` (so budget changes visibly change the action) and
    `action_log_std = LOG_STD`.
    """
    rng = np.random.default_rng(0)
    weights = rng.normal(0.0, 0.5, (observation_dim, action_dim)).astype(np.float32)
    initializers = [
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(np.array([context_len - 1], np.int64), "newest"),
        numpy_helper.from_array(np.full(action_dim, cost_weight, np.float32), "cost_weight"),
        numpy_helper.from_array(np.full(action_dim, 0.01, np.float32), "return_weight"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(LOG_STD, np.float32), "log_std"),
    ]
    nodes = [
        helper.make_node("Gather", ["states", "newest"], ["state_k"], axis=1),  # [B, 1, obs]
        helper.make_node("MatMul", ["state_k", "weights"], ["projected"]),  # [B, 1, act]
        helper.make_node("Gather", ["costs_to_go", "newest"], ["cost_k"], axis=1),  # [B, 1]
        helper.make_node("Gather", ["returns_to_go", "newest"], ["return_k"], axis=1),  # [B, 1]
        helper.make_node("Mul", ["cost_k", "cost_weight"], ["cost_term"]),  # [B, act]
        helper.make_node("Mul", ["return_k", "return_weight"], ["return_term"]),  # [B, act]
        helper.make_node("Squeeze", ["projected", "newest_axis"], ["projected_2d"]),
        helper.make_node("Add", ["projected_2d", "cost_term"], ["with_cost"]),
        helper.make_node("Add", ["with_cost", "return_term"], ["logits"]),
        helper.make_node("Tanh", ["logits"], ["action_mean"]),
        helper.make_node("Mul", ["action_mean", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "log_std"], ["action_log_std"]),
    ]
    initializers.append(numpy_helper.from_array(np.array([1], np.int64), "newest_axis"))
    batch, k = "batch", context_len
    inputs = [
        helper.make_tensor_value_info("states", TensorProto.FLOAT, [batch, k, observation_dim]),
        helper.make_tensor_value_info("actions", TensorProto.FLOAT, [batch, k, action_dim]),
        helper.make_tensor_value_info("returns_to_go", TensorProto.FLOAT, [batch, k]),
        helper.make_tensor_value_info("costs_to_go", TensorProto.FLOAT, [batch, k]),
        helper.make_tensor_value_info("time_steps", TensorProto.INT64, [batch, k]),
        helper.make_tensor_value_info("padding_mask", TensorProto.BOOL, [batch, k]),
    ]
    outputs = [
        helper.make_tensor_value_info("action_mean", TensorProto.FLOAT, [batch, action_dim]),
        helper.make_tensor_value_info("action_log_std", TensorProto.FLOAT, [batch, action_dim]),
    ]
    graph = helper.make_graph(nodes, "test_policy", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_test_policy(
    directory: Path,
    *,
    name: str = "toy",
    version: str = "1",
    observation_dim: int = 3,
    action_dim: int = 2,
    context_len: int = 4,
    cost_weight: float = 0.1,
    validated_cost_range: Sequence[float] | None = (5.0, 40.0),
    action_bound: float = 1.0,
) -> Path:
    """Write `model.onnx` and `model.json` (the ARTIFACT.md card) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    graph = build_test_graph(observation_dim, action_dim, context_len, cost_weight)
    onnx.save(graph, str(directory / "model.onnx"))
    card = {
        "name": name,
        "version": version,
        "algo": "test",
        "task": "SafetyToyRun-v0",
        "observation_dim": observation_dim,
        "action_dim": action_dim,
        "action_low": [-action_bound] * action_dim,
        "action_high": [action_bound] * action_dim,
        "context_len": context_len,
        "max_episode_len": 100,
        "default_targets": [{"reward": 50.0, "cost": 10.0}],
        "dataset": {"reward_return_min": 0.0, "reward_return_max": 100.0},
        "validated_cost_range": list(validated_cost_range) if validated_cost_range else None,
        "training_config": {"seed": 0},
    }
    (directory / "model.json").write_text(json.dumps(card))
    return directory


REDIS_URL = "redis://127.0.0.1:6379/0"
"""The Redis server CI and every developer machine run (tests skip when it does not answer)."""
