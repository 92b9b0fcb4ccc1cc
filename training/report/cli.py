"""`cdt report`: run the grid (`grid.py`), then write `<out>/<stem>.md` and `<stem>.json`.

The tables record the command that made them and the compute used.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import tyro

from training.evaluation.evaluate import evaluate_policy_dir
from training.report.config import ReportConfig
from training.report.grid import EvaluateFunction, existing_results, missing_inputs, run_grid
from training.report.tables import (
    RunResult,
    build_table,
    render_markdown,
    steps_by_algorithm,
    table_json,
)


def write_report(
    config: ReportConfig, results: Sequence[RunResult], command: str, seconds: float
) -> tuple[Path, Path]:
    """Write <stem>.md and <stem>.json under `config.out`; returns both paths."""
    table = build_table(results, config.average)
    config.out.mkdir(parents=True, exist_ok=True)
    markdown = config.out / f"{config.stem}.md"
    markdown.write_text(
        render_markdown(
            table, config.title, command, config.cost_limit, steps_by_algorithm(results)
        )
    )
    payload = {
        "title": config.title,
        "command": command,
        "created_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cost_limit": config.cost_limit,
        "compute": {
            "wall_seconds": round(seconds, 1),
            "train_steps_per_run": config.train.steps,
            "train_seconds_total": round(sum(r.train_seconds or 0.0 for r in results), 1),
            "train_steps_by_algorithm": steps_by_algorithm(results),
            "batch_size": config.train.batch_size,
            "device": config.train.device,
            "cpu_count": os.cpu_count(),
            "evaluation": f"{config.episodes} episodes x {config.eval_seeds} seeds per model",
        },
        "table": table_json(table),
        "runs": [result._asdict() for result in results],
    }
    path = config.out / f"{config.stem}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return markdown, path


def main(argv: list[str] | None = None, evaluate: EvaluateFunction | None = None) -> None:
    """Entry point of `cdt report`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = sys.argv[1:] if argv is None else argv
    config = tyro.cli(ReportConfig, args=args, prog="cdt report")
    if missing := missing_inputs(config):
        raise SystemExit("cdt report: " + "; ".join(missing))
    evaluate = evaluate or evaluate_policy_dir
    started = time.perf_counter()
    results = run_grid(config, evaluate) + existing_results(config, evaluate)
    command = shlex.join(["cdt", "report", *args])
    markdown, json_path = write_report(config, results, command, time.perf_counter() - started)
    print(f"tables written: {markdown} and {json_path}")


if __name__ == "__main__":
    main()
