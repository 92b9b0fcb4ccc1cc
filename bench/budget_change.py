"""Budgets changed mid-episode, from outside: served policies driven through `cdt serve`.

    python bench/budget_change.py --models cdt-carrun-cpu --seed 950000 --episodes 10

Starts `cdt serve` on the model repository (or uses `--server URL`) and, for each model, action
mode and budget schedule (default: 40 then 10 at step 100, 20 then 10 at step 100, 10 then 40 at
step 100), runs `--episodes` simulator episodes over REST with `cdt rollout`'s client; each change
is a `PATCH .../budget` before that step's request. It prints the mean episode cost, how many
episodes ended over the budget in force at the end, and the mean reward. Figures only, no
verdict: cost spent before a tightening cannot be given back, so whether a tightened budget can
still be kept depends on when the policy spends, which this measures.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from bench.local_server import add_service_arguments, service_url
from clients.rollout import EpisodeOutcome, RolloutConfig, parse_cost_schedule, run_rollouts
from runtime.arguments import positive_int
from runtime.evaluation_protocol import action_mode

SCHEDULES = ("0:40,100:10", "0:20,100:10", "0:10,100:40")
"""STEP:LIMIT lists, as `cdt rollout --cost-schedule` takes them."""


def schedule_steps(text: str) -> tuple[tuple[int, float], ...]:
    """The (step, limit) pairs of a schedule that names the episode's first limit at step 0."""
    steps = parse_cost_schedule(text)
    if not steps or steps[0][0] != 0:
        raise ValueError(f"{text!r} must start with 0:LIMIT, the episode's first budget")
    return steps


@dataclass(frozen=True)
class ScheduleResult:
    """The episodes of one model under one schedule in one action mode."""

    schedule: str
    deterministic: bool
    cost_mean: float
    episodes_over: int
    """Episodes whose cost exceeded the budget in force at their end."""
    episodes: int
    reward_mean: float


def summarise(
    schedule: str, deterministic: bool, outcomes: Sequence[EpisodeOutcome]
) -> ScheduleResult:
    """One row from finished episodes."""
    count = len(outcomes)
    return ScheduleResult(
        schedule,
        deterministic,
        sum(outcome.cost for outcome in outcomes) / count,
        sum(outcome.over_budget for outcome in outcomes),
        count,
        sum(outcome.reward for outcome in outcomes) / count,
    )


def measure(
    server: str, model: str, schedules: Sequence[str], episodes: int, seed: int
) -> tuple[list[ScheduleResult], list[EpisodeOutcome]]:
    """Every (action mode, schedule) of one model, `episodes` episodes each on the same seeds."""
    results, outcomes = [], []
    for deterministic in (False, True):
        for schedule in schedules:
            steps = schedule_steps(schedule)
            config = RolloutConfig(
                server=server,
                model=model,
                episodes=episodes,
                cost_limit=steps[0][1],
                cost_schedule=steps,
                seed=seed,
                deterministic=deterministic,
            )
            ran = run_rollouts(config)
            outcomes += ran
            results.append(summarise(schedule, deterministic, ran))
    return results, outcomes


def report(model: str, results: Sequence[ScheduleResult]) -> None:
    """Print one model's rows."""
    print(f"\n{model}")
    print("| actions | budget schedule (step:limit) | cost | over the final budget | reward |")
    print("|---|---|---|---|---|")
    for row in results:
        print(
            f"| {action_mode(row.deterministic)} | {row.schedule} | {row.cost_mean:.1f} "
            f"| {row.episodes_over} of {row.episodes} | {row.reward_mean:.1f} |"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_service_arguments(parser)
    parser.add_argument("--episodes", type=positive_int, default=10, help="episodes per row")
    parser.add_argument("--seed", type=int, default=950_000, help="first episode seed")
    parser.add_argument(
        "--schedules", nargs="+", default=list(SCHEDULES), help="STEP:LIMIT,... per schedule"
    )
    parser.add_argument("--json", type=Path, help="write every episode here")
    args = parser.parse_args(argv)
    for schedule in args.schedules:
        try:
            schedule_steps(schedule)
        except ValueError as error:
            parser.error(f"--schedules {schedule!r}: {error}")
    kept: dict[str, list[dict[str, object]]] = {}
    with service_url(args) as url:
        for model in args.models:
            results, outcomes = measure(url, model, args.schedules, args.episodes, args.seed)
            report(model, results)
            kept[model] = [asdict(outcome) for outcome in outcomes]
    if args.json:
        args.json.write_text(json.dumps({"episodes": kept}, indent=2) + "\n")


if __name__ == "__main__":
    main()
