"""Runs of earlier reports joining a table (training/report/included.py, `--include-runs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from training.report.cli import main
from training.report.included import read_included, repeated_runs
from training.report.tables import RunResult


def _report(
    path: Path, runs: list[RunResult], cost_limit: float = 10.0, cpu: str = "CPU A"
) -> Path:
    payload: dict[str, Any] = {
        "cost_limit": cost_limit,
        "compute": {"cpu": cpu},
        "runs": [run._asdict() for run in runs],
    }
    path.write_text(json.dumps(payload))
    return path


CDT = [RunResult("cdt", "CarRun", seed, 70.0 + seed, 0.5, 24_000) for seed in range(3)]
BCQ = [RunResult("bcq-lag", "CarRun", 0, 33.0, 7.6, 24_000)]


def test_an_entry_takes_every_run_or_only_the_named_algorithms(tmp_path: Path) -> None:
    path = _report(tmp_path / "a.json", [*CDT, *BCQ])
    assert read_included(str(path), 10.0).runs == [*CDT, *BCQ]
    only = read_included(f"bcq-lag={path}", 10.0)
    assert only.runs == BCQ and only.cpu == "CPU A" and only.path == path
    renamed = read_included(f"cdt>cdt-guided={path}", 10.0).runs  # beside the plain CDT row
    assert [run.algo for run in renamed] == ["cdt-guided"] * 3
    assert [run.reward for run in renamed] == [run.reward for run in CDT]


def test_an_entry_can_keep_only_some_tasks(tmp_path: Path) -> None:
    ant = [RunResult("cdt", "AntRun", seed, 60.0, 3.0, 24_000) for seed in range(3)]
    path = _report(tmp_path / "a.json", [*CDT, *ant, *BCQ])
    assert read_included(f"@AntRun={path}", 10.0).runs == ant  # every algorithm, one column
    kept = read_included(f"cdt>cdt-calibrated@CarRun={path}", 10.0).runs
    assert [(run.algo, run.task) for run in kept] == [("cdt-calibrated", "CarRun")] * 3
    with pytest.raises(ValueError, match="no runs on BallRun \\(it holds AntRun, CarRun\\)"):
        read_included(f"cdt@BallRun,CarRun={path}", 10.0)
    with pytest.raises(ValueError, match="no runs on AntRun \\(it holds CarRun\\)"):
        read_included(f"bcq-lag@AntRun={path}", 10.0)  # another algorithm's column is no answer


@pytest.mark.parametrize(
    ("entry", "cost_limit", "message"),
    [
        ("dt-cost={path}", 10.0, "no runs of dt-cost (it holds bcq-lag, cdt)"),
        ("{path}", 20.0, "scored at cost limit 10.0, this table at 20"),
        ("{tmp}/missing.json", 10.0, "cannot read it"),
        ("{tmp}/bad.json", 10.0, "not JSON"),
        ("{tmp}/other.json", 10.0, "not a `cdt report` table"),
    ],
)
def test_a_file_that_cannot_join_is_refused_with_its_name(
    tmp_path: Path, entry: str, cost_limit: float, message: str
) -> None:
    path = _report(tmp_path / "a.json", [*CDT, *BCQ])
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text(json.dumps({"runs": {}}))
    with pytest.raises(ValueError, match="json: ") as error:
        read_included(entry.format(path=path, tmp=tmp_path), cost_limit)
    assert message in str(error.value)


def test_a_run_counted_twice_is_named() -> None:
    assert repeated_runs([*CDT, *BCQ]) == []
    assert repeated_runs([*CDT, CDT[1]]) == ["cdt on CarRun, seed 1"]


def test_report_merges_earlier_runs_and_names_where_they_ran(tmp_path: Path) -> None:
    seeds = _report(tmp_path / "seeds.json", CDT, cpu="CPU A")
    qlearning = _report(tmp_path / "q.json", BCQ, cpu="CPU B")
    argv = ["--algorithms", "--include-runs", str(seeds), f"bcq-lag={qlearning}"]
    main([*argv, "--out", str(tmp_path), "--stem", "merged", "--no-average"])
    payload = json.loads((tmp_path / "merged.json").read_text())
    assert payload["table"]["cdt"]["CarRun"]["runs"] == 3
    assert payload["table"]["cdt"]["CarRun"]["reward"] == pytest.approx(71.0)
    assert payload["table"]["bcq-lag"]["CarRun"]["safe"] is False
    assert [part["cpu"] for part in payload["included_runs"]] == ["CPU A", "CPU B"]
    markdown = (tmp_path / "merged.md").read_text()
    sources = f"CPU A (the runs from {seeds}); CPU B (the runs from {qlearning})"
    assert f", episodes on {sources}\n" in markdown  # no episode ran here: this CPU is not named
    assert payload["compute"]["cpu"] == sources  # what a later --include-runs of it will say
    assert "Training seeds per cell: CDT 3; BCQ-Lag 1." in markdown
    with pytest.raises(SystemExit) as exit_info:  # the same file twice would double its runs
        main([*argv, str(seeds), "--out", str(tmp_path), "--stem", "twice"])
    assert exit_info.value.code == 2
    assert not (tmp_path / "twice.md").exists()
