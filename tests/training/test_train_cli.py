"""`cdt train` (training/train_cli.py): the CLI, its one-line errors, and the checkpoint
evaluation it hands the training loop."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from runtime.episodes import EpisodeResult
from tests.training.cdt_synthetic import write_dataset
from tests.training.held_lock import held_elsewhere
from training.checkpoint import load_checkpoint
from training.evaluation import checkpoint_scores
from training.ledger import read_ledger
from training.train_cli import main


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "tiny.hdf5")


TINY = ["--update-steps", "2", "--batch-size", "2", "--embedding-dim", "8", "--num-heads", "2",
        "--num-layers", "1", "--no-tensorboard"]  # fmt: skip


def test_train_cli_trains_and_prints_the_checkpoint(
    dataset_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], private_ledger: Path
):
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path), "--run-name", "cli"]
    main([*argv, *TINY, "--eval-every", "0"])
    assert (tmp_path / "cli" / "last.pt").is_file()
    assert "last.pt" in capsys.readouterr().out
    (entry,) = read_ledger(private_ledger)  # the run is in the ledger, with its fate
    assert (entry.command, entry.outcome, entry.steps) == ("train", "done", 2)
    assert entry.subject == str(tmp_path / "cli")


def test_train_cli_refuses_missing_files_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    for flag in ("--dataset", "--resume"):
        with pytest.raises(SystemExit) as stopped:
            main([flag, str(tmp_path / "missing")])
        assert stopped.value.code == 2
        error = capsys.readouterr().err
        assert error.startswith(f"cdt train: {flag} ") and error.count("\n") == 1


def test_train_cli_refuses_corrupt_files_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    corrupt = tmp_path / "corrupt.hdf5"
    corrupt.write_text("not hdf5")
    with pytest.raises(SystemExit) as stopped:
        main(["--dataset", str(corrupt)])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("cdt train: not a readable HDF5 file") and error.count("\n") == 1


def test_train_cli_scores_checkpoints_in_the_simulator_and_keeps_the_best(
    dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    episodes: list[int] = []

    def simulated(model: Any, stats: Any, task: str, specs: Any, budget_scale: float) -> Any:
        episodes.append(len(specs))  # every budget within its share: admissible
        return [EpisodeResult(spec, 100.0, 0.5 * spec.target_cost, 10) for spec in specs]

    monkeypatch.setattr(checkpoint_scores, "evaluate_model", simulated)
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path), "--run-name", "scored"]
    main([*argv, *TINY, "--eval-every", "1", "--eval-episodes", "2"])
    run = tmp_path / "scored"
    assert len(episodes) == 2  # steps 1 and 2
    best = load_checkpoint(run / "best.pt")
    assert best["evaluation"]["protocol"] == "selection" and best["evaluation"]["admissible"]
    with (run / "eval.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["step"]) for row in rows] == [1, 2] and "score" in rows[0]


def test_train_cli_never_starts_a_new_run_in_a_folder_holding_an_earlier_one(
    dataset_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    earlier = tmp_path / "cdt-SafetyBallRun-v0-seed0"  # the default name: <algo>-<task>-seed<seed>
    earlier.mkdir()
    (earlier / "best.pt").write_text("an earlier run's choice")
    with pytest.raises(SystemExit) as stopped:
        main(["--dataset", str(dataset_path), "--out-dir", str(tmp_path), *TINY])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"--resume {earlier / 'last.pt'}" in error
    assert sorted(p.name for p in earlier.iterdir()) == ["best.pt"]  # nothing written beside it


def test_train_cli_refuses_a_run_folder_another_process_is_writing(
    dataset_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], private_ledger: Path
):
    argv = ["--dataset", str(dataset_path), "--out-dir", str(tmp_path), "--run-name", "busy"]
    main([*argv, *TINY, "--eval-every", "0"])
    run = tmp_path / "busy"
    written = (run / "last.pt").read_bytes()
    capsys.readouterr()
    with held_elsewhere(run, "cdt pipeline (pid 4242)"), pytest.raises(SystemExit) as stopped:
        main(["--resume", str(run / "last.pt"), "--update-steps", "4", "--no-tensorboard"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "in use by cdt pipeline (pid 4242)" in error
    assert (run / "last.pt").read_bytes() == written  # the holder's run is left alone
    assert [entry.outcome for entry in read_ledger(private_ledger)] == ["done"]  # no second run
    main(["--resume", str(run / "last.pt"), "--update-steps", "4", "--no-tensorboard"])
    assert load_checkpoint(run / "last.pt")["step"] == 4  # free again once the holder is gone


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--update-steps", "0"], "--update-steps must be at least 1, got 0"),
        (["--num-threads", "0"], "--num-threads must be at least 1, got 0"),
        (["--eval-every", "-1"], "--eval-every must be at least 0, got -1"),
        (["--learning-rate", "nan"], "--learning-rate must be finite, got nan"),
        (["--selection-max-share-over", "2"], "must lie in [0, 1], got 2"),
        (["--device", "cuda:7"], "--device cuda:7:"),
        (["--compile"], "--compile is for CUDA devices, not cpu"),
    ],
)
def test_train_cli_refuses_values_no_run_can_train_with(
    dataset_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
):
    with pytest.raises(SystemExit) as stopped:
        main(["--dataset", str(dataset_path), "--out-dir", str(tmp_path), *flags])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("cdt train: ") and message in error and error.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
