"""What a running training job holds, and its checkpoints: save, resume, and the contract of
the checkpoint evaluation the loop is handed (`CheckpointScore`, `EvaluateCheckpoint`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.optim.swa_utils import AveragedModel

from runtime.evaluation_protocol import BudgetRow
from training.checkpoint import load_checkpoint, write_checkpoint
from training.data.windows import Batch, NormalisationStats, WindowSampler
from training.learn.config import TrainConfig
from training.learn.distributed import DistributedContext, gather_states
from training.learn.flat_parameters import FlatParameters, flat_optimizer_state
from training.learn.metrics import ScalarLog
from training.learn.model import ConstrainedDecisionTransformer
from training.learn.temperature import EntropyTemperature


@dataclass
class TrainState:
    """Everything a running training job holds (mutable; not a config)."""

    config: TrainConfig
    context: DistributedContext
    run_dir: Path
    device: torch.device
    dataset_info: dict[str, Any]
    stats: NormalisationStats
    sampler: WindowSampler
    model: ConstrainedDecisionTransformer
    trainable: torch.nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    temperature: EntropyTemperature | None
    temperature_optimizer: torch.optim.Optimizer | None
    log: ScalarLog | None
    step: int = 0
    best_score: float = -math.inf
    evaluation: dict[str, Any] | None = None  # the latest in-env evaluation (for the model card)
    averaged: AveragedModel | None = None  # the weight average checkpoints carry (if any)
    flat: FlatParameters | None = None  # the model's parameters as one buffer (CPU)
    flat_average: FlatParameters | None = None  # the same for `averaged`'s
    probe_batch: Batch | None = None  # recorded windows of the token probe
    last_rows: list[BudgetRow] = dataclasses.field(default_factory=list)  # latest selection rows

    def network(self) -> ConstrainedDecisionTransformer:
        """The weights that are evaluated, checkpointed as `model` and exported."""
        if self.averaged is None:
            return self.model
        module = self.averaged.module
        assert isinstance(module, ConstrainedDecisionTransformer)  # AveragedModel types it Module
        return module


class CheckpointScore(NamedTuple):
    """What a checkpoint evaluation tells the loop about the evaluated weights at one step."""

    score: float
    """higher is better: best.pt holds the step with the highest score."""
    record: dict[str, Any]
    """kept in the checkpoint as `evaluation` (export copies it into the model card)."""
    rows: list[BudgetRow]
    """the protocol's rows (the fail-fast check reads the mean action's)."""
    scalars: dict[str, float]
    """written to the `eval` log (eval.csv, TensorBoard)."""
    summary: str
    """one log line."""


EvaluateCheckpoint = Callable[[TrainState], CheckpointScore]
"""Scores `state.network()` (rank 0, every `eval_every` steps)."""


def save_checkpoint(state: TrainState, name: str) -> Path | None:
    """Write `<run_dir>/<name>.pt` and `<name>.json` (rank 0 only; all ranks must call it)."""
    sampler_states = gather_states(state.context, state.sampler.generator.get_state())
    rng_states = gather_states(state.context, torch.get_rng_state())
    cuda_rng_states = None
    if state.device.type == "cuda":  # dropout on the GPU draws from the CUDA generator
        cuda_rng_states = gather_states(state.context, torch.cuda.get_rng_state(state.device))
    if not state.context.is_main:
        return None
    payload: dict[str, Any] = {
        "step": state.step,
        "best_score": state.best_score,
        "evaluation": state.evaluation,
        "model": state.network().state_dict(),
        "model_config": dataclasses.asdict(state.model.config),
        "stats": state.stats.to_dict(),
        "config": state.config.to_json_dict(),
        "dataset": state.dataset_info,
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "sampler_states": sampler_states,
        "rng_states": rng_states,
        "cuda_rng_states": cuda_rng_states,
    }
    if state.averaged is not None:
        payload["training_model"] = state.model.state_dict()
    if state.temperature is not None and state.temperature_optimizer is not None:
        payload["temperature"] = state.temperature.state_dict()
        payload["temperature_optimizer"] = state.temperature_optimizer.state_dict()
    return write_checkpoint(state.run_dir / f"{name}.pt", payload)


def resolve_config(config: TrainConfig) -> tuple[TrainConfig, dict[str, Any] | None]:
    """A resumed run takes its stored config, except update_steps and resume."""
    if config.resume is None:
        return config, None
    checkpoint = load_checkpoint(config.resume)
    stored = TrainConfig.from_json_dict(checkpoint["config"])
    resolved = dataclasses.replace(stored, update_steps=config.update_steps, resume=config.resume)
    return resolved, checkpoint


def restore_checkpoint(state: TrainState, checkpoint: dict[str, Any]) -> None:
    """Load every piece of training state so the run continues bit-for-bit."""
    state.model.load_state_dict(checkpoint.get("training_model", checkpoint["model"]))
    if state.averaged is not None:
        state.averaged.module.load_state_dict(checkpoint["model"])
        state.averaged.n_averaged.fill_(int(checkpoint["step"]))
    optimizer_state = checkpoint["optimizer"]
    if state.flat is not None:
        optimizer_state = flat_optimizer_state(optimizer_state, state.flat)
    state.optimizer.load_state_dict(optimizer_state)
    state.scheduler.load_state_dict(checkpoint["scheduler"])
    if state.temperature is not None and state.temperature_optimizer is not None:
        state.temperature.load_state_dict(checkpoint["temperature"])
        state.temperature_optimizer.load_state_dict(checkpoint["temperature_optimizer"])
    rank = state.context.rank
    state.sampler.generator.set_state(checkpoint["sampler_states"][rank])
    torch.set_rng_state(checkpoint["rng_states"][rank])
    if state.device.type == "cuda" and checkpoint.get("cuda_rng_states"):
        torch.cuda.set_rng_state(checkpoint["cuda_rng_states"][rank], state.device)
    state.step = int(checkpoint["step"])
    state.best_score = float(checkpoint["best_score"])
    state.evaluation = checkpoint.get("evaluation")
