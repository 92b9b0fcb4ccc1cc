"""`cdt critic` never replaces a critic without --force, and with it drops the shield tuned to
the old one; a dataset of another task is refused (`cdt card-update` too)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime.card import read_card, update_card
from runtime.files import COST_CRITIC_FILE
from tests.training.placeholder_graphs import write_placeholder_graphs
from tests.training.test_cost_critic import action_cost_episodes, write_model_dir
from training import card_update
from training.critic_cli import main
from training.data.dataset import save_dataset

FAST = ["--steps", "20", "--batch-size", "32"]
MEASURED = {
    "budget": 10, "action_mode": "mean", "episodes": 20, "first_seed": 7,
    "guarded": {"share_over_budget": 0.0, "cost_mean": 3.0},
    "unguarded": {"share_over_budget": 0.1, "cost_mean": 5.0},
}  # fmt: skip


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the datasets and a model (task SafetyCarRun-v0) with a 20-step critic, a
    shield chosen for it and guard rows; trained once, copied for each test."""
    root = tmp_path_factory.mktemp("critic")
    episodes = action_cost_episodes(count=10)
    save_dataset(root / "data.hdf5", episodes, {"env_id": "SafetyCarRun-v0"})
    save_dataset(root / "ball.hdf5", episodes, {"env_id": "SafetyBallRun-v0"})
    model_dir = write_model_dir(root / "model", "data.hdf5")
    with pytest.MonkeyPatch.context() as patch:  # set up before the private ledger is
        patch.setenv("CDT_LEDGER", "off")
        write_placeholder_graphs(patch)  # the card's rules are under test, not the graph
        patch.chdir(root)  # the card's dataset path is relative to the current folder
        main([str(model_dir), *FAST])
    guard = {"fallback_margin": 0, "hidden_reserve": 0, "shield_margin": 25, "shield_risk": 1}
    evaluation = {"shield": {"finished": True}, "protocol": {"rows": []}}
    update_card(
        model_dir, budget_guard=guard, budget_guard_measured=[MEASURED], evaluation=evaluation
    )
    return root


@pytest.fixture
def shielded(trained_once: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's copy of `trained_once`'s model (the current folder holds the datasets)."""
    write_placeholder_graphs(monkeypatch)
    shutil.copytree(trained_once, tmp_path / "work")
    monkeypatch.chdir(tmp_path / "work")
    return Path("model")


def _state(model_dir: Path) -> tuple[bytes, bytes]:
    return (model_dir / COST_CRITIC_FILE).read_bytes(), (model_dir / "model.json").read_bytes()


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    return error


def test_a_trained_critic_is_replaced_only_with_force(
    shielded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _state(shielded)
    capsys.readouterr()
    error = _refused([str(shielded), "--steps", "3"], capsys)
    assert "has a cost critic already (20 steps, validation MSE" in error
    assert "pass --force" in error
    assert _state(shielded) == before  # nothing written


def test_force_replaces_the_critic_and_switches_off_the_shield_tuned_to_the_old_one(
    shielded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    main([str(shielded), "--steps", "3", "--batch-size", "32", "--force"])
    card = read_card(shielded)
    assert card.cost_critic is not None and card.cost_critic.update_steps == 3
    assert (card.guard.shield_margin, card.guard.shield_risk) == (0.0, 2.0)  # off, the default
    assert card.guard.fallback_margin == 0.0  # the rest of the card's guard stays
    assert card.budget_guard_measured is None  # measured with the old shield
    assert card.evaluation == {"protocol": {"rows": []}}  # the shield is chosen again
    said = capsys.readouterr().out.splitlines()[-1]
    assert "replaced the cost critic of 20 steps" in said
    assert "shield_margin 25" in said and f"cdt shield {shielded}" in said


def test_force_on_a_card_without_a_shield_keeps_its_guard_rows(
    shielded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    update_card(shielded, budget_guard=None)  # the default guard: no shield
    main([str(shielded), "--steps", "3", "--batch-size", "32", "--force"])
    card = read_card(shielded)
    assert card.budget_guard is None and card.budget_guard_measured is not None


def test_a_dataset_of_another_task_is_refused(
    shielded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _state(shielded)
    capsys.readouterr()
    error = _refused([str(shielded), "--dataset", "ball.hdf5", *FAST], capsys)
    assert "--dataset ball.hdf5: holds SafetyBallRun-v0 data" in error
    assert "SafetyCarRun-v0" in error and _state(shielded) == before


def test_card_update_refuses_a_dataset_of_another_task(
    shielded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _state(shielded)
    with pytest.raises(SystemExit) as stopped:
        card_update.main([str(shielded), "--dataset", "ball.hdf5"])
    assert stopped.value.code == 2
    assert "holds SafetyBallRun-v0 data" in capsys.readouterr().err
    assert _state(shielded) == before
    card_update.main([str(shielded), "--dataset", "data.hdf5", "--thresholds", "1"])
    assert json.loads(capsys.readouterr().out)[0]["cost"] == 1.0
