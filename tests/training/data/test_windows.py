"""Windows, padding, returns-to-go, normalisation and sampling (training/data/windows.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.training.cdt_synthetic import make_episodes
from training.data.augmentation import Relabel
from training.data.windows import (
    WindowSampler,
    build_buffer,
    compute_stats,
    cost_sampling_weights,
    to_go,
    window_coverage,
)

SEQ_LEN = 4


@pytest.fixture
def episodes():
    return make_episodes(count=6, seed=1, max_length=12)


@pytest.fixture
def stats(episodes):
    return compute_stats(episodes, {}, reward_scale=0.5, cost_scale=2.0)


def test_to_go_is_the_reverse_cumulative_sum():
    np.testing.assert_allclose(to_go(np.array([1.0, 2.0, 3.0])), [6.0, 5.0, 3.0])


def test_compute_stats_widens_bounds_to_cover_the_data(episodes):
    episodes[0].actions[0, 1] = 1.5
    stats = compute_stats(episodes, {"max_episode_steps": 99}, 1.0, 1.0)
    assert stats.action_low == [-1.0, -1.0]
    assert stats.action_high[1] == pytest.approx(1.5)
    assert stats.max_episode_len == 99
    scaled = stats.scale_actions(np.concatenate([ep.actions for ep in episodes]))
    assert scaled.min() >= -1.0 and scaled.max() <= 1.0


def test_window_is_left_padded_with_the_newest_step_last(episodes, stats):
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    sampler = WindowSampler(buffer, SEQ_LEN, batch_size=1, seed=0)
    episode = episodes[2]
    for newest in range(episode.length):
        row = int(buffer.first_row[2]) + newest
        batch = sampler.gather(torch.tensor([[row - 3, row - 2, row - 1, row]]))
        pads = max(SEQ_LEN - 1 - newest, 0)
        assert batch.padding_mask[0].tolist() == [True] * pads + [False] * (SEQ_LEN - pads)
        real = slice(pads, SEQ_LEN)
        steps = np.arange(newest - (SEQ_LEN - pads) + 1, newest + 1)
        np.testing.assert_array_equal(batch.time_steps[0, real].numpy(), steps)
        expected_states = stats.normalise_states(episode.observations[steps])
        np.testing.assert_allclose(batch.states[0, real].numpy(), expected_states, rtol=1e-5)
        expected_rtg = to_go(episode.rewards)[steps] * 0.5
        np.testing.assert_allclose(batch.returns_to_go[0, real].numpy(), expected_rtg, rtol=1e-5)
        expected_ctg = to_go(episode.costs)[steps] * 2.0
        np.testing.assert_allclose(batch.costs_to_go[0, real].numpy(), expected_ctg, rtol=1e-5)
        assert batch.states[0, :pads].abs().sum() == 0  # padding is zeros


def test_sampled_windows_never_cross_episodes(episodes, stats):
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    sampler = WindowSampler(buffer, SEQ_LEN, batch_size=512, seed=0)
    batch = sampler.sample()
    real = ~batch.padding_mask
    # real steps of a window are consecutive time steps ending at the newest one
    diffs = batch.time_steps[:, 1:] - batch.time_steps[:, :-1]
    assert torch.all(diffs[real[:, :-1]] == 1)
    assert real[:, -1].all()  # the newest step is always real


def test_relabelled_copy_starts_at_its_targets(episodes, stats):
    relabel = Relabel(source=3, reward_return=100.0, cost_return=7.0)
    buffer = build_buffer(episodes, stats, SEQ_LEN, [relabel])
    copy = len(episodes)  # appended after the originals
    first = int(buffer.first_row[copy])
    assert buffer.returns_to_go[first] == pytest.approx(100.0 * 0.5)
    assert buffer.costs_to_go[first] == pytest.approx(7.0 * 2.0)
    length = episodes[3].length
    original = int(buffer.first_row[3])
    torch.testing.assert_close(
        buffer.states[first : first + length], buffer.states[original : original + length]
    )
    assert float(buffer.cost_returns[copy]) == 7.0


def test_cost_weighted_sampling_never_draws_episodes_above_the_constant(episodes, stats):
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    constant = float(np.median(buffer.cost_returns.numpy()))
    weights = cost_sampling_weights(buffer.cost_returns, constant)
    sampler = WindowSampler(buffer, SEQ_LEN, batch_size=256, seed=0, episode_weights=weights)
    rows = []
    for _ in range(4):
        batch = sampler.sample()
        rows.append(batch.costs_to_go[:, -1])
    # a window's newest cost-to-go never exceeds its episode's cost return
    allowed = buffer.cost_returns[weights > 0].max()
    assert torch.cat(rows).max() <= allowed * stats.cost_scale + 1e-5
    assert weights[buffer.cost_returns >= constant].sum() == 0


def test_cost_sampling_weights_fall_back_to_uniform():
    weights = cost_sampling_weights(torch.tensor([60.0, 80.0]), ceiling=50.0)
    assert weights.tolist() == [1.0, 1.0]


def test_default_ceiling_draws_every_episode_and_coverage_is_exact(episodes, stats):
    relabels = [Relabel(source=3, reward_return=50.0, cost_return=float(10**6))]
    buffer = build_buffer(episodes, stats, SEQ_LEN, relabels)
    weights = cost_sampling_weights(buffer.cost_returns, ceiling=None)
    assert (weights > 0).all()  # the relabelled copy's huge target cost included
    coverage = window_coverage(buffer, weights, len(episodes), stats.cost_scale)
    assert sum(coverage["cost_to_go_share"]) == pytest.approx(1.0)
    expected = float(weights[len(episodes) :].sum() / weights.sum())
    assert coverage["relabelled_window_share"] == pytest.approx(expected)
    sampler = WindowSampler(buffer, SEQ_LEN, batch_size=4096, seed=0, episode_weights=weights)
    drawn, _ = sampler.draw()
    assert float((drawn >= len(episodes)).double().mean()) == pytest.approx(expected, abs=0.02)


def test_sampler_is_reproducible(episodes, stats):
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    first = WindowSampler(buffer, SEQ_LEN, batch_size=8, seed=3)
    second = WindowSampler(buffer, SEQ_LEN, batch_size=8, seed=3)
    for left, right in zip(first.sample(), second.sample(), strict=True):
        torch.testing.assert_close(left, right)


def test_cost_sampling_floor_keeps_every_episode_in_the_draw():
    costs = torch.tensor([0.0, 35.0, 70.0, 200.0])
    plain = cost_sampling_weights(costs, ceiling=70.0)
    floored = cost_sampling_weights(costs, ceiling=70.0, min_weight=0.1)
    assert plain.tolist() == [70.0, 35.0, 0.0, 0.0]
    assert floored.tolist() == pytest.approx([70.0, 35.0, 7.0, 7.0])


def test_rows_to_moves_only_the_per_row_tensors(episodes, stats):
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    moved = buffer.rows_to(torch.device("meta"))  # a device every machine has
    on_device = {name for name, tensor in moved._asdict().items() if tensor.is_meta}
    assert on_device == {
        "states", "actions", "returns_to_go", "costs_to_go", "time_steps", "is_padding", "costs"
    }  # fmt: skip
    assert torch.equal(moved.lengths, buffer.lengths)  # indices are still drawn on the host
