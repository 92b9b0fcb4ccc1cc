"""`cdt train`'s checks of the settings against the dataset, the machine and the simulator
(training/train_cli.py, training/learn/checks.py): a mistake is one line naming the flag, exit
code 2, and nothing written: no run folder, no ledger line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.training.cdt_synthetic import make_episode, write_dataset
from training.data.dataset import save_dataset
from training.ledger import read_ledger
from training.train_cli import main

TINY = ["--update-steps", "2", "--batch-size", "2", "--embedding-dim", "8", "--num-heads", "2",
        "--num-layers", "1", "--no-tensorboard"]  # fmt: skip
EPISODE_STEPS = 12


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "tiny.hdf5")


def even_dataset(path: Path, attrs: dict[str, object], state_dim: int = 7) -> Path:
    """Six episodes of EPISODE_STEPS steps each, with `state_dim` observations and 2 actions."""
    rng = np.random.default_rng(0)
    episodes = [make_episode(rng, EPISODE_STEPS, 0.3) for _ in range(6)]
    if state_dim != episodes[0].observations.shape[1]:
        episodes = [
            episode._replace(
                observations=np.resize(episode.observations, (EPISODE_STEPS, state_dim)),
                next_observations=np.resize(episode.next_observations, (EPISODE_STEPS, state_dim)),
            )
            for episode in episodes
        ]
    return save_dataset(path, episodes, attrs)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `cdt train argv` stops with (exit code 2)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("cdt train: ") and error.count("\n") == 1, error
    return error


def test_a_context_longer_than_the_longest_episode_is_refused_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], private_ledger: Path
) -> None:
    data = even_dataset(tmp_path / "even.hdf5", {"env_id": "SafetyBallRun-v0"})
    out = tmp_path / "runs"
    argv = ["--dataset", str(data), "--out-dir", str(out), *TINY, "--eval-every", "0"]
    error = refused([*argv, "--seq-len", "1000"], capsys)
    assert f"--seq-len must be at most {EPISODE_STEPS} " in error and "got 1000" in error
    assert not out.exists() and not private_ledger.exists()  # no run folder, no ledger line
    main([*argv, "--seq-len", str(EPISODE_STEPS)])  # a window of a whole episode trains
    assert (out / "cdt-SafetyBallRun-v0-seed0" / "last.pt").is_file()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--embedding-dim", "0"], "--embedding-dim must be at least 1, got 0"),
        (["--num-layers", "0"], "--num-layers must be at least 1, got 0"),
        (["--num-heads", "0"], "--num-heads must be at least 1, got 0"),
        (["--embedding-dim", "6", "--num-heads", "4"], "multiple of --num-heads (4), got 6"),
        (["--eval-budgets"], "--eval-budgets must name at least one budget"),
        (["--seed", "-1"], "--seed must lie in [0, 2**63 - 1], got -1"),
        (["--seed", str(2**64)], "--seed must lie in [0, 2**63 - 1]"),
        (["--outlier-filter", "--outlier-grid", "0", "5"], "--outlier-grid must be at least 1"),
    ],
)
def test_sizes_budgets_and_seeds_no_run_can_use_are_refused(
    dataset_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    private_ledger: Path,
    flags: list[str],
    message: str,
) -> None:
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path / "runs"), "--eval-every"]
    error = refused([*argv, "0", "--update-steps", "1", *flags], capsys)
    assert message in error
    assert not (tmp_path / "runs").exists() and not private_ledger.exists()


def test_more_threads_than_four_per_core_are_refused(
    dataset_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    too_many = 4 * (os.cpu_count() or 1) + 1  # 100,000 segfaulted in libgomp
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path / "runs"), *TINY]
    error = refused([*argv, "--eval-every", "0", "--num-threads", str(too_many)], capsys)
    assert f"--num-threads must be at most {too_many - 1} " in error
    assert not (tmp_path / "runs").exists()


def test_a_batch_whose_step_cannot_fit_in_memory_is_refused(
    dataset_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from training.learn import checks  # here: without it, a batch this big is ~30 GB

    monkeypatch.setattr(checks, "device_memory", lambda device: 10**9)  # a 1 GB machine
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path / "runs"), *TINY]
    error = refused([*argv, "--eval-every", "0", "--batch-size", "100000000"], capsys)
    assert "--batch-size 100000000: one training step needs at least" in error
    assert "1.0 GB of memory; use a smaller --batch-size" in error
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("attrs", "state_dim", "message"),
    [
        ({}, 7, "names no task (no env_id attribute)"),
        ({"env_id": "SafetyBallRunn-v0"}, 7, "names a task the simulator cannot make"),
        ({"env_id": "SafetyBallRun-v0"}, 5, "has 5 observations and 2 actions, but its task"),
    ],
)
def test_in_loop_evaluation_needs_a_simulator_task_that_fits_the_data(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    private_ledger: Path,
    attrs: dict[str, object],
    state_dim: int,
    message: str,
) -> None:
    data = even_dataset(tmp_path / "data.hdf5", attrs, state_dim)
    argv = ["--dataset", str(data), "--out-dir", str(tmp_path / "runs"), "--run-name", "run"]
    error = refused([*argv, *TINY, "--eval-every", "1"], capsys)
    assert message in error and "pass --eval-every 0 to train without in-loop evaluation" in error
    assert not (tmp_path / "runs").exists() and not private_ledger.exists()
    main([*argv, *TINY, "--eval-every", "0"])  # no evaluation, no simulator needed
    assert (tmp_path / "runs" / "run" / "last.pt").is_file()


def test_a_resumed_run_is_recorded_with_its_own_task_and_recipe(
    dataset_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    private_ledger: Path,
) -> None:
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path), "--run-name", "ball"]
    main([*argv, "--preset", "cpu-budget", *TINY, "--eval-every", "0", "--fail-fast-step", "0"])
    last = tmp_path / "ball" / "last.pt"
    main(["--resume", str(last), "--update-steps", "3", "--learning-rate", "0.5", "--seed", "7"])
    first, resumed = read_ledger(private_ledger)
    assert first.task == resumed.task == "SafetyBallRun-v0"  # not the CLI's default dataset's
    assert (
        first.recipe
        == resumed.recipe
        == "cpu-budget --embedding-dim 8 --num-layers 1 " + ("--num-heads 2 --batch-size 2")
    )  # the run's preset and flags; flags --resume ignores are not in it
    assert (resumed.seed, resumed.steps, resumed.subject) == (0, 3, str(tmp_path / "ball"))
    assert "ignored --learning-rate --seed" in caplog.text
    stored = json.loads(last.with_suffix(".json").read_text())
    assert (stored["learning_rate"], stored["update_steps"]) == (3e-4, 3)


def test_a_resume_whose_settings_cannot_be_read_is_refused(
    dataset_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path), "--run-name", "run"]
    main([*argv, *TINY, "--eval-every", "0"])
    last = tmp_path / "run" / "last.pt"
    last.with_suffix(".json").write_text('{"unknown": 1}')
    capsys.readouterr()
    error = refused(["--resume", str(last), "--update-steps", "3"], capsys)
    assert error.startswith(f"cdt train: --resume {last}: ") and "no training settings" in error
