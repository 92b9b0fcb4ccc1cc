"""Command-line value types shared by the `cdt` commands: a bad value is one argparse line
naming the option, never a traceback from deep inside the command."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError


def positive_int(text: str) -> int:
    """An integer >= 1 (episodes, seeds, workers, bins)."""
    value = int(text)
    if value < 1:
        raise ArgumentTypeError(f"must be at least 1, got {value}")
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


def budget(text: str) -> float:
    """A cost budget: a finite number >= 0."""
    value = finite_float(text)
    if value < 0:
        raise ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value
