"""`cdt select RUN_DIR`: choose best.pt among a run's kept checkpoints, by the reported protocol.

The arguments are parsed and checked here, apart from the selection (`select_checkpoint.py`),
so that `--help` and a mistake answer at once: scoring checkpoints imports torch (~2 s).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from runtime.arguments import CommandParser, non_negative_int, positive_float, positive_int, share
from runtime.evaluation_protocol import SELECTION_BUDGET_SCALES, SelectionRule
from runtime.user_errors import UserError, exit_on_user_errors


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt select", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="run folder holding step_*.pt checkpoints")
    parser.add_argument("--cost-margin", type=positive_float, default=SelectionRule.cost_margin)
    parser.add_argument("--max-share-over", type=share, default=SelectionRule.max_share_over)
    parser.add_argument(
        "--min-budget-use",
        type=share,
        default=SelectionRule.min_budget_use,
        help="mean cost must reach this share of every budget above the tightest",
    )
    text = "skip earlier checkpoints"
    parser.add_argument("--from-step", type=non_negative_int, default=0, help=text)
    parser.add_argument(
        "--budget-scales",
        type=positive_float,
        nargs="+",
        default=list(SELECTION_BUDGET_SCALES),
        help="calibrations to try, largest first (1 = the paper's Algorithm 2 unchanged)",
    )
    parser.add_argument(
        "--episodes",
        type=positive_int,
        help="episodes per budget and action mode; rows measured on another count are measured "
        "again (default: the run's --eval-episodes, 20, and earlier rows reused whatever their "
        "count); more episodes see more of a sampled policy's cost tail",
    )
    return parser


@exit_on_user_errors("cdt select", "training.checkpoint.CheckpointError")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt select`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir} is not a folder")
    # Imported after parsing: scoring loads torch (~2 s), which --help never needs.
    from training.evaluation.select_checkpoint import (
        check_checkpoints,
        record_selection,
        select_best,
    )

    check_checkpoints(args.run_dir, args.from_step)
    rule = SelectionRule(args.cost_margin, args.max_share_over, args.min_budget_use)
    path, evaluation = select_best(
        args.run_dir, rule, args.from_step, tuple(args.budget_scales), args.episodes
    )
    outcome = "admissible" if evaluation["admissible"] else "NOT admissible (none was)"
    mean_scale = evaluation["mean_action_budget_scale"]
    calibration = f"x{evaluation['budget_scale']:g}" + (
        "" if mean_scale is None else f" (mean action x{mean_scale:g})"
    )
    print(
        f"best: step {evaluation['step']} {calibration} budget "
        f"({outcome}, score {evaluation['score']:.2f}) -> {path}"
    )
    record_selection(args.run_dir, evaluation)


if __name__ == "__main__":
    main()
