"""`cdt train`: train CDT (or DT-Cost) on an offline dataset and write checkpoints.

`train(config) -> Path` is composed of `make_dataloader`, `train_step`, `evaluate` and
`save_checkpoint`. Runs alone or under `torchrun` (DistributedDataParallel: rank 0 logs,
evaluates and writes checkpoints; every rank samples its own batches).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from runtime.protocol import BudgetRow, SelectionRule, action_mode, describe
from training.data.dataset import OfflineDataset, load_dataset
from training.data.windows import (
    Batch,
    NormalisationStats,
    WindowSampler,
    build_buffer,
    compute_stats,
    cost_sampling_weights,
    dataset_summary,
    describe_coverage,
    window_coverage,
)
from training.evaluation.selection import (
    evaluate_selection,
    selection_record,
    verdict,
)
from training.learn.checkpoint import load_checkpoint, write_checkpoint
from training.learn.config import TrainConfig
from training.learn.distributed import (
    DistributedContext,
    average_gradients,
    gather_states,
    init_distributed,
    shutdown_distributed,
)
from training.learn.interrupt import StopRequest, TrainingInterrupted
from training.learn.losses import LossTerms, policy_loss
from training.learn.metrics import ScalarLog
from training.learn.model import ConstrainedDecisionTransformer, EntropyTemperature, ModelConfig
from training.learn.relabelling import relabel_episodes

logger = logging.getLogger(__name__)


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


def make_dataloader(
    config: TrainConfig, dataset: OfflineDataset, stats: NormalisationStats, rank: int = 0
) -> WindowSampler:
    """Augment and pre-pad the episodes; returns the batch sampler of this rank."""
    episodes = dataset.episodes
    relabels = relabel_episodes(config, episodes)
    buffer = build_buffer(episodes, stats, config.seq_len, relabels)
    weights = None
    if config.uses_cost_sampling:
        weights = cost_sampling_weights(buffer.cost_returns, config.sampling_cost_ceiling)
    logger.info("%d episodes + %d relabelled copies", len(episodes), len(relabels))
    if rank == 0:
        coverage = window_coverage(buffer, weights, len(episodes), stats.cost_scale)
        logger.info(describe_coverage(coverage))
    return WindowSampler(buffer, config.seq_len, config.batch_size, config.seed + rank, weights)


def build_model(
    config: TrainConfig, stats: NormalisationStats, dims: tuple[int, int]
) -> ConstrainedDecisionTransformer:
    """The network for `config`, on the CPU, seeded by `config.seed`."""
    torch.manual_seed(config.seed)
    model_config = ModelConfig(
        state_dim=dims[0],
        action_dim=dims[1],
        seq_len=config.seq_len,
        max_episode_len=stats.max_episode_len,
        embedding_dim=config.embedding_dim,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        dropout=config.dropout,
        stochastic=config.stochastic,
        log_std_min=config.log_std_min,
        log_std_max=config.log_std_max,
        cost_prediction=config.effective_cost_prediction_weight > 0,
        cost_to_go_offset=config.cost_to_go_offset,
        cost_conditioned=config.cost_conditioned,
        fused_attention=config.fused_attention,
        skip_unread_outputs=config.skip_unread_outputs,
        fast_dropout=config.fast_dropout,
    )
    return ConstrainedDecisionTransformer(model_config)


def _autocast(state: TrainState) -> Any:
    if not state.config.bf16:
        return nullcontext()
    return torch.autocast(device_type=state.device.type, dtype=torch.bfloat16)


def train_step(state: TrainState, batch: Batch) -> LossTerms:
    """One gradient step on `batch` (plus the temperature step when it is learned)."""
    config = state.config
    with _autocast(state):
        output = state.trainable(
            batch.states,
            batch.actions,
            batch.returns_to_go,
            batch.costs_to_go,
            batch.time_steps,
            batch.padding_mask,
        )
    entropy_weight: torch.Tensor | float = config.entropy_weight if config.entropy else 0.0
    if state.temperature is not None:
        entropy_weight = state.temperature().detach()
    terms = policy_loss(
        output,
        batch,
        stochastic=config.stochastic,
        entropy_weight=entropy_weight,
        cost_weight=config.effective_cost_prediction_weight,
    )
    state.optimizer.zero_grad(set_to_none=True)
    torch.autograd.backward(terms.loss)
    torch.nn.utils.clip_grad_norm_(state.trainable.parameters(), config.clip_grad)
    state.optimizer.step()
    state.scheduler.step()
    if state.temperature is not None and state.temperature_optimizer is not None:
        state.temperature_optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(state.temperature.loss(terms.entropy))
        average_gradients(state.context, list(state.temperature.parameters()))
        state.temperature_optimizer.step()
    return terms


def evaluate(state: TrainState) -> list[BudgetRow]:
    """The reported protocol on selection seeds: every budget, both action modes."""
    return evaluate_selection(state.model, state.stats, state.config, state.dataset_info)


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
        "model": state.model.state_dict(),
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
    if state.temperature is not None and state.temperature_optimizer is not None:
        payload["temperature"] = state.temperature.state_dict()
        payload["temperature_optimizer"] = state.temperature_optimizer.state_dict()
    return write_checkpoint(state.run_dir / f"{name}.pt", payload)


def _resolve_config(config: TrainConfig) -> tuple[TrainConfig, dict[str, Any] | None]:
    """A resumed run takes its stored config, except update_steps and resume."""
    if config.resume is None:
        return config, None
    checkpoint = load_checkpoint(config.resume)
    stored = TrainConfig.from_json_dict(checkpoint["config"])
    resolved = dataclasses.replace(stored, update_steps=config.update_steps, resume=config.resume)
    return resolved, checkpoint


def _run_dir(config: TrainConfig, task: str) -> Path:
    if config.resume is not None:
        return config.resume.parent
    name = config.run_name or f"{config.algo}-{task}-seed{config.seed}"
    return config.out_dir / name


def _device(config: TrainConfig, context: DistributedContext) -> torch.device:
    if config.device.startswith("cuda") and context.enabled:
        return torch.device("cuda", context.local_rank)
    return torch.device(config.device)


def _optimisers(
    config: TrainConfig, model: torch.nn.Module, action_dim: int, device: torch.device
) -> tuple[Any, ...]:
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        betas=config.betas,
        weight_decay=config.weight_decay,
        fused=device.type == "cuda",  # one kernel for all parameters instead of one per tensor
    )
    warmup = max(config.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, 1.0)
    )
    if not (config.stochastic and config.entropy and config.learn_temperature):
        return optimizer, scheduler, None, None
    temperature = EntropyTemperature(config.entropy_weight, config.target_entropy(action_dim))
    temperature = temperature.to(device)
    # OSRL: a separate Adam, lr 1e-4, for the log-temperature.
    temperature_optimizer = torch.optim.Adam(temperature.parameters(), lr=1e-4)
    return optimizer, scheduler, temperature, temperature_optimizer


def _restore(state: TrainState, checkpoint: dict[str, Any]) -> None:
    """Load every piece of training state so the run continues bit-for-bit."""
    state.model.load_state_dict(checkpoint["model"])
    state.optimizer.load_state_dict(checkpoint["optimizer"])
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


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # Intel AMX tiles; AVX-512 BF16 (AMD Zen 4+)


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Does this CPU multiply bf16 natively (where bf16 autocast pays)? False when unknown."""
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def prepare_training(config: TrainConfig) -> TrainState:
    """Load data, build model and optimisers, and restore a checkpoint when resuming."""
    config, checkpoint = _resolve_config(config)
    context = init_distributed(config.device)
    if config.num_threads is not None and not config.device.startswith("cuda"):
        torch.set_num_threads(max(1, config.num_threads // context.world_size))
    dataset = load_dataset(config.dataset)
    dataset_info = dataset_summary(config.dataset, dataset, config.eval_budgets)
    stats = compute_stats(dataset.episodes, dataset.attrs, config.reward_scale, config.cost_scale)
    dims = (dataset.observation_dim, dataset.action_dim)
    device = _device(config, context)
    if config.bf16 and device.type == "cpu" and not cpu_has_native_bf16():
        logger.warning("--bf16 on a CPU without bf16 instructions: expect much slower training")
    model = build_model(config, stats, dims).to(device)
    optimisers = _optimisers(config, model, dims[1], device)
    optimizer, scheduler, temperature, temperature_optimizer = optimisers
    sampler = make_dataloader(config, dataset, stats, context.rank)
    if device.type == "cuda":  # gather windows on the GPU: no per-step host work or copy
        sampler.buffer = sampler.buffer.rows_to(device)
    torch.manual_seed(config.seed + 1 + context.rank)  # dropout stream, distinct per rank
    run_dir = _run_dir(config, dataset.task)
    if context.is_main:
        logger.info(
            "run folder %s (Ctrl-C stops after the current step and keeps last.pt; "
            "continue with: cdt train --resume %s)",
            run_dir,
            run_dir / "last.pt",
        )
    trainable: torch.nn.Module = model
    if config.compile:
        trainable = torch.compile(model)  # type: ignore[assignment]
    if context.enabled:
        trainable = DistributedDataParallel(trainable, device_ids=_ddp_devices(device))
    state = TrainState(
        config, context, run_dir, device, dataset_info, stats, sampler, model, trainable,
        optimizer, scheduler, temperature, temperature_optimizer, log=None,
    )  # fmt: skip
    if checkpoint is not None:
        _restore(state, checkpoint)
    if context.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resume_step = state.step if checkpoint is not None else None
        state.log = ScalarLog(run_dir, config.tensorboard, resume_step=resume_step)
    return state


def _ddp_devices(device: torch.device) -> list[int] | None:
    return [device.index or 0] if device.type == "cuda" else None


def _is_due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def _log_training(state: TrainState, terms: LossTerms, speed: float, bar: Any) -> None:
    values = {
        "loss": float(terms.loss.detach()),
        "nll": float(terms.nll),
        "entropy": float(terms.entropy),
        "cost_loss": float(terms.cost_loss),
        "learning_rate": float(state.scheduler.get_last_lr()[0]),
        "steps_per_s": speed,
    }
    if state.temperature is not None:
        values["temperature"] = float(state.temperature().detach())
    if state.log is not None:
        state.log.write("train", state.step, values)
    bar.set_postfix(
        loss=f"{values['loss']:.3f}",
        nll=f"{values['nll']:.3f}",
        ent=f"{values['entropy']:.2f}",
        steps_s=f"{speed:.1f}",
    )


def _evaluate_and_keep_best(state: TrainState) -> None:
    """Evaluate (rank 0), log, and write best.pt when the score improves (all ranks call it)."""
    improved = False
    if state.context.is_main:
        config = state.config
        rule = SelectionRule(
            config.selection_cost_margin,
            config.selection_max_share_over,
            config.selection_min_budget_use,
        )
        rows = evaluate(state)
        state.evaluation = selection_record(state.step, rows, rule)
        score = state.evaluation["score"]
        if state.log is not None:
            state.log.write("eval", state.step, _eval_scalars(rows, score))
        logger.info(
            "step %d selection (score %.2f, %s): %s",
            state.step,
            score,
            verdict(state.evaluation),
            describe(rows),
        )
        improved = score > state.best_score
        state.best_score = max(score, state.best_score)
    if state.context.enabled:
        flag = [improved]
        torch.distributed.broadcast_object_list(flag, src=0)
        improved = bool(flag[0])
    if improved:
        save_checkpoint(state, "best")


def _eval_scalars(rows: list[BudgetRow], score: float) -> dict[str, float]:
    scalars = {"score": score}
    for row in rows:
        tag = f"kappa{row.target_cost:g}_{action_mode(row.deterministic)}"
        scalars[f"{tag}/normalised_reward"] = row.normalised_reward
        scalars[f"{tag}/normalised_cost"] = row.normalised_cost
        scalars[f"{tag}/share_over_budget"] = row.share_over_budget
    return scalars


def run_training(state: TrainState) -> Path:
    """The loop: sample, step, log, evaluate, checkpoint. Returns the path of `last.pt`.

    Ctrl-C or SIGTERM stops it after the current step: `last.pt` is written, then
    TrainingInterrupted raised. Under torchrun every rank would have to stop at the same step, so
    there signals act at once.
    """
    config, last = state.config, state.config.update_steps
    bar = tqdm(total=last, initial=state.step, desc="train", disable=not state.context.is_main)
    window_start, window_steps = time.perf_counter(), 0
    saved_at = None
    with StopRequest(enabled=not state.context.enabled) as stop:
        while state.step < last and not stop.requested:
            batch = state.sampler.sample().to(state.device)
            terms = train_step(state, batch)
            state.step += 1
            window_steps += 1
            bar.update(1)
            if _is_due(state.step, config.log_every, last):
                speed = window_steps / max(time.perf_counter() - window_start, 1e-9)
                _log_training(state, terms, speed, bar)
                window_start, window_steps = time.perf_counter(), 0
            if config.eval_every > 0 and _is_due(state.step, config.eval_every, last):
                _evaluate_and_keep_best(state)
            if _is_due(state.step, config.checkpoint_every, last):
                save_checkpoint(state, "last")
                if config.keep_checkpoints:
                    save_checkpoint(state, f"step_{state.step:07d}")
                saved_at = state.step
    bar.close()
    if saved_at != state.step:  # stopped early, or nothing left to train (or update_steps was 0)
        save_checkpoint(state, "last")
    if stop.requested:
        raise TrainingInterrupted(state.run_dir / "last.pt", state.step)
    return state.run_dir / "last.pt"


def train(config: TrainConfig) -> Path:
    """Train a policy as `config` says; returns the path of the final checkpoint (`last.pt`)."""
    state = prepare_training(config)
    try:
        path = run_training(state)
    finally:
        if state.log is not None:
            state.log.close()
        shutdown_distributed(state.context)
    return path
