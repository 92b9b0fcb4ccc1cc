"""A tiny cost critic graph built with `onnx.helper` (no torch), for runtime and service tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from runtime.files import COST_CRITIC_FILE


def write_test_critic(
    directory: Path,
    observation_dim: int,
    action_dim: int,
    action_weight: float = 2.0,
    bias: float = 0.0,
) -> Path:
    """`cost = action_weight * actions[:, 0] + 0.1 * observations[:, 0] + bias`: the first action
    component is what costs, so a shield has somewhere to go."""
    action_weights = np.zeros((action_dim, 1), np.float32)
    action_weights[0, 0] = action_weight
    observation_weights = np.zeros((observation_dim, 1), np.float32)
    observation_weights[0, 0] = 0.1
    initializers = [
        numpy_helper.from_array(action_weights, "action_weights"),
        numpy_helper.from_array(observation_weights, "observation_weights"),
        numpy_helper.from_array(np.array([1], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([bias], np.float32), "bias"),
    ]
    nodes = [
        helper.make_node("MatMul", ["actions", "action_weights"], ["from_action"]),  # [N, 1]
        helper.make_node("MatMul", ["observations", "observation_weights"], ["from_state"]),
        helper.make_node("Add", ["from_action", "from_state"], ["unbiased"]),  # [N, 1]
        helper.make_node("Add", ["unbiased", "bias"], ["cost_2d"]),  # [N, 1]
        helper.make_node("Squeeze", ["cost_2d", "last_axis"], ["cost"]),  # [N]
    ]
    inputs = [
        helper.make_tensor_value_info("observations", TensorProto.FLOAT, ["n", observation_dim]),
        helper.make_tensor_value_info("actions", TensorProto.FLOAT, ["n", action_dim]),
    ]
    outputs = [helper.make_tensor_value_info("cost", TensorProto.FLOAT, ["n"])]
    graph = helper.make_graph(nodes, "test_critic", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = directory / COST_CRITIC_FILE
    onnx.save(model, path)
    return path
