"""In-simulator evaluation of a torch policy during training (paper Algorithm 2).

All (target, episode) pairs run in lockstep, one batched forward pass per env step. The rollout
follows docs/ARTIFACT.md: R_0 = target reward, C_0 = target cost, then R_{t+1} = R_t - r_t and
C_{t+1} = max(C_t - c_t, 0); windows are left-padded and the newest action slot is 0. Actions are
the policy mean (as in OSRL's evaluation), clipped to the action bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from clients.sim import make_env, seed_simulator
from training.config import TrainConfig
from training.data import NormalisationStats
from training.model import ConstrainedDecisionTransformer

DEFAULT_COST_LIMITS = (10.0, 20.0, 40.0)


class EpisodeResult(NamedTuple):
    target_reward: float
    target_cost: float
    reward: float
    cost: float
    length: int


class _Histories:
    """Raw per-episode histories, [episodes, max_len + 1, ...], filled as the rollout advances."""

    def __init__(self, count: int, max_len: int, state_dim: int, action_dim: int) -> None:
        self.states = np.zeros((count, max_len + 1, state_dim), dtype=np.float32)
        self.actions = np.zeros((count, max_len + 1, action_dim), dtype=np.float32)
        self.returns_to_go = np.zeros((count, max_len + 1), dtype=np.float32)
        self.costs_to_go = np.zeros((count, max_len + 1), dtype=np.float32)


def _window(
    histories: _Histories, active: np.ndarray, step: int, seq_len: int, stats: NormalisationStats
) -> dict[str, torch.Tensor]:
    """Model inputs for the active episodes at `step`: [active, seq_len, ...], left-padded."""
    index = step - seq_len + 1 + np.arange(seq_len)  # [seq_len], oldest ... newest
    padding = index < 0
    index = np.maximum(index, 0)
    states = stats.normalise_states(histories.states[active][:, index])
    actions = stats.scale_actions(histories.actions[active][:, index])
    keep = ~padding[None, :, None]  # [1, seq_len, 1]
    time_steps = np.minimum(index, stats.max_episode_len - 1)
    count = len(active)
    return {
        "states": torch.as_tensor(states * keep, dtype=torch.float32),
        "actions": torch.as_tensor(actions * keep, dtype=torch.float32),
        "returns_to_go": torch.as_tensor(
            histories.returns_to_go[active][:, index] * stats.reward_scale * keep[..., 0]
        ),
        "costs_to_go": torch.as_tensor(
            histories.costs_to_go[active][:, index] * stats.cost_scale * keep[..., 0]
        ),
        "time_steps": torch.as_tensor(np.broadcast_to(time_steps, (count, seq_len)).copy()),
        "padding_mask": torch.as_tensor(np.broadcast_to(padding, (count, seq_len)).copy()),
    }


def _reset(
    envs: Sequence[Any],
    histories: _Histories,
    targets: Sequence[tuple[float, float]],
    seeds: Sequence[int],
) -> None:
    # Bullet-Safety-Gym draws placement noise from the global RNGs, not from reset(seed=...).
    seed_simulator(seeds[0] if seeds else 0)
    for row, (env, seed, (reward, cost)) in enumerate(zip(envs, seeds, targets, strict=True)):
        histories.states[row, 0] = env.reset(seed=seed)[0]
        histories.returns_to_go[row, 0], histories.costs_to_go[row, 0] = reward, cost


def _step_envs(
    envs: Sequence[Any],
    histories: _Histories,
    active: np.ndarray,
    actions: np.ndarray,
    step: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Step the active envs; returns ([active, 2] (reward, cost), the still-active indices)."""
    outcomes = np.zeros((len(active), 2))
    still_active = []
    for position, (index, action) in enumerate(zip(active, actions, strict=True)):
        observation, reward, terminated, truncated, info = envs[index].step(action)
        cost = float(info.get("cost", 0.0))
        outcomes[position] = (reward, cost)
        histories.actions[index, step] = action
        histories.states[index, step + 1] = observation
        rtg, ctg = histories.returns_to_go, histories.costs_to_go
        rtg[index, step + 1] = rtg[index, step] - reward
        ctg[index, step + 1] = max(ctg[index, step] - cost, 0.0)
        if not (terminated or truncated):
            still_active.append(index)
    return outcomes, np.asarray(still_active, dtype=np.int64)


@torch.no_grad()
def rollout(
    model: ConstrainedDecisionTransformer,
    stats: NormalisationStats,
    task: str,
    targets: Sequence[tuple[float, float]],
    seeds: Sequence[int],
) -> list[EpisodeResult]:
    """Run one episode per (target, seed) pair, all at once; returns results in the same order."""
    envs = [make_env(task) for _ in targets]
    config = model.config
    histories = _Histories(len(envs), stats.max_episode_len, config.state_dim, config.action_dim)
    _reset(envs, histories, targets, seeds)
    totals = np.zeros((len(envs), 2))  # (reward, cost) so far
    lengths = np.zeros(len(envs), dtype=np.int64)
    active = np.arange(len(envs))
    low, high = np.asarray(stats.action_low), np.asarray(stats.action_high)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for step in range(stats.max_episode_len):
        if len(active) == 0:
            break
        inputs = _window(histories, active, step, config.seq_len, stats)
        output = model(**{key: value.to(device) for key, value in inputs.items()})
        means = output.action_mean[:, -1].float().cpu().numpy()  # [active, action_dim], [-1, 1]
        actions = np.clip(stats.unscale_actions(means), low, high).astype(np.float32)
        outcomes, still_active = _step_envs(envs, histories, active, actions, step)
        totals[active] += outcomes
        lengths[active] = step + 1
        active = still_active
    model.train(was_training)
    for env in envs:
        env.close()
    return [
        EpisodeResult(reward, cost, float(total[0]), float(total[1]), int(length))
        for (reward, cost), total, length in zip(targets, totals, lengths, strict=True)
    ]


def summarise(
    results: Sequence[EpisodeResult], reward_range: tuple[float, float]
) -> dict[str, float]:
    """Mean raw and normalised reward and cost, per target and over all targets.

    Normalised reward = (R - r_min) / (r_max - r_min) with the dataset's return range; normalised
    cost = C / target cost (paper section 5: safe means <= 1).
    """
    low, high = reward_range
    summary: dict[str, float] = {}
    per_target: dict[tuple[float, float], list[EpisodeResult]] = {}
    for result in results:
        per_target.setdefault((result.target_reward, result.target_cost), []).append(result)
    norm_rewards, norm_costs = [], []
    for (target_reward, target_cost), group in per_target.items():
        reward = float(np.mean([result.reward for result in group]))
        cost = float(np.mean([result.cost for result in group]))
        norm_reward = (reward - low) / max(high - low, 1e-8)
        norm_cost = cost / target_cost
        tag = f"r{target_reward:g}_c{target_cost:g}"
        summary |= {f"{tag}/reward": reward, f"{tag}/cost": cost}
        summary |= {f"{tag}/normalised_reward": norm_reward, f"{tag}/normalised_cost": norm_cost}
        norm_rewards.append(norm_reward)
        norm_costs.append(norm_cost)
    summary["normalised_reward"] = float(np.mean(norm_rewards))
    summary["normalised_cost"] = float(np.mean(norm_costs))
    return summary


def eval_targets(config: TrainConfig, dataset_info: dict[str, Any]) -> list[tuple[float, float]]:
    """Configured targets, or (best reward return, kappa) for kappa in 10, 20, 40."""
    if config.eval_targets:
        return [(float(reward), float(cost)) for reward, cost in config.eval_targets]
    best = float(dataset_info["reward_return_max"])
    return [(best, limit) for limit in DEFAULT_COST_LIMITS]


def evaluation_score(summary: dict[str, float]) -> float:
    """Safe first (mean normalised cost <= 1), then reward: the score best.pt is chosen by."""
    if summary["normalised_cost"] <= 1.0:
        return summary["normalised_reward"]
    return -summary["normalised_cost"]
