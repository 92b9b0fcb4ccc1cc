"""`cdt pipeline --name` is a model name, checked before any stage: never a path."""

from __future__ import annotations

from pathlib import Path

import pytest

from training import pipeline
from training.pipeline import PipelineConfig


@pytest.mark.parametrize("name", ["../../evil", "a/b", ".hidden", "-dash", "x" * 129])
def test_a_name_no_model_card_takes_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    work = tmp_path / "a" / "b"  # ../../evil would land in tmp_path
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["--task", "SafetyBallRun-v0", f"--name={name}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cdt pipeline: --name ") and "not a model name" in err
    assert err.count("\n") == 1
    assert sorted(path.name for path in tmp_path.rglob("*")) == ["a", "b"]  # nothing written


def test_a_model_name_is_taken_as_given() -> None:
    config = PipelineConfig(task="SafetyBallRun-v0", name="my-model_2.1")
    assert config.run_dir == Path("runs/pipeline-my-model_2.1")
    assert config.model_dir == Path("models/my-model_2.1")
