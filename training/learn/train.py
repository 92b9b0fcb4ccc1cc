"""The training loop of `cdt train`: CDT (or DT-Cost) on an offline dataset, with checkpoints.

`train(config) -> Path` is composed of `make_dataloader`, `train_step`, the checkpoint evaluation
and `save_checkpoint`. Runs alone or under `torchrun` (DistributedDataParallel: rank 0 logs,
evaluates and writes checkpoints; every rank samples its own batches).

The loop imports no evaluation code: whoever wants checkpoints scored in the simulator (and a
best.pt) passes `evaluate_checkpoint`, as `cdt train` (`training/train_cli.py`) does with
`training.evaluation.checkpoint_scores.score_in_training`.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from tqdm.auto import tqdm

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
from training.interrupt import StopRequest, TrainingInterrupted
from training.learn.checks import check_training_data, thread_cap
from training.learn.config import TrainConfig
from training.learn.distributed import (
    average_gradients,
    ddp_device_ids,
    init_distributed,
    process_device,
    shutdown_distributed,
)
from training.learn.flat_parameters import FlatParameters
from training.learn.losses import LossTerms, policy_loss
from training.learn.metrics import ScalarLog
from training.learn.model import ConstrainedDecisionTransformer, ModelConfig
from training.learn.optimisers import make_optimisers
from training.learn.probe import BudgetIgnored, TokenSensitivity, probe_rows, token_sensitivity
from training.learn.relabelling import relabel_episodes
from training.learn.state import (
    EvaluateCheckpoint,
    TrainState,
    resolve_config,
    restore_checkpoint,
    save_checkpoint,
)
from training.ledger import NATIVE_BF16_FLAGS, read_cpuinfo

logger = logging.getLogger(__name__)

PROBE_WINDOWS = 256  # recorded windows the token probe averages over


def make_dataloader(
    config: TrainConfig, dataset: OfflineDataset, stats: NormalisationStats, rank: int = 0
) -> WindowSampler:
    """Augment and pre-pad the episodes; returns the batch sampler of this rank."""
    episodes = dataset.episodes
    relabels = relabel_episodes(config, episodes)
    buffer = build_buffer(episodes, stats, config.seq_len, relabels)
    weights = None
    if config.uses_cost_sampling:
        weights = cost_sampling_weights(
            buffer.cost_returns, config.sampling_cost_ceiling, config.sampling_min_weight
        )
    logger.info("%d episodes + %d relabelled copies", len(episodes), len(relabels))
    if rank == 0:
        coverage = window_coverage(buffer, weights, len(episodes), stats.cost_scale)
        logger.info(describe_coverage(coverage))
    return WindowSampler(buffer, config.seq_len, config.batch_size, config.seed + rank, weights)


def build_model(
    config: TrainConfig,
    stats: NormalisationStats,
    dims: tuple[int, int],
    reward_returns: np.ndarray,
) -> ConstrainedDecisionTransformer:
    """The network for `config`, on the CPU, seeded by `config.seed`; `reward_returns` (one per
    episode) place the return tokens' basis."""
    torch.manual_seed(config.seed)
    reward_range, cost_range = config.token_ranges(
        reward_returns, stats.reward_scale, stats.cost_scale
    )
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
        short_attention=config.short_attention,
        skip_unread_outputs=config.skip_unread_outputs,
        fast_dropout=config.fast_dropout,
        return_basis=config.return_basis,
        reward_token_range=reward_range,
        cost_token_range=cost_range,
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
    flat = state.flat
    state.optimizer.zero_grad(set_to_none=flat is None)  # flat: the gradient views must stay
    torch.autograd.backward(terms.loss)
    # what the optimiser updates: the model's tensors, or the one flat buffer
    updated = [p for group in state.optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(updated, config.clip_grad)
    state.optimizer.step()
    state.scheduler.step()
    if state.averaged is not None:
        _update_average(state)
    if state.temperature is not None and state.temperature_optimizer is not None:
        state.temperature.set_gradient(terms.entropy)
        average_gradients(state.context, list(state.temperature.parameters()))
        state.temperature_optimizer.step()
    return terms


def _update_average(state: TrainState) -> None:
    assert state.averaged is not None
    if state.flat is None or state.flat_average is None:
        state.averaged.update_parameters(state.model)
        return
    averaged_before = int(state.averaged.n_averaged)
    state.flat_average.follow(state.flat, state.config.weight_averaging, averaged_before)
    state.averaged.n_averaged += 1


def uses_flat_parameters(config: TrainConfig, device: torch.device, distributed: bool) -> bool:
    """Flat parameters pay on a CPU, in one process, uncompiled (CUDA has fused AdamW)."""
    cpu_alone = device.type == "cpu" and not distributed
    return config.flat_parameters and cpu_alone and not config.compile


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Does this CPU multiply bf16 natively (where bf16 autocast pays)? False when unknown."""
    _, flags = read_cpuinfo(cpuinfo)
    return flags is not None and any(flag in flags for flag in NATIVE_BF16_FLAGS)


def prepare_training(config: TrainConfig) -> TrainState:
    """Load data, build model and optimisers, and restore a checkpoint when resuming."""
    config, checkpoint = resolve_config(config)
    context = init_distributed(config.device)
    if config.num_threads is not None and not config.device.startswith("cuda"):
        # capped: a resumed run keeps the count of the machine it started on, maybe a larger one
        threads = min(config.num_threads, thread_cap())
        torch.set_num_threads(max(1, threads // context.world_size))
    dataset = load_dataset(config.dataset)
    check_training_data(config, dataset)  # `cdt train` checked already; other callers not
    dataset_info = dataset_summary(config.dataset, dataset, config.eval_budgets)
    reward_scale, cost_scale = config.token_scales(dataset.reward_returns)
    stats = compute_stats(dataset.episodes, dataset.attrs, reward_scale, cost_scale)
    dims = (dataset.observation_dim, dataset.action_dim)
    device = process_device(config.device, context)
    if config.bf16 and device.type == "cpu" and not cpu_has_native_bf16():
        logger.warning("--bf16 on a CPU without bf16 instructions: expect much slower training")
    model = build_model(config, stats, dims, dataset.reward_returns).to(device)
    flat = FlatParameters(model) if uses_flat_parameters(config, device, context.enabled) else None
    parameters: list[torch.Tensor] = [flat.values] if flat is not None else list(model.parameters())
    optimisers = make_optimisers(config, parameters, dims[1], device)
    optimizer, scheduler, temperature, temperature_optimizer = optimisers
    sampler = make_dataloader(config, dataset, stats, context.rank)
    if device.type == "cuda":  # gather windows on the GPU: no per-step host work or copy
        sampler.buffer = sampler.buffer.rows_to(device)
    torch.manual_seed(config.seed + 1 + context.rank)  # dropout stream, distinct per rank
    run_dir = config.run_dir(dataset.task)
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
        trainable = DistributedDataParallel(trainable, device_ids=ddp_device_ids(device))
    state = TrainState(
        config, context, run_dir, device, dataset_info, stats, sampler, model, trainable,
        optimizer, scheduler, temperature, temperature_optimizer, log=None, flat=flat,
    )  # fmt: skip
    if config.weight_averaging > 0:
        averaging = get_ema_multi_avg_fn(config.weight_averaging)  # type: ignore[no-untyped-call]
        state.averaged = AveragedModel(model, multi_avg_fn=averaging, use_buffers=True)
        if flat is not None:
            state.flat_average = FlatParameters(state.averaged.module, gradients=False)
    buffer, recorded = sampler.buffer, len(dataset.episodes)
    rows = probe_rows(buffer, recorded, config.seq_len, PROBE_WINDOWS, config.seed)
    state.probe_batch = sampler.gather(rows)
    if checkpoint is not None:
        restore_checkpoint(state, checkpoint)
    if context.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resume_step = state.step if checkpoint is not None else None
        state.log = ScalarLog(run_dir, config.tensorboard, resume_step=resume_step)
    return state


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


def _evaluate_and_keep_best(state: TrainState, evaluate_checkpoint: EvaluateCheckpoint) -> None:
    """Evaluate (rank 0), log, and write best.pt when the score improves (all ranks call it)."""
    improved = False
    if state.context.is_main:
        scored = evaluate_checkpoint(state)
        state.last_rows = scored.rows
        state.evaluation = scored.record
        if state.log is not None:
            state.log.write("eval", state.step, scored.scalars)
        logger.info("step %d selection %s", state.step, scored.summary)
        improved = scored.score > state.best_score
        state.best_score = max(scored.score, state.best_score)
    if state.context.enabled:
        flag = [improved]
        torch.distributed.broadcast_object_list(flag, src=0)
        improved = bool(flag[0])
    if improved:
        save_checkpoint(state, "best")


def probe_tokens(state: TrainState) -> TokenSensitivity | None:
    """The token probe on the evaluated weights: cost-to-go raised by the largest budget,
    reward-to-go lowered by a fifth of the best |reward return|; logged as `probe/*`."""
    if state.probe_batch is None or not state.context.is_main:
        return None
    config, stats = state.config, state.stats
    best = max(
        abs(state.dataset_info["reward_return_max"]), abs(state.dataset_info["reward_return_min"])
    )
    probe = token_sensitivity(
        state.network(),
        state.probe_batch.to(state.device),
        cost_shift=max(config.eval_budgets) * stats.cost_scale,
        reward_shift=-0.2 * best * stats.reward_scale,
    )
    if state.log is not None:
        state.log.write("probe", state.step, probe._asdict())
    logger.info("step %d %s", state.step, probe.describe())
    return probe


def fail_fast(state: TrainState) -> None:
    """Stop a run whose actions ignore the budget (config.fail_fast_step), with the reason.

    Two checks: the token probe, and where selection ran at this step, whether the mean action's
    cost at the tightest budget follows it (a run over twice that budget that spends no less than
    at the loosest one is not reading the cost token).
    """
    probe = probe_tokens(state)
    config = state.config
    reasons = []
    if probe is not None and probe.cost_effect < config.fail_fast_min_effect:
        reasons.append(
            f"raising the cost-to-go by {max(config.eval_budgets):g} moves the mean action by "
            f"{probe.cost_effect:.3f} < {config.fail_fast_min_effect:g}"
        )
    rows = [row for row in state.last_rows if row.deterministic]
    if rows:
        tight = min(rows, key=lambda row: row.target_cost)
        loose = max(rows, key=lambda row: row.target_cost)
        if tight.cost_mean > 2 * tight.target_cost and tight.cost_mean >= loose.cost_mean:
            reasons.append(
                f"mean-action cost {tight.cost_mean:.1f} at budget {tight.target_cost:g} "
                f"(and {loose.cost_mean:.1f} at {loose.target_cost:g})"
            )
    if reasons:
        raise BudgetIgnored(state.step, "; ".join(reasons))


def run_training(state: TrainState, evaluate_checkpoint: EvaluateCheckpoint | None = None) -> Path:
    """The loop: sample, step, log, evaluate, checkpoint. Returns the path of `last.pt`.

    Every `eval_every` steps `evaluate_checkpoint` scores the weights (none given: no evaluation
    and no best.pt). Ctrl-C or SIGTERM stops the loop after the current step: `last.pt` is
    written, then TrainingInterrupted raised. Under torchrun every rank would have to stop at the
    same step, so there signals act at once.
    """
    config, last = state.config, state.config.update_steps
    if config.eval_every > 0 and evaluate_checkpoint is None and state.context.is_main:
        logger.warning(
            "eval_every=%d, but no checkpoint evaluation given: no best.pt", config.eval_every
        )
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
                if evaluate_checkpoint is not None:
                    _evaluate_and_keep_best(state, evaluate_checkpoint)
                if state.step != config.fail_fast_step:
                    probe_tokens(state)
            if state.step == config.fail_fast_step and state.context.is_main:
                fail_fast(state)
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


def train(config: TrainConfig, evaluate_checkpoint: EvaluateCheckpoint | None = None) -> Path:
    """Train a policy as `config` says; returns the path of the final checkpoint (`last.pt`).

    `evaluate_checkpoint` scores the weights every `config.eval_every` steps and decides best.pt
    (`cdt train` passes `training.evaluation.checkpoint_scores.score_in_training`).
    """
    state = prepare_training(config)
    try:
        path = run_training(state, evaluate_checkpoint)
    finally:
        if state.log is not None:
            state.log.close()
        shutdown_distributed(state.context)
    return path
