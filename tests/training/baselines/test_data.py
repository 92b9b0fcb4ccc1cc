"""Trajectory selection of the BC variants and the transition tensors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tests.training.baselines.synthetic import ACTION_HIGH, ACTION_LOW, COST_LIMIT
from training.baselines.config import BaselineConfig
from training.baselines.data import (
    TransitionData,
    action_bounds,
    make_normaliser,
    select_episodes,
    selection_mask,
)
from training.data.dataset import OfflineDataset

COSTS = np.array([0.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0])
REWARDS = np.array([10.0, 30.0, 35.0, 50.0, 52.0, 60.0, 20.0])


def test_selection_mask_safe_keeps_cost_at_or_below_limit() -> None:
    assert selection_mask("bc-safe", COSTS, REWARDS, 10.0).tolist() == [1, 1, 1, 1, 0, 0, 0]


def test_selection_mask_risky_keeps_twice_the_limit_or_more() -> None:
    assert selection_mask("bc-risky", COSTS, REWARDS, 10.0).tolist() == [0, 0, 0, 0, 0, 1, 1]


def test_selection_mask_boundary_keeps_half_to_one_and_a_half_limits() -> None:
    assert selection_mask("bc-boundary", COSTS, REWARDS, 10.0).tolist() == [0, 0, 0, 1, 1, 0, 0]


def test_selection_mask_frontier_drops_points_far_below_the_frontier() -> None:
    mask = selection_mask("bc-frontier", COSTS, REWARDS, 10.0)
    assert mask[3] and mask[5]  # on the Pareto frontier
    assert not mask[6]  # cost 30, reward 20: far below it


def test_selection_mask_all_for_other_algorithms() -> None:
    for algo in ("bc-all", "mt-bc", "bcq-lag", "coptidice"):
        assert selection_mask(algo, COSTS, REWARDS, 10.0).all()


def test_select_episodes_none_qualifies_raises(tiny_dataset: OfflineDataset) -> None:
    try:
        select_episodes(tiny_dataset.episodes, "bc-risky", 1000.0)
    except ValueError as error:
        assert "bc-risky" in str(error)
    else:
        raise AssertionError("expected ValueError")


def test_transition_data_scales_and_flags(
    tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    config = tiny_config("mt-bc", reward_scale=0.5)
    bounds = action_bounds(tiny_dataset, config)
    normaliser = make_normaliser(tiny_dataset.episodes, bounds, COST_LIMIT)
    data = TransitionData(tiny_dataset.episodes, normaliser, config)
    episode = tiny_dataset.episodes[5]
    first = 5 * episode.length  # every episode has the same length
    tensors = data.tensors
    assert data.size == len(tiny_dataset.episodes) * episode.length
    assert tensors.actions.abs().max() <= 1.0
    assert torch.allclose(tensors.rewards[first], torch.tensor(0.5 * episode.rewards[0]))
    assert tensors.is_initial[first] == 1.0 and tensors.is_initial[first + 1] == 0.0
    expected = episode.cost_return / normaliser.cost_normaliser
    assert torch.isclose(tensors.costs_to_go[first], torch.tensor(expected))
    assert abs(float(tensors.states.mean())) < 0.1  # standardised
    assert np.allclose(bounds[0], ACTION_LOW) and np.allclose(bounds[1], ACTION_HIGH)
    batch = data.sample(8, torch.Generator().manual_seed(0))
    assert batch.states.shape == (8, 3) and batch.actions.shape == (8, 2)


def test_action_bounds_come_from_attrs_when_config_has_none(
    tiny_dataset: OfflineDataset, tiny_config: Callable[..., BaselineConfig]
) -> None:
    config = tiny_config("bc-all", action_low=None, action_high=None)
    attrs = {"env_id": "TinyTask-v0", "action_low": [-3.0, -3.0], "action_high": [3.0, 3.0]}
    dataset = OfflineDataset(episodes=tiny_dataset.episodes, attrs=attrs)
    low, high = action_bounds(dataset, config)
    assert low.tolist() == [-3.0, -3.0] and high.tolist() == [3.0, 3.0]
