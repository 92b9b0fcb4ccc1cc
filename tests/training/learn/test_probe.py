"""The token-sensitivity probe (training/learn/probe.py)."""

from __future__ import annotations

import torch

from tests.training.cdt_synthetic import make_episodes
from training.data.windows import WindowSampler, build_buffer, compute_stats
from training.learn.model import ConstrainedDecisionTransformer, ModelConfig
from training.learn.probe import probe_rows, token_sensitivity

SEQ_LEN = 4


def _model_and_batch(return_basis: int) -> tuple[ConstrainedDecisionTransformer, object]:
    episodes = make_episodes(count=5, seed=2, max_length=12)
    stats = compute_stats(episodes, {}, reward_scale=0.1, cost_scale=0.05)
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    rows = probe_rows(buffer, len(episodes), SEQ_LEN, count=32, seed=0)
    batch = WindowSampler(buffer, SEQ_LEN, batch_size=1, seed=0).gather(rows)
    torch.manual_seed(0)
    config = ModelConfig(
        state_dim=episodes[0].observations.shape[1],
        action_dim=episodes[0].actions.shape[1],
        seq_len=SEQ_LEN,
        max_episode_len=stats.max_episode_len,
        embedding_dim=16,
        num_layers=1,
        num_heads=2,
        dropout=0.0,
        return_basis=return_basis,
    )
    return ConstrainedDecisionTransformer(config), batch


def test_probe_windows_end_inside_recorded_episodes():
    episodes = make_episodes(count=5, seed=2, max_length=12)
    stats = compute_stats(episodes, {}, reward_scale=0.1, cost_scale=0.05)
    buffer = build_buffer(episodes, stats, SEQ_LEN)
    rows = probe_rows(buffer, recorded_episodes=2, seq_len=SEQ_LEN, count=64, seed=1)
    assert rows.shape == (64, SEQ_LEN)
    end_of_second = int(buffer.first_row[1] + buffer.lengths[1])
    assert int(rows[:, -1].max()) < end_of_second
    assert not bool(buffer.is_padding[rows[:, -1]].any())


def test_probe_sees_no_effect_from_a_token_the_model_cannot_read():
    model, batch = _model_and_batch(return_basis=4)
    with torch.no_grad():
        model.cost_embedding.linear.weight.zero_()
        model.cost_embedding.basis.weight.zero_()  # type: ignore[union-attr]
    probe = token_sensitivity(model, batch, cost_shift=2.0, reward_shift=-1.0)  # type: ignore[arg-type]
    assert probe.cost_effect == 0.0
    assert probe.reward_effect > 0.0
    assert model.training  # the probe restores the mode it found


def test_probe_sees_a_coded_cost_token():
    model, batch = _model_and_batch(return_basis=4)
    probe = token_sensitivity(model, batch, cost_shift=0.5, reward_shift=0.0)  # type: ignore[arg-type]
    assert probe.cost_effect > 0.0
    assert probe.reward_effect == 0.0
