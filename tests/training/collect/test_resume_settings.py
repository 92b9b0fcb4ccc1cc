"""`cdt collect` continues a run folder only with the settings its epochs were collected with,
and a finalized stopped run says how many epochs it holds."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import tyro

from tests.training.cdt_synthetic import make_episodes
from training.collect import cli as collect_cli
from training.collect import collection
from training.collect.settings import CollectConfig
from training.data.dataset import load_dataset

TASK = ["--task", "SafetyBallRun-v0"]  # 50 epochs; threshold 5 -> 80 over epochs 5-40


def _collected(run_dir: Path, config: CollectConfig, epochs: int) -> None:
    """A run folder as `learn` leaves it after `epochs` epochs of `config`."""
    run_dir.mkdir(parents=True)
    saved = {**dataclasses.asdict(config), "schedule": dataclasses.asdict(config.schedule())}
    (run_dir / "config.json").write_text(json.dumps(saved, default=str))
    for epoch in range(epochs):
        episodes = make_episodes(count=6, seed=epoch)
        collection._save_raw_epoch(run_dir, epoch, episodes, config.schedule().threshold(epoch))


@pytest.fixture
def started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[str], list[CollectConfig]]:
    """The argv that points at a run folder of two epochs collected with thresholds 50 -> 10,
    and the configs `learn` was called with (it collects nothing here)."""
    monkeypatch.chdir(tmp_path)
    argv = [*TASK, "--run-dir", "run", "--out", "out.hdf5"]
    argv += ["--threshold-start", "50", "--threshold-end", "10"]
    _collected(tmp_path / "run", tyro.cli(CollectConfig, args=argv), epochs=2)
    learnt: list[CollectConfig] = []
    monkeypatch.setattr(collection, "learn", learnt.append)
    monkeypatch.setattr(collection, "finalize", lambda config: config.output_path)
    return argv, learnt


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        (["--threshold-start", "5", "--threshold-end", "80"], "--threshold-start 50.0 -> 5.0"),
        (["--seed", "3"], "--seed 0 -> 3"),
        (["--steps-per-epoch", "999"], "--steps-per-epoch 20000 -> 999"),
        (["--finalize-only", "--seed", "3"], "--seed 0 -> 3"),
    ],
)
def test_a_resume_with_other_settings_is_one_line_and_starts_nothing(
    started: tuple[list[str], list[CollectConfig]],
    capsys: pytest.CaptureFixture[str],
    changed: list[str],
    said: str,
) -> None:
    argv, learnt = started
    before = Path("run/config.json").read_text()
    with pytest.raises(SystemExit) as exit_info:
        collect_cli.main([*argv, *changed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "run holds 2 epochs collected with other settings" in err
    assert err.count("\n") == 1 and learnt == []
    assert Path("run/config.json").read_text() == before and not Path("out.hdf5").exists()


def test_the_defaults_after_a_changed_schedule_are_refused(
    started: tuple[list[str], list[CollectConfig]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        collect_cli.main([*TASK, "--run-dir", "run", "--out", "out.hdf5"])
    assert "--threshold-end 10.0 -> 80.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        [],  # the same settings
        ["--epochs", "60", "--env-workers", "2", "--max-per-cell", "3"],  # further, elsewhere
        ["--fall-to", "5", "--fall-epochs", "10"],  # a later phase: epochs 0-1 keep 50
        ["--threshold-end", "20"],  # the ramp starts at epoch 5: epochs 0-1 keep 50
    ],
)
def test_a_resume_that_keeps_the_epochs_collected_goes_on(
    started: tuple[list[str], list[CollectConfig]], extra: list[str]
) -> None:
    argv, learnt = started
    collect_cli.main([*argv, *extra])
    assert len(learnt) == 1


def test_a_negative_seed_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        collect_cli.main([*TASK, "--seed", "-1"])
    assert exit_info.value.code == 2
    assert "--seed must be at least 0, got -1" in capsys.readouterr().err


def test_a_stopped_run_finalized_records_the_epochs_it_holds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = CollectConfig(task="SafetyBallRun-v0", run_dir=tmp_path / "run", out=tmp_path / "d.h5")
    _collected(config.run_path, config, epochs=2)
    with caplog.at_level(logging.WARNING):
        collection.finalize(config)
    attrs = load_dataset(config.output_path).attrs
    assert attrs["epochs_collected"] == 2 and attrs["schedule"]["epochs"] == 50  # as planned
    assert "holds 2 of the schedule's 50 epochs" in caplog.text
