"""Budget guard alternatives offline: the same seeds through the one episode loop, guard by guard.

    python bench/guard_alternatives.py --model cdt-ballrun-paper --budgets 10 20 40 \
        --episodes 20 --seed 7000000 --alternatives unguarded fallback-5 shipped

Runs `runtime.episodes.run_episodes` (the loop every offline evaluation runs, with the service's
guard code) on an exported model, once per alternative, on the same seeds. An alternative is a
name below or `NAME={"field": value}` with `runtime.budget_guard.BudgetGuard` fields, and two of
this bench's own: `"release_as_new": true` tells the model, from mid-episode on (where a hold
for a budget cut releases), that its episode began there: time steps counted from mid-episode
and the episode's target reward-to-go afresh each step; `"released_guidance": w` sets the cost
guidance's weight from then on. It prints, per budget and action mode, the share of episodes over
budget, mean, 90th-percentile and largest cost, normalised reward and its difference to the first
alternative, guarded steps per episode, the mean cost spent by mid-episode (what a budget cut
there finds spent) and the reward earned by then (in points of the normalised range, so the rest
of the episode earned the reward less this, plus what the range's minimum subtracts).
Figures only; `bench/budget_guard.py` measures the shipped guard from outside, through the
service.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from runtime.arguments import positive_int
from runtime.budget_guard import BudgetGuard
from runtime.card import ModelCard
from runtime.episodes import (
    EpisodePolicy,
    EpisodeResult,
    EpisodeSpec,
    GuidanceWeights,
    Predict,
    Windows,
    run_episodes,
)
from runtime.evaluation_protocol import action_mode, target_reward_for
from runtime.policy import Policy
from runtime.scores import normalised_reward
from runtime.sim import check_memory_for
from runtime.user_errors import exit_on_user_errors
from training.evaluation.evaluate import onnx_episode_policy

FALLBACK_ONLY = {"mean_action_pace": 0.0, "full_noise_pace": 0.0, "hidden_reserve": 0.0}
ALTERNATIVES: dict[str, dict[str, Any] | None] = {
    "unguarded": None,
    "fallback-1": {"fallback_margin": 1.0, **FALLBACK_ONLY},
    "fallback-3": {"fallback_margin": 3.0, **FALLBACK_ONLY},
    "fallback-5": {"fallback_margin": 5.0, **FALLBACK_ONLY},
    "fallback-8": {"fallback_margin": 8.0, **FALLBACK_ONLY},
    "no-hidden-reserve": {"hidden_reserve": 0.0},
    "noise-from-pace-0.5": {"mean_action_pace": 0.5},
    "paced-0.5": {"early_scale": 0.5},
    "shipped": {},
}
"""Named alternatives: None runs without the guard; a dict overrides the card's guard."""
BENCH_FIELDS = ("release_as_new", "released_guidance")
"""Fields of an alternative that change what the model is told, not the guard."""


def parse_alternative(text: str) -> tuple[str, dict[str, Any] | None]:
    """A name of `ALTERNATIVES`, or `NAME={"field": value, ...}`."""
    name, sep, fields = text.partition("=")
    if not sep:
        if name not in ALTERNATIVES:
            raise argparse.ArgumentTypeError(f"unknown alternative {name!r}: {list(ALTERNATIVES)}")
        return name, ALTERNATIVES[name]
    return name, dict(json.loads(fields))


def row(
    results: list[EpisodeResult],
    limit: float,
    reward_range: tuple[float, float],
    first: float,
    mid: int,
) -> tuple[float, str]:
    """The normalised reward of one run, and its share over, mean, p90 and largest cost (how
    far the worst episode went over), reward, reward against `first` (the row's first
    alternative; nan: this is it), guarded steps, and the mean cost and reward (points of the
    normalised range) of the first `mid` steps."""
    costs = np.array([result.cost for result in results])
    reward = normalised_reward(float(np.mean([result.reward for result in results])), reward_range)
    guarded = np.mean([result.guard.guarded_steps for result in results])
    by_mid = np.mean([sum(result.step_costs[:mid]) for result in results])
    earned = np.mean([sum(result.step_rewards[:mid]) for result in results])
    earned_points = normalised_reward(float(earned), reward_range) - normalised_reward(
        0.0, reward_range
    )
    against = "" if np.isnan(first) else f"{reward - first:+.1f}"
    return reward, (
        f"{np.mean(costs > limit):.0%} | {costs.mean():.1f} | {np.quantile(costs, 0.9):.0f} "
        f"| {costs.max():.0f} | {reward:.1f} | {against} | {guarded:.0f} | {by_mid:.1f} "
        f"| {earned_points:.1f}"
    )


def released_as_new(
    predict: Predict, release: int, target_reward: float, guidance: float | None
) -> Predict:
    """`predict` for windows whose newest step is at or past `release` told that their episode
    began at `release` (time steps from there, `target_reward` to go), with cost guidance weight
    `guidance` (None: as asked)."""

    def told_afresh(windows: Windows, weights: GuidanceWeights) -> tuple[Any, Any]:
        late = windows["time_steps"][:, -1] >= release  # [B]
        told = dict(windows)
        told["time_steps"] = np.where(
            late[:, None], np.maximum(windows["time_steps"] - release, 0), windows["time_steps"]
        )
        told["returns_to_go"] = np.where(
            late[:, None], np.float32(target_reward), windows["returns_to_go"]
        ).astype(np.float32)
        if guidance is not None:
            weights = [
                guidance if past else weight for past, weight in zip(late, weights, strict=True)
            ]
        return predict(told, weights)

    return told_afresh


@exit_on_user_errors("bench/guard_alternatives.py")
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model name under --models-dir")
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--budgets", type=float, nargs="+", default=[10.0, 20.0, 40.0])
    parser.add_argument("--modes", nargs="+", choices=["sampled", "mean"], default=["sampled"])
    parser.add_argument("--episodes", type=positive_int, default=20)
    parser.add_argument("--seed", type=int, default=7_000_000, help="first episode seed")
    parser.add_argument("--cut", type=float, help="cut the budget to this at mid-episode")
    parser.add_argument(
        "--alternatives", nargs="+", type=parse_alternative, default=list(ALTERNATIVES.items())
    )
    args = parser.parse_args(argv)
    check_memory_for(args.episodes)  # a row's episodes step together, one env each
    policy = Policy.load(args.models_dir / args.model)
    card, base = policy.card, onnx_episode_policy(policy)
    reward_range = card.reward_return_range or (0.0, 1.0)
    header = (
        "| budget | actions | alternative | over | cost | p90 cost | most cost | reward "
        "| against the first | guarded steps | cost by mid-episode | reward by mid-episode |"
    )
    print(f"{args.model}\n{header}\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for budget in args.budgets:
        for deterministic in (mode == "mean" for mode in args.modes):
            first = float("nan")
            for name, fields in args.alternatives:
                ran = run_alternative(base, card, fields, args, (budget, deterministic))
                limit, label = budget, f"{budget:g}"
                if args.cut is not None:
                    limit, label = args.cut, f"{budget:g} -> {args.cut:g}"
                mid = card.max_episode_len // 2
                reward, figures = row(ran, limit, reward_range, first, mid)
                first = reward if np.isnan(first) else first
                print(
                    f"| {label} | {action_mode(deterministic)} | {name} | {figures} |", flush=True
                )


def run_alternative(
    base: EpisodePolicy,
    card: ModelCard,
    fields: dict[str, Any] | None,
    args: argparse.Namespace,
    row_spec: tuple[float, bool],
) -> list[EpisodeResult]:
    """The episodes of one (budget, action mode) with one alternative, on the row's seeds."""
    budget, deterministic = row_spec
    asked = fields or {}
    guard_fields = {k: v for k, v in asked.items() if k not in BENCH_FIELDS}
    guard = BudgetGuard.model_validate(card.guard.model_dump() | guard_fields)
    mid = card.max_episode_len // 2
    schedule = () if args.cut is None else ((mid, args.cut),)
    target = target_reward_for(card.default_targets or [], budget)
    guarded = fields is not None
    specs = [
        EpisodeSpec(args.seed + e, target, budget, deterministic, schedule, budget_guard=guarded)
        for e in range(args.episodes)
    ]
    policy = dataclasses.replace(base, budget_guard=guard)
    if asked.get("release_as_new"):
        told = released_as_new(base.predict, mid, target, asked.get("released_guidance"))
        policy = dataclasses.replace(policy, predict=told)
    return run_episodes(policy, card.task, specs, record_steps=True)


if __name__ == "__main__":
    main()
