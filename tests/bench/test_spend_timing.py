"""Spend timing: the share of a dataset's cost spent by mid-episode."""

from __future__ import annotations

import numpy as np
import pytest

from bench.spend_timing import spend_timing
from training.data.dataset import Episode


def _episode(costs: list[float], reward: float = 0.0) -> Episode:
    length = len(costs)
    zeros = np.zeros((length, 1), dtype=np.float32)
    flags = np.zeros(length, dtype=bool)
    rewards = np.full(length, reward / length, np.float32)
    return Episode(zeros, zeros, zeros, rewards, np.array(costs, np.float32), flags, flags)


def test_counts_full_length_episodes_in_the_cost_band_by_their_first_half() -> None:
    early = _episode([5, 5, 0, 0], reward=40)  # 10, all of it by mid-episode
    late = _episode([0, 2, 4, 4], reward=100)  # 10, 2 of it by mid-episode
    cheap = _episode([1, 0, 0, 0], reward=0)  # below the band; sets the reward range's low end
    short = _episode([5, 5], reward=20)  # not full length
    timing = spend_timing([early, late, cheap, short], (5, 40), cut=5)
    assert timing.episodes == 2
    assert timing.share_by_mid == pytest.approx(12 / 20)
    assert timing.kept_cut == pytest.approx(0.5)
    assert timing.reward_kept == "100.0 / 100.0"  # the late spender, normalised over 0-100
    assert timing.reward_spent == "40.0 / 40.0"


def test_an_empty_band_gives_no_figures() -> None:
    timing = spend_timing([_episode([0, 0])], (5, 40), cut=5)
    assert timing.episodes == 0 and np.isnan(timing.share_by_mid) and np.isnan(timing.kept_cut)
    assert timing.reward_kept == timing.reward_spent == "-"
