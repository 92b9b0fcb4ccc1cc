"""Which episodes Algorithm 1 relabels, as a training run's config says (paper section 4.4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from training.data.augmentation import Relabel, augment_returns, density_filter
from training.data.dataset import Episode
from training.learn.config import TrainConfig

logger = logging.getLogger(__name__)


def augmentation_candidates(
    config: TrainConfig, rewards: np.ndarray, costs: np.ndarray
) -> np.ndarray:
    """Indices of the episodes augmentation may relabel: all, or those the density filter keeps.

    As in OSRL, the filter (paper appendix, noisy datasets) only decides which trajectories define
    the frontier and receive relabelled copies; every episode is still trained on as recorded.
    """
    everything = np.arange(len(rewards))
    if not config.outlier_filter:
        return everything
    keep = density_filter(rewards, costs, config.outlier_grid, config.outlier_min_count)
    if not keep.any():
        logger.warning("the outlier filter would drop every episode; augmenting from all of them")
        return everything
    logger.info("outlier filter keeps %d of %d episodes for augmentation", keep.sum(), len(keep))
    kept: np.ndarray = everything[keep]
    return kept


def relabel_episodes(config: TrainConfig, episodes: Sequence[Episode]) -> list[Relabel]:
    """Algorithm 1 targets for `augment_fraction * len(episodes)` relabelled copies."""
    if not config.uses_augmentation:
        return []
    rewards = np.array([episode.reward_return for episode in episodes])
    costs = np.array([episode.cost_return for episode in episodes])
    candidates = augmentation_candidates(config, rewards, costs)
    relabels = augment_returns(
        rewards[candidates],
        costs[candidates],
        count=int(config.augment_fraction * len(episodes)),
        rng=np.random.default_rng(config.seed),
        min_gap=config.augment_min_gap,
        max_reward=config.augment_max_reward,
        max_cost=None if config.augment_cost_cap_factor is None else config.served_cost_cap,
        association=config.association,
        beta=config.association_beta,
        max_reward_drop=config.association_max_reward_drop * float(np.ptp(rewards)),
    )
    return [relabel._replace(source=int(candidates[relabel.source])) for relabel in relabels]
