"""The cost critic: its targets, a short fit, the exported graph, and `cdt critic`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.card import read_card
from runtime.cost_critic import CostCritic
from runtime.files import COST_CRITIC_FILE
from training.cost_critic import (
    CriticConfig,
    CriticFit,
    discounted_costs,
    export_cost_critic,
    train_cost_critic,
)
from training.critic_cli import main
from training.data.dataset import Episode, save_dataset

OBSERVATION_DIM, ACTION_DIM = 3, 2


def action_cost_episodes(count: int = 30, length: int = 20, seed: int = 0) -> list[Episode]:
    """Random states and actions; cost 1 exactly when action[0] > 0."""
    rng = np.random.default_rng(seed)
    episodes = []
    for _ in range(count):
        observations = rng.normal(size=(length + 1, OBSERVATION_DIM)).astype(np.float32)
        actions = rng.uniform(-1.0, 1.0, size=(length, ACTION_DIM)).astype(np.float32)
        timeouts = np.zeros(length, dtype=bool)
        timeouts[-1] = True
        episodes.append(
            Episode(
                observations=observations[:-1],
                next_observations=observations[1:],
                actions=actions,
                rewards=np.zeros(length, dtype=np.float32),
                costs=(actions[:, 0] > 0).astype(np.float32),
                terminals=np.zeros(length, dtype=bool),
                timeouts=timeouts,
            )
        )
    return episodes


@pytest.fixture(scope="module")
def trained() -> CriticFit:
    # A small discount keeps the later, action-independent costs from drowning the signal.
    config = CriticConfig(discount=0.5, update_steps=300, batch_size=128, seed=0)
    return train_cost_critic(action_cost_episodes(), config)


def test_discounted_costs_restart_at_each_episode_end() -> None:
    costs = np.array([1.0, 0.0, 2.0, 1.0, 1.0])
    ends = np.array([False, False, True, False, True])  # episodes [0, 3) and [3, 5)
    targets = discounted_costs(costs, ends, discount=0.5)
    np.testing.assert_allclose(targets, [1.0 + 0.25 * 2.0, 0.5 * 2.0, 2.0, 1.5, 1.0])


def test_train_cost_critic_learns_that_the_costly_action_costs_more(trained: CriticFit) -> None:
    observations = torch.randn(64, OBSERVATION_DIM, generator=torch.Generator().manual_seed(1))
    costly, free = torch.zeros(64, ACTION_DIM), torch.zeros(64, ACTION_DIM)
    costly[:, 0], free[:, 0] = 0.8, -0.8
    with torch.no_grad():
        gap = trained.critic(observations, costly) - trained.critic(observations, free)  # [64]
    assert gap.mean() > 0.5  # 1 in expectation: the cost of the step itself
    assert trained.validation_episodes == 1  # 2 % of 30 episodes, at least one
    assert trained.validation_mse < trained.target_variance


def test_export_cost_critic_answers_as_the_module_and_loads(
    trained: CriticFit, tmp_path: Path
) -> None:
    export_cost_critic(trained.critic, tmp_path / COST_CRITIC_FILE)
    critic = CostCritic.load(tmp_path, OBSERVATION_DIM, ACTION_DIM)
    rng = np.random.default_rng(2)
    observations = (3 * rng.normal(size=(5, OBSERVATION_DIM))).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(5, ACTION_DIM)).astype(np.float32)
    with torch.no_grad():
        expected = trained.critic(torch.from_numpy(observations), torch.from_numpy(actions))
    np.testing.assert_allclose(critic.predict(observations, actions), expected.numpy(), atol=1e-4)


def write_model_dir(folder: Path, dataset: str | None) -> Path:
    """A model folder with just the card `cdt critic` reads (it never opens the graph)."""
    card = {
        "name": "tiny", "version": "1", "task": "SafetyCarRun-v0",
        "observation_dim": OBSERVATION_DIM, "action_dim": ACTION_DIM,
        "action_low": [-1, -1], "action_high": [1, 1], "context_len": 5, "max_episode_len": 20,
        "dataset": {"path": dataset} if dataset else {"episodes": 30},
    }  # fmt: skip
    folder.mkdir()
    (folder / "model.json").write_text(json.dumps(card))
    return folder


def test_critic_cli_writes_the_graph_and_the_card_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the card's dataset path is relative to the current folder
    save_dataset(tmp_path / "data.hdf5", action_cost_episodes(count=10), {"env_id": "test"})
    model_dir = write_model_dir(tmp_path / "model", "data.hdf5")
    main([str(model_dir), "--steps", "20", "--batch-size", "32", "--discount", "0.8"])
    record = read_card(model_dir).cost_critic
    assert record is not None
    assert (record.discount, record.dataset, record.update_steps) == (0.8, "data.hdf5", 20)
    CostCritic.load(model_dir, OBSERVATION_DIM, ACTION_DIM)
    assert "validation MSE" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("dataset", "argv", "said"),
    [
        (None, [], "names no dataset path"),
        ("missing.hdf5", [], "no such file"),
        ("missing.hdf5", ["--dataset", "other.hdf5"], "--dataset: no such file"),
        ("missing.hdf5", ["--discount", "1"], "must lie in (0, 1)"),
    ],
)
def test_critic_cli_mistakes_are_one_line_and_write_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    dataset: str | None,
    argv: list[str],
    said: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    model_dir = write_model_dir(tmp_path / "model", dataset)
    before = (model_dir / "model.json").read_text()
    with pytest.raises(SystemExit) as stopped:
        main([str(model_dir), *argv])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert said in error and error.count("\n") == 1
    assert (model_dir / "model.json").read_text() == before
    assert not (model_dir / COST_CRITIC_FILE).exists()
