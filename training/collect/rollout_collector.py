"""On-policy rollouts for the collector: step several envs, keep every finished episode."""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from training.collect.env_workers import EnvGroup
from training.collect.ppo_lagrangian import (
    ActorCritic,
    RolloutBatch,
    RunningNormaliser,
    gaussian_log_prob,
    generalised_advantages,
)
from training.data.dataset import Episode


@dataclass
class _EpisodeBuffer:
    observations: list[np.ndarray] = field(default_factory=list)
    next_observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def to_episode(self, terminated: bool) -> Episode:
        length = len(self.rewards)
        terminals = np.zeros(length, dtype=bool)
        timeouts = np.zeros(length, dtype=bool)
        (terminals if terminated else timeouts)[-1] = True
        return Episode(
            observations=np.asarray(self.observations, dtype=np.float32),
            next_observations=np.asarray(self.next_observations, dtype=np.float32),
            actions=np.asarray(self.actions, dtype=np.float32),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            costs=np.asarray(self.costs, dtype=np.float32),
            terminals=terminals,
            timeouts=timeouts,
        )


class EpisodeRecorder:
    """Live envs, their current observations and the episodes they are in the middle of."""

    def __init__(self, envs: EnvGroup, seed: int) -> None:
        self.envs = envs
        self.buffers = [_EpisodeBuffer() for _ in range(envs.count)]
        self.observations = envs.reset(seed)
        action_space = envs.action_space
        assert isinstance(action_space, gym.spaces.Box), "the collector needs a Box action space"
        self.low, self.high = action_space.low, action_space.high

    @property
    def count(self) -> int:
        return self.envs.count

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[Episode]]:
        """Step every env with (clipped) actions; finished episodes are returned and reset.

        Returns:
            rewards, costs, terminated, done flags and next observations (the true last
            observation where an episode ended), each [n_envs, ...], plus the finished episodes.
        """
        actions = np.clip(actions, self.low, self.high)
        steps = self.envs.step(actions)
        finished: list[Episode] = []
        for i, buffer in enumerate(self.buffers):
            buffer.observations.append(self.observations[i].copy())
            buffer.next_observations.append(steps.observations[i])
            buffer.actions.append(actions[i])
            buffer.rewards.append(float(steps.rewards[i]))
            buffer.costs.append(float(steps.costs[i]))
            if steps.done[i]:
                finished.append(buffer.to_episode(terminated=bool(steps.terminated[i])))
                self.buffers[i] = _EpisodeBuffer()
        self.observations = steps.next_observations
        return (
            steps.rewards,
            steps.costs,
            steps.terminated,
            steps.done,
            steps.observations,
            finished,
        )


@dataclass
class EpochRollout:
    """One epoch's PPO batch and the episodes that finished during it."""

    batch: RolloutBatch
    episodes: list[Episode]

    @property
    def mean_reward(self) -> float:
        return float(np.mean([e.reward_return for e in self.episodes])) if self.episodes else 0.0

    @property
    def mean_cost(self) -> float:
        return float(np.mean([e.cost_return for e in self.episodes])) if self.episodes else 0.0


def collect_epoch(
    recorder: EpisodeRecorder,
    model: ActorCritic,
    normaliser: RunningNormaliser,
    steps: int,
    gamma: float,
    gae_lambda: float,
) -> EpochRollout:
    """Roll the current policy for `steps` env steps (over all envs) and build a PPO batch."""
    horizon = max(1, steps // recorder.count)
    shape = (horizon, recorder.count)
    observations = np.zeros((*shape, recorder.observations.shape[1]), dtype=np.float32)
    actions = np.zeros((*shape, recorder.low.shape[0]), dtype=np.float32)
    log_probs, rewards, costs = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    dones = np.zeros(shape)
    values = np.zeros((2, *shape))
    next_values = np.zeros((2, *shape))
    episodes: list[Episode] = []
    raw_seen = []
    for t in range(horizon):
        raw_seen.append(recorder.observations.copy())
        normalised = torch.as_tensor(normaliser(recorder.observations), dtype=torch.float32)
        with torch.no_grad():
            mean, log_std = model.policy(normalised)
            sampled = mean + log_std.exp() * torch.randn_like(mean)
            log_probs[t] = gaussian_log_prob(mean, log_std, sampled).numpy()
            values[:, t] = torch.stack(model.values(normalised)).numpy()
        observations[t], actions[t] = normalised.numpy(), sampled.numpy()
        rewards[t], costs[t], terminated, dones[t], following, finished = recorder.step(
            sampled.numpy()
        )
        episodes += finished
        with torch.no_grad():
            following_values = model.values(
                torch.as_tensor(normaliser(following), dtype=torch.float32)
            )
        # Bootstrap through timeouts and the epoch's cut, never through a true terminal.
        next_values[:, t] = torch.stack(following_values).numpy() * (1.0 - terminated)
    normaliser.update(np.concatenate(raw_seen))
    reward_adv, reward_ret = generalised_advantages(
        rewards, values[0], next_values[0], dones, gamma, gae_lambda
    )
    cost_adv, cost_ret = generalised_advantages(
        costs, values[1], next_values[1], dones, gamma, gae_lambda
    )

    def flat(array: np.ndarray) -> torch.Tensor:
        # [horizon, n_envs, ...] -> [horizon * n_envs, ...]
        return torch.as_tensor(
            array.reshape(horizon * recorder.count, *array.shape[2:]), dtype=torch.float32
        )

    batch = RolloutBatch(
        flat(observations),
        flat(actions),
        flat(log_probs),
        flat(reward_adv),
        flat(cost_adv),
        flat(reward_ret),
        flat(cost_ret),
    )
    return EpochRollout(batch=batch, episodes=episodes)
