"""`cdt evaluate`: returns-conditioned rollouts of an exported policy (paper Algorithm 2).

Episodes run through the one episode loop (`runtime.episodes.run_episodes`) with the service's
own forward pass (`runtime.policy.Policy`), so what is measured is what is served. Episodes run in
worker processes; within a worker all its episodes step together and share one batched forward
pass per step. Seeds come from one split (`--split`, runtime.evaluation_protocol.split_seeds): by
default the reported test seeds, which choose nothing; `selection` and `validation` for the
experiments that do choose (their results go to a `<split>/` subfolder and never into a card).

Before any episode the command loads the policy (a corrupt graph or card is one line, exit 2),
checks the task (a model is run on another task than its card's only with `--force`) and its
outputs: `reports/NAME/` for a model in this checkout's `models/`, the model's own folder for any
other (or `--out`); earlier results there are replaced only with `--force`.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from runtime.arguments import CommandParser, budget, finite_float, positive_int
from runtime.card import read_card
from runtime.episodes import EpisodePolicy, EpisodeResult, EpisodeSpec, run_episodes
from runtime.evaluation_protocol import (
    REPORTED_BUDGETS,
    SEED_SPLITS,
    SeedSplit,
    action_mode,
    check_split,
    split_seeds,
    summarise,
    target_reward_for,
)
from runtime.files import write_atomic
from runtime.policy import Policy
from runtime.scores import normalised_cost, normalised_reward
from runtime.sim import check_memory_for, check_task
from runtime.user_errors import UserError, exit_on_user_errors
from training.card_update import record_evaluation
from training.evaluation.inputs import (
    check_report_outputs,
    check_task_for,
    default_report_dir,
    load_policy,
)
from training.interrupt import ignore_interrupts, sigterm_as_interrupt
from training.ledger import LedgerEntry, record

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutJob:
    """What one worker runs: episodes of one exported policy in one task."""

    model_dir: str
    task: str
    specs: tuple[EpisodeSpec, ...]
    record_steps: bool = False


def onnx_episode_policy(policy: Policy) -> EpisodePolicy:
    """An exported policy as the episode loop sees it."""
    card = policy.card
    return EpisodePolicy(
        predict=policy.predict,
        context_len=card.context_len,
        action_dim=card.action_dim,
        action_low=card.action_low,
        action_high=card.action_high,
        cost_input_scale=card.cost_input_scale,
        budget_guard=card.guard,
        max_episode_len=card.max_episode_len,
        cost_critic=policy.cost_critic,
    )


EPISODES_AT_ONCE = 60
"""Episodes stepped together in one evaluation chunk (memory, not speed, sets it)."""


def run_in_chunks(
    policy: EpisodePolicy, task: str, specs: Sequence[EpisodeSpec], record_steps: bool = False
) -> list[EpisodeResult]:
    """`run_episodes` on at most EPISODES_AT_ONCE specs at a time, with a progress bar."""
    check_task(task)  # a task no simulator has: one line, before any bar is drawn
    bar = tqdm(total=len(specs), desc="selection episodes", unit="episode", leave=False)
    try:
        # in chunks: each episode's env holds up to runtime.sim.ENV_MEMORY_BYTES
        return [
            result
            for start in range(0, len(specs), EPISODES_AT_ONCE)
            for result in run_episodes(
                policy,
                task,
                specs[start : start + EPISODES_AT_ONCE],
                record_steps=record_steps,
                on_episode_end=bar.update,
            )
        ]
    finally:
        bar.close()


def run_job(job: RolloutJob) -> list[EpisodeResult]:
    """Load the policy and run the job's episodes (a worker process' entry point)."""
    policy = onnx_episode_policy(Policy.load(Path(job.model_dir)))
    return run_episodes(policy, job.task, job.specs, record_steps=job.record_steps)


def run_parallel(jobs: list[RolloutJob], workers: int, label: str) -> list[EpisodeResult]:
    """Run the jobs, in `workers` processes when more than one; with a progress bar. The results
    come in the jobs' order, however the workers finish (rows summarised from them keep it)."""
    for task in sorted({job.task for job in jobs}):
        check_task(task)  # once, before a bar is drawn or a worker starts (each would fail)
    if jobs:  # the largest jobs, one per worker, may run side by side
        check_memory_for(max(len(job.specs) for job in jobs), max(min(workers, len(jobs)), 1))
    results: list[EpisodeResult] = []
    total = sum(len(job.specs) for job in jobs)
    with tqdm(total=total, desc=label, unit="episode") as progress:
        if workers <= 1:
            for job in jobs:
                results += run_job(job)
                progress.update(len(job.specs))
            return results
        return _run_in_pool(jobs, workers, progress)


def _run_in_pool(jobs: list[RolloutJob], workers: int, progress: Any) -> list[EpisodeResult]:
    """`run_parallel`'s workers; Ctrl-C, SIGTERM or an error ends them at once (the pool's
    shutdown waits for their episodes; a parent killed by SIGTERM orphaned them)."""
    context = multiprocessing.get_context("spawn")
    with (
        sigterm_as_interrupt(),
        ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=ignore_interrupts
        ) as pool,
    ):
        try:
            futures = {pool.submit(run_job, job): job for job in jobs}
            for future in as_completed(futures):
                progress.update(len(futures[future].specs))
            return [result for future in futures for result in future.result()]
        except BaseException:
            # 3.11's pool has no terminate_workers (3.14's); leaving the `with` joins them
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()
            raise


def _summary(
    results: Sequence[EpisodeResult],
    reward_range: tuple[float, float],
    seed_groups: Sequence[tuple[int, ...]],
) -> dict[str, Any]:
    """The protocol's row for these episodes plus the spread of per-seed means (paper: 3 seeds)."""
    (row,) = summarise(results, reward_range)
    by_seed = {result.spec.seed: result for result in results}
    seed_means = [
        (
            normalised_reward(np.array([by_seed[seed].reward for seed in group]), reward_range),
            normalised_cost(np.array([by_seed[seed].cost for seed in group]), row.target_cost),
        )
        for group in seed_groups
    ]
    return {
        "episodes": row.episodes,
        "reward_mean": row.reward_mean,
        "reward_std": row.reward_std,
        "cost_mean": row.cost_mean,
        "cost_std": row.cost_std,
        "normalised_reward_mean": row.normalised_reward,
        "normalised_reward_std": float(np.std([reward.mean() for reward, _ in seed_means])),
        "normalised_cost_mean": row.normalised_cost,
        "normalised_cost_std": float(np.std([cost.mean() for _, cost in seed_means])),
        "share_over_budget": row.share_over_budget,
        "safe": row.safe,
        "reward_range": list(reward_range),
    }


def evaluate_policy_dir(
    model_dir: str | Path,
    episodes: int = 20,
    seeds: int = 3,
    target_reward: float | None = None,
    target_cost: float = 10.0,
    *,
    task: str | None = None,
    workers: int = 2,
    deterministic: bool = False,
    budget_guard: bool = False,
    split: SeedSplit = "test",
) -> dict[str, Any]:
    """Evaluate an exported policy at one (target reward, budget) pair on one split's seeds
    (the reported test seeds unless told otherwise); with `budget_guard`, as the service serves
    it by default (`cdt evaluate` does unless `--no-budget-guard`; sweeps and reports measure the
    model alone).

    Args:
        model_dir: `models/NAME/` with model.onnx and model.json.
        target_reward: defaults to the card's default target at the closest cost.
        task: the env id (defaults to the card's task).

    Returns:
        Raw and normalised reward and cost with spread across seeds, plus the settings used.
    """
    card = read_card(Path(model_dir))
    reward_range = card.reward_return_range
    if reward_range is None:
        raise UserError(f"{model_dir}: the card has no dataset reward range")
    if target_reward is None:
        target_reward = target_reward_for(card.default_targets or [], target_cost)
    seed_groups = split_seeds(split, episodes, seeds)
    jobs = [
        RolloutJob(
            str(model_dir),
            task or card.task,
            tuple(
                EpisodeSpec(
                    seed, target_reward, target_cost, deterministic, budget_guard=budget_guard
                )
                for seed in chunk
            ),
        )
        for chunk in seed_groups
    ]
    label = f"evaluate {card.name} @ cost {target_cost:g} ({_mode(deterministic)})"
    results = run_parallel(jobs, workers, label)
    return {
        "model": card.name,
        "version": card.version,
        "task": task or card.task,
        "target_reward": target_reward,
        "target_cost": target_cost,
        "kappa": target_cost,
        "seeds": seeds,
        "split": split,
        "deterministic": deterministic,
        "budget_guard": budget_guard,
        "guarded_steps_mean": float(np.mean([result.guard.guarded_steps for result in results])),
        **_summary(results, reward_range, seed_groups),
    }


def _mode(deterministic: bool) -> str:
    return f"{action_mode(deterministic)} actions"


def evaluate_benchmark(model_dir: str | Path, **options: Any) -> dict[str, Any]:
    """The benchmark convention: average the scores over the reported budgets 10, 20 and 40."""
    rows = [
        evaluate_policy_dir(model_dir, target_cost=budget, **options) for budget in REPORTED_BUDGETS
    ]
    keys = ("normalised_reward_mean", "normalised_cost_mean")
    average = {key: float(np.mean([row[key] for row in rows])) for key in keys}
    return {
        "convention": "benchmark",
        "thresholds": list(REPORTED_BUDGETS),
        "rows": rows,
        **average,
        "safe": all(row["safe"] for row in rows),
    }


def to_markdown(result: dict[str, Any]) -> str:
    """A Markdown table of one or more evaluation rows."""
    rows = result.get("rows", [result])
    lines = [
        "| model | actions | target reward | target cost | reward (± episodes) | cost (± episodes) "
        "| normalised reward (± seeds) | normalised cost (± seeds) | episodes over budget | safe |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {action_mode(row['deterministic'])}"
            f"{', guarded' if row.get('budget_guard') else ''} "
            f"| {row['target_reward']:g} | {row['target_cost']:g} "
            f"| {row['reward_mean']:.1f} ± {row['reward_std']:.1f} "
            f"| {row['cost_mean']:.1f} ± {row['cost_std']:.1f} "
            f"| {row['normalised_reward_mean']:.1f} ± {row['normalised_reward_std']:.1f} "
            f"| {row['normalised_cost_mean']:.2f} ± {row['normalised_cost_std']:.2f} "
            f"| {row['share_over_budget']:.0%} | {'yes' if row['safe'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def evaluate_protocol(model_dir: str | Path, **options: Any) -> dict[str, Any]:
    """The reported protocol: every reported budget, with sampled and with mean actions."""
    options.pop("deterministic", None)
    rows = [
        evaluate_policy_dir(model_dir, target_cost=budget, deterministic=mean, **options)
        for budget in REPORTED_BUDGETS
        for mean in (False, True)
    ]
    return {
        "convention": "protocol",
        "thresholds": list(REPORTED_BUDGETS),
        "rows": rows,
        "safe": all(row["safe"] for row in rows),
    }


def report_paths(out: Path, convention: str, guarded: bool = True) -> list[Path]:
    """The files `write_report` writes; unguarded figures get their own (`_unguarded`), so the
    guarded and unguarded runs of one model sit side by side."""
    stem = out / f"evaluation_{convention}{'' if guarded else '_unguarded'}"
    return [stem.with_suffix(".json"), stem.with_suffix(".md")]


def write_report(result: dict[str, Any], out: Path, convention: str, guarded: bool = True) -> Path:
    """Write `out/evaluation_<convention>[_unguarded].json` and `.md` (each atomically); returns
    their stem."""
    json_path, markdown_path = report_paths(out, convention, guarded)
    text = json.dumps(result, indent=2)
    write_atomic(json_path, lambda temporary: temporary.write_text(text))
    write_atomic(markdown_path, lambda temporary: temporary.write_text(to_markdown(result)))
    return json_path.with_suffix("")


def record_report(
    model_dir: Path, stem: Path, convention: str, guarded: bool, task: str, split: str
) -> None:
    """The ledger's entry for an evaluation written to `stem`.json."""
    fate = f"{convention}{'' if guarded else ', unguarded'}: {stem}.json"
    record(LedgerEntry("evaluate", str(model_dir), fate, task=task, split=split))


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported policy directory (models/NAME)")
    parser.add_argument("--task", help="env id (default: the model card's task)")
    parser.add_argument("--episodes", type=positive_int, default=20, help="episodes per seed")
    parser.add_argument("--seeds", type=positive_int, default=3, help="number of seeds")
    parser.add_argument("--target-reward", type=finite_float, help="default: from the model card")
    parser.add_argument("--target-cost", type=budget, default=10.0, help="cost budget kappa")
    parser.add_argument(
        "--convention",
        choices=["paper", "benchmark", "protocol"],
        default="paper",
        help="paper: one kappa; benchmark: average over kappa = 10, 20, 40; protocol: each of "
        "kappa = 10, 20, 40 with sampled and with mean actions",
    )
    parser.add_argument("--deterministic", action="store_true", help="use the mean action")
    parser.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    parser.add_argument(
        "--split",
        choices=SEED_SPLITS,
        default="test",
        help="whose seeds: `test` (default) is the reported evaluation, run once per shipped model"
        " and never used to choose; `selection` / `validation` are for runs that choose (results"
        " go to OUT/<split>/, never into the card)",
    )
    parser.add_argument(
        "--no-budget-guard",
        dest="budget_guard",
        action="store_false",
        help="without the service's budget guard (the unguarded figures; --record adds"
        " /unguarded to the card's key)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="directory for evaluation_*.json / .md (default: reports/NAME for a model in this"
        " checkout's models/, else the model's own folder)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="also store the result in the model card's `evaluation`",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace earlier results in the output folder; run a model on a --task other than"
        " its card's",
    )
    return parser


def _record_key(convention: str, target_cost: float, deterministic: bool) -> str:
    mode = action_mode(deterministic)
    if convention == "protocol":
        return "protocol"
    if convention == "benchmark":
        return f"benchmark/{mode}"
    return f"kappa_{target_cost:g}/{mode}"


@exit_on_user_errors("cdt evaluate")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt evaluate`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.record and args.split != "test":
        parser.error("--record stores the reported evaluation: only with --split test")
    check_split(args.split, args.episodes, args.seeds)
    card = load_policy(args.model_dir, writes_card=args.record).card
    task = check_task_for(card, args.task, args.force)
    out = args.out or default_report_dir(args.model_dir)
    if args.split != "test":
        out = out / args.split  # never beside (or instead of) the reported figures
    check_report_outputs(report_paths(out, args.convention, args.budget_guard), args.force)
    options = {
        "episodes": args.episodes,
        "seeds": args.seeds,
        "task": task,
        "workers": args.workers,
        "deterministic": args.deterministic,
        "budget_guard": args.budget_guard,
        "split": args.split,
    }
    if args.convention == "benchmark":
        result = evaluate_benchmark(args.model_dir, **options)
    elif args.convention == "protocol":
        result = evaluate_protocol(args.model_dir, **options)
    else:
        result = evaluate_policy_dir(
            args.model_dir,
            target_reward=args.target_reward,
            target_cost=args.target_cost,
            **options,
        )
    print(to_markdown(result))
    stem = write_report(result, out, args.convention, args.budget_guard)
    print(f"written: {stem}.json, {stem}.md")
    record_report(args.model_dir, stem, args.convention, args.budget_guard, task, args.split)
    if args.record:
        key = _record_key(args.convention, args.target_cost, args.deterministic)
        key += "" if args.budget_guard else "/unguarded"
        record_evaluation(args.model_dir, key, result)


if __name__ == "__main__":
    main()
