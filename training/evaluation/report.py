"""`cdt report`: train and evaluate an algorithm x task x seed grid, write the paper's Table 1.

Each algorithm is trained on each dataset with each seed, exported to
<models_dir>/<task>/<algo>-s<seed>/, and evaluated in the simulator by
`training.evaluation.evaluate.evaluate_policy_dir(model_dir, episodes, seeds, target_reward,
target_cost)`.
Baselines train through `training.baselines`; the sequence models (`cdt`, `dt-cost`, `dt`) through
`cdt train` with the `cpu` preset plus `--sequence-args`, exporting `best.pt` (the checkpoint
chosen by in-env evaluation) for CDT and the last checkpoint for the DTs, which are not selected
for safety. Already exported models (shipped CDT policies, earlier runs) join the grid with
`--include-existing DIR`: the card's `algo` and `task` place them, and its `evaluation` entry is
used when it holds scores.

Scores are the evaluator's `normalised_reward_mean` and `normalised_cost_mean` (paper section 5:
100 (R - R_min) / (R_max - R_min) over the dataset's return range, and C / kappa); a result
with only raw `reward_mean` and `cost_mean` is normalised with the evaluator's own function.

The tables (`<stem>.md`, `<stem>.json`, table1 by default) record the command that made them and
the compute used.
Rendering (`build_table`, `render_markdown`) is pure and works on hand-built `RunResult`s.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import tyro

from training.baselines.config import BaselineConfig

logger = logging.getLogger(__name__)

EvaluateFunction = Callable[..., dict[str, Any]]
AVERAGE = "Average"
SAMPLED_SUFFIX = "-sampled"
"""Row suffix of an algorithm evaluated with sampled actions, shown beside the convention's row."""
DISPLAY_NAMES = {
    "bc-all": "BC-All",
    "bc-safe": "BC-Safe",
    "bc-risky": "BC-Risky",
    "bc-frontier": "BC-Frontier",
    "bc-boundary": "BC-Boundary",
    "mt-bc": "MT-BC",
    "bcq-lag": "BCQ-Lag",
    "bear-lag": "BEAR-Lag",
    "cpq": "CPQ",
    "coptidice": "COptiDICE",
    "bcq": "BCQ",
    "bear": "BEAR",
    "cdt": "CDT",
    "cdt-sampled": "CDT (sampled actions)",
    "dt": "DT",
}


@dataclass(frozen=True)
class ReportConfig:
    """The grid to run and where the tables go."""

    algorithms: tuple[str, ...] = (
        "bc-all",
        "bc-safe",
        "bc-frontier",
        "bcq-lag",
        "bear-lag",
        "cpq",
        "coptidice",
    )
    """algorithms to train (names as in `cdt train --algo`, the sequence models included)."""
    datasets: tuple[str, ...] = (
        "datasets/SafetyCarRun-v0.hdf5",
        "datasets/SafetyBallRun-v0.hdf5",
    )
    """dataset files, each PATH or LABEL=PATH (the label names the table column)."""
    seeds: int = 3
    """training seeds per algorithm and task."""
    cost_limit: float = 10.0
    """cost threshold kappa for training, evaluation and the safety mark."""
    episodes: int = 20
    """evaluation episodes per evaluation seed."""
    eval_seeds: int = 3
    """evaluation seeds per trained model."""
    include_existing: tuple[str, ...] = ()
    """exported model dirs (DIR or LABEL=DIR) to add, e.g. CDT's."""
    models_dir: Path = Path("runs/report-models")
    """where the grid's models are exported and every evaluation is kept."""
    out: Path = Path("reports")
    """where the tables are written."""
    stem: str = "table1"
    """file name of the tables: <out>/<stem>.md and <out>/<stem>.json."""
    reuse: bool = False
    """skip training where the model dir already holds a model card."""
    title: str = "Table 1: normalised reward and cost"
    """heading of the Markdown table."""
    train: BaselineConfig = field(default_factory=BaselineConfig)
    """per-run training settings (algo, dataset, seed, out and cost limit are set by the grid)."""
    average: bool = True
    """add the Average column (`--no-average` where the columns are not tasks, e.g. one task's
    full and reduced datasets)."""
    sampled_beside: tuple[str, ...] = ("cdt",)
    """algorithms also evaluated with sampled actions, in an extra `<algo>-sampled` row (the
    table's convention is the mean action for every row)."""
    sequence_args: str = ""
    """extra `cdt train` flags for cdt, dt-cost and dt, in one string, given with `=`:
    `--sequence-args="--update-steps 2000"`."""


class RunResult(NamedTuple):
    """One evaluated model: normalised scores (reward, cost) of one algorithm, task and seed."""

    algo: str
    task: str
    seed: int
    reward: float
    cost: float
    train_steps: int | None = None
    """gradient steps of its training run, from the model card."""
    train_seconds: float | None = None
    """training wall time, where the card records it."""


def card_training(card: dict[str, Any]) -> tuple[int | None, float | None]:
    """(gradient steps, training seconds) of a model card: baseline or sequence-model layout."""
    config = card.get("training_config") or {}
    # a selected checkpoint records the step it was taken at; the config only the run's plan
    steps = card.get("training_step", config.get("steps", config.get("update_steps")))
    seconds = (card.get("training") or {}).get("train_seconds")
    return (None if steps is None else int(steps)), seconds


class Cell(NamedTuple):
    """One table entry: seed means and standard deviations."""

    reward: float
    cost: float
    reward_std: float
    cost_std: float
    runs: int

    @property
    def safe(self) -> bool:
        return self.cost <= 1.0


@dataclass(frozen=True)
class Table:
    """Rows (algorithms) x columns (tasks, then the average) of cells."""

    algorithms: list[str]
    tasks: list[str]
    cells: dict[tuple[str, str], Cell]

    def best_safe(self, task: str) -> str | None:
        """The safe algorithm with the highest reward in column `task`, if any is safe (rows
        with sampled actions are shown beside, not ranked)."""
        safe = [
            (cell.reward, algo)
            for algo in self.algorithms
            if (cell := self.cells.get((algo, task))) is not None
            and cell.safe
            and not algo.endswith(SAMPLED_SUFFIX)
        ]
        return max(safe)[1] if safe else None


def _cell(rewards: Sequence[float], costs: Sequence[float]) -> Cell:
    return Cell(
        reward=float(np.mean(rewards)),
        cost=float(np.mean(costs)),
        reward_std=float(np.std(rewards)),
        cost_std=float(np.std(costs)),
        runs=len(rewards),
    )


def build_table(results: Sequence[RunResult], average: bool = True) -> Table:
    """Average seeds per (algo, task); the average column (if `average`) averages the task
    means."""
    algorithms = list(dict.fromkeys(result.algo for result in results))
    tasks = list(dict.fromkeys(result.task for result in results))
    cells: dict[tuple[str, str], Cell] = {}
    for algo in algorithms:
        for task in tasks:
            runs = [r for r in results if r.algo == algo and r.task == task]
            if runs:
                cells[algo, task] = _cell([r.reward for r in runs], [r.cost for r in runs])
        row = [cells[algo, task] for task in tasks if (algo, task) in cells]
        if average and len(row) == len(tasks):  # an average over a partial row would mislead
            cells[algo, AVERAGE] = _cell([c.reward for c in row], [c.cost for c in row])
    return Table(algorithms=algorithms, tasks=[*tasks, AVERAGE] if average else tasks, cells=cells)


def _format_pair(cell: Cell | None, best: bool) -> list[str]:
    if cell is None:
        return ["n/a", "n/a"]
    reward, cost = f"{cell.reward:.1f}", f"{cell.cost:.2f}"
    if not cell.safe:
        return [f"{reward}†", f"{cost}†"]
    return [f"**{reward}**" + (" ★" if best else ""), f"**{cost}**"]


def render_markdown(
    table: Table,
    title: str,
    command: str,
    cost_limit: float,
    steps: dict[str, list[int]] | None = None,
) -> str:
    """Table 1 layout: a reward and a cost column per task and for the average.

    `steps`: gradient steps per algorithm (`steps_by_algorithm`), listed under the table.
    """
    header = ["Algorithm"]
    for task in table.tasks:
        header += [f"{task} reward ↑", f"{task} cost ↓"]
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|---" + "|---:" * (len(header) - 1) + "|")
    best = {task: table.best_safe(task) for task in table.tasks}
    for algo in table.algorithms:
        row = [DISPLAY_NAMES.get(algo, algo)]
        for task in table.tasks:
            row += _format_pair(table.cells.get((algo, task)), best[task] == algo)
        lines.append("| " + " | ".join(row) + " |")
    runs = sorted({cell.runs for (_, task), cell in table.cells.items() if task != AVERAGE})
    lines += [
        "",
        "Scores as `cdt evaluate` computes them: normalised reward 100 (R - R_min) / "
        "(R_max - R_min) over the dataset's return range, normalised cost C / kappa (plus a "
        f"small epsilon) with kappa = {cost_limit:g}; mean over {'/'.join(map(str, runs))} "
        "training seed(s). Every row acts with the policy's mean action; rows marked "
        "(sampled actions) sample from the same policy's Gaussian.",
        "**Bold**: safe (normalised cost <= 1). †: unsafe. ★: highest reward among the safe "
        "algorithms of that column.",
    ]
    if steps:
        counts = [
            f"{DISPLAY_NAMES.get(algo, algo)} {'/'.join(f'{n:,}' for n in steps[algo])}"
            for algo in table.algorithms
            if algo in steps
        ]
        lines.append(f"Gradient steps per training run: {'; '.join(counts)}.")
    lines += ["", f"Made by: `{command}`", ""]
    return "\n".join(lines)


def table_json(table: Table) -> dict[str, dict[str, dict[str, Any]]]:
    """The table as {algo: {task: {reward, cost, reward_std, cost_std, runs, safe, best}}}."""
    best = {task: table.best_safe(task) for task in table.tasks}
    return {
        algo: {
            task: {**cell._asdict(), "safe": cell.safe, "best_safe": best[task] == algo}
            for task in table.tasks
            if (cell := table.cells.get((algo, task))) is not None
        }
        for algo in table.algorithms
    }


def normalised_scores(
    result: dict[str, Any], card: dict[str, Any], cost_limit: float
) -> tuple[float, float] | None:
    """(normalised reward, normalised cost) of one evaluation result, or None if it has none.

    Takes the evaluator's `normalised_reward_mean` / `normalised_cost_mean` when present, else
    normalises raw mean returns (`reward_mean` / `cost_mean`) the way `cdt evaluate` does.
    """
    if "normalised_reward_mean" in result and "normalised_cost_mean" in result:
        return float(result["normalised_reward_mean"]), float(result["normalised_cost_mean"])
    if "reward_mean" not in result or "cost_mean" not in result:
        return None
    from training.evaluation.evaluate import normalised_scores as score_returns

    data = card.get("dataset") or {}
    reward_range = (
        float(data.get("reward_return_min", 0.0)),
        float(data.get("reward_return_max", 1.0)),
    )
    reward, cost = score_returns(
        np.array([result["reward_mean"]]), np.array([result["cost_mean"]]), reward_range, cost_limit
    )
    return float(reward[0]), float(cost[0])


def _split_label(entry: str) -> tuple[str | None, Path]:
    label, separator, path = entry.partition("=")
    return (label, Path(path)) if separator else (None, Path(entry))


def short_task(task: str) -> str:
    """SafetyCarRun-v0 -> CarRun."""
    return task.removeprefix("Safety").rsplit("-v", 1)[0]


def _evaluate_dir(
    model_dir: Path,
    label: str,
    card: dict[str, Any],
    config: ReportConfig,
    evaluate: EvaluateFunction,
    *,
    mean: bool,
) -> dict[str, Any]:
    """The evaluation result of one exported model (`card`: its model.json), with mean or
    sampled actions.

    The result is kept under `<models_dir>/evaluations/` (never beside a shipped model), so a
    rerun with `--reuse` after an interruption skips the evaluations already done with the same
    episodes, seeds, cost limit, action mode and model.
    """
    from runtime.card import read_card
    from runtime.protocol import target_reward_for

    settings = {
        "episodes": config.episodes,
        "seeds": config.eval_seeds,
        "target_cost": config.cost_limit,
        "deterministic": mean,
        "model_dir": str(model_dir),
        "card_created_at": card.get("created_at"),
    }
    mode = "mean" if mean else "sampled"
    saved_path = config.models_dir / "evaluations" / f"{label}-{model_dir.name}-{mode}.json"
    if config.reuse and saved_path.is_file():
        saved = json.loads(saved_path.read_text())
        if saved.get("settings") == settings:
            return dict(saved["result"])
    result = evaluate(
        model_dir=model_dir,
        episodes=config.episodes,
        seeds=config.eval_seeds,
        target_reward=target_reward_for(
            read_card(model_dir).default_targets or [], config.cost_limit
        ),
        target_cost=config.cost_limit,
        deterministic=mean,
    )
    saved_path.parent.mkdir(parents=True, exist_ok=True)
    saved_path.write_text(
        json.dumps({"settings": settings, "result": result}, default=float) + "\n"
    )
    return result


def _evaluated_results(
    model_dir: Path, task: str, seed: int, config: ReportConfig, evaluate: EvaluateFunction
) -> list[RunResult]:
    """The model's row under the table's one convention (the Gaussian's mean action, as the
    authors evaluate CDT), plus a `<algo>-sampled` row for the algorithms in `sampled_beside`."""
    card = json.loads((model_dir / "model.json").read_text())
    algo = str(card.get("algo", model_dir.name))
    modes = [(algo, True)]
    if algo in config.sampled_beside:
        modes.append((algo + SAMPLED_SUFFIX, False))
    results = []
    for name, mean in modes:
        result = _evaluate_dir(model_dir, task, card, config, evaluate, mean=mean)
        scores = normalised_scores(result, card, config.cost_limit)
        if scores is None:
            raise ValueError(f"{model_dir}: evaluation has no reward/cost returns")
        results.append(RunResult(name, task, seed, *scores, *card_training(card)))
        logger.info("%s %s seed %d: reward %.2f cost %.2f", task, name, seed, *scores)
    return results


SEQUENCE_ALGORITHMS = ("cdt", "dt-cost", "dt")


def _train_cell(config: ReportConfig, dataset_path: Path, label: str, algo: str, seed: int) -> Path:
    from training.baselines.registry import train_and_export
    from training.data.dataset import load_dataset

    model_dir = config.models_dir / label / f"{algo}-s{seed}"
    if config.reuse and (model_dir / "model.json").is_file():
        return model_dir
    if algo in SEQUENCE_ALGORITHMS:
        return _train_sequence_cell(config, dataset_path, model_dir, algo, seed)
    run = dataclasses.replace(
        config.train,
        algo=algo,  # type: ignore[arg-type]
        dataset=dataset_path,
        seed=seed,
        out=model_dir,
        cost_limit=config.cost_limit,
    )
    return train_and_export(run, load_dataset(dataset_path))


def _train_sequence_cell(
    config: ReportConfig, dataset_path: Path, model_dir: Path, algo: str, seed: int
) -> Path:
    """`cdt train` + `cdt export` + default targets from the data, for one sequence model."""
    from training.card_update import record_default_targets
    from training.data.dataset import load_dataset
    from training.data.frontiers import derive_default_targets
    from training.export import export_checkpoint
    from training.learn.config import parse_config
    from training.learn.train import train

    args = ["--dataset", str(dataset_path), "--algo", algo, "--seed", str(seed)]
    args += ["--out-dir", str(model_dir.parent / "runs"), "--run-name", model_dir.name]
    if algo != "cdt":
        args += ["--eval-every", "0"]  # the unselected last checkpoint is what is exported
    last = train(parse_config([*args, *shlex.split(config.sequence_args)]))
    best = last.with_name("best.pt")
    model_dir.mkdir(parents=True, exist_ok=True)
    export_checkpoint(best if algo == "cdt" and best.is_file() else last, model_dir)
    dataset = load_dataset(dataset_path)
    thresholds = (config.cost_limit, 2 * config.cost_limit, 4 * config.cost_limit)
    targets = derive_default_targets(dataset.cost_returns, dataset.reward_returns, thresholds)
    record_default_targets(model_dir, targets)
    return model_dir


def _dataset_label(entry: str) -> tuple[str, Path]:
    label, path = _split_label(entry)
    if label is None:
        from training.data.dataset import load_dataset

        label = short_task(load_dataset(path).task)
    return label, path


def run_grid(config: ReportConfig, evaluate: EvaluateFunction) -> list[RunResult]:
    """Train, export and evaluate every (dataset, algorithm, seed) of the grid."""
    results: list[RunResult] = []
    for entry in config.datasets:
        label, path = _dataset_label(entry)
        for algo in config.algorithms:
            for seed in range(config.seeds):
                model_dir = _train_cell(config, path, label, algo, seed)
                results += _evaluated_results(model_dir, label, seed, config, evaluate)
    return results


def existing_results(config: ReportConfig, evaluate: EvaluateFunction) -> list[RunResult]:
    """Already exported models, evaluated like the grid's (a card's own evaluation may have used
    another action convention, so it is never taken as the row)."""
    results = []
    for index, entry in enumerate(config.include_existing):
        label, model_dir = _split_label(entry)
        card = json.loads((model_dir / "model.json").read_text())
        task = label or short_task(str(card.get("task", model_dir.name)))
        results += _evaluated_results(model_dir, task, index, config, evaluate)
    return results


def missing_inputs(config: ReportConfig) -> list[str]:
    """Dataset files and model cards the grid names but that are not there: said before the
    first training run, not after an hour of them."""
    missing = [
        f"no dataset {path}"
        for path in (_split_label(entry)[1] for entry in config.datasets)
        if not path.is_file()
    ]
    missing += [
        f"{model_dir} has no model.json"
        for model_dir in (_split_label(entry)[1] for entry in config.include_existing)
        if not (model_dir / "model.json").is_file()
    ]
    return missing


def _default_evaluate() -> EvaluateFunction:
    from training.evaluation.evaluate import evaluate_policy_dir

    return evaluate_policy_dir


def steps_by_algorithm(results: Sequence[RunResult]) -> dict[str, list[int]]:
    """The distinct gradient-step counts of each algorithm's runs."""
    steps: dict[str, set[int]] = {}
    for result in results:
        if result.train_steps is not None:
            steps.setdefault(result.algo, set()).add(result.train_steps)
    return {algo: sorted(counts) for algo, counts in steps.items()}


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
    evaluate = evaluate or _default_evaluate()
    started = time.perf_counter()
    results = run_grid(config, evaluate) + existing_results(config, evaluate)
    command = shlex.join(["cdt", "report", *args])
    markdown, json_path = write_report(config, results, command, time.perf_counter() - started)
    print(f"tables written: {markdown} and {json_path}")


if __name__ == "__main__":
    main()
