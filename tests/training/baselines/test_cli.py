"""`python -m training.baselines.cli`: train, export and say where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.baselines.synthetic import tiny_episodes
from training.baselines.cli import main
from training.data.dataset import save_dataset
from training.ledger import read_ledger


def test_main_trains_exports_and_prints_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], private_ledger: Path
) -> None:
    dataset = save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    out = tmp_path / "models" / "bcq-lag-tiny"
    main(
        [
            "--algo", "bcq-lag", "--dataset", str(dataset), "--out", str(out),
            "--cost-limit", "4", "--update-steps", "3", "--seed", "1", "--batch-size", "16",
            "--actor-hidden", "8", "8", "--critic-hidden", "8", "8", "--vae-hidden", "8",
            "--action-low", "-1", "-2", "--action-high", "1", "2",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert str(out / "model.onnx") in printed
    card = json.loads((out / "model.json").read_text())
    assert card["algo"] == "bcq-lag" and card["training_config"]["seed"] == 1
    assert card["training_config"]["steps"] == 3  # --update-steps, as for CDT
    assert card["action_low"] == [-1.0, -2.0]
    (entry,) = read_ledger(private_ledger)  # a baseline run is in the ledger too
    assert (entry.command, entry.subject, entry.outcome) == ("train", str(out), "done")
    assert (entry.algorithm, entry.task, entry.seed, entry.steps) == (
        "bcq-lag",
        "TinyTask-v0",
        1,
        3,
    )
    assert entry.details == {}  # trained on the CPU, which the entry names anyway


def test_main_without_qualifying_trajectories_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    argv = ["--algo", "bc-risky", "--dataset", str(dataset), "--cost-limit", "1000", "--steps", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "model")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no trajectory qualifies" in err and err.count("\n") == 1


def test_main_refuses_bad_values_and_a_model_in_out_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    out = tmp_path / "shipped"
    out.mkdir()
    (out / "model.json").write_text("{}")
    base = ["--algo", "bc-safe", "--dataset", str(dataset), "--steps", "1"]
    cases = [
        (["--steps", "0", "--out", str(tmp_path / "new")], "--steps must be at least 1, got 0"),
        (["--gamma", "nan", "--out", str(tmp_path / "new")], "--gamma must be finite, got nan"),
        (["--out", str(out)], "pass --force to replace that model"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *extra])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("cdt train: ") and message in err and err.count("\n") == 1
    assert (out / "model.json").read_text() == "{}" and not (tmp_path / "new").exists()
