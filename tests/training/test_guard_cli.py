"""`cdt guard`: a card's own budget guard, validated, and no stale measurement beside it."""

import json
from pathlib import Path

import pytest

from training.guard_cli import main

CARD = {
    "name": "m", "version": "1", "task": "SafetyCarRun-v0", "observation_dim": 7,
    "action_dim": 2, "action_low": [-1, -1], "action_high": [1, 1], "context_len": 1,
    "max_episode_len": 200,
    "budget_guard_measured": [{
        "budget": 10, "action_mode": "mean", "episodes": 20, "first_seed": 7,
        "guarded": {"share_over_budget": 0.1, "cost_mean": 3.0, "normalised_reward": 50.0},
        "unguarded": {"share_over_budget": 0.1, "cost_mean": 3.0, "normalised_reward": 50.0},
    }],
}  # fmt: skip


def _card(folder: Path) -> dict[str, object]:
    return dict(json.loads((folder / "model.json").read_text()))


def test_set_writes_the_guard_and_drops_what_the_old_one_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model.json").write_text(json.dumps(CARD))
    main([str(tmp_path), "--set", '{"fallback_margin": 0, "hidden_reserve": 0}'])
    card = _card(tmp_path)
    guard = card["budget_guard"]
    assert isinstance(guard, dict)
    assert (guard["fallback_margin"], guard["hidden_reserve"]) == (0.0, 0.0)
    assert card.get("budget_guard_measured") is None  # measured with the default guard
    shown = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert shown["guard"] == "its own" and shown["fallback_margin"] == 0.0
    main([str(tmp_path), "--default"])
    assert _card(tmp_path).get("budget_guard") is None


def test_the_same_guard_again_keeps_the_measurements(tmp_path: Path) -> None:
    (tmp_path / "model.json").write_text(json.dumps(CARD))
    main([str(tmp_path), "--set", "{}"])  # the defaults: nothing changes
    assert _card(tmp_path)["budget_guard_measured"] == CARD["budget_guard_measured"]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ("{fallback", "not JSON"),
        ("[1, 2]", "a JSON object"),
        ('{"fallback_margin": -1}', "fallback_margin"),
        ('{"no_such": 1}', "no_such"),
        ('{"mean_action_pace": 2, "full_noise_pace": 1}', "full_noise_pace"),
        # a setting this card cannot take: named as the setting's fault, not the card's
        ('{"shield_margin": 15}', "--set: budget_guard.shield_margin needs a cost critic"),
    ],
)
def test_a_bad_guard_is_one_line_and_leaves_the_card_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: str, said: str
) -> None:
    (tmp_path / "model.json").write_text(json.dumps(CARD))
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), "--set", settings])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip()
    assert said in error and len(error.splitlines()) == 1
    assert _card(tmp_path) == CARD
