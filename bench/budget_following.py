"""Budget following from outside: served policies driven through `cdt serve` by our own client.

    python bench/budget_following.py --models cdt-carrun-cpu --seed 700000 --episodes 10

Starts `cdt serve` on the model repository (or uses `--server URL`) and, for each model, action
mode (sampled, then mean) and budget (10, 20, 40), runs `--episodes` simulator episodes over REST
with `cdt rollout`'s client, seeds `--seed` on (pick seeds the models were neither selected nor
reported on: selection uses 5,000,000 on, reports 0 .. 29,999). Target reward: each card's
default at that budget. It prints one row per (model, mode, budget) and checks the budget-following
issue's criteria in every mode:

- mean episode cost <= the budget at every budget;
- mean cost >= half the budget at every budget above the tightest (a loosened budget is used);
- at most 20 % of episodes over the tightest budget;
- mean reward does not fall as the budget grows.

Exit status 1 when a model fails a check. `--json FILE` keeps every episode.
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
from clients.rollout import EpisodeOutcome, RolloutConfig, run_rollouts, summarise
from runtime.arguments import budget, positive_int
from runtime.evaluation_protocol import REPORTED_BUDGETS, action_mode

MIN_BUDGET_USE = 0.5
MAX_SHARE_OVER_TIGHTEST = 0.2


@dataclass(frozen=True)
class BudgetResult:
    """The episodes of one model at one budget in one action mode, as `cdt rollout` sums them."""

    budget: float
    deterministic: bool
    reward_mean: float
    cost_mean: float
    share_over: float
    """Fraction of episodes whose cost exceeded the budget."""


def failed_checks(results: Sequence[BudgetResult]) -> list[str]:
    """What one action mode's results (one per budget) miss of the issue's criteria."""
    rows = sorted(results, key=lambda result: result.budget)
    if not rows:
        return ["no episodes"]
    failures = []
    for row in rows:
        if row.cost_mean > row.budget:
            failures.append(f"mean cost {row.cost_mean:.1f} over budget {row.budget:g}")
    for row in rows[1:]:
        if row.cost_mean < MIN_BUDGET_USE * row.budget:
            failures.append(
                f"budget {row.budget:g} left unused: mean cost {row.cost_mean:.1f} "
                f"< {MIN_BUDGET_USE:g} x budget"
            )
    if rows[0].share_over > MAX_SHARE_OVER_TIGHTEST:
        failures.append(
            f"{rows[0].share_over:.0%} of episodes over the tightest budget {rows[0].budget:g}"
        )
    for looser, tighter in zip(rows[1:], rows[:-1], strict=True):
        if looser.reward_mean < tighter.reward_mean:
            failures.append(
                f"reward falls from {tighter.reward_mean:.1f} at budget {tighter.budget:g} "
                f"to {looser.reward_mean:.1f} at {looser.budget:g}"
            )
    return failures


def measure(
    server: str, model: str, budgets: Sequence[float], episodes: int, seed: int
) -> tuple[list[BudgetResult], list[EpisodeOutcome]]:
    """Every (action mode, budget) of one model, `episodes` episodes each on the same seeds."""
    results, outcomes = [], []
    for deterministic in (False, True):
        for limit in budgets:
            config = RolloutConfig(
                server=server,
                model=model,
                episodes=episodes,
                cost_limit=limit,
                seed=seed,
                deterministic=deterministic,
            )
            ran = run_rollouts(config)
            outcomes += ran
            summary = summarise(ran)
            results.append(
                BudgetResult(
                    limit,
                    deterministic,
                    summary["reward_mean"],
                    summary["cost_mean"],
                    summary["share_over_budget"],
                )
            )
    return results, outcomes


def report(model: str, results: Sequence[BudgetResult]) -> list[str]:
    """Print the model's rows and verdicts; returns every failed check, mode named."""
    print(f"\n{model}")
    print("| actions | budget | reward | cost | episodes over budget |")
    print("|---|---|---|---|---|")
    for row in results:
        print(
            f"| {action_mode(row.deterministic)} | {row.budget:g} | {row.reward_mean:.1f} "
            f"| {row.cost_mean:.1f} | {row.share_over:.0%} |"
        )
    failures = []
    for deterministic in (False, True):
        mode = action_mode(deterministic)
        mine = [row for row in results if row.deterministic == deterministic]
        failures += [f"{mode}: {failure}" for failure in failed_checks(mine)]
    print("\n".join(f"FAIL {failure}" for failure in failures) or "PASS every check")
    return failures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_service_arguments(parser)
    parser.add_argument(
        "--episodes", type=positive_int, default=10, help="episodes per budget and mode"
    )
    parser.add_argument("--seed", type=int, default=700_000, help="first episode seed")
    parser.add_argument("--budgets", type=budget, nargs="+", default=list(REPORTED_BUDGETS))
    parser.add_argument("--json", type=Path, help="write every episode and verdict here")
    args = parser.parse_args(argv)
    failed: dict[str, list[str]] = {}
    kept: dict[str, list[dict[str, object]]] = {}
    with service_url(args) as url:
        for model in args.models:
            results, outcomes = measure(url, model, args.budgets, args.episodes, args.seed)
            failed[model] = report(model, results)
            kept[model] = [asdict(outcome) for outcome in outcomes]
    if args.json:
        args.json.write_text(json.dumps({"failures": failed, "episodes": kept}, indent=2) + "\n")
    raise SystemExit(1 if any(failed.values()) else 0)


if __name__ == "__main__":
    main()
