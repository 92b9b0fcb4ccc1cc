"""Per task, the wall time of each stage from dataset to served model, with the CPU it ran on.

`cdt pipeline --task T` adds each stage's seconds (interrupted runs included) to
`runs/pipeline-<model>/stage_seconds.json` and its CPU to `cpu.txt` beside it; this script reads
them and prints one row per model, in minutes:

    python bench/pipeline_stages.py            # every runs/pipeline-*/
    python bench/pipeline_stages.py --runs-dir runs --goal-minutes 90

Collection is shown apart: the goal (issue "every paper task on two CPU cores") counts from a
dataset to a served model, i.e. every stage after it (train, select, export, guidance or
calibrate, critic, shield, evaluate).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from training.pipeline import STAGES as PIPELINE_STAGES

STAGES = tuple(name for name, _, _ in PIPELINE_STAGES)
SERVED_FROM_DATASET = STAGES[1:]


def stage_rows(runs_dir: Path) -> list[tuple[str, dict[str, float], str]]:
    """(model name, stage -> seconds, CPU) for every pipeline run folder under `runs_dir`."""
    rows = []
    for path in sorted(runs_dir.glob("pipeline-*/stage_seconds.json")):
        seconds = {name: float(value) for name, value in json.loads(path.read_text()).items()}
        cpu_file = path.with_name("cpu.txt")
        cpu = cpu_file.read_text().strip() if cpu_file.is_file() else "CPU not recorded"
        rows.append((path.parent.name.removeprefix("pipeline-"), seconds, cpu))
    return rows


def format_table(rows: list[tuple[str, dict[str, float], str]], goal_minutes: float) -> str:
    """A Markdown table: minutes per stage, dataset -> served total, against the goal."""
    header = ["model", *STAGES, "dataset -> served", f"<= {goal_minutes:g} min", "CPU"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, seconds, cpu in rows:
        served = sum(seconds.get(stage, 0.0) for stage in SERVED_FROM_DATASET) / 60
        cells = [f"{seconds[stage] / 60:.1f}" if stage in seconds else "-" for stage in STAGES]
        verdict = "yes" if served <= goal_minutes else "no"
        lines.append("| " + " | ".join([name, *cells, f"{served:.1f}", verdict, cpu]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument("--goal-minutes", type=float, default=90.0)
    args = parser.parse_args()
    rows = stage_rows(args.runs_dir)
    if not rows:
        raise SystemExit(f"no runs/pipeline-*/stage_seconds.json under {args.runs_dir}")
    print(format_table(rows, args.goal_minutes))


if __name__ == "__main__":
    main()
