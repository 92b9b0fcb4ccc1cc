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

from runtime.arguments import AT_LEAST_1, POSITIVE, unmet
from runtime.evaluation_protocol import split_problems
from runtime.files import check_writable, refuse_overwrite, write_atomic
from runtime.user_errors import UserError, exit_on_user_errors
from training.baselines import ALGORITHMS
from training.interrupt import TrainingInterrupted
from training.learn.config import ConfigError, parse_config
from training.ledger import cpu_name, format_ledger, ledger_path, read_ledger
from training.report.config import ReportConfig
from training.report.grid import (
    SEQUENCE_ALGORITHMS,
    EvaluateFunction,
    existing_results,
    missing_inputs,
    run_grid,
    split_label,
    unfinished_elsewhere,
)
from training.report.included import IncludedRuns, read_included, repeated_runs
from training.report.tables import (
    RunResult,
    build_table,
    online_episodes_by_algorithm,
    render_markdown,
    steps_by_algorithm,
    table_json,
)
from training.train_cli import config_problems as train_problems
from training.tyro_cli import parse


def write_report(
    config: ReportConfig,
    results: Sequence[RunResult],
    command: str,
    seconds: float,
    included: Sequence[IncludedRuns] = (),
) -> tuple[Path, Path]:
    """Write <stem>.md and <stem>.json under `config.out`; returns both paths. `results` holds
    the `included` runs too; each earlier report's CPU is named beside this one's."""
    table = build_table(results, config.average)
    markdown, path = output_paths(config)
    steps, cpu = steps_by_algorithm(results), cpu_name()  # /proc/cpuinfo read once per report
    sources = [f"{part.cpu} (the runs from {part.path})" for part in included]
    if len(results) > sum(len(part.runs) for part in included):  # episodes ran here too
        sources.insert(0, cpu)
    evaluated_on = "; ".join(sources)
    online = online_episodes_by_algorithm(results)
    text = render_markdown(
        table, config.title, command, config.cost_limit, steps, evaluated_on, online
    )
    write_atomic(markdown, lambda temporary: temporary.write_text(text))
    payload = {
        "title": config.title,
        "command": command,
        "created_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cost_limit": config.cost_limit,
        "compute": {
            "wall_seconds": round(seconds, 1),
            "train_seconds_total": round(sum(r.train_seconds or 0.0 for r in results), 1),
            "train_steps_by_algorithm": steps,  # as each model's card records them
            # what a missing baseline cell would be trained with (none may have been)
            "grid_baseline_settings": {
                "steps": config.train.steps,
                "batch_size": config.train.batch_size,
                "device": config.train.device,
            },
            "cpu_count": os.cpu_count(),
            "cpu": evaluated_on,  # this CPU, then each included report's, where they differ
            "evaluation": f"{config.episodes} episodes x {config.eval_seeds} seeds per model",
        },
        "included_runs": [
            {"file": str(part.path), "cpu": part.cpu, "runs": len(part.runs)} for part in included
        ],
        "table": table_json(table),
        "runs": [result._asdict() for result in results],
    }
    payload_text = json.dumps(payload, indent=2) + "\n"
    write_atomic(path, lambda temporary: temporary.write_text(payload_text))
    return markdown, path


def output_paths(config: ReportConfig) -> tuple[Path, Path]:
    """<out>/<stem>.md and <out>/<stem>.json."""
    return config.out / f"{config.stem}.md", config.out / f"{config.stem}.json"


def config_problems(config: ReportConfig) -> list[str]:
    """Every setting the grid cannot run with, one phrase each, said before the first run."""
    known = (*ALGORITHMS, *SEQUENCE_ALGORITHMS)
    found = [
        f"--algorithms: no algorithm {name!r} (known: {', '.join(known)})"
        for name in (*config.algorithms, *config.sampled_beside)
        if name not in known
    ]
    counts = {"--seeds": config.seeds, "--episodes": config.episodes}
    found += unmet(AT_LEAST_1, counts | {"--eval-seeds": config.eval_seeds})
    if config.episodes >= 1 and config.eval_seeds >= 1:  # below 1: said just above
        options = ("--episodes", "--eval-seeds")
        found += split_problems("test", config.episodes, config.eval_seeds, options)
    found += unmet(POSITIVE, {"--cost-limit": config.cost_limit})
    if not (config.include_existing or config.include_runs) and not (
        config.algorithms and config.datasets
    ):
        found.append(
            "name --algorithms and --datasets, or models with --include-existing, "
            "or earlier runs with --include-runs"
        )
    # Imported here, not at the top: it loads h5py and the dataset reader, which --help skips.
    from training.baselines.cli import config_problems as baseline_problems

    found += [f"--train: {problem}" for problem in baseline_problems(config.train)]
    if found or not set(config.algorithms) & set(SEQUENCE_ALGORITHMS):
        return found
    # The sequence models' flags, parsed as their first run parses them (tyro explains its own
    # refusals and exits 2).
    dataset = split_label(config.datasets[0])[1]
    try:
        sequence = parse_config(["--dataset", str(dataset), *shlex.split(config.sequence_args)])
    except ConfigError as error:
        return [f"--sequence-args: {error}"]
    return [f"--sequence-args: {problem}" for problem in train_problems(sequence)]


def included_runs(config: ReportConfig) -> list[IncludedRuns]:
    """The `--include-runs` files read, or a UserError naming every one that cannot be."""
    parts, problems = [], []
    for entry in config.include_runs:
        try:
            parts.append(read_included(entry, config.cost_limit))
        except ValueError as error:
            problems.append(f"--include-runs: {error}")
    if repeated := repeated_runs([run for part in parts for run in part.runs]):
        problems.append("--include-runs: the same run twice: " + "; ".join(repeated))
    if problems:
        raise UserError("; ".join(problems))
    return parts


def check_before_running(config: ReportConfig) -> list[IncludedRuns]:
    """The inputs are there, every value can run, the tables may be written; returns the
    earlier runs to include."""
    if problems := missing_inputs(config) + config_problems(config):
        raise UserError("; ".join(problems))
    if problems := unfinished_elsewhere(config):
        raise UserError("; ".join(problems))
    included = included_runs(config)
    for path in output_paths(config):
        check_writable(path, option="--out")
    hint = "pass another --out or --stem, or --force to replace them"
    refuse_overwrite(output_paths(config), config.force, hint)
    return included


def interrupted_line(args: Sequence[str], stopped: KeyboardInterrupt) -> str:
    """What a stopped grid says: where its training stopped, and the command that goes on (with
    `--reuse`, so that finished cells and evaluations are kept, not redone)."""
    again = [arg for arg in args if arg != "--no-reuse"]
    again += [] if "--reuse" in again else ["--reuse"]
    where = ""
    if isinstance(stopped, TrainingInterrupted):
        where = f" at step {stopped.step:,} ({stopped.checkpoint}"
        # A baseline's progress.pt is continued; a sequence model's cell trains again.
        where += ")" if stopped.checkpoint.name == "progress.pt" else ", not resumed by the grid)"
    return f"interrupted{where}; continue with: {shlex.join(['cdt', 'report', *again])}"


@exit_on_user_errors("cdt report")
def main(argv: list[str] | None = None, evaluate: EvaluateFunction | None = None) -> None:
    """Entry point of `cdt report`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = sys.argv[1:] if argv is None else argv
    config = parse(ReportConfig, args, "cdt report")
    included = check_before_running(config)
    if evaluate is None:  # the simulator's evaluator loads onnxruntime and more (~0.7 s)
        from training.evaluation.evaluate import evaluate_policy_dir

        evaluate = evaluate_policy_dir
    started = time.perf_counter()
    try:
        results = run_grid(config, evaluate) + existing_results(config, evaluate)
    except KeyboardInterrupt as stopped:  # Ctrl-C or SIGTERM: what is done stays done
        print(f"cdt report: {interrupted_line(args, stopped)}", file=sys.stderr)
        raise SystemExit(130) from None
    results += [run for part in included for run in part.runs]
    # Against the grid's own runs only now; its models and evaluations are kept, so a rerun
    # with --reuse and fewer --include-runs costs nothing.
    if repeated := repeated_runs(results):
        raise UserError(
            "the same run twice among the grid, --include-existing and --include-runs: "
            + "; ".join(repeated)
        )
    command = shlex.join(["cdt", "report", *args])
    seconds = time.perf_counter() - started
    markdown, json_path = write_report(config, results, command, seconds, included)
    print(f"tables written: {markdown} and {json_path}")
    ledger = ledger_path()
    if ledger is not None and ledger.is_file():  # every run attempted, with its fate
        text = "# Ledger: every run, with its fate\n\n" + format_ledger(read_ledger(ledger)) + "\n"
        write_atomic(config.out / "ledger.md", lambda temporary: temporary.write_text(text))
        print(f"ledger written: {config.out / 'ledger.md'}")


if __name__ == "__main__":
    main()
