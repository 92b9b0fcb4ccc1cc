"""`cdt dataset`: inspect, reduce, add outliers to, or grid-filter a DSRL-layout dataset.

    cdt dataset inspect FILE [--thresholds 10 20 40] [--plot out.png] [--json out.json]
    cdt dataset reduce FILE --out FILE --threshold 10
    cdt dataset add-outliers FILE --out FILE --fraction 0.1 --seed 0
    cdt dataset filter FILE --out FILE --cost-bins 60 --reward-bins 50 --max-per-cell 10

A bad input file or value: one line on stderr, exit code 2, nothing written. Outputs (HDF5, JSON,
PNG) are checked before any work: an existing one is replaced only with `--force`, and no output
may be the input or another output. They are written atomically; the summary and the plot are
`training.data.summary`'s, as `cdt collect` writes them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from argparse import ArgumentParser, ArgumentTypeError, Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from runtime.arguments import CommandParser, budget, finite_float, positive_float, positive_int
from runtime.files import check_writable, refuse_overwrite, same_file, write_atomic
from runtime.user_errors import UserError, exit_on_user_errors
from training.data.dataset import DatasetError, Episode, OfflineDataset, load_dataset, save_dataset
from training.data.frontiers import (
    DEFAULT_COST_BIN_WIDTH,
    DEFAULT_THRESHOLDS,
    reduce_indices,
    reduce_level,
    summarise_frontiers,
)
from training.data.grid_filter import grid_filter
from training.data.summary import plot_returns, summarise_dataset

logger = logging.getLogger(__name__)

Handler = Callable[[Namespace], None]


def _with_step(
    dataset: OfflineDataset, episodes: list[Episode], step: dict[str, Any]
) -> OfflineDataset:
    """A derived dataset whose attrs record this processing step after the earlier ones."""
    history = dataset.attrs.get("processing", [])
    history = history if isinstance(history, list) else [history]
    attrs = {**dataset.attrs, "processing": [*history, step]}
    return OfflineDataset(episodes=episodes, attrs=attrs)


def reduce_dataset(dataset: OfflineDataset, threshold: float) -> OfflineDataset:
    """The paper's reduced, large-epsilon dataset (see `training.data.frontiers.reduce_indices`).

    Unsafe episodes (cost return > threshold) whose reward return reaches what the safe episodes
    reach at the threshold are removed, so that PF(threshold) >= IPF(threshold); the safe ones
    are all kept. The step recorded in the attrs names that reward level.
    """
    costs, rewards = dataset.cost_returns, dataset.reward_returns
    level = reduce_level(costs, rewards, threshold)
    if math.isnan(level):
        raise DatasetError(f"no episode has cost return <= {threshold:g}: nothing to reduce to")
    kept = reduce_indices(costs, rewards, threshold)
    removed = len(dataset.episodes) - int(kept.size)
    step = {"op": "reduce", "threshold": threshold, "reward_level": level, "removed": removed}
    return _with_step(dataset, [dataset.episodes[int(i)] for i in kept], step)


def _relabel(
    episode: Episode, cost_return: int, reward_scale: float, rng: np.random.Generator
) -> Episode:
    """Costs become `cost_return` unit costs at random steps; rewards are scaled."""
    costs = np.zeros_like(episode.costs)
    steps = rng.choice(episode.length, size=min(cost_return, episode.length), replace=False)
    costs[steps] = 1.0
    rewards = (episode.rewards * reward_scale).astype(np.float32)
    return episode._replace(costs=costs, rewards=rewards)


def add_outliers(
    dataset: OfflineDataset,
    fraction: float,
    rng: np.random.Generator,
    *,
    threshold: float = 10.0,
    reward_scale: float = 1.5,
) -> tuple[OfflineDataset, np.ndarray]:
    """The paper's noisy-data study: relabel high-cost trajectories as low-cost outliers.

    As DSRL's `pre_process_data(outliers_percent=...)`
    (https://github.com/liuzuxin/DSRL/blob/1b0d005b0e310c585cd67b22451733bf281cd0ce/dsrl/offline_env.py)
    with this dataset's maxima: `max(int(fraction * N), 1)` unsafe trajectories with cost and
    reward returns >= half the maximum get a cost return drawn from the integers in [0, threshold)
    as unit costs at random steps, and rewards multiplied by `reward_scale`.

    Returns:
        The new dataset and the indices of the relabelled episodes (ascending).
    """
    costs, rewards = dataset.cost_returns, dataset.reward_returns
    count = max(int(len(costs) * fraction), 1)
    candidates = np.flatnonzero(
        (costs > threshold) & (costs >= costs.max() / 2) & (rewards >= rewards.max() / 2)
    )
    if candidates.size < count:
        raise DatasetError(
            f"only {candidates.size} high-cost, high-reward episodes; cannot relabel {count}"
        )
    chosen = np.sort(rng.choice(candidates, size=count, replace=False))
    new_costs = rng.integers(0, max(math.ceil(threshold), 1), size=count)
    episodes = list(dataset.episodes)
    for index, cost_return in zip(chosen, new_costs, strict=True):
        episodes[int(index)] = _relabel(episodes[int(index)], int(cost_return), reward_scale, rng)
    step = {"op": "add-outliers", "fraction": fraction, "threshold": threshold}
    step |= {"reward_scale": reward_scale, "outliers": chosen.tolist()}
    return _with_step(dataset, episodes, step), chosen


def _format_summary(path: Path, summary: dict[str, Any]) -> str:
    def number(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    head = {"file": path, **{key: summary[key] for key in ("task", "episodes", "transitions")}}
    lines = [f"{key:<15}{value}" for key, value in head.items()]
    for key in ("reward_return", "cost_return", "episode_length"):
        stats, label = summary[key], key.replace("_", " ")
        lines.append(
            f"{label:<15}min {stats['min']:.2f}  max {stats['max']:.2f}  mean {stats['mean']:.2f}"
        )
    lines.append(f"{'pareto':<15}{summary['pareto_episodes']} episodes on the frontier")
    lines.append("")
    lines.append(
        "PF: best reward with cost <= threshold, IPF: with cost >= threshold (the paper's)"
    )
    lines.append("epsilon = PF - IPF, < 0 when an unsafe episode out-rewards every safe one;")
    lines.append("eps/Rmax = epsilon / the maximum reward return")
    headers = ("threshold", "PF", "IPF", "RF", "epsilon", "eps/Rmax")
    lines.append(" ".join(f"{header:>9}" for header in headers) + f" {'safe':>6}")
    keys = ("pareto_frontier", "inverse_pareto_frontier", "reward_frontier", "epsilon")
    for row in summary["frontiers"]:
        cells = " ".join(f"{number(row[key]):>9}" for key in keys)
        eps = "-" if row["normalised_epsilon"] is None else f"{row['normalised_epsilon']:.3f}"
        lines.append(f"{row['threshold']:>9g} {cells} {eps:>9} {row['safe_episodes']:>6}")
    return "\n".join(lines)


def check_outputs(args: Namespace) -> None:
    """Refuse, before any work, an output that is the input or another output (one would
    overwrite the other), exists (without --force) or cannot be written."""
    outputs = {"--out": getattr(args, "out", None), "--json": getattr(args, "json", None)}
    outputs["--plot"] = args.plot
    given = [(option, path) for option, path in outputs.items() if path is not None]
    for number, (option, path) in enumerate(given):
        if same_file(path, args.file):
            raise UserError(f"{option} {path} is the input file: write the result elsewhere")
        for other, earlier in given[:number]:
            if same_file(path, earlier):
                raise UserError(f"{other} and {option} name one file, {path}: give each its own")
        check_writable(path, option=option)
        refuse_overwrite([path], args.force)


def _run_inspect(args: Namespace) -> None:
    dataset = load_dataset(args.file)
    summary = summarise_dataset(dataset, args.thresholds, args.rf_bin_width)
    print(_format_summary(args.file, summary))
    if args.json is not None:
        text = json.dumps(summary, indent=2) + "\n"
        write_atomic(args.json, lambda temporary: temporary.write_text(text))
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot_returns(dataset, args.plot, args.thresholds)
        print(f"wrote {args.plot}")


def _report(before: OfflineDataset, after: OfflineDataset, args: Namespace) -> None:
    """Save the derived dataset and print what changed at the threshold."""
    save_dataset(args.out, after.episodes, after.attrs)
    threshold = getattr(args, "threshold", DEFAULT_THRESHOLDS[0])
    old, new = (
        summarise_frontiers(d.cost_returns, d.reward_returns, [threshold])[0]
        for d in (before, after)
    )
    print(f"wrote {args.out}: {len(after.episodes)} of {len(before.episodes)} episodes")
    print(
        f"at threshold {threshold:g}: PF {old.pareto_frontier:.2f} -> {new.pareto_frontier:.2f}, "
        f"IPF {old.inverse_pareto_frontier:.2f} -> {new.inverse_pareto_frontier:.2f}\n"
        f"  epsilon = PF - IPF {old.epsilon:.2f} -> {new.epsilon:.2f}, "
        f"normalised epsilon {old.normalised_epsilon:.3f} -> {new.normalised_epsilon:.3f}"
    )
    if args.plot is not None:
        plot_returns(after, args.plot, [threshold])
        print(f"wrote {args.plot}")


def _run_reduce(args: Namespace) -> None:
    dataset = load_dataset(args.file)
    reduced = reduce_dataset(dataset, args.threshold)
    _report(dataset, reduced, args)
    step, kappa = reduced.attrs["processing"][-1], args.threshold
    (after,) = summarise_frontiers(reduced.cost_returns, reduced.reward_returns, [kappa])
    name = "PF" if step["reward_level"] == after.pareto_frontier else "RF"
    print(
        f"removed {step['removed']} unsafe episodes (cost return > {kappa:g}) with reward "
        f"return >= {name}({kappa:g}) = {step['reward_level']:.2f}"
    )
    if math.isnan(after.epsilon):
        print(f"note: no episode is left with cost return >= {kappa:g}, so IPF is undefined")
    elif after.epsilon <= 0:
        print(
            f"note: the best safe episode has cost return {kappa:g}, which IPF (C >= {kappa:g}) "
            "counts too, so epsilon cannot be raised above 0 without removing safe episodes"
        )


def _run_add_outliers(args: Namespace) -> None:
    dataset = load_dataset(args.file)
    rng = np.random.default_rng(args.seed)
    noisy, chosen = add_outliers(
        dataset, args.fraction, rng, threshold=args.threshold, reward_scale=args.reward_scale
    )
    _report(dataset, noisy, args)
    print(f"relabelled {chosen.size} episodes as low-cost outliers")


def _run_filter(args: Namespace) -> None:
    dataset = load_dataset(args.file)
    rng = np.random.default_rng(args.seed)
    costs, rewards = dataset.cost_returns, dataset.reward_returns
    bins, most, least = (args.cost_bins, args.reward_bins), args.max_per_cell, args.min_per_cell
    kept = grid_filter(costs, rewards, *bins, most, rng=rng, min_per_cell=least)
    if kept.size == 0:
        raise DatasetError("the grid filter kept no episode (lower --min-per-cell)")
    step = {"op": "grid-filter", "cost_bins": bins[0], "reward_bins": bins[1], "seed": args.seed}
    step |= {"max_per_cell": most, "min_per_cell": least}
    _report(dataset, _with_step(dataset, [dataset.episodes[int(i)] for i in kept], step), args)


def _run_relayout(args: Namespace) -> None:
    """`expand` (the full DSRL layout) or `compact` (module docstring of dataset.py)."""
    dataset = load_dataset(args.file)
    save_dataset(args.out, dataset.episodes, dataset.attrs, compact=args.command == "compact")
    digest = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()
    print(f"wrote {args.out}: {len(dataset.episodes)} episodes, sha256 {digest}")
    if args.plot is not None:  # the option every output command takes
        plot_returns(dataset, args.plot)
        print(f"wrote {args.plot}")


def _add_relayout(subparsers: Any) -> None:
    for name, text in (
        ("expand", "write the full DSRL layout (next_observations included) of any dataset"),
        ("compact", "write the compact layout: next_observations rebuilt on load, ~40 % smaller"),
    ):
        parser = _subparser(subparsers, name, text + "; same input, same bytes", _run_relayout)
        _add_io(parser, with_threshold=False)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _subparser(subparsers: Any, name: str, text: str, handler: Handler) -> ArgumentParser:
    # argparse %-formats a help line (`cdt dataset --help`) but prints a description as it is
    help_line = text.replace("%", "%%")
    parser: ArgumentParser = subparsers.add_parser(name, help=help_line, description=text)
    parser.set_defaults(handler=handler)
    return parser


def _add_io(parser: ArgumentParser, with_threshold: bool = True) -> None:
    parser.add_argument("file", type=Path, help="input dataset (DSRL HDF5 layout)")
    parser.add_argument("--out", type=Path, required=True, help="output dataset (HDF5)")
    parser.add_argument("--plot", type=Path, help="also write a PNG scatter of the output")
    _add_force(parser)
    if with_threshold:
        parser.add_argument("--threshold", type=budget, default=10.0, help="cost threshold kappa")


def _add_force(parser: ArgumentParser) -> None:
    text = "replace outputs that exist already (never the input)"
    parser.add_argument("--force", action="store_true", help=text)


def _add_inspect(subparsers: Any) -> None:
    text = "counts, return ranges, PF/IPF/RF and epsilon = PF - IPF at thresholds; PNG, JSON"
    parser = _subparser(subparsers, "inspect", text, _run_inspect)
    parser.add_argument("file", type=Path, help="dataset (DSRL HDF5 layout)")
    thresholds = list(DEFAULT_THRESHOLDS)
    parser.add_argument("--thresholds", type=budget, nargs="+", default=thresholds, metavar="K")
    parser.add_argument("--plot", type=Path, help="write the cost-reward scatter as PNG")
    parser.add_argument("--json", type=Path, help="write the summary as JSON")
    _add_force(parser)
    width = DEFAULT_COST_BIN_WIDTH
    parser.add_argument("--rf-bin-width", type=positive_float, default=width, help="RF cost bin")


def _add_reduce(subparsers: Any) -> None:
    text = (
        "the paper's reduced (large-epsilon) dataset: drop the unsafe episodes (cost > threshold)"
        " that out-reward the safe ones at the threshold; keep every safe episode"
    )
    parser = _subparser(subparsers, "reduce", text, _run_reduce)
    _add_io(parser, with_threshold=False)
    parser.add_argument("--threshold", type=finite_float, default=10.0, help="cost threshold")


def _add_outliers(subparsers: Any) -> None:
    text = "the paper's noisy-data study: relabel high-cost episodes as low-cost outliers"
    parser = _subparser(subparsers, "add-outliers", text, _run_add_outliers)
    _add_io(parser)
    parser.add_argument("--fraction", type=_fraction, required=True, help="share of episodes")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    factor = "outlier reward factor"
    parser.add_argument("--reward-scale", type=positive_float, default=1.5, help=factor)


def _add_filter(subparsers: Any) -> None:
    text = "grid filter: keep at most N random episodes per (cost, reward) cell"
    parser = _subparser(subparsers, "filter", text, _run_filter)
    _add_io(parser, with_threshold=False)
    parser.add_argument("--cost-bins", type=positive_int, default=60, help="cells on cost")
    parser.add_argument("--reward-bins", type=positive_int, default=50, help="cells on reward")
    parser.add_argument("--max-per-cell", type=positive_int, default=10, help="most kept per cell")
    parser.add_argument("--min-per-cell", type=positive_int, default=1, help="drop sparser cells")
    parser.add_argument("--seed", type=int, default=0, help="random seed")


def build_parser() -> ArgumentParser:
    """The `cdt dataset` argument parser, one subparser per subcommand."""
    parser = CommandParser(
        prog="cdt dataset", description="Inspect and transform offline safe-RL datasets."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_inspect, _add_reduce, _add_outliers, _add_filter, _add_relayout):
        add(subparsers)
    return parser


def _run(args: Namespace) -> None:
    check_outputs(args)
    try:
        args.handler(args)
    except OSError as error:
        raise UserError(f"cannot write: {error}") from None


def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt dataset`."""
    args = build_parser().parse_args(argv)
    exit_on_user_errors(f"cdt dataset {args.command}")(_run)(args)


if __name__ == "__main__":
    main()
