"""Command-line value types: bad values are refused with a message argparse can show."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable

import pytest

from runtime.arguments import budget, finite_float, positive_float, positive_int


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
