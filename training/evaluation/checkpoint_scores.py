"""Scores of a checkpoint in the simulator, on the protocol we report.

The torch model is wrapped in the exported graph's own module (`OnnxPolicy`: normalisation, action
scaling, time-step clamping) and driven by the one episode loop every evaluation uses
(`runtime.episodes.run_episodes`), so the windows, budgets and actions are the service's. The
protocol (budgets, target rewards from the data, both action modes, seeds disjoint from the
reported evaluation's) is `runtime.evaluation_protocol`'s.

Two callers: `cdt train` hands `score_in_training` to the training loop (learn/ imports no
evaluation code), and `cdt select` (`select_checkpoint.py`) scores kept checkpoints with
`score_checkpoint`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from runtime.card import CardTarget
from runtime.context import WINDOW_NAMES
from runtime.episodes import EpisodePolicy, EpisodeResult, EpisodeSpec, GuidanceWeights
from runtime.evaluation_protocol import (
    BudgetRow,
    SelectionRule,
    action_mode,
    describe,
    on_frontier,
    selection_specs,
    summarise,
)
from training.data.windows import NormalisationStats
from training.evaluation.evaluate import run_in_chunks
from training.export import OnnxPolicy, policy_from_checkpoint
from training.learn.config import TrainConfig
from training.learn.model import ConstrainedDecisionTransformer
from training.learn.state import CheckpointScore, TrainState


def torch_episode_policy(
    model: ConstrainedDecisionTransformer, stats: NormalisationStats, budget_scale: float = 1.0
) -> EpisodePolicy:
    """The model as the episode loop sees an exported policy (raw env-unit windows in)."""
    policy = OnnxPolicy(model, stats, budget_scale)
    device = next(model.parameters()).device

    @torch.no_grad()
    def predict(
        windows: dict[str, np.ndarray], _guidance_weights: GuidanceWeights
    ) -> tuple[np.ndarray, np.ndarray]:  # no card, so no cost guidance to weigh
        inputs = [torch.as_tensor(windows[name]).to(device) for name in WINDOW_NAMES]
        mean, log_std = policy(*inputs)
        return mean.float().cpu().numpy(), log_std.float().cpu().numpy()

    return EpisodePolicy(
        predict=predict,
        context_len=model.config.seq_len,
        action_dim=model.config.action_dim,
        action_low=list(stats.action_low),
        action_high=list(stats.action_high),
    )


def evaluate_model(
    model: ConstrainedDecisionTransformer,
    stats: NormalisationStats,
    task: str,
    specs: Sequence[EpisodeSpec],
    budget_scale: float = 1.0,
) -> list[EpisodeResult]:
    """Run `specs` with the model in eval mode; its training mode is restored afterwards."""
    was_training = model.training
    try:
        return run_in_chunks(torch_episode_policy(model, stats, budget_scale), task, specs)
    finally:
        model.train(was_training)


def evaluate_selection(
    model: ConstrainedDecisionTransformer,
    stats: NormalisationStats,
    config: TrainConfig,
    dataset_info: dict[str, Any],
    budget_scale: float = 1.0,
) -> list[BudgetRow]:
    """The reported protocol on selection seeds: every budget, each action mode selection uses."""
    specs = selection_specs(
        dataset_info["default_targets"],
        config.eval_budgets,
        config.selection_action_modes,
        config.eval_episodes,
    )
    results = evaluate_model(model, stats, dataset_info["task"], specs, budget_scale)
    reward_range = (dataset_info["reward_return_min"], dataset_info["reward_return_max"])
    return summarise(results, reward_range)


def selection_record(
    step: int,
    rows: Sequence[BudgetRow],
    rule: SelectionRule,
    budget_scale: float = 1.0,
    mean_action_budget_scale: float | None = None,
) -> dict[str, Any]:
    """What a checkpoint and its card keep of a selection evaluation; `mean_action_budget_scale`
    when the mean action's rows were measured at another calibration (None: the same)."""
    failures = rule.failures(rows)
    return {
        "step": step,
        "budget_scale": budget_scale,
        "mean_action_budget_scale": mean_action_budget_scale,
        "protocol": "selection",
        "admissible": not failures,
        "failures": failures,
        "score": rule.score(rows),
        "rows": [dataclasses.asdict(row) for row in rows],
    }


def verdict(record: dict[str, Any]) -> str:
    """'admissible', or 'not admissible' with every reason a selection record gives."""
    failures = record["failures"]
    return "admissible" if not failures else "not admissible: " + ", ".join(failures)


def selection_rule(config: TrainConfig, dataset_info: dict[str, Any]) -> SelectionRule:
    """The rule a run's `--selection-*` flags set, on the run's data (`for_data`)."""
    rule = SelectionRule(
        config.selection_cost_margin,
        config.selection_max_share_over,
        config.selection_min_budget_use,
    )
    return for_data(rule, dataset_info)


def for_data(rule: SelectionRule, dataset_info: dict[str, Any]) -> SelectionRule:
    """`rule` on a run's data (`on_frontier`): its default targets and reward range."""
    targets = [CardTarget.model_validate(target) for target in dataset_info["default_targets"]]
    span = float(dataset_info["reward_return_max"]) - float(dataset_info["reward_return_min"])
    return on_frontier(rule, targets, span)


def score_checkpoint(
    checkpoint: dict[str, Any],
    rule: SelectionRule,
    budget_scale: float = 1.0,
    episodes: int | None = None,
) -> dict[str, Any]:
    """The selection protocol's rows and score for one checkpoint at one budget calibration,
    with `episodes` per budget and action mode (default: the run's `eval_episodes`)."""
    config = TrainConfig.from_json_dict(checkpoint["config"])
    if episodes is not None:
        config = dataclasses.replace(config, eval_episodes=episodes)
    model = policy_from_checkpoint(checkpoint).model
    stats = NormalisationStats(**checkpoint["stats"])
    rows = evaluate_selection(model, stats, config, checkpoint["dataset"], budget_scale)
    rule = for_data(rule, checkpoint["dataset"])
    return selection_record(int(checkpoint["step"]), rows, rule, budget_scale)


def score_scalars(rows: Sequence[BudgetRow], score: float) -> dict[str, float]:
    """The selection rows as the training log's `eval` scalars."""
    scalars = {"score": score}
    for row in rows:
        tag = f"kappa{row.target_cost:g}_{action_mode(row.deterministic)}"
        scalars[f"{tag}/normalised_reward"] = row.normalised_reward
        scalars[f"{tag}/normalised_cost"] = row.normalised_cost
        scalars[f"{tag}/share_over_budget"] = row.share_over_budget
    return scalars


def score_in_training(state: TrainState) -> CheckpointScore:
    """`cdt train`'s checkpoint evaluation (`train(..., evaluate_checkpoint=...)`): the reported
    protocol on selection seeds, every budget, each action mode selection uses."""
    model = state.network()  # the weights checkpoints keep (an average, when the run keeps one)
    rows = evaluate_selection(model, state.stats, state.config, state.dataset_info)
    record = selection_record(state.step, rows, selection_rule(state.config, state.dataset_info))
    score = float(record["score"])
    summary = f"(score {score:.2f}, {verdict(record)}): {describe(rows)}"
    return CheckpointScore(score, record, rows, score_scalars(rows, score), summary)
