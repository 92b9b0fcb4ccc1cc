"""Collector: threshold schedule, PID multiplier, GAE, and a tiny real collection run."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import tyro

from runtime.user_errors import UserError
from tests.training.held_lock import held_elsewhere
from training.collect import cli as collect_cli
from training.collect import collection
from training.collect.collection import learn, load_raw_episodes
from training.collect.ppo_lagrangian import RunningNormaliser, generalised_advantages
from training.collect.settings import CollectConfig, cost_threshold
from training.pid_lagrangian import PidLagrangian


def test_cost_threshold_rises_linearly_between_n1_and_n2() -> None:
    assert cost_threshold(0, 5.0, 45.0, 10, 30) == 5.0
    assert cost_threshold(10, 5.0, 45.0, 10, 30) == 5.0
    assert cost_threshold(20, 5.0, 45.0, 10, 30) == pytest.approx(25.0)
    assert cost_threshold(30, 5.0, 45.0, 10, 30) == 45.0
    assert cost_threshold(99, 5.0, 45.0, 10, 30) == 45.0


def test_paper_task_schedule_resolves_and_command_line_wins() -> None:
    # The paper's Drone-Circle column (tab:dataset-hyperparameters); steps/epoch are ours.
    schedule = CollectConfig(task="SafetyDroneCircle-v0").schedule()
    assert (schedule.eps_1, schedule.eps_2, schedule.n_1, schedule.n_2) == (10.0, 80.0, 20, 550)
    assert (schedule.epochs, schedule.steps_per_epoch) == (570, 3_000)
    assert (schedule.clip_ratio, schedule.gae_lambda, schedule.gamma) == (0.15, 0.95, 0.98)
    argv = ["--task", "SafetyDroneCircle-v0", "--gamma", "0.9", "--rise-end-epoch", "100"]
    overridden = tyro.cli(CollectConfig, args=argv).schedule()
    assert (overridden.gamma, overridden.n_2) == (0.9, 100)
    assert (overridden.clip_ratio, overridden.n_1, overridden.epochs) == (0.15, 20, 570)


def test_falling_phase_follows_the_ramp_then_holds() -> None:
    argv = ["--task", "SafetyDroneCircle-v0", "--fall-to", "5", "--fall-epochs", "170"]
    schedule = tyro.cli(CollectConfig, args=[*argv, "--hold-epochs", "60"]).schedule()
    assert schedule.total_epochs == 570 + 170 + 60
    assert schedule.threshold(300) == cost_threshold(300, 10.0, 80.0, 20, 550)
    assert schedule.threshold(570) == 80.0
    assert schedule.threshold(655) == pytest.approx(42.5)
    assert schedule.threshold(740) == schedule.threshold(799) == 5.0
    paper = CollectConfig(task="SafetyDroneCircle-v0").schedule()
    assert paper.total_epochs == 570 and paper.threshold(799) == 80.0


@pytest.mark.parametrize(
    "argv",
    [["--fall-epochs", "10"], ["--fall-to", "5"], ["--fall-to", "-1", "--hold-epochs", "3"]],
)
def test_falling_phase_refuses_incomplete_settings(argv: list[str]) -> None:
    with pytest.raises(UserError, match="fall"):
        tyro.cli(CollectConfig, args=argv)


def test_pid_multiplier_rises_above_threshold_and_falls_below() -> None:
    pid = PidLagrangian()
    rising = [pid.update(episode_cost=50.0, threshold=10.0) for _ in range(20)]
    assert rising[-1] > rising[0] > 0.0
    falling = [pid.update(episode_cost=0.0, threshold=10.0) for _ in range(200)]
    assert falling[-1] < rising[-1]
    assert min(falling) >= 0.0


def test_generalised_advantages_matches_hand_computation() -> None:
    # One env, three steps, episode ends at t=2 (terminal: next value zeroed by the caller).
    signals = np.array([[1.0], [2.0], [3.0]])
    values = np.array([[0.5], [0.5], [0.5]])
    next_values = np.array([[0.5], [0.5], [0.0]])
    dones = np.array([[0.0], [0.0], [1.0]])
    gamma, lam = 0.9, 0.5
    d2 = 3.0 - 0.5
    d1 = 2.0 + 0.9 * 0.5 - 0.5
    d0 = 1.0 + 0.9 * 0.5 - 0.5
    a2 = d2
    a1 = d1 + gamma * lam * a2
    a0 = d0 + gamma * lam * a1
    advantages, targets = generalised_advantages(signals, values, next_values, dones, gamma, lam)
    np.testing.assert_allclose(advantages[:, 0], [a0, a1, a2])
    np.testing.assert_allclose(targets, advantages + values)


def test_running_normaliser_matches_batch_statistics() -> None:
    data = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 4))
    normaliser = RunningNormaliser(4)
    for chunk in np.split(data, 10):
        normaliser.update(chunk)
    np.testing.assert_allclose(normaliser.mean, data.mean(0), atol=1e-3)
    np.testing.assert_allclose(normaliser.var, data.var(0), rtol=1e-2)


@pytest.mark.slow
def test_collect_learn_keeps_raw_episodes_and_resumes(tmp_path: Path) -> None:
    config = CollectConfig(
        task="SafetyBallRun-v0",
        run_dir=tmp_path / "run",
        epochs=1,
        steps_per_epoch=400,
        num_envs=2,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        learn(config)
        assert torch.get_num_threads() == 3  # a pipeline trains next, in the same process
    finally:
        torch.set_num_threads(before)
    episodes, epochs = load_raw_episodes(config.run_path)
    assert len(episodes) >= 2 and set(epochs) == {0}
    assert all(e.length == 100 for e in episodes)  # BallRun's time limit
    assert all(e.timeouts[-1] or e.terminals[-1] for e in episodes)
    assert all(np.all(np.abs(e.actions) <= 1.0) for e in episodes)
    # A second call with more epochs resumes from the saved learner state.
    learn(CollectConfig(**{**config.__dict__, "epochs": 2}))
    _, epochs = load_raw_episodes(config.run_path)
    assert set(epochs) == {0, 1}


def test_collect_never_replaces_a_dataset_without_force_and_checks_before_any_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    shipped = tmp_path / "datasets" / "SafetyBallRun-v0.hdf5"
    shipped.parent.mkdir()
    shipped.write_text("1,306 episodes of shipped data")

    def no_work(config: CollectConfig) -> None:
        raise AssertionError("the collection started")

    monkeypatch.setattr(collection, "learn", no_work)
    with pytest.raises(SystemExit) as exit_info:
        collect_cli.main(["--task", "SafetyBallRun-v0", "--epochs", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cdt collect: {Path('datasets/SafetyBallRun-v0.hdf5')} exists already")
    assert shipped.read_text() == "1,306 episodes of shipped data"
    assert not (tmp_path / "runs").exists()
    with pytest.raises(AssertionError, match="the collection started"):  # --force goes ahead
        collect_cli.main(["--task", "SafetyBallRun-v0", "--epochs", "1", "--force"])


def test_a_collection_whose_run_folder_another_process_writes_stops_before_any_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run = Path("runs") / "collect" / "SafetyBallRun-v0"
    monkeypatch.setattr(collection, "learn", lambda config: pytest.fail("the collection started"))
    with held_elsewhere(run, "cdt collect (pid 4242)"):  # a collection already under way
        with pytest.raises(SystemExit) as exit_info:
            collect_cli.main(["--task", "SafetyBallRun-v0", "--epochs", "1"])
    assert exit_info.value.code == 2
    assert f"cdt collect: {run} is in use by cdt collect (pid 4242)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_envs": 0}, "--num-envs must be at least 1, got 0"),
        ({"gamma": float("nan")}, "--gamma must lie in (0, 1], got nan"),
        ({"steps_per_epoch": -1}, "--steps-per-epoch must be at least 1, got -1"),
        ({"k_i": -0.1}, "--k-i must be a finite number >= 0"),
        ({"rise_start_epoch": 9, "rise_end_epoch": 3}, "must start rising (epoch 9)"),
    ],
)
def test_collect_config_refuses_values_no_collection_runs_with(
    values: dict[str, float], message: str
) -> None:
    with pytest.raises(UserError, match=re.escape(message)):
        CollectConfig(task="SafetyBallRun-v0", **values)  # type: ignore[arg-type]
