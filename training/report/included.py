"""Per-seed runs that an earlier `cdt report` recorded, joining a new table (`--include-runs`).

A training run on these CPUs takes minutes to an hour and its model folder is not kept, while
its evaluated scores are in the earlier table's JSON (`runs`). A table that gathers rows measured
in several sessions reads them from there instead of training them again. Each entry is FILE
(every run in it) or ALGO[,ALGO...]=FILE (only those rows); ALGO>ROW puts ALGO's runs in row ROW
(`cdt>cdt-guided`: the guided CDT beside the plain one), and @TASK[,TASK...] before the `=` keeps
only those columns (`cdt@AntRun,BallRun=FILE`: the other tasks' runs were measured again). The
earlier table's CPU stays with them, so the new table can say where its figures came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.report.grid import split_label
from training.report.tables import RunResult


@dataclass(frozen=True)
class IncludedRuns:
    """The runs taken from one earlier report, and where they were measured."""

    path: Path
    runs: list[RunResult]
    cpu: str
    """the CPU the earlier report's episodes ran on, as its JSON records it."""


def _parse_entry(entry: str) -> tuple[dict[str, str], set[str], Path]:
    """({algorithm in the file: its row in the new table}, {tasks kept}, file); no names: every
    run as is, no tasks: every column."""
    label, path = split_label(entry)  # ALGOS=FILE reads like --include-existing's LABEL=DIR
    algorithms, _, tasks = (label or "").partition("@")
    rows = {}
    for name in filter(None, algorithms.split(",")):
        source, _, row = name.partition(">")
        rows[source] = row or source
    return rows, set(filter(None, tasks.split(","))), path


def _read_payload(path: Path) -> dict[str, Any]:
    try:
        payload = json.loads(path.read_text())
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error.msg}, line {error.lineno})") from error
    if not isinstance(payload, dict) or not isinstance(payload.get("runs"), list):
        raise ValueError(f"{path}: not a `cdt report` table (no list of runs)")
    return payload


def _run(record: Any, path: Path) -> RunResult:
    try:
        return RunResult(**record)
    except TypeError as error:
        raise ValueError(f"{path}: a run is not one `cdt report` wrote ({error})") from error


def _check_held(path: Path, preposition: str, wanted: set[str], held: set[str]) -> None:
    """ValueError naming what an entry asks for (algorithms, tasks) that the file does not hold."""
    if missing := sorted(wanted - held):
        raise ValueError(
            f"{path}: no runs {preposition} {', '.join(missing)} "
            f"(it holds {', '.join(sorted(held))})"
        )


def read_included(entry: str, cost_limit: float) -> IncludedRuns:
    """The runs one `--include-runs` entry names; ValueError, with the file named, for a file
    that is not a report's JSON, an algorithm or task it does not hold, or another cost limit."""
    rows, tasks, path = _parse_entry(entry)
    payload = _read_payload(path)
    if payload.get("cost_limit") != cost_limit:
        raise ValueError(
            f"{path}: its runs were scored at cost limit {payload.get('cost_limit')}, "
            f"this table at {cost_limit:g}"
        )
    runs = [_run(record, path) for record in payload["runs"]]
    _check_held(path, "of", set(rows), {run.algo for run in runs})
    if rows:
        runs = [run._replace(algo=rows[run.algo]) for run in runs if run.algo in rows]
    _check_held(path, "on", tasks, {run.task for run in runs})  # of the algorithms kept
    if tasks:
        runs = [run for run in runs if run.task in tasks]
    cpu = str((payload.get("compute") or {}).get("cpu", "a CPU not recorded"))
    return IncludedRuns(path=path, runs=runs, cpu=cpu)


def repeated_runs(results: Sequence[RunResult]) -> list[str]:
    """(algorithm, task, seed) cells that appear more than once: a run counted twice would
    weigh double in its mean, so the table refuses them."""
    seen: set[tuple[str, str, int]] = set()
    repeated: list[str] = []
    for result in results:
        key = (result.algo, result.task, result.seed)
        if key in seen:
            repeated.append(f"{result.algo} on {result.task}, seed {result.seed}")
        seen.add(key)
    return repeated
