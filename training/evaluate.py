"""`cdt evaluate`: returns-conditioned rollouts of an exported policy (paper Algorithm 2).

The rollouts go through the service's own inference code (`service.policy.Policy`,
`service.context.EpisodeContext`, `service.context.sample_action`), so what is measured is what
is served. Episodes run in worker processes; within a worker all its episodes step together and
share one batched forward pass per step.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from clients.scores import normalised_cost, normalised_reward
from service.context import EpisodeContext, sample_action, stack_windows
from service.policy import Policy, read_card
from training.card_update import record_evaluation

logger = logging.getLogger(__name__)

BENCHMARK_THRESHOLDS = (10.0, 20.0, 40.0)


@dataclass(frozen=True)
class EpisodeResult:
    """One evaluated episode."""

    seed: int
    reward: float
    cost: float
    length: int
    step_costs: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RolloutSpec:
    """What a worker runs: targets, seeds and an optional cost-limit schedule."""

    model_dir: str
    task: str
    target_reward: float
    target_cost: float
    seeds: tuple[int, ...]
    deterministic: bool = False
    cost_schedule: tuple[tuple[int, float], ...] = ()
    """(step, new episode cost limit) pairs applied mid-episode, as `PATCH .../budget` does."""
    record_steps: bool = False


def run_episodes(spec: RolloutSpec) -> list[EpisodeResult]:
    """Roll one episode per seed, all stepping together with one batched forward pass per step."""
    from clients.sim import make_env, seed_simulator

    policy = Policy.load(Path(spec.model_dir))
    seed_simulator(spec.seeds[0])
    card = policy.card
    envs = [make_env(spec.task) for _ in spec.seeds]
    schedule = dict(spec.cost_schedule)
    contexts = []
    for env, seed in zip(envs, spec.seeds, strict=True):
        observation, _ = env.reset(seed=seed)
        contexts.append(
            EpisodeContext.start(
                observation,
                spec.target_reward,
                spec.target_cost,
                context_len=card.context_len,
                action_dim=card.action_dim,
                seed=seed,
            )
        )
    active = list(range(len(envs)))
    lengths = [0] * len(envs)
    step_costs: list[list[float]] = [[] for _ in envs]
    while active:
        mean, log_std = policy.predict(stack_windows([contexts[i] for i in active]))
        still_active = []
        for row, i in enumerate(active):
            context = contexts[i]
            if lengths[i] in schedule:
                context.set_budget(cost_limit=schedule[lengths[i]])
            action = sample_action(
                mean[row],
                log_std[row],
                context.rng,
                card.action_low,
                card.action_high,
                spec.deterministic,
            )
            context.record_action(action)
            observation, reward, terminated, truncated, info = envs[i].step(
                action.astype(np.float32)
            )
            cost = float(info.get("cost", 0.0))
            context.advance(float(reward), cost, observation)
            lengths[i] += 1
            if spec.record_steps:
                step_costs[i].append(cost)
            if not (terminated or truncated):
                still_active.append(i)
        active = still_active
    for env in envs:
        env.close()
    return [
        EpisodeResult(seed, c.total_reward, c.total_cost, n, costs)
        for seed, c, n, costs in zip(spec.seeds, contexts, lengths, step_costs, strict=True)
    ]


def normalised_scores(
    reward: np.ndarray, cost: np.ndarray, reward_range: tuple[float, float], kappa: float
) -> tuple[np.ndarray, np.ndarray]:
    """Paper section 5: reward (R - r_min) / (r_max - r_min) * 100 and cost C / (kappa + eps)."""
    return normalised_reward(reward, reward_range), normalised_cost(cost, kappa)


def run_parallel(specs: list[RolloutSpec], workers: int, label: str) -> list[EpisodeResult]:
    results: list[EpisodeResult] = []
    total = sum(len(spec.seeds) for spec in specs)
    with tqdm(total=total, desc=label, unit="episode") as progress:
        if workers <= 1:
            for spec in specs:
                results += run_episodes(spec)
                progress.update(len(spec.seeds))
            return results
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {pool.submit(run_episodes, spec): spec for spec in specs}
            for future in as_completed(futures):
                results += future.result()
                progress.update(len(futures[future].seeds))
    return results


def episode_seeds(episodes: int, seeds: int) -> list[tuple[int, ...]]:
    """Seed s owns episodes s*10_000 + 0..episodes-1: distinct env and policy seeds."""
    return [tuple(s * 10_000 + e for e in range(episodes)) for s in range(seeds)]


def _summary(
    results: Sequence[EpisodeResult], card_data: dict[str, Any], kappa: float, seeds: int
) -> dict[str, Any]:
    dataset = card_data.get("dataset") or {}
    reward_range = (
        float(dataset.get("reward_return_min", 0.0)),
        float(dataset.get("reward_return_max", 1.0)),
    )
    reward = np.array([r.reward for r in results])
    cost = np.array([r.cost for r in results])
    norm_reward, norm_cost = normalised_scores(reward, cost, reward_range, kappa)
    per_seed = np.array([r.seed // 10_000 for r in results])
    seed_means = [
        (float(norm_reward[per_seed == s].mean()), float(norm_cost[per_seed == s].mean()))
        for s in range(seeds)
    ]
    return {
        "episodes": len(results),
        "reward_mean": float(reward.mean()),
        "reward_std": float(reward.std()),
        "cost_mean": float(cost.mean()),
        "cost_std": float(cost.std()),
        "normalised_reward_mean": float(norm_reward.mean()),
        "normalised_reward_std": float(np.std([m[0] for m in seed_means])),
        "normalised_cost_mean": float(norm_cost.mean()),
        "normalised_cost_std": float(np.std([m[1] for m in seed_means])),
        "safe": bool(norm_cost.mean() <= 1.0),
        "reward_range": list(reward_range),
    }


def evaluate_policy_dir(
    model_dir: str | Path,
    episodes: int = 20,
    seeds: int = 3,
    target_reward: float | None = None,
    target_cost: float = 10.0,
    *,
    kappa: float | None = None,
    task: str | None = None,
    workers: int = 2,
    deterministic: bool = False,
) -> dict[str, Any]:
    """Evaluate an exported policy at one (target reward, target cost) pair.

    Args:
        model_dir: `models/NAME/` with model.onnx and model.json.
        target_reward: defaults to the card's first default target, else the dataset's max return.
        kappa: the threshold scores are normalised by (defaults to `target_cost`).
        task: the env id (defaults to the card's task).

    Returns:
        Raw and normalised reward and cost with spread across seeds, plus the settings used.
    """
    card = read_card(Path(model_dir))
    card_data = card.model_dump()
    if target_reward is None:
        target_reward = default_target_reward(card_data, target_cost)
    specs = [
        RolloutSpec(
            str(model_dir), task or card.task, target_reward, target_cost, chunk, deterministic
        )
        for chunk in episode_seeds(episodes, seeds)
    ]
    results = run_parallel(specs, workers, f"evaluate {card.name} @ cost {target_cost:g}")
    summary = _summary(results, card_data, target_cost if kappa is None else kappa, seeds)
    return {
        "model": card.name,
        "version": card.version,
        "task": task or card.task,
        "target_reward": target_reward,
        "target_cost": target_cost,
        "kappa": target_cost if kappa is None else kappa,
        "seeds": seeds,
        "deterministic": deterministic,
        **summary,
    }


def default_target_reward(card_data: dict[str, Any], target_cost: float) -> float:
    """The card's default target reward at the cost closest to `target_cost`."""
    targets = card_data.get("default_targets") or []
    if targets:
        closest = min(targets, key=lambda t: abs(float(t["cost"]) - target_cost))
        return float(closest["reward"])
    return float((card_data.get("dataset") or {}).get("reward_return_max", 0.0))


def evaluate_benchmark(model_dir: str | Path, **options: Any) -> dict[str, Any]:
    """The benchmark convention: average the scores over thresholds 10, 20 and 40."""
    rows = [
        evaluate_policy_dir(model_dir, target_cost=threshold, **options)
        for threshold in BENCHMARK_THRESHOLDS
    ]
    keys = ("normalised_reward_mean", "normalised_cost_mean")
    average = {key: float(np.mean([row[key] for row in rows])) for key in keys}
    return {
        "convention": "benchmark",
        "thresholds": list(BENCHMARK_THRESHOLDS),
        "rows": rows,
        **average,
        "safe": average["normalised_cost_mean"] <= 1.0,
    }


def to_markdown(result: dict[str, Any]) -> str:
    """A Markdown table of one or more evaluation rows."""
    rows = result.get("rows", [result])
    lines = [
        "| model | target reward | target cost | reward | cost | normalised reward | "
        "normalised cost | safe |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['target_reward']:g} | {row['target_cost']:g} "
            f"| {row['reward_mean']:.1f} ± {row['reward_std']:.1f} "
            f"| {row['cost_mean']:.1f} ± {row['cost_std']:.1f} "
            f"| {row['normalised_reward_mean']:.1f} ± {row['normalised_reward_std']:.1f} "
            f"| {row['normalised_cost_mean']:.2f} ± {row['normalised_cost_std']:.2f} "
            f"| {'yes' if row['safe'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdt evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="exported policy directory (models/NAME)")
    parser.add_argument("--task", help="env id (default: the model card's task)")
    parser.add_argument("--episodes", type=int, default=20, help="episodes per seed")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds")
    parser.add_argument("--target-reward", type=float, help="default: from the model card")
    parser.add_argument("--target-cost", type=float, default=10.0, help="cost budget kappa")
    parser.add_argument(
        "--convention",
        choices=["paper", "benchmark"],
        default="paper",
        help="paper: one kappa; benchmark: average over kappa = 10, 20, 40",
    )
    parser.add_argument("--deterministic", action="store_true", help="use the mean action")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, help="directory for evaluation.json / .md")
    parser.add_argument(
        "--record",
        action="store_true",
        help="also store the result in the model card's `evaluation`",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt evaluate`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = _parser().parse_args(argv)
    if not (args.model_dir / "model.json").is_file():
        raise SystemExit(f"cdt evaluate: {args.model_dir} has no model.json")
    options = {
        "episodes": args.episodes,
        "seeds": args.seeds,
        "task": args.task,
        "workers": args.workers,
        "deterministic": args.deterministic,
    }
    if args.convention == "benchmark":
        result = evaluate_benchmark(args.model_dir, **options)
    else:
        result = evaluate_policy_dir(
            args.model_dir,
            target_reward=args.target_reward,
            target_cost=args.target_cost,
            **options,
        )
    markdown = to_markdown(result)
    print(markdown)
    out = args.out or args.model_dir / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"evaluation_{args.convention}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    stem.with_suffix(".md").write_text(markdown)
    print(f"written: {stem}.json, {stem}.md")
    if args.record:
        key = "benchmark" if args.convention == "benchmark" else f"kappa_{args.target_cost:g}"
        record_evaluation(args.model_dir, key, result)


if __name__ == "__main__":
    main()
