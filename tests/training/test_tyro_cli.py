"""`training.tyro_cli.parse`: tyro's mistakes as one line and exit code 2, its help untouched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from training.tyro_cli import box_problem, parse


@dataclass(frozen=True)
class _Config:
    dataset: Path
    """The HDF5 file to train on."""
    preset: Literal["cpu", "paper"] = "cpu"
    """Which recipe."""
    steps: int = 10
    """Gradient steps."""


def _mistake(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        parse(_Config, args, "cdt toy")
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.endswith(" (see cdt toy --help)\n") and err.count("\n") == 1
    return err


def test_a_bad_value_is_one_line_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    err = _mistake(["--dataset", "d.h5", "--steps", "ten"], capsys)
    assert err.startswith("cdt toy: Error parsing --steps:") and "'ten'" in err
    assert "Gradient steps" not in err  # the option's help stays in --help


def test_a_bad_choice_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    err = _mistake(["--dataset", "d.h5", "--preset", "gpu"], capsys)
    assert "'gpu'" in err and "'cpu'" in err and "'paper'" in err


def test_a_misspelt_option_gets_the_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    err = _mistake(["--dataset", "d.h5", "--stepz", "3"], capsys)
    assert "Unrecognized options: --stepz" in err and "(perhaps you meant --steps INT)" in err


def test_a_missing_option_is_named_without_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    err = _mistake([], capsys)
    assert "--dataset PATH" in err and "HDF5" not in err


def test_help_and_a_good_parse_are_tyros_own(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(_Config, ["--dataset", "d.h5"], "cdt toy") == _Config(Path("d.h5"))
    with pytest.raises(SystemExit) as stopped:
        parse(_Config, ["--help"], "cdt toy")
    assert stopped.value.code in (0, None)
    out, err = capsys.readouterr()
    assert "Gradient steps" in out and err == ""


def test_text_that_is_not_a_box_is_kept_on_one_line() -> None:
    assert box_problem("Error: no such\n  shell") == "Error: no such shell"
