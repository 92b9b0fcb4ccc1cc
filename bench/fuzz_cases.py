"""What the file fuzzers (`bench/fuzz_datasets.py`, `bench/fuzz_models.py`) record per case, and
how they list the cases that broke an invariant."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class Result(NamedTuple):
    """What one check (a loader, a command, a reload) did with one case: `ok`, `refused` (one
    clear line), `removed` (a reload dropped the model) or `violation`."""

    check: str
    outcome: str
    detail: str


class Case(NamedTuple):
    index: int
    kind: str
    variant: str
    results: list[Result]


def violation_lines(
    cases: Sequence[Case], reproduce: Callable[[Case], str], width: int = 300
) -> list[str]:
    """The count of violations, then each with its case and the command that repeats it."""
    violations = [(case, r) for case in cases for r in case.results if r.outcome == "violation"]
    lines = ["", f"violations: {len(violations)}"]
    for case, result in violations:
        detail = " ".join(result.detail.split())[:width]
        lines.append(f"  case {case.index} [{case.kind}: {case.variant}] {result.check}: {detail}")
        lines.append(f"    reproduce: {reproduce(case)}")
    return lines
