"""Export a trained baseline as models/<name>/model.onnx + model.json (docs/ARTIFACT.md).

The graph takes the contract's six inputs with K = 1, normalises the newest state itself, maps
the policy's [-1, 1] action to env units inside [action_low, action_high], and outputs the
action mean and log-std. Inputs a stateless policy does not read (all but `states`, and
`costs_to_go` for MT-BC) are still declared, so every artifact has the same signature.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from runtime.card import write_card
from runtime.context import WINDOW_NAMES
from runtime.evaluation_protocol import REPORTED_BUDGETS
from runtime.files import ONNX_FILE, staged_files
from runtime.policy import OUTPUT_NAMES
from training.baselines import DETERMINISTIC_ALGORITHMS
from training.baselines.data import Normaliser
from training.baselines.networks import DETERMINISTIC_LOG_STD
from training.baselines.trainer import TrainedBaseline
from training.data.dataset import OfflineDataset
from training.data.windows import dataset_summary
from training.export import EnvUnitPolicy
from training.provenance import git_commit

ONNX_OPSET = 17
CONTEXT_LEN = 1


class OnnxBaselinePolicy(EnvUnitPolicy):
    """The exported graph: contract inputs -> (action_mean, action_log_std) in env units."""

    cost_normaliser: torch.Tensor

    def __init__(self, head: nn.Module, normaliser: Normaliser) -> None:
        super().__init__(
            normaliser.state_mean,
            normaliser.state_std,
            normaliser.action_low,
            normaliser.action_high,
        )
        self.head = head
        cost = torch.as_tensor(normaliser.cost_normaliser, dtype=torch.float32)
        self.register_buffer("cost_normaliser", cost)

    def forward(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        costs_to_go: torch.Tensor,
        time_steps: torch.Tensor,
        padding_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """states [B, K, obs_dim], costs_to_go [B, K] -> mean, log-std [B, act_dim]."""
        newest = self.standardise(states[:, -1])  # [B, obs_dim], step K - 1
        condition = costs_to_go[:, -1] / self.cost_normaliser  # [B]
        unit_mean, unit_log_std = self.head(newest, condition)
        deterministic = unit_log_std is None
        if unit_log_std is None:
            unit_log_std = torch.zeros_like(unit_mean)
        mean, log_std = self.env_actions(unit_mean, unit_log_std)
        low = self.action_center - self.action_half_range
        mean = torch.minimum(torch.maximum(mean, low), self.action_center + self.action_half_range)
        if deterministic:
            return mean, torch.full_like(mean, DETERMINISTIC_LOG_STD)
        return mean, log_std


def example_inputs(
    observation_dim: int, action_dim: int, batch_size: int = 2
) -> tuple[torch.Tensor, ...]:
    """Zero-valued contract inputs of K = 1, in WINDOW_NAMES order."""
    shape = (batch_size, CONTEXT_LEN)
    return (
        torch.zeros((*shape, observation_dim)),
        torch.zeros((*shape, action_dim)),
        torch.zeros(shape),
        torch.full(shape, 10.0),
        torch.zeros(shape, dtype=torch.int64),
        torch.zeros(shape, dtype=torch.bool),
    )


def _declare_all_inputs(model: onnx.ModelProto, observation_dim: int, action_dim: int) -> None:
    """Put every contract input in the graph, in order (the exporter drops unused ones)."""
    specs: dict[str, tuple[int, list[str | int | None]]] = {
        "states": (TensorProto.FLOAT, ["batch", CONTEXT_LEN, observation_dim]),
        "actions": (TensorProto.FLOAT, ["batch", CONTEXT_LEN, action_dim]),
        "returns_to_go": (TensorProto.FLOAT, ["batch", CONTEXT_LEN]),
        "costs_to_go": (TensorProto.FLOAT, ["batch", CONTEXT_LEN]),
        "time_steps": (TensorProto.INT64, ["batch", CONTEXT_LEN]),
        "padding_mask": (TensorProto.BOOL, ["batch", CONTEXT_LEN]),
    }
    present = {value.name: value for value in model.graph.input}
    inputs = [
        present.get(name) or helper.make_tensor_value_info(name, *specs[name])
        for name in WINDOW_NAMES
    ]
    del model.graph.input[:]
    model.graph.input.extend(inputs)


def export_onnx(
    policy: OnnxBaselinePolicy, path: Path, observation_dim: int, action_dim: int
) -> Path:
    """Trace `policy` on CPU to ONNX (opset 17, dynamic batch) and check the graph."""
    policy = copy.deepcopy(policy).cpu().eval()
    axes = {name: {0: "batch"} for name in (*WINDOW_NAMES, *OUTPUT_NAMES)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            policy,
            example_inputs(observation_dim, action_dim),
            str(path),
            input_names=list(WINDOW_NAMES),
            output_names=list(OUTPUT_NAMES),
            dynamic_axes=axes,
            opset_version=ONNX_OPSET,
            dynamo=False,
        )
    model = onnx.load(str(path))
    _declare_all_inputs(model, observation_dim, action_dim)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def build_card(trained: TrainedBaseline, dataset: OfflineDataset, name: str) -> dict[str, Any]:
    """The model card: the contract's required keys plus data, training and provenance."""
    config, normaliser = trained.config, trained.normaliser
    now = datetime.datetime.now(datetime.UTC)
    budgets = dict.fromkeys((config.cost_limit, *REPORTED_BUDGETS))  # its own limit first
    summary = dataset_summary(config.dataset, dataset, tuple(budgets))
    conditioned = config.algo == "mt-bc"
    return {
        "name": name,
        "version": f"{now:%Y-%m-%d}.1",
        "algo": config.algo,
        "task": dataset.task,
        "observation_dim": trained.observation_dim,
        "action_dim": trained.action_dim,
        "action_low": normaliser.action_low.tolist(),
        "action_high": normaliser.action_high.tolist(),
        "context_len": CONTEXT_LEN,
        "max_episode_len": trained.episode_len,
        "reward_scale": 1.0,
        "cost_scale": 1.0 / normaliser.cost_normaliser if conditioned else 1.0,
        "onnx_opset": ONNX_OPSET,
        "git_commit": git_commit(),
        "created_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "dataset": summary,
        "default_targets": summary.pop("default_targets"),
        "cost_limit": config.cost_limit,
        "deterministic": config.algo in DETERMINISTIC_ALGORITHMS,
        "training_config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "training": {
            "episodes_used": trained.episodes_used,
            "train_seconds": round(trained.train_seconds, 1),
            "history": trained.history[-5:],
        },
        "evaluation": None,
    }


def export_baseline(trained: TrainedBaseline, dataset: OfflineDataset, out_dir: Path) -> Path:
    """Write out_dir/model.onnx and out_dir/model.json together; returns out_dir.

    The card is validated first, and both files are written in a staging folder beside out_dir
    and moved in at the end: a refused card or a failed export leaves no half pair behind (a
    graph without its card, which a rerun would then refuse to replace).
    """
    policy = OnnxBaselinePolicy(trained.learner.policy_head(), trained.normaliser)
    with staged_files(out_dir) as staging:
        write_card(staging, build_card(trained, dataset, out_dir.name))
        export_onnx(policy, staging / ONNX_FILE, trained.observation_dim, trained.action_dim)
    return out_dir
