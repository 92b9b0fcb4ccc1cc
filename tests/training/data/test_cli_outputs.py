"""`cdt dataset`'s outputs never overwrite each other, and every `--help` renders as written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.training.data.synthetic_dsrl import make_episode
from training import card_update
from training.data.cli import main
from training.data.dataset import save_dataset

SUBCOMMANDS = ["inspect", "reduce", "add-outliers", "filter", "expand", "compact"]


@pytest.fixture
def dataset_path(tmp_path: Path) -> Path:
    safe, costly = make_episode(np.ones(10), np.zeros(10)), make_episode(np.ones(10), np.ones(10))
    episodes = [safe, costly]  # cost returns 0 and 10
    return save_dataset(tmp_path / "in.hdf5", episodes, {"env_id": "SafetyCarRun-v0"})


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["reduce", "--out", "{out}/r.hdf5", "--plot", "{out}/r.hdf5"], "--out and --plot"),
        (["compact", "--out", "{out}/c.hdf5", "--plot", "{out}/./c.hdf5"], "--out and --plot"),
        (["inspect", "--json", "{out}/s.json", "--plot", "{out}/s.json"], "--json and --plot"),
        (["filter", "--out", "{out}/f.hdf5", "--plot", "{out}/sub/../f.hdf5"], "--out and --plot"),
    ],
)
def test_two_outputs_naming_one_file_are_refused_before_any_work(
    dataset_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    options: str,
) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    command, *rest = argv
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(dataset_path), *(a.format(out=out) for a in rest), "--force"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{options} name one file" in err and err.count("\n") == 1
    assert sorted(path.name for path in out.iterdir()) == ["sub"]  # nothing written


def test_distinct_outputs_are_all_written(dataset_path: Path, tmp_path: Path) -> None:
    main(["compact", str(dataset_path), "--out", str(tmp_path / "c.hdf5")])
    plot = tmp_path / "d.png"
    main(["compact", str(dataset_path), "--out", str(tmp_path / "d.hdf5"), "--plot", str(plot)])
    assert (tmp_path / "c.hdf5").read_bytes() == (tmp_path / "d.hdf5").read_bytes()
    assert plot.read_bytes().startswith(b"\x89PNG")  # --plot was once ignored here


def _help(run: object, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run(argv)  # type: ignore[operator]
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], *([command] for command in SUBCOMMANDS)])
def test_dataset_help_renders_as_written(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    shown = _help(main, [*argv, "--help"], capsys)
    assert "%%" not in shown and "'option_strings'" not in shown  # no format code, no dict
    if argv in (["compact"], []):
        assert "~40 % smaller" in " ".join(shown.split())


def test_card_update_help_renders_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    shown = " ".join(_help(card_update.main, ["--help"], capsys).split())
    assert "10 % of the reward range" in shown and "%%" not in shown
