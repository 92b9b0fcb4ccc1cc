"""Command-line value types and the argument parser shared by the `cdt` commands: a bad value is
one line naming the option, never a traceback from deep inside the command."""

from __future__ import annotations

import argparse
import math
import re
import sys
from argparse import ArgumentTypeError
from collections.abc import Callable, Mapping
from typing import NamedTuple, NoReturn

from runtime.user_errors import USER_ERROR_EXIT

# Any number, "-1e9" and "-inf" included: argparse's own pattern (-1, -.5) takes "-1e9" for an
# option, so `--target-reward -1e9` failed with "expected one argument".
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.I)


class CommandParser(argparse.ArgumentParser):
    """argparse with one-line errors (`prog: problem (see prog --help)`, exit 2) that reads
    negative numbers in any notation as values."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        """Print the problem as one line and exit 2 (argparse prints the whole usage first)."""
        exit_on_mistake(self.prog, message)


def exit_on_mistake(prog: str, message: str) -> NoReturn:
    """A command-line mistake, as every `cdt` parser reports it: `prog: message (see prog
    --help)` on stderr, exit 2."""
    sys.stderr.write(f"{prog}: {message} (see {prog} --help)\n")
    raise SystemExit(USER_ERROR_EXIT)


def positive_int(text: str) -> int:
    """An integer >= 1 (episodes, seeds, workers, bins)."""
    value = int(text)
    if value < 1:
        raise ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (seeds, steps)."""
    value = int(text)
    if value < 0:
        raise ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def finite_float(text: str) -> float:
    """Any finite number."""
    value = float(text)
    if not math.isfinite(value):
        raise ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def budget(text: str) -> float:
    """A cost budget: a finite number >= 0."""
    return non_negative_float(text)


def share(text: str) -> float:
    """A share of episodes or of a budget: a number in [0, 1]."""
    value = finite_float(text)
    if not 0 <= value <= 1:
        raise ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


class Requirement(NamedTuple):
    """What a value must satisfy, for settings checked after parsing (dataclass configs)."""

    holds: Callable[[float], bool]
    text: str


AT_LEAST_1 = Requirement(lambda value: value >= 1, "must be at least 1")
AT_LEAST_0 = Requirement(lambda value: value >= 0, "must be at least 0")
FINITE = Requirement(math.isfinite, "must be a finite number")
FINITE_AT_LEAST_0 = Requirement(
    lambda value: math.isfinite(value) and value >= 0, "must be a finite number >= 0"
)
POSITIVE = Requirement(
    lambda value: math.isfinite(value) and value > 0, "must be a positive number"
)
UNIT_INTERVAL = Requirement(lambda value: 0 <= value <= 1, "must lie in [0, 1]")  # NaN fails
OPEN_UNIT_INTERVAL = Requirement(lambda value: 0 < value <= 1, "must lie in (0, 1]")


def unmet(requirement: Requirement, values: Mapping[str, float | None]) -> list[str]:
    """One phrase per named value (None: not given) that breaks `requirement`."""
    return [
        f"{name} {requirement.text}, got {value}"
        for name, value in values.items()
        if value is not None and not requirement.holds(value)
    ]
