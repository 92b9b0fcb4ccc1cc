"""The paper's target sweeps and the mid-episode budget-change study, with PNG plots.

- Zero-shot adaptation (paper Fig. 4): fix the target reward, vary the target cost.
- Conflicting targets (paper section 5, robustness to conflicting returns): fix the target cost,
  vary the target reward.
- Budget change: start at one cost limit, tighten it at step t, compare the cost rate before and
  after t (what `PATCH /v1/episodes/{id}/budget` does in the service).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.arguments import CommandParser, budget, finite_float, positive_int
from runtime.card import read_card
from runtime.episodes import EpisodeSpec
from runtime.evaluation_protocol import check_split, report_seeds
from runtime.files import write_atomic
from runtime.user_errors import UserError, exit_on_user_errors, require
from training.card_update import record_sweep
from training.evaluation.evaluate import RolloutJob, evaluate_policy_dir, run_parallel
from training.evaluation.inputs import check_report_outputs, default_report_dir, load_policy

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)


def sweep(
    model_dir: Path,
    *,
    vary: str,
    values: Sequence[float],
    fixed: float,
    episodes: int,
    seeds: int,
    workers: int,
) -> list[dict[str, Any]]:
    """Evaluate at each value of the varied target ("cost" or "reward"), the other fixed."""
    rows = []
    for value in values:
        reward, cost = (fixed, value) if vary == "cost" else (value, fixed)
        rows.append(
            evaluate_policy_dir(
                model_dir,
                episodes,
                seeds,
                target_reward=reward,
                target_cost=cost,
                workers=workers,
            )
        )
    return rows


def _agg_figure(width: float, height: float) -> Figure:
    """A figure drawn by Agg, without pyplot's global state."""
    # Deferred on purpose: matplotlib takes ~0.5 s to import and only plotting needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def plot_sweep(rows: list[dict[str, Any]], vary: str, path: Path) -> None:
    """Reward and cost (mean +- one std) against the varied target."""
    x = np.array([row[f"target_{vary}"] for row in rows])
    figure = _agg_figure(10, 4)
    left, right = figure.subplots(1, 2)
    for axis, key, label in ((left, "reward", "episode reward"), (right, "cost", "episode cost")):
        mean = np.array([row[f"{key}_mean"] for row in rows])
        std = np.array([row[f"{key}_std"] for row in rows])
        axis.plot(x, mean, marker="o", label="CDT")
        axis.fill_between(x, mean - std, mean + std, alpha=0.25)
        axis.set_xlabel(f"target {vary}")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    if vary == "cost":
        right.plot(x, x, linestyle="--", color="grey", label="cost = target")
        right.legend()
    figure.suptitle(f"{rows[0]['model']}: {'zero-shot cost' if vary == 'cost' else 'reward'} sweep")
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, dpi=110, format="png"))


def _step_costs(jobs: list[RolloutJob], workers: int, label: str) -> np.ndarray:
    """Per-step costs, [episodes, horizon] (zero after an early end)."""
    results = run_parallel(jobs, workers, label)
    results.sort(key=lambda result: result.spec.seed)
    costs = np.zeros((len(results), max(len(r.step_costs) for r in results)))
    for row, result in enumerate(results):
        costs[row, : len(result.step_costs)] = result.step_costs
    return costs


def budget_change_study(
    model_dir: Path,
    *,
    target_reward: float,
    start_cost: float,
    end_cost: float,
    change_step: int,
    episodes: int,
    workers: int,
) -> dict[str, Any]:
    """Tighten the cost limit at `change_step`, against a control run that keeps it.

    Both runs use the same seeds, so until `change_step` they are the same episodes; the cost
    rate after the change is compared with the control's over the same steps (cost in these
    tasks builds up with speed, so "before vs after" alone would mislead).
    """
    card = read_card(model_dir)
    runs = {}
    for label, schedule in (("changed", ((change_step, end_cost),)), ("control", ())):
        specs = [
            EpisodeSpec(seed, target_reward, start_cost, cost_schedule=schedule)
            for seed in report_seeds(episodes, 1)[0]
        ]
        # one job per worker, so the episodes of both runs spread over the processes
        jobs = [
            RolloutJob(str(model_dir), card.task, tuple(specs[part::workers]), record_steps=True)
            for part in range(max(workers, 1))
            if specs[part::workers]
        ]
        runs[label] = _step_costs(jobs, workers, f"budget change ({label})")
    changed, control = runs["changed"], runs["control"]
    return {
        "model": card.name,
        "start_cost": start_cost,
        "end_cost": end_cost,
        "change_step": change_step,
        "episodes": changed.shape[0],
        "cost_rate_before": float(changed[:, :change_step].mean()),
        "cost_rate_after": float(changed[:, change_step:].mean()),
        "control_cost_rate_after": float(control[:, change_step:].mean()),
        "mean_step_costs": changed.mean(0).tolist(),
        "control_mean_step_costs": control.mean(0).tolist(),
        "total_cost_mean": float(changed.sum(1).mean()),
        "control_total_cost_mean": float(control.sum(1).mean()),
    }


def plot_budget_change(study: dict[str, Any], path: Path) -> None:
    """Cumulative cost per step with and without the change, the change marked."""
    figure = _agg_figure(6, 4)
    axis = figure.subplots()
    axis.plot(
        np.cumsum(study["control_mean_step_costs"]),
        color="grey",
        label=f"limit stays {study['start_cost']:g}",
    )
    axis.plot(
        np.cumsum(study["mean_step_costs"]),
        color="tab:blue",
        label=f"limit {study['start_cost']:g} -> {study['end_cost']:g}",
    )
    axis.axvline(study["change_step"], color="red", linestyle="--", label="budget change")
    axis.set_xlabel("step")
    axis.set_ylabel("mean cumulative cost")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, dpi=110, format="png"))


def _floats(parse: Callable[[str], float]) -> Callable[[str], list[float]]:
    """An argparse type: comma-separated numbers, each checked by `parse`."""

    def parse_list(text: str) -> list[float]:
        try:
            return [parse(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected numbers like 10,20,40, got {text}"
            ) from None

    return parse_list


OUTPUT_FILES = ("sweeps.json", "zero_shot_cost.png", "conflicting_reward.png", "budget_change.png")


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt sweeps", description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument(
        "--costs",
        type=_floats(budget),
        default=[0.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0],
        help="zero-shot cost targets, comma-separated (default: 0,5,10,20,30,40,60)",
    )
    parser.add_argument(
        "--rewards",
        type=_floats(finite_float),
        default=[],
        help="conflicting reward targets (default: 50%%..150%% of the dataset's max return)",
    )
    parser.add_argument(
        "--fixed-reward", type=finite_float, help="default: the card's default target"
    )
    parser.add_argument("--fixed-cost", type=budget, default=10.0)
    parser.add_argument("--episodes", type=positive_int, default=10)
    parser.add_argument("--seeds", type=positive_int, default=3)
    parser.add_argument("--workers", type=positive_int, default=2)
    parser.add_argument("--change-step", type=positive_int, default=60)
    parser.add_argument(
        "--out",
        type=Path,
        help="default: reports/NAME for a model in this checkout's models/, else its own folder",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="store the cost curve and validated budget range in the card",
    )
    parser.add_argument("--force", action="store_true", help="replace earlier results in --out")
    return parser


def _check(args: argparse.Namespace, card: dict[str, Any]) -> Path:
    """Before any episode: the values fit the model and the seed split, the outputs may be
    written, the plots can be drawn (matplotlib); returns the output folder."""
    if not args.costs:
        raise UserError("--costs names no cost target")
    check_split("test", args.episodes, args.seeds)
    if args.change_step >= card["max_episode_len"]:
        raise UserError(
            f"--change-step {args.change_step} lies past the episode's end"
            f" ({card['max_episode_len']} steps)"
        )
    out: Path = args.out or default_report_dir(args.model_dir)
    check_report_outputs([out / name for name in OUTPUT_FILES], args.force)
    require("matplotlib")  # imported only to plot, after the episodes
    return out


@exit_on_user_errors("cdt sweeps")
def main(argv: list[str] | None = None) -> None:
    """`cdt sweeps MODEL_DIR`: run the sweeps and the budget-change study."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    card = load_policy(args.model_dir, writes_card=args.record).card.model_dump()
    out = _check(args, card)
    r_max = float((card.get("dataset") or {}).get("reward_return_max", 100.0))
    targets = card.get("default_targets") or [{"reward": r_max}]
    fixed_reward = args.fixed_reward
    if fixed_reward is None:
        fixed_reward = float(targets[0]["reward"])
    rewards = args.rewards or [r_max * f for f in (0.5, 0.75, 1.0, 1.25, 1.5)]
    common = {"episodes": args.episodes, "seeds": args.seeds, "workers": args.workers}
    zero_shot = sweep(args.model_dir, vary="cost", values=args.costs, fixed=fixed_reward, **common)
    conflict = sweep(args.model_dir, vary="reward", values=rewards, fixed=args.fixed_cost, **common)
    study = budget_change_study(
        args.model_dir,
        target_reward=fixed_reward,
        start_cost=40.0,
        end_cost=10.0,
        change_step=args.change_step,
        episodes=args.episodes,
        workers=args.workers,
    )
    # Written once every episode has run: an interrupted sweep leaves nothing to --force over.
    plot_sweep(zero_shot, "cost", out / "zero_shot_cost.png")
    plot_sweep(conflict, "reward", out / "conflicting_reward.png")
    plot_budget_change(study, out / "budget_change.png")
    result = {"zero_shot": zero_shot, "conflicting": conflict, "budget_change": study}
    text = json.dumps(result, indent=2)
    write_atomic(out / "sweeps.json", lambda temporary: temporary.write_text(text))
    if args.record:
        record_sweep(args.model_dir, zero_shot)
    print(f"written: {out}/sweeps.json and three PNG plots")


if __name__ == "__main__":
    main()
