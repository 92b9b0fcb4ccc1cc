"""A baseline's card values are checked before training, and its graph and card are written
together: no run leaves a model.onnx without its model.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.training.baselines.synthetic import tiny_episodes
from training.baselines import export
from training.baselines.cli import main
from training.baselines.config import BaselineConfig
from training.baselines.export import export_baseline
from training.baselines.registry import train_baseline
from training.data.dataset import OfflineDataset, save_dataset

TINY = ["--cost-limit", "4", "--steps", "2", "--batch-size", "16", "--actor-hidden", "8", "8"]
TINY += ["--critic-hidden", "8", "8", "--vae-hidden", "8"]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--action-low", "1", "1", "--action-high", "-1", "-1"], "each low must be at most"),
        (["--action-low", "-1", "--action-high", "1"], "2 values each"),
        (["--action-low", "-1", "-1"], "--action-low and --action-high go together"),
        (["--out", "{tmp}/models/.hidden"], "not a model name"),
    ],
)
def test_card_values_from_flags_are_refused_before_training(
    dataset: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    private_ledger: Path,
    flags: list[str],
    said: str,
) -> None:
    out = tmp_path / "models" / "bcq-lag-tiny"
    argv = ["--algo", "bcq-lag", "--dataset", str(dataset), "--out", str(out), *TINY]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, *(flag.format(tmp=tmp_path) for flag in flags)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "models").exists() and not private_ledger.exists()  # never trained
    main([*argv, "--action-low", "-1", "-2", "--action-high", "1", "2"])  # corrected: it runs
    assert json.loads((out / "model.json").read_text())["action_low"] == [-1.0, -2.0]


def test_a_failed_export_leaves_neither_file(
    tiny_dataset: OfflineDataset,
    tiny_config: Callable[..., BaselineConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tiny_config("bc-all", steps=2)
    trained = train_baseline(config, tiny_dataset)
    assert config.out is not None

    def fails_midway(policy: object, path: Path, *dims: int) -> Path:
        path.write_bytes(b"half a graph")
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(export, "export_onnx", fails_midway)
    with pytest.raises(RuntimeError, match="the exporter failed"):
        export_baseline(trained, tiny_dataset, config.out)
    assert not config.out.exists() or not any(config.out.iterdir())
    assert [path.name for path in config.out.parent.iterdir() if path.name.startswith(".")] == []
