"""`cdt report` stopped (Ctrl-C, SIGTERM) or pointed at a cell another dataset started: one line
each, the way to go on named, and no traceback (training/report/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.files import CARD_FILE
from tests.training.baselines.synthetic import tiny_episodes
from training.baselines import registry
from training.baselines.resume import ProgressMismatch
from training.data.dataset import save_dataset
from training.interrupt import TrainingInterrupted
from training.report.cli import main


@pytest.fixture
def grid(tmp_path: Path, private_ledger: Path) -> list[str]:
    """A one-cell grid (bc-all, seed 0) on a tiny TinyTask dataset, its folders under tmp."""
    dataset = save_dataset(tmp_path / "a.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    argv = ["--algorithms", "bc-all", "--datasets", str(dataset), "--seeds", "1"]
    argv += ["--models-dir", str(tmp_path / "grid"), "--out", str(tmp_path / "reports")]
    argv += ["--episodes", "1", "--eval-seeds", "1", "--train.steps", "2"]
    argv += ["--train.batch-size", "8", "--train.actor-hidden", "8"]
    return [*argv, "--train.action-low", "-1", "-2", "--train.action-high", "1", "2"]


def _stops(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """The grid's training stops with `error` (as Ctrl-C or SIGTERM stops it)."""

    def train_and_export(*args: Any, **kwargs: Any) -> Path:
        raise error

    monkeypatch.setattr(registry, "train_and_export", train_and_export)


def _answer(argv: list[str], capsys: pytest.CaptureFixture[str], **kwargs: Any) -> tuple[Any, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv, **kwargs)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return exit_info.value.code, err


def test_ctrl_c_is_one_line_with_the_command_that_goes_on(
    grid: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _stops(monkeypatch, KeyboardInterrupt())
    code, err = _answer(grid, capsys)
    assert code == 130
    assert err.startswith("cdt report: interrupted; continue with: cdt report --algorithms bc-all")
    assert err.rstrip().endswith("--reuse")  # finished cells and evaluations are kept
    again = [*grid, "--no-reuse"]
    _, err = _answer(again, capsys)
    assert "--no-reuse" not in err and err.count("--reuse") == 1


def test_a_stopped_training_names_its_step_and_progress(
    grid: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress = tmp_path / "grid" / "TinyTask" / "bc-all-s0" / "progress.pt"
    _stops(monkeypatch, TrainingInterrupted(progress, 1234, "run the same command again"))
    code, err = _answer([*grid, "--reuse"], capsys)
    assert code == 130
    assert err.startswith(f"cdt report: interrupted at step 1,234 ({progress}); continue with: ")
    assert err.count("--reuse") == 1
    last = tmp_path / "grid" / "TinyTask" / "runs" / "cdt-s0" / "last.pt"
    _stops(monkeypatch, TrainingInterrupted(last, 9))  # a sequence model's cell
    _, err = _answer(grid, capsys)
    assert "last.pt, not resumed by the grid); continue with" in err


def test_a_cell_started_on_another_dataset_is_refused_before_any_training(
    grid: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The repro: a grid stopped on one dataset, run again on another of the same task. The cell
    folder is the table's cell (`<Label>/<algo>-s<seed>`, which `--reuse` and runs trained
    elsewhere go by), so the grid refuses rather than continue the other dataset's run."""
    cell = tmp_path / "grid" / "TinyTask" / "bc-all-s0"
    cell.mkdir(parents=True)
    (cell / "progress.pt").write_bytes(b"an unfinished run")
    (cell / "progress.json").write_text('{"dataset": "missing.hdf5", "algo": "bc-all"}')

    def trained(*args: Any, **kwargs: Any) -> Path:
        raise AssertionError("a cell trained")

    monkeypatch.setattr(registry, "train_and_export", trained)
    code, err = _answer(grid, capsys)
    dataset = tmp_path / "a.hdf5"
    assert code == 2
    assert err.startswith(
        f"cdt report: {cell} holds an unfinished bc-all run on dataset missing.hdf5, not {dataset}"
    )
    assert f"--datasets LABEL={dataset}" in err and "--models-dir" in err
    assert f"delete {cell / 'progress.pt'}" in err
    (cell / CARD_FILE).write_text("{}")  # a finished model is reused as it is: no refusal
    (cell / "progress.pt").unlink()  # ... and a deleted progress file is no refusal either
    with pytest.raises(AssertionError, match="a cell trained"):
        main(grid)


def test_other_training_settings_than_the_cells_unfinished_run_are_one_line(
    grid: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def mismatch(*args: Any, **kwargs: Any) -> Path:
        raise ProgressMismatch(
            "x/progress.pt holds a run with other settings (batch_size 8 -> 16): train with"
            " those, or delete the file to start over"
        )

    monkeypatch.setattr(registry, "train_and_export", mismatch)
    code, err = _answer(grid, capsys)
    assert code == 2
    assert err == (
        "cdt report: x/progress.pt holds a run with other settings (batch_size 8 -> 16): train"
        " with those, or delete the file to start over, or give the grid another --models-dir\n"
    )
