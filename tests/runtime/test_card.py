"""The typed model card: read, validated writes, updates (runtime/card.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.card import CardError, read_card, update_card, write_card

CARD = {
    "name": "m", "version": "1", "task": "SafetyCarRun-v0", "observation_dim": 7,
    "action_dim": 2, "action_low": [-1.0, -1.0], "action_high": [1.0, 1.0], "context_len": 10,
    "max_episode_len": 200, "training": {"kept": "extra keys survive"},
}  # fmt: skip


def test_write_then_read_keeps_typed_and_extra_keys(tmp_path: Path) -> None:
    write_card(tmp_path, CARD)
    card = read_card(tmp_path)
    assert card.budget_scale == 1.0 and card.git_commit is None
    assert card.model_extra == {"training": {"kept": "extra keys survive"}}
    assert update_card(tmp_path, budget_scale=0.8).budget_scale == 0.8
    assert json.loads((tmp_path / "model.json").read_text())["training"] == CARD["training"]


def test_only_a_mean_action_calibration_rescales_the_cost_input(tmp_path: Path) -> None:
    card = write_card(tmp_path, CARD | {"budget_scale": 0.8})
    assert card.cost_input_scale(deterministic=True) == card.cost_input_scale(False) == 1.0
    card = update_card(tmp_path, mean_action_budget_scale=0.6)
    assert card.cost_input_scale(deterministic=True) == pytest.approx(0.6 / 0.8)
    assert card.cost_input_scale(deterministic=False) == 1.0
    with pytest.raises(CardError, match="greater than 0"):
        update_card(tmp_path, mean_action_budget_scale=0.0)


def test_invalid_cards_are_refused_and_never_written(tmp_path: Path) -> None:
    write_card(tmp_path, CARD)
    before = (tmp_path / "model.json").read_text()
    with pytest.raises(CardError, match="action_low and action_high"):
        update_card(tmp_path, action_low=[-1.0])
    assert (tmp_path / "model.json").read_text() == before
    with pytest.raises(CardError, match=r"model\.json"):
        read_card(tmp_path / "missing")
