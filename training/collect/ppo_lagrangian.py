"""PPO-Lagrangian with a PID Lagrange multiplier: the data collector's learner.

Follows the CDT paper's appendix ("Dataset Collection"): PPO with separate reward and cost
critics, GAE, and a PID-controlled multiplier (Stooke et al., 2020, "Responsive Safety in RL by
PID Lagrangian Methods"; `training/pid_lagrangian.py`) whose cost threshold the collector raises
over training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import nn


class ActorCritic(nn.Module):
    """Gaussian actor (state-independent log-std) with separate reward and cost critics."""

    def __init__(self, observation_dim: int, action_dim: int, hidden_dim: int = 64) -> None:
        super().__init__()

        def mlp(out_dim: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Linear(observation_dim, hidden_dim),
                nn.Tanh(),
                nn.Linear(hidden_dim, hidden_dim),
                nn.Tanh(),
                nn.Linear(hidden_dim, out_dim),
            )

        self.actor_mean = mlp(action_dim)
        self.actor_log_std = nn.Parameter(torch.full((action_dim,), -0.5))
        self.reward_critic = mlp(1)
        self.cost_critic = mlp(1)

    def parameter_groups(self) -> list[list[nn.Parameter]]:
        actor = [*self.actor_mean.parameters(), self.actor_log_std]
        critics = [*self.reward_critic.parameters(), *self.cost_critic.parameters()]
        return [actor, critics]

    def policy(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-std of the Gaussian policy, each [N, act_dim]."""
        mean = self.actor_mean(observations)
        return mean, self.actor_log_std.expand_as(mean)

    def values(self, observations: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.reward_critic(observations).squeeze(-1), self.cost_critic(observations).squeeze(
            -1
        )


def gaussian_log_prob(
    mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor
) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the action axis: [N, act_dim] -> [N]."""
    z = (actions - mean) / log_std.exp()
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the action axis: [N, act_dim] -> [N]."""
    return (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)


class RunningNormaliser:
    """Running mean/variance of observations (parallel-variance update)."""

    def __init__(self, dim: int) -> None:
        self.mean = np.zeros(dim)
        self.var = np.ones(dim)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        batch_mean, batch_var, batch_count = batch.mean(0), batch.var(0), batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        self.var = (
            self.var * self.count
            + batch_var * batch_count
            + delta**2 * self.count * batch_count / total
        ) / total
        self.count = total

    def __call__(self, observations: np.ndarray) -> np.ndarray:
        return np.clip((observations - self.mean) / np.sqrt(self.var + 1e-8), -10.0, 10.0)


class RolloutBatch(NamedTuple):
    """One epoch of on-policy data, flattened over envs and time."""

    observations: torch.Tensor  # [N, obs_dim], normalised
    actions: torch.Tensor  # [N, act_dim], pre-clip samples
    log_probs: torch.Tensor  # [N]
    reward_advantages: torch.Tensor  # [N]
    cost_advantages: torch.Tensor  # [N]
    reward_returns: torch.Tensor  # [N]
    cost_returns: torch.Tensor  # [N]


def generalised_advantages(
    signals: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE over a [T, n_envs] rollout.

    Args:
        signals: rewards or costs, [T, n_envs].
        values: V(s_t), [T, n_envs].
        next_values: V(s_{t+1}), zero where s_{t+1} is terminal, [T, n_envs].
        dones: True where the episode ended at t (terminal or timeout), [T, n_envs].

    Returns:
        (advantages, value targets), both [T, n_envs].
    """
    advantages = np.zeros_like(signals)
    running = np.zeros(signals.shape[1])
    for t in reversed(range(signals.shape[0])):
        delta = signals[t] + gamma * next_values[t] - values[t]
        running = delta + gamma * gae_lambda * (1.0 - dones[t]) * running
        advantages[t] = running
    return advantages, advantages + values


@dataclass(frozen=True)
class PpoSettings:
    """PPO update hyper-parameters."""

    clip_ratio: float = 0.2
    update_epochs: int = 10
    minibatch_size: int = 2048
    learning_rate: float = 3e-4
    entropy_coefficient: float = 0.0
    max_grad_norm: float = 0.5


def ppo_update(
    model: ActorCritic,
    optimiser: torch.optim.Optimizer,
    batch: RolloutBatch,
    multiplier: float,
    settings: PpoSettings,
    generator: torch.Generator,
) -> dict[str, float]:
    """Clipped PPO on the Lagrangian advantage (A_r - lambda A_c) / (1 + lambda)."""
    advantages = (batch.reward_advantages - multiplier * batch.cost_advantages) / (1 + multiplier)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    size = batch.observations.shape[0]
    stats = {"policy_loss": 0.0, "value_loss": 0.0}
    for _ in range(settings.update_epochs):
        order = torch.randperm(size, generator=generator)
        for start in range(0, size, settings.minibatch_size):
            index = order[start : start + settings.minibatch_size]
            mean, log_std = model.policy(batch.observations[index])
            log_probs = gaussian_log_prob(mean, log_std, batch.actions[index])
            ratio = (log_probs - batch.log_probs[index]).exp()
            clipped = ratio.clamp(1 - settings.clip_ratio, 1 + settings.clip_ratio)
            policy_loss = -torch.min(ratio * advantages[index], clipped * advantages[index]).mean()
            reward_values, cost_values = model.values(batch.observations[index])
            value_loss = ((reward_values - batch.reward_returns[index]) ** 2).mean() + (
                (cost_values - batch.cost_returns[index]) ** 2
            ).mean()
            entropy = gaussian_entropy(log_std).mean()
            loss = policy_loss + 0.5 * value_loss - settings.entropy_coefficient * entropy
            optimiser.zero_grad()
            torch.autograd.backward(loss)
            # Clip actor and critics apart: the critics' large return-scale gradients
            # would otherwise shrink the policy step through a shared norm.
            for group in model.parameter_groups():
                nn.utils.clip_grad_norm_(group, settings.max_grad_norm)
            optimiser.step()
            stats = {"policy_loss": policy_loss.item(), "value_loss": value_loss.item()}
    return stats
