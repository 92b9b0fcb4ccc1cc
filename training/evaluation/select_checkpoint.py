"""Choose best.pt among a run's kept checkpoints, by the reported protocol (`cdt select`).

For runs trained where no simulator runs (a GPU machine, `--eval-every 0 --keep-checkpoints`):
every `step_<N>.pt` is evaluated here exactly as in-training selection would (the same budgets,
target rewards, action modes and selection seeds), and the best admissible one is copied to
`best.pt` with its evaluation. `selection.json` lists every checkpoint's rows; a rerun reuses them.
The scoring itself is `checkpoint_scores.py`'s; this module chooses among the scores, and
`select_cli.py` is the command.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from runtime.evaluation_protocol import SELECTION_BUDGET_SCALES, BudgetRow, SelectionRule, describe
from runtime.files import check_writable, write_atomic
from runtime.user_errors import UserError
from training.checkpoint import load_checkpoint, write_checkpoint
from training.evaluation.checkpoint_scores import score_checkpoint, selection_record, verdict
from training.ledger import LedgerEntry, record

logger = logging.getLogger(__name__)


def per_mode_record(
    step: int, measured: list[tuple[float, list[BudgetRow]]], rule: SelectionRule
) -> dict[str, Any] | None:
    """A record that calibrates each action mode on its own: the sampled rows of the largest
    scale they pass at, the mean action's of the largest it passes at; None unless both pass.

    Measured reason: sampling noise moves the cost a cost-to-go buys, so one scale may be too
    tight for sampled actions and too loose for the mean (CarRun seed 2, step 8,000: sampled
    actions idle at kappa 40 at x0.8, the mean action over the margin at x0.85 and above).
    """
    chosen: dict[bool, tuple[float, list[BudgetRow]]] = {}
    for budget_scale, rows in measured:  # largest first
        for deterministic in (False, True):
            mode_rows = [row for row in rows if row.deterministic == deterministic]
            if deterministic not in chosen and mode_rows and not rule.failures(mode_rows):
                chosen[deterministic] = (budget_scale, mode_rows)
    if set(chosen) != {False, True}:
        return None
    (sampled_scale, sampled_rows), (mean_scale, mean_rows) = chosen[False], chosen[True]
    rows = sorted(sampled_rows + mean_rows, key=lambda row: (row.target_cost, row.deterministic))
    return selection_record(step, rows, rule, sampled_scale, mean_scale)


def _listed_records(listing: Path) -> list[dict[str, Any]]:
    """The records a previous `cdt select` wrote (none when the file is missing or unreadable)."""
    try:
        records = json.loads(listing.read_text())
    except (OSError, ValueError):
        return []
    return records if isinstance(records, list) else []


def _measured_rows(
    records: list[dict[str, Any]],
) -> dict[tuple[str, int, float], list[dict[str, Any]]]:
    """Rows of earlier records, by (checkpoint, its mtime, budget scale)."""
    return {
        (record["checkpoint"], record.get("checkpoint_mtime_ns", -1), record["budget_scale"]): (
            record["rows"]
        )
        for record in records
    }


def _with_episodes(rows: list[dict[str, Any]], episodes: int) -> list[dict[str, Any]] | None:
    """The rows if each was measured on `episodes` episodes, else None (measure again)."""
    return rows if all(row["episodes"] == episodes for row in rows) else None


def _write_listing(
    listing: Path, earlier: list[dict[str, Any]], evaluations: list[dict[str, Any]]
) -> None:
    """This call's records, after the earlier ones it did not redo: a rerun on fewer
    checkpoints or other scales keeps what was measured before."""
    redone = {(record["checkpoint"], record["budget_scale"]) for record in evaluations}
    kept = [
        record
        for record in earlier
        if (record.get("checkpoint"), record.get("budget_scale")) not in redone
    ]
    write_atomic(
        listing, lambda file: file.write_text(json.dumps(kept + evaluations, indent=2) + "\n")
    )


def kept_checkpoints(run_dir: Path, from_step: int = 0) -> list[Path]:
    """The run's `step_<N>.pt` from `from_step` on, in step order; a `UserError` when none."""
    steps = {path: path.stem.removeprefix("step_") for path in run_dir.glob("step_*.pt")}
    candidates = sorted(
        (path for path, step in steps.items() if step.isdigit() and int(step) >= from_step),
        key=lambda path: int(steps[path]),
    )
    if not candidates:
        where = f"{run_dir} from step {from_step}" if from_step else str(run_dir)
        raise UserError(f"no step_*.pt in {where} (train with --keep-checkpoints)")
    return candidates


def check_checkpoints(run_dir: Path, from_step: int) -> None:
    """Before any episode: every kept checkpoint from `from_step` on loads, and best.pt and
    selection.json may be written."""
    for path in kept_checkpoints(run_dir, from_step):
        load_checkpoint(path)  # a CheckpointError names the file
    for name in ("best.pt", "selection.json"):
        check_writable(run_dir / name)


def select_best(
    run_dir: Path,
    rule: SelectionRule,
    from_step: int = 0,
    budget_scales: tuple[float, ...] = SELECTION_BUDGET_SCALES,
    episodes: int | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Evaluate the kept checkpoints from `from_step` on; write best.pt and selection.json.

    selection.json is rewritten after every evaluation, and its rows are reused by a later call
    (re-scored under that call's rule) while the checkpoint file is unchanged and they hold the
    episodes asked for (any count when none is asked): rerunning as a run keeps writing
    checkpoints, or after an interruption, evaluates only what is new. `episodes`: per budget
    and action mode (default: the run's).
    """
    candidates = kept_checkpoints(run_dir, from_step)
    listing = run_dir / "selection.json"
    earlier = _listed_records(listing)
    measured = _measured_rows(earlier)
    best_score, best_path, best_evaluation = -math.inf, None, {}
    evaluations: list[dict[str, Any]] = []
    for path in candidates:
        step, mtime_ns = int(path.stem[5:]), path.stat().st_mtime_ns
        checkpoint: dict[str, Any] | None = None
        measured_here: list[tuple[float, list[BudgetRow]]] = []
        for budget_scale in budget_scales:  # largest first: stop at the first admissible one
            rows_measured = measured.get((path.name, mtime_ns, budget_scale))
            if rows_measured is not None and episodes is not None:
                rows_measured = _with_episodes(rows_measured, episodes)
            if rows_measured is None:
                checkpoint = checkpoint or load_checkpoint(path)
                evaluation = score_checkpoint(checkpoint, rule, budget_scale, episodes)
                rows = [BudgetRow(**row) for row in evaluation["rows"]]
            else:
                rows = [BudgetRow(**row) for row in rows_measured]
                evaluation = selection_record(step, rows, rule, budget_scale)
            evaluations.append({"checkpoint": path.name, "checkpoint_mtime_ns": mtime_ns})
            evaluations[-1] |= evaluation
            _write_listing(listing, earlier, evaluations)
            logger.info(
                "%s x%.2f: score %.2f%s, %s; %s",
                path.name,
                budget_scale,
                evaluation["score"],
                "" if rows_measured is None else " (measured before)",
                verdict(evaluation),
                describe(rows),
            )
            measured_here.append((budget_scale, rows))
            if not evaluation["admissible"]:
                combined = per_mode_record(step, measured_here, rule)
                if combined is not None:
                    logger.info(
                        "%s: admissible with x%.2f for sampled actions, x%.2f for the mean",
                        path.name,
                        combined["budget_scale"],
                        combined["mean_action_budget_scale"],
                    )
                    evaluation = combined
            if best_path is None or evaluation["score"] > best_score:
                best_score, best_path, best_evaluation = evaluation["score"], path, evaluation
            if evaluation["admissible"]:
                break
    assert best_path is not None  # candidates is not empty
    payload = {key: value for key, value in load_checkpoint(best_path).items() if key != "format"}
    payload |= {
        "evaluation": best_evaluation,
        "budget_scale": best_evaluation["budget_scale"],
        "mean_action_budget_scale": best_evaluation["mean_action_budget_scale"],
    }
    write_checkpoint(run_dir / "best.pt", payload)
    return run_dir / "best.pt", best_evaluation


def record_selection(run_dir: Path, evaluation: dict[str, Any]) -> None:
    """The ledger's entry for a selection that chose `evaluation` in `run_dir`."""
    fate = f"best step {evaluation['step']}: {verdict(evaluation)}"
    record(LedgerEntry("select", str(run_dir), fate, split="selection"))
