"""Baseline data: which trajectories each algorithm learns from, and single-transition batches.

Trajectory selection follows OSRL's `process_bc_dataset` (liuzuxin/OSRL,
`osrl/common/dataset.py` at commit 08df54dc09b42387cc32827989187b2f62f9d64d), the code behind
the CDT paper's appendix, with undiscounted returns (its BC configs use gamma = 1):

- ``bc-safe``: cost return C <= kappa;  ``bc-risky``: C >= 2 kappa;
- ``bc-boundary``: 0.5 kappa < C <= 1.5 kappa (trajectories near the threshold);
- ``bc-frontier``: within a fifth of the reward-return range of a polynomial fitted to the
  Pareto frontier of (C, R);
- every other algorithm learns from all trajectories.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from training.baselines.config import BaselineConfig
from training.data.dataset import Episode, OfflineDataset
from training.data.frontiers import pareto_indices

logger = logging.getLogger(__name__)


class TransitionBatch(NamedTuple):
    """Single transitions, already normalised and scaled for the networks."""

    states: torch.Tensor  # [B, obs_dim], normalised
    actions: torch.Tensor  # [B, act_dim], in [-1, 1]
    rewards: torch.Tensor  # [B], times reward_scale
    costs: torch.Tensor  # [B], times cost_scale
    next_states: torch.Tensor  # [B, obs_dim], normalised
    dones: torch.Tensor  # [B], 1.0 at a terminal (not a timeout)
    costs_to_go: torch.Tensor  # [B], remaining episode cost / cost_normaliser (MT-BC)
    is_initial: torch.Tensor  # [B], 1.0 at an episode's first step (COptiDICE)


@dataclass(frozen=True)
class Normaliser:
    """What the exported graph needs to map raw inputs to network units and back."""

    state_mean: np.ndarray  # [obs_dim]
    state_std: np.ndarray  # [obs_dim]
    action_low: np.ndarray  # [act_dim]
    action_high: np.ndarray  # [act_dim]
    cost_normaliser: float  # raw cost-to-go / this = the MT-BC condition

    def unit_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env actions -> [-1, 1] (clipped)."""
        unit = 2.0 * (actions - self.action_low) / (self.action_high - self.action_low) - 1.0
        clipped: np.ndarray = np.clip(unit, -1.0, 1.0).astype(np.float32)
        return clipped


def _fit_frontier(costs: np.ndarray, rewards: np.ndarray) -> np.poly1d:
    """Lowest-degree (0..2) polynomial through the Pareto points with R^2 >= 0.9 (OSRL)."""
    front = pareto_indices(costs, rewards)
    front_costs, front_rewards = costs[front], rewards[front]
    frontier = np.poly1d([float(front_rewards.mean())])
    total = float(np.sum((front_rewards - front_rewards.mean()) ** 2))
    for degree in range(min(3, len(front))):
        frontier = np.poly1d(np.polyfit(front_costs, front_rewards, deg=degree))
        residual = float(np.sum((front_rewards - frontier(front_costs)) ** 2))
        if total == 0.0 or 1.0 - residual / total >= 0.9:
            break
    return frontier


def selection_mask(
    algo: str, costs: np.ndarray, rewards: np.ndarray, cost_limit: float
) -> np.ndarray:
    """Which trajectories (by episode cost and reward return) an algorithm trains on."""
    if algo == "bc-safe":
        return costs <= cost_limit
    if algo == "bc-risky":
        return costs >= 2.0 * cost_limit
    if algo == "bc-boundary":
        return (costs > 0.5 * cost_limit) & (costs <= 1.5 * cost_limit)
    if algo == "bc-frontier":
        band = (rewards.max() - rewards.min()) / 5.0
        close: np.ndarray = np.abs(rewards - _fit_frontier(costs, rewards)(costs)) <= band
        return close
    return np.ones_like(costs, dtype=bool)


def select_episodes(episodes: Sequence[Episode], algo: str, cost_limit: float) -> list[Episode]:
    """The trajectories `algo` learns from; raises ValueError when none qualifies."""
    costs = np.array([episode.cost_return for episode in episodes])
    rewards = np.array([episode.reward_return for episode in episodes])
    mask = selection_mask(algo, costs, rewards, cost_limit)
    if not mask.any():
        raise ValueError(f"{algo}: no trajectory qualifies at cost limit {cost_limit}")
    logger.info("%s: %d of %d trajectories", algo, int(mask.sum()), len(episodes))
    return [episode for episode, keep in zip(episodes, mask, strict=True) if keep]


def _env_action_bounds(task: str) -> tuple[np.ndarray, np.ndarray] | None:
    try:  # deferred on purpose: the simulator is optional here (bounds can come from the config)
        import gymnasium

        from runtime.sim import make_env
    except ImportError as error:  # the [sim] extra is not installed
        logger.warning("no simulator to read %r's action bounds from (%s)", task, error)
        return None
    try:
        env = make_env(task)
    except gymnasium.error.Error as error:  # an id gymnasium does not know
        logger.warning("no env %r to read action bounds from (%s)", task, error)
        return None
    space = env.action_space
    env.close()
    return np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)


def action_bounds(dataset: OfflineDataset, config: BaselineConfig) -> tuple[np.ndarray, np.ndarray]:
    """Action bounds: the config, then the dataset's attrs, the env, and last the data range."""
    if config.action_low is not None and config.action_high is not None:
        return np.asarray(config.action_low, np.float32), np.asarray(config.action_high, np.float32)
    if "action_low" in dataset.attrs and "action_high" in dataset.attrs:
        low, high = dataset.attrs["action_low"], dataset.attrs["action_high"]
        return np.asarray(low, np.float32), np.asarray(high, np.float32)
    bounds = _env_action_bounds(dataset.task)
    if bounds is not None:
        return bounds
    actions = np.concatenate([episode.actions for episode in dataset.episodes])
    logger.warning("action bounds taken from the data range")
    return actions.min(0), actions.max(0)


def make_normaliser(
    episodes: Sequence[Episode], bounds: tuple[np.ndarray, np.ndarray], cost_limit: float
) -> Normaliser:
    """State statistics of the training episodes, plus bounds and the cost normaliser."""
    states = np.concatenate([episode.observations for episode in episodes])  # [N, obs_dim]
    max_cost = max(episode.cost_return for episode in episodes)
    return Normaliser(
        state_mean=states.mean(0).astype(np.float32),
        state_std=(states.std(0) + 1e-6).astype(np.float32),
        action_low=bounds[0].astype(np.float32),
        action_high=bounds[1].astype(np.float32),
        cost_normaliser=float(max(max_cost, cost_limit, 1.0)),
    )


def _costs_to_go(costs: np.ndarray) -> np.ndarray:
    return np.cumsum(costs[::-1])[::-1].astype(np.float32)  # [T], sum_{t' >= t} c_t'


class TransitionData:
    """All transitions of the training episodes as tensors, sampled uniformly."""

    def __init__(
        self,
        episodes: Sequence[Episode],
        normaliser: Normaliser,
        config: BaselineConfig,
    ) -> None:
        def column(values: list[np.ndarray]) -> torch.Tensor:
            return torch.as_tensor(np.concatenate(values), device=config.device)

        mean, std = normaliser.state_mean, normaliser.state_std
        initial = [np.eye(1, episode.length, dtype=np.float32)[0] for episode in episodes]
        self.tensors = TransitionBatch(
            states=column([(e.observations - mean) / std for e in episodes]).float(),
            actions=column([normaliser.unit_actions(e.actions) for e in episodes]),
            rewards=column([e.rewards * config.reward_scale for e in episodes]).float(),
            costs=column([e.costs * config.cost_scale for e in episodes]).float(),
            next_states=column([(e.next_observations - mean) / std for e in episodes]).float(),
            dones=column([e.terminals.astype(np.float32) for e in episodes]),
            costs_to_go=column(
                [_costs_to_go(e.costs) / normaliser.cost_normaliser for e in episodes]
            ),
            is_initial=column(initial),
        )
        self.size = int(self.tensors.rewards.shape[0])
        self.initial_fraction = len(episodes) / self.size

    @property
    def state_dim(self) -> int:
        return int(self.tensors.states.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.tensors.actions.shape[1])

    def sample(self, batch_size: int, generator: torch.Generator) -> TransitionBatch:
        """A uniform batch of `batch_size` transitions (with replacement)."""
        index = torch.randint(self.size, (batch_size,), generator=generator)
        index = index.to(self.tensors.rewards.device)
        return TransitionBatch(*(tensor[index] for tensor in self.tensors))
