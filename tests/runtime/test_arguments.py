"""Command-line value types: bad values are refused with a message argparse can show."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable

import pytest

from runtime.arguments import (
    AT_LEAST_1,
    UNIT_INTERVAL,
    CommandParser,
    budget,
    finite_float,
    non_negative_int,
    positive_float,
    positive_int,
    share,
    unmet,
)


def test_good_values_pass_through() -> None:
    assert positive_int("3") == 3
    assert finite_float("-2.5") == -2.5
    assert positive_float("0.1") == 0.1
    assert budget("0") == 0.0


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (positive_int, "0", "must be at least 1, got 0"),
        (finite_float, "inf", "must be a finite number, got inf"),
        (positive_float, "0", "must be a positive number, got 0"),
        (positive_float, "nan", "must be a finite number, got nan"),
        (budget, "-1", "must be a finite number >= 0, got -1"),
        (budget, "nan", "must be a finite number, got nan"),
    ],
)
def test_bad_values_are_refused_with_the_value_named(
    parse: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(ArgumentTypeError, match=message):
        parse(text)


def test_command_parser_reads_negative_numbers_in_any_notation_as_values() -> None:
    parser = CommandParser(prog="cdt test")
    parser.add_argument("--target-reward", type=finite_float)
    parser.add_argument("--seed", type=non_negative_int, default=0)
    assert parser.parse_args(["--target-reward", "-1e9"]).target_reward == -1e9
    assert parser.parse_args(["--target-reward", "-.5"]).target_reward == -0.5


def test_command_parser_errors_are_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    parser = CommandParser(prog="cdt test")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--share", type=share)
    for argv in (["--seed", "-1"], ["--share", "2"], ["--nope"]):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("cdt test: ") and err.count("\n") == 1
        assert err.endswith("(see cdt test --help)\n")


def test_unmet_names_each_value_that_breaks_a_requirement() -> None:
    values = {"--a": 0, "--b": 3, "--c": None, "--d": float("nan")}
    assert unmet(AT_LEAST_1, values) == [
        "--a must be at least 1, got 0",
        "--d must be at least 1, got nan",  # NaN meets no requirement
    ]
    assert unmet(UNIT_INTERVAL, {"--d": float("nan"), "--e": 0.5}) == [
        "--d must lie in [0, 1], got nan"
    ]
