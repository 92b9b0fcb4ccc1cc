"""Spend timing: the share of a dataset's cost spent by mid-episode."""

from __future__ import annotations

import numpy as np
import pytest

from bench.spend_timing import spend_timing
from training.data.dataset import Episode


def _episode(costs: list[float]) -> Episode:
    length = len(costs)
    zeros = np.zeros((length, 1), dtype=np.float32)
    flags = np.zeros(length, dtype=bool)
    return Episode(
        zeros, zeros, zeros, np.zeros(length, np.float32), np.array(costs, np.float32), flags, flags
    )


def test_counts_full_length_episodes_in_the_cost_band_by_their_first_half() -> None:
    early = _episode([5, 5, 0, 0])  # 10, all of it by mid-episode
    late = _episode([0, 2, 4, 4])  # 10, 2 of it by mid-episode
    cheap = _episode([1, 0, 0, 0])  # below the band
    short = _episode([5, 5])  # not full length
    count, share, kept = spend_timing([early, late, cheap, short], (5, 40), cut=5)
    assert count == 2
    assert share == pytest.approx(12 / 20)
    assert kept == pytest.approx(0.5)


def test_an_empty_band_gives_no_figures() -> None:
    count, share, kept = spend_timing([_episode([0, 0])], (5, 40), cut=5)
    assert count == 0 and np.isnan(share) and np.isnan(kept)
