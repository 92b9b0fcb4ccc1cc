"""The ONNX policy plus its model card, from a training checkpoint (`cdt export`: export_cli.py).

The graph follows docs/ARTIFACT.md: raw env-unit inputs, a fixed context length K with a padding
mask, a dynamic batch axis, and (action_mean, action_log_std) for the newest step in env units.
`OnnxPolicy` owns the pre- and post-processing (state normalisation, action scaling, return
scaling, time-step clamping), so the service never re-implements it.
"""

from __future__ import annotations

import datetime as dt
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from runtime.card import write_card
from runtime.context import WINDOW_NAMES
from runtime.files import COST_CRITIC_FILE, ONNX_FILE, staged_files, write_atomic
from runtime.policy import OUTPUT_NAMES
from training.checkpoint import load_checkpoint
from training.data.windows import NormalisationStats
from training.interrupt import sigterm_as_interrupt
from training.learn.model import ConstrainedDecisionTransformer, ModelConfig
from training.provenance import git_commit

logger = logging.getLogger(__name__)
ONNX_OPSET = 18


class EnvUnitPolicy(nn.Module):
    """Base of every exported graph: it owns state standardisation and action scaling, so the
    graph reads and answers env units and the service never re-implements either."""

    state_mean: torch.Tensor  # [state_dim]
    state_std: torch.Tensor  # [state_dim]
    action_center: torch.Tensor  # [action_dim]
    action_half_range: torch.Tensor  # [action_dim]

    def __init__(self, state_mean: Any, state_std: Any, action_low: Any, action_high: Any) -> None:
        super().__init__()
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("state_mean", torch.as_tensor(state_mean, dtype=torch.float32))
        self.register_buffer("state_std", torch.as_tensor(state_std, dtype=torch.float32))
        self.register_buffer("action_center", (high + low) / 2)
        self.register_buffer("action_half_range", (high - low) / 2)

    def standardise(self, states: torch.Tensor) -> torch.Tensor:
        """Env-unit states [..., state_dim] -> standardised states."""
        return (states - self.state_mean) / self.state_std

    def unit_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Env-unit actions [..., action_dim] -> [-1, 1]."""
        return (actions - self.action_center) / self.action_half_range

    def env_actions(
        self, unit_mean: torch.Tensor, unit_log_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A Gaussian over [-1, 1] actions -> the same Gaussian in env units."""
        mean = unit_mean * self.action_half_range + self.action_center
        return mean, unit_log_std + torch.log(self.action_half_range)


class OnnxPolicy(EnvUnitPolicy):
    """Raw env-unit windows in, the newest step's action distribution (env units) out."""

    def __init__(
        self,
        model: ConstrainedDecisionTransformer,
        stats: NormalisationStats,
        budget_scale: float = 1.0,
    ) -> None:
        super().__init__(stats.state_mean, stats.state_std, stats.action_low, stats.action_high)
        self.model = model.eval()
        self.reward_scale = float(stats.reward_scale)
        # Deviation (measured): the graph may feed budget_scale x the remaining cost budget, chosen
        # by `cdt select` so that few episodes exceed their budget
        # (training/evaluation/select_checkpoint.py).
        self.cost_scale = float(stats.cost_scale) * budget_scale
        self.max_time_step = int(stats.max_episode_len) - 1
        self.eval()

    def forward(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        costs_to_go: torch.Tensor,
        time_steps: torch.Tensor,
        padding_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes as in docs/ARTIFACT.md; returns ([B, act_dim], [B, act_dim])."""
        real = (~padding_mask).unsqueeze(-1)  # [batch, seq_len, 1]
        # Padding positions are zeroed so that whatever the caller put there cannot leak in.
        states = torch.where(real, self.standardise(states), 0.0)
        actions = torch.where(real, self.unit_actions(actions), 0.0)
        returns_to_go = torch.where(real[..., 0], returns_to_go * self.reward_scale, 0.0)
        costs_to_go = torch.where(real[..., 0], costs_to_go * self.cost_scale, 0.0)
        time_steps = time_steps.clamp(0, self.max_time_step)
        output = self.model(
            states, actions, returns_to_go, costs_to_go, time_steps, padding_mask, newest_only=True
        )
        # [batch, action_dim] each, the mean in [-1, 1]
        return self.env_actions(output.action_mean[:, -1], output.action_log_std[:, -1])


def policy_from_checkpoint(checkpoint: dict[str, Any]) -> OnnxPolicy:
    """Rebuild the trained network from a checkpoint dict and wrap it."""
    model = ConstrainedDecisionTransformer(ModelConfig(**checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    stats = NormalisationStats(**checkpoint["stats"])
    return OnnxPolicy(model, stats, checkpoint.get("budget_scale", 1.0)).eval()


def example_inputs(policy: OnnxPolicy, batch_size: int = 2) -> tuple[torch.Tensor, ...]:
    """A full (unpadded) window per row, used to trace the graph."""
    config = policy.model.config
    seq_len = config.seq_len
    return (
        torch.zeros(batch_size, seq_len, config.state_dim),
        torch.zeros(batch_size, seq_len, config.action_dim),
        torch.zeros(batch_size, seq_len),
        torch.zeros(batch_size, seq_len),
        torch.arange(seq_len).repeat(batch_size, 1),
        torch.zeros(batch_size, seq_len, dtype=torch.bool),
    )


def export_graph(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    names: tuple[Sequence[str], Sequence[str]],
    path: Path,
    opset: int = ONNX_OPSET,
) -> Path:
    """Export `module` with a dynamic batch axis on every input (the example's other axes stay
    fixed), check the graph, and write it atomically; returns `path`.

    Args:
        example: one tensor per input, with a batch axis first, to trace the graph.
        names: (input names, output names) as the graph's contract spells them.
    """
    input_names, output_names = names
    batch = torch.export.Dim("batch", min=1, max=65536)
    with warnings.catch_warnings():
        # Every input shares the one batch Dim, and the exporter says so once per input.
        warnings.filterwarnings("ignore", message=".*axis name: batch will not be used")
        # torch's own exporter internals use a pytree API that torch itself deprecates.
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        program = torch.onnx.export(
            module,
            example,
            input_names=list(input_names),
            output_names=list(output_names),
            opset_version=opset,
            dynamic_shapes={name: {0: batch} for name in input_names},
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")

    def write(temporary: Path) -> None:
        program.save(str(temporary))
        onnx.checker.check_model(str(temporary), full_check=True)  # refuse a bad graph unwritten

    return write_atomic(path, write)


def export_onnx(policy: OnnxPolicy, path: Path, opset: int = ONNX_OPSET) -> Path:
    """Export the policy with a dynamic batch axis (fixed K), check it, write it atomically."""
    names = (WINDOW_NAMES, OUTPUT_NAMES)  # the contract's names, from runtime/ (ARTIFACT.md)
    return export_graph(policy, example_inputs(policy), names, path, opset)


def _mean_action_budget_scales(checkpoint: dict[str, Any]) -> list[dict[str, float]] | None:
    """`cdt select`'s one mean-action scale as the card lists it: one entry, at every budget."""
    scale = checkpoint.get("mean_action_budget_scale")
    if scale is None:
        return None
    return [{"budget": min(checkpoint["config"]["eval_budgets"]), "scale": scale}]


def model_card(
    checkpoint: dict[str, Any], name: str, version: str | None, opset: int
) -> dict[str, Any]:
    """The sidecar JSON described in docs/ARTIFACT.md."""
    stats, config = checkpoint["stats"], checkpoint["config"]
    model_config = checkpoint["model_config"]
    dataset = dict(checkpoint["dataset"])
    now = dt.datetime.now(dt.UTC)
    return {
        "name": name,
        "version": version or f"{now:%Y-%m-%d}.{checkpoint['step']}",
        "algo": config["algo"],
        "task": dataset.pop("task"),
        "observation_dim": model_config["state_dim"],
        "action_dim": model_config["action_dim"],
        "action_low": stats["action_low"],
        "action_high": stats["action_high"],
        "context_len": model_config["seq_len"],
        "max_episode_len": stats["max_episode_len"],
        "reward_scale": stats["reward_scale"],
        "cost_scale": stats["cost_scale"],
        "budget_scale": checkpoint.get("budget_scale", 1.0),
        "mean_action_budget_scales": _mean_action_budget_scales(checkpoint),
        "deterministic": not model_config["stochastic"],
        "onnx_opset": opset,
        "git_commit": dataset.pop("git_commit", None) or git_commit(),
        "created_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "training_step": checkpoint["step"],
        "dataset": dataset,
        # the data's PF(kappa) + 10 % of the reward range: the targets selection used
        "default_targets": dataset.pop("default_targets"),
        "cost_curve": None,
        "validated_cost_range": None,
        "training_config": config,
        # the selection protocol's result (selection seeds); `cdt evaluate --record` adds more
        "evaluation": {"selection": checkpoint["evaluation"]}
        if checkpoint.get("evaluation")
        else None,
    }


def export_checkpoint(
    checkpoint_path: Path, out_dir: Path, name: str | None = None, version: str | None = None
) -> Path:
    """Write `out_dir/model.onnx` and `out_dir/model.json`; returns out_dir.

    Both are written and checked in a staging folder first, then moved in (`staged_files`): a
    failed or interrupted export (Ctrl-C, SIGTERM) leaves the folder as it was, and the staging
    folders of exports killed outright are removed by the next export of `out_dir`. A cost
    critic an earlier export's model had goes: it was fitted for that model (`cdt critic`).
    """
    checkpoint = load_checkpoint(checkpoint_path)
    policy = policy_from_checkpoint(checkpoint)
    card = model_card(checkpoint, name or out_dir.resolve().name, version, ONNX_OPSET)
    # SIGTERM as Ctrl-C: the staging folder goes with the interrupted export, not after it.
    with sigterm_as_interrupt(), staged_files(out_dir) as staging:
        export_onnx(policy, staging / ONNX_FILE)
        write_card(staging, card)
    (out_dir / COST_CRITIC_FILE).unlink(missing_ok=True)  # the new card names no critic
    return out_dir


def quiet_exporter_logs() -> None:
    """Silence the exporter's harmless notes (constant folding, torchvision ops we never use,
    one line per deduplicated initializer under a caller's INFO logging, as `cdt pipeline`'s)."""
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    logging.getLogger("onnx_ir").setLevel(logging.WARNING)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
