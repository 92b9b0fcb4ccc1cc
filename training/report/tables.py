"""The paper's Table 1 from evaluated runs: seed means, the average column, Markdown and JSON.

Pure: `build_table`, `render_markdown` and `table_json` work on hand-built `RunResult`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from training.baselines import NAMES_IN_PAPER

AVERAGE = "Average"
SAMPLED_SUFFIX = "-sampled"
"""Row suffix of an algorithm evaluated with sampled actions, shown beside the convention's row."""
CDT_ABLATIONS = (
    ("augment", False, "cdt-no-augment", "CDT (w/o augment)"),
    ("entropy", False, "cdt-no-entropy", "CDT (w/o entropy)"),
    ("deterministic", True, "cdt-deterministic", "CDT (deterministic)"),
)
"""The paper's ablations of CDT: (training setting, its ablated value, row key, row name)."""

DISPLAY_NAMES = {
    **NAMES_IN_PAPER,
    "cdt": "CDT",
    "cdt-sampled": "CDT (sampled actions)",
    "cdt-guided": "CDT + guidance",
    "cdt-calibrated": "CDT + calibration",
    "mt-bc-calibrated": "MT-BC + calibration",
    "dt": "DT",
    "dt-cost": "DT-Cost",
    **{key: name for _, _, key, name in CDT_ABLATIONS},
}


def row_algorithm(card: dict[str, Any]) -> str:
    """The table row a model card belongs to: its algorithm, or for a CDT trained without one
    of its parts the paper's ablation of that part (several at once: `cdt-no-augment+...`)."""
    algo = str(card.get("algo", ""))
    settings = card.get("training_config") or {}
    if algo != "cdt":
        return algo
    ablated = [key for setting, value, key, _ in CDT_ABLATIONS if settings.get(setting) == value]
    return "+".join(ablated) if ablated else algo


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
    online_episodes: int | None = None
    """simulator episodes its calibration ran on the selection seeds before the test (the
    card's record for the row's action mode); None: not calibrated."""


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


def _sample_std(values: Sequence[float]) -> float:
    """The spread a reader expects of "mean +- sd" over seeds (n - 1); 0 for one value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _cell(rewards: Sequence[float], costs: Sequence[float]) -> Cell:
    return Cell(
        reward=float(np.mean(rewards)),
        cost=float(np.mean(costs)),
        reward_std=_sample_std(rewards),
        cost_std=_sample_std(costs),
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


PAPER_DIFFERENCES = (
    "Differs from the paper's setting: our datasets are our own collections (our PPO-Lagrangian "
    "on Bullet-Safety-Gym, grid-filtered), not the paper's, so R_min, R_max and the frontiers "
    "differ and these normalised scores are not comparable with the paper's Table 1; and the "
    "paper trains every algorithm for 10^5 gradient steps (its appendix), where the step counts "
    "here are those listed above."
)
"""Said under every table (issue "results a reviewer would sign")."""


def _format_pair(cell: Cell | None, best: bool, spread: bool) -> list[str]:
    """Reward and cost text of a cell; `spread` adds the seeds' "+- sd" where there are several."""
    if cell is None:
        return ["n/a", "n/a"]
    reward, cost = f"{cell.reward:.1f}", f"{cell.cost:.2f}"
    if spread and cell.runs > 1:
        reward, cost = f"{reward} ± {cell.reward_std:.1f}", f"{cost} ± {cell.cost_std:.2f}"
    if not cell.safe:
        return [f"{reward}†", f"{cost}†"]
    return [f"**{reward}**" + (" ★" if best else ""), f"**{cost}**"]


def render_markdown(
    table: Table,
    title: str,
    command: str,
    cost_limit: float,
    steps: dict[str, list[int]] | None = None,
    evaluated_on: str | None = None,
    online: dict[str, list[int]] | None = None,
) -> str:
    """Table 1 layout: a reward and a cost column per task and for the average.

    `steps`: gradient steps per algorithm (`steps_by_algorithm`), listed under the table;
    `evaluated_on`: the CPU the episodes ran on (the simulator's episodes depend on it);
    `online`: calibrated rows' online episodes per model (`online_episodes_by_algorithm`).
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
            cell = table.cells.get((algo, task))
            row += _format_pair(cell, best[task] == algo, spread=task != AVERAGE)
        lines.append("| " + " | ".join(row) + " |")
    runs = sorted({cell.runs for (_, task), cell in table.cells.items() if task != AVERAGE})
    lines += [
        "",
        "Scores as `cdt evaluate` computes them: normalised reward 100 (R - R_min) / "
        "(R_max - R_min) over the dataset's return range, normalised cost C / kappa (plus a "
        f"small epsilon) with kappa = {cost_limit:g}; mean over {'/'.join(map(str, runs))} "
        "training seed(s), +- the sample standard deviation across them where there are "
        "several (the Average column averages the task means). Every row acts with the "
        "policy's mean action; rows marked (sampled actions) sample from the same policy's "
        "Gaussian.",
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
    if online:  # a calibrated row spent simulator episodes the others did not
        spent = [
            f"{DISPLAY_NAMES.get(algo, algo)} {_count_range(online[algo])} per model"
            f" ({sum(online[algo]):,} in all)"
            for algo in table.algorithms
            if algo in online
        ]
        lines.append(
            "Online episodes before the test (calibration, on the selection seeds): "
            f"{'; '.join(spent)}."
        )
    if len(runs) > 1:  # rows measured over different numbers of seeds: say which is which
        lines.append(f"Training seeds per cell: {'; '.join(_seed_counts(table))}.")
    lines.append(PAPER_DIFFERENCES)
    lines += [
        "",
        f"Made by: `{command}`" + (f", episodes on {evaluated_on}" if evaluated_on else ""),
        "",
    ]
    return "\n".join(lines)


def _count_range(counts: Sequence[int]) -> str:
    low, high = min(counts), max(counts)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def _seed_counts(table: Table) -> list[str]:
    """Each row's training seeds per cell, and its tasks where it lacks some: "BCQ-Lag 1
    (CarRun)"."""
    tasks = [task for task in table.tasks if task != AVERAGE]
    counts = []
    for algo in table.algorithms:
        cells = {task: cell for task in tasks if (cell := table.cells.get((algo, task)))}
        seeds = "/".join(str(n) for n in sorted({cell.runs for cell in cells.values()}))
        text = f"{DISPLAY_NAMES.get(algo, algo)} {seeds}"
        counts.append(text + (f" ({', '.join(cells)})" if len(cells) < len(tasks) else ""))
    return counts


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


def steps_by_algorithm(results: Sequence[RunResult]) -> dict[str, list[int]]:
    """The distinct gradient-step counts of each algorithm's runs."""
    steps: dict[str, set[int]] = {}
    for result in results:
        if result.train_steps is not None:
            steps.setdefault(result.algo, set()).add(result.train_steps)
    return {algo: sorted(counts) for algo, counts in steps.items()}


def online_episodes_by_algorithm(results: Sequence[RunResult]) -> dict[str, list[int]]:
    """Each calibrated algorithm's online episodes, one count per model."""
    counts: dict[str, list[int]] = {}
    for result in results:
        if result.online_episodes is not None:
            counts.setdefault(result.algo, []).append(result.online_episodes)
    return {algo: sorted(values) for algo, values in counts.items()}


def short_task(task: str) -> str:
    """SafetyCarRun-v0 -> CarRun."""
    return task.removeprefix("Safety").rsplit("-v", 1)[0]
