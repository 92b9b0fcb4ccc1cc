"""Every baseline's loss falls on tiny data; the PID multiplier follows the cost estimate."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import get_args, get_type_hints

import pytest
import torch

from training.baselines import ALGORITHMS, NAMES_IN_PAPER
from training.baselines.config import BaselineConfig
from training.baselines.lagrangian import CostMultiplier, per_step_threshold
from training.baselines.registry import LEARNERS, train_baseline
from training.data.dataset import OfflineDataset

# The supervised parts each algorithm fits: behaviour models and critics (whose TD targets
# settle fast with gamma = 0.5); COptiDICE's weighted likelihood.
FITTED_LOSSES = {
    **{algo: ("actor_loss",) for algo in ALGORITHMS if "bc" in algo and "bcq" not in algo},
    "bcq-lag": ("vae_loss", "critic_loss", "cost_critic_loss"),
    "bear-lag": ("vae_loss", "critic_loss", "cost_critic_loss"),
    "bcq": ("vae_loss", "critic_loss"),
    "bear": ("vae_loss", "critic_loss"),
    "cpq": ("vae_loss", "critic_loss"),
    "coptidice": ("actor_loss",),
}


def test_registry_covers_every_algorithm() -> None:
    assert set(LEARNERS) == set(ALGORITHMS) == set(NAMES_IN_PAPER)
    assert set(FITTED_LOSSES) == set(ALGORITHMS)
    assert get_args(get_type_hints(BaselineConfig)["algo"]) == ALGORITHMS


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_train_loss_decreases_on_tiny_data(
    algo: str, tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    trained = train_baseline(tiny_config(algo, steps=80), tiny_dataset)
    first, last = trained.history[0], trained.history[-1]
    for key in FITTED_LOSSES[algo]:
        assert last[key] < first[key], f"{algo} {key}: {first[key]:.4f} -> {last[key]:.4f}"
    assert all(
        torch.isfinite(torch.tensor(list(window.values()))).all() for window in trained.history
    )


def test_cost_multiplier_rises_above_threshold_and_falls_below() -> None:
    multiplier = CostMultiplier(threshold=1.0)
    values = [multiplier.update(3.0) for _ in range(50)]
    assert values[-1] > values[0] > 0.0
    assert all(later >= earlier for earlier, later in itertools.pairwise(values))
    falling = [multiplier.update(0.0) for _ in range(50)]
    assert falling[-1] < values[-1]
    assert all(later <= earlier for earlier, later in itertools.pairwise(falling))


def test_per_step_threshold_spreads_the_limit_over_the_discounted_episode() -> None:
    assert per_step_threshold(10.0, 1.0, 100) == 10.0
    assert per_step_threshold(10.0, 0.99, 200) == pytest.approx(10.0 * 86.6 / 200, rel=1e-3)


@pytest.mark.parametrize("algo", ["bcq-lag", "bear-lag"])
def test_lagrangian_learner_multiplier_follows_the_cost_critic(
    algo: str, tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    learner = train_baseline(tiny_config(algo, steps=1), tiny_dataset).learner
    critics = learner.critics  # type: ignore[attr-defined]
    states, actions = torch.zeros(16, 3), torch.zeros(16, 2)
    threshold = critics.multiplier.threshold
    with torch.no_grad():
        for net in critics.cost_critic.nets:
            net[-1].weight.zero_()
            net[-1].bias.fill_(threshold + 5.0)  # estimated cost above the threshold
    rising = [critics.actor_objective(states, actions)[1]["multiplier"] for _ in range(20)]
    with torch.no_grad():
        for net in critics.cost_critic.nets:
            net[-1].bias.fill_(0.0)  # estimated cost below the threshold
    falling = [critics.actor_objective(states, actions)[1]["multiplier"] for _ in range(20)]
    assert rising[-1] > rising[0] and falling[-1] < rising[-1]
