"""The cost critic Q_c(s, a), the budget guard's shield: fit on a dataset, exported beside a model.

Its target is the discounted cost that followed each logged transition within its episode,
y_t = sum_{k>=0} discount^k c_{t+k} (a Monte-Carlo return, no bootstrapping): the behaviour data's
near-term cost of taking `a` in `s`. An MLP regresses it (MSE, uniform batches) and is exported
with its observation standardisation inside, as `runtime.cost_critic` loads it (`cdt critic`:
critic_cli.py). Held-out episodes measure it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from runtime.cost_critic import INPUT_NAMES, OUTPUT_NAME
from training.data.dataset import DatasetError, Episode
from training.export import ONNX_OPSET, export_graph

HIDDEN = 256
LEARNING_RATE = 1e-3
VALIDATION_SHARE = 0.02
"""Share of the episodes held out (at least one), whole episodes so no target leaks across."""
STD_FLOOR = 1e-6
"""Added to each observation's standard deviation: constant features divide by it, not by 0."""


@dataclass(frozen=True)
class CriticConfig:
    """How `train_cost_critic` fits a critic (`cdt critic`'s options)."""

    discount: float = 0.9
    """Per-step weight of later costs in the target, in (0, 1)."""
    update_steps: int = 20_000
    """Adam steps; the learning rate anneals (cosine) from 1e-3 to 0 over them."""
    batch_size: int = 1024
    """Transitions per step, drawn uniformly with replacement from the training episodes."""
    seed: int = 0
    """Seeds the held-out episodes and the batches (numpy) and the initial weights (torch)."""
    threads: int = 1
    """Torch's CPU threads."""


class CriticData(NamedTuple):
    """Transitions of whole episodes, one after another, with their targets."""

    observations: torch.Tensor  # [N, observation_dim]
    actions: torch.Tensor  # [N, action_dim]
    targets: torch.Tensor  # [N], the discounted cost that follows


class CostCriticNetwork(nn.Module):
    """Raw observations and actions in, the predicted discounted cost out; the observations are
    standardised inside, so the exported graph reads env units."""

    observation_mean: torch.Tensor  # [observation_dim]
    observation_std: torch.Tensor  # [observation_dim]

    def __init__(
        self,
        observation_mean: npt.ArrayLike,
        observation_std: npt.ArrayLike,
        action_dim: int,
        hidden: int = HIDDEN,
    ) -> None:
        super().__init__()
        mean = torch.as_tensor(observation_mean, dtype=torch.float32)
        std = torch.as_tensor(observation_std, dtype=torch.float32)
        self.register_buffer("observation_mean", mean)
        self.register_buffer("observation_std", std)
        self.observation_dim, self.action_dim = len(mean), action_dim
        self.layers = nn.Sequential(
            nn.Linear(self.observation_dim + action_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, observations: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """observations [N, observation_dim] and actions [N, action_dim] -> cost [N]."""
        standardised = (observations - self.observation_mean) / self.observation_std
        inputs = torch.cat([standardised, actions], dim=-1)  # [N, observation_dim + action_dim]
        cost: torch.Tensor = self.layers(inputs)  # [N, 1]
        return cost.squeeze(-1)  # [N]


class CriticFit(NamedTuple):
    """A trained critic and how well it predicts the held-out episodes."""

    critic: CostCriticNetwork
    validation_mse: float
    target_variance: float
    """Variance of the held-out targets: the MSE of predicting their mean."""
    validation_episodes: int


def discounted_costs(
    costs: npt.ArrayLike, episode_ends: npt.ArrayLike, discount: float
) -> npt.NDArray[np.float64]:
    """y_t = sum_{k>=0} discount^k c_{t+k}, summed within each episode only.

    Args:
        costs: [N] costs of transitions, episode after episode.
        episode_ends: [N] bool, True at each episode's last transition (terminal or timeout).
        discount: the weight per step later.

    Returns:
        [N] targets; an unfinished last episode counts the costs up to the array's end.
    """
    cost_list = np.asarray(costs, dtype=np.float64).tolist()  # Python floats: a fast loop
    ends = np.asarray(episode_ends, dtype=bool).tolist()
    targets = np.empty(len(cost_list), dtype=np.float64)
    following = 0.0
    for step in range(len(cost_list) - 1, -1, -1):
        if ends[step]:
            following = 0.0  # the next episode's costs never count
        following = cost_list[step] + discount * following
        targets[step] = following
    return targets


def critic_data(episodes: Sequence[Episode], discount: float) -> CriticData:
    """The episodes' transitions, flat, with their discounted-cost targets."""
    costs = np.concatenate([episode.costs for episode in episodes])  # [N]
    ends = np.concatenate([episode.terminals | episode.timeouts for episode in episodes])  # [N]
    return CriticData(
        torch.from_numpy(np.concatenate([episode.observations for episode in episodes])).float(),
        torch.from_numpy(np.concatenate([episode.actions for episode in episodes])).float(),
        torch.from_numpy(discounted_costs(costs, ends, discount)).float(),
    )


def held_out_episodes(episode_count: int, generator: np.random.Generator) -> set[int]:
    """Indices of the validation episodes: VALIDATION_SHARE of them, at least one."""
    count = max(1, round(VALIDATION_SHARE * episode_count))
    return {int(index) for index in generator.choice(episode_count, count, replace=False)}


def mean_squared_error(critic: CostCriticNetwork, data: CriticData) -> float:
    """The critic's MSE on `data`'s targets."""
    critic.eval()
    with torch.no_grad():
        return float(F.mse_loss(critic(data.observations, data.actions), data.targets))


def fit(
    critic: CostCriticNetwork,
    data: CriticData,
    config: CriticConfig,
    generator: np.random.Generator,
) -> None:
    """`config.update_steps` Adam steps on uniform batches of `data`, drawn with `generator`."""
    optimiser = torch.optim.Adam(critic.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=config.update_steps)
    critic.train()
    bar = tqdm(range(config.update_steps), desc="cost critic", unit="step", mininterval=5.0)
    for step in bar:
        rows = torch.from_numpy(generator.integers(0, len(data.targets), config.batch_size))
        loss = F.mse_loss(critic(data.observations[rows], data.actions[rows]), data.targets[rows])
        optimiser.zero_grad()
        torch.autograd.backward(loss)
        optimiser.step()
        schedule.step()
        if (step + 1) % 500 == 0:
            bar.set_postfix(loss=f"{loss.item():.3g}")
    critic.eval()


def train_cost_critic(episodes: Sequence[Episode], config: CriticConfig) -> CriticFit:
    """Hold out episodes, fit a critic on the rest, measure it on them."""
    if len(episodes) < 2:
        raise DatasetError("a cost critic needs at least two episodes (one is held out)")
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    generator = np.random.default_rng(config.seed)
    held_out = held_out_episodes(len(episodes), generator)
    training = [episode for index, episode in enumerate(episodes) if index not in held_out]
    validation = [episodes[index] for index in sorted(held_out)]
    observations = np.concatenate([episode.observations for episode in episodes])  # [N, obs]
    critic = CostCriticNetwork(
        observations.mean(axis=0, dtype=np.float64),
        observations.std(axis=0, dtype=np.float64) + STD_FLOOR,
        action_dim=episodes[0].actions.shape[1],
    )
    fit(critic, critic_data(training, config.discount), config, generator)
    measured = critic_data(validation, config.discount)
    return CriticFit(
        critic,
        validation_mse=mean_squared_error(critic, measured),
        target_variance=float(measured.targets.double().var(unbiased=False)),
        validation_episodes=len(validation),
    )


def export_cost_critic(critic: CostCriticNetwork, path: Path, opset: int = ONNX_OPSET) -> Path:
    """Export as runtime.cost_critic's contract says (a dynamic batch axis), check the graph,
    and write it atomically; returns `path`."""
    critic.eval()
    example = (torch.zeros(2, critic.observation_dim), torch.zeros(2, critic.action_dim))
    return export_graph(critic, example, (INPUT_NAMES, (OUTPUT_NAME,)), path, opset)
