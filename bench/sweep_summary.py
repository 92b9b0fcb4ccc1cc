"""One table of what `cdt select` measured across a sweep's runs (bench/gpu_train.sh SWEEP=...).

    for run in runs/sweep/*/; do cdt select $run --episodes 10 --budget-scales 1; done
    python bench/sweep_summary.py runs/sweep

A row per run and checkpoint (budget scale 1 only): normalised cost at each budget with the mean
action and with sampled actions, the share of episodes over budget, and the mean action's
normalised reward. Rows sort by the worst mean-action cost, so the runs nearest to keeping every
budget come first.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

Modes = dict[bool, dict[str, float]]  # deterministic (mean action) -> a selection row


@dataclass(frozen=True)
class Scored:
    """One checkpoint of one run, as `cdt select` measured it at budget scale 1."""

    run: str
    step: int
    budgets: dict[float, Modes]

    def worst_mean_cost(self) -> float:
        return max(modes[True]["normalised_cost"] for modes in self.budgets.values())


def scored(sweep: Path) -> list[Scored]:
    found = []
    for selection in sorted(sweep.glob("*/selection.json")):
        for entry in json.loads(selection.read_text()):
            if entry["budget_scale"] != 1.0:
                continue
            budgets: dict[float, Modes] = {}
            for row in entry["rows"]:
                budgets.setdefault(row["target_cost"], {})[row["deterministic"]] = row
            found.append(Scored(selection.parent.name, entry["step"], budgets))
    return found


def cell(modes: Modes) -> str:
    mean, sampled = modes[True], modes[False]
    return (
        f"{mean['normalised_cost']:.2f}/{sampled['normalised_cost']:.2f} "
        f"({mean['share_over_budget']:.0%}/{sampled['share_over_budget']:.0%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sweep", type=Path, help="folder of run folders that `cdt select` scored")
    args = parser.parse_args()
    found = scored(args.sweep)
    if not found:
        raise SystemExit(f"sweep_summary: no */selection.json under {args.sweep}")
    budgets = sorted({budget for entry in found for budget in entry.budgets})
    header = " ".join(f"{f'cost@{b:g} mean/samp (over)':>27}" for b in budgets)
    print(f"{'run':<16} {'step':>6} {header} {f'reward@{budgets[0]:g}':>10}")
    for entry in sorted(found, key=Scored.worst_mean_cost):
        cells = " ".join(f"{cell(entry.budgets[b]):>27}" for b in budgets)
        reward = entry.budgets[budgets[0]][True]["normalised_reward"]
        print(f"{entry.run:<16} {entry.step:>6} {cells} {reward:>10.1f}")


if __name__ == "__main__":
    main()
