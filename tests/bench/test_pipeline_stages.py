"""The stage-time bench reads what `cdt pipeline` records (bench/pipeline_stages.py)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.pipeline_stages import format_table, stage_rows


def test_stage_table_counts_dataset_to_served_without_collection(tmp_path: Path) -> None:
    run = tmp_path / "pipeline-cdt-carcircle"
    run.mkdir()
    stages = {"collect": 2400.0, "train": 3000.0, "select": 600.0, "export": 60.0}
    (run / "stage_seconds.json").write_text(json.dumps(stages))
    (run / "cpu.txt").write_text("Intel(R) Xeon(R) Processor\n")
    rows = stage_rows(tmp_path)
    assert rows == [("cdt-carcircle", stages, "Intel(R) Xeon(R) Processor")]
    table = format_table(rows, goal_minutes=60)
    empty = "| - " * 6  # guidance, calibrate, critic, shield, cut-ready, evaluate: not run
    assert f"| cdt-carcircle | 40.0 | 50.0 | 10.0 | 1.0 {empty}| 61.0 | no |" in table
    assert "| yes |" in format_table(rows, goal_minutes=90)
