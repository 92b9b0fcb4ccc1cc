"""The budget guard measured from outside: the same seeds guarded and unguarded through `cdt serve`.

    python bench/budget_guard.py --models cdt-carrun-paper cdt-ballrun-paper --episodes 20 \
        --seed 7100000 --json guard.json

Starts `cdt serve` on the model repository (or uses `--server URL`). For each model, budget
(`--budgets`, default 10, 20, 40), action mode and a budget cut at mid-episode (`--cut`, default
40 then 10 at half the model's `max_episode_len`; run twice: as a controller that says nothing
beforehand, and as one whose episodes name the cut's budget as their `cut_floor`), it runs
`--episodes` simulator episodes with
`cdt rollout`'s client, once with the service's budget guard (the default) and once with
`budget_guard: false`, on the same seeds. It prints, per row, the share of episodes over the
budget in force at their end, the mean cost and normalised reward of both, the reward the guard
cost and its guarded steps per episode.

It reads the server's `/metrics` before and after, and checks that its budget-adherence counters
moved by what the client counted (episodes ended, over budget, guarded steps): the figures an
operator sees are the ones users get. That holds when nothing else uses the server meanwhile.

`--guard '{"early_scale": 0.5}'` measures the models with those guard settings instead of their
cards' (served from a copy of their folders). `--record` writes the rows into each card's
`budget_guard_measured`, and with `--guard` the settings into its `budget_guard` (`runtime.card`),
once the server has stopped; a server that already runs must be restarted to serve the new cards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

from bench.local_server import add_service_arguments, service_url
from clients.rollout import EpisodeOutcome, RolloutConfig, run_rollouts
from runtime.arguments import positive_int
from runtime.budget_guard import BudgetGuard
from runtime.card import GuardFigures, GuardMeasurement, read_card, update_card
from runtime.evaluation_protocol import REPORTED_BUDGETS, action_mode

ADHERENCE = (
    "cdt_episodes_ended_total",
    "cdt_episodes_over_budget_total",
    "cdt_budget_guard_steps_total",
)
"""The `/metrics` counters the client's counts are checked against."""


@dataclass(frozen=True)
class RowSpec:
    """One row: a starting budget, an optional budget change and an action mode."""

    budget: float
    deterministic: bool
    schedule: tuple[tuple[int, float], ...] = ()
    cut_floor: float | None = None
    """The lowest budget the episodes say they may be cut to (None: they say nothing)."""

    @property
    def schedule_text(self) -> str:
        """`STEP:LIMIT,...` as `cdt rollout --cost-schedule` takes it; empty without a change."""
        return ",".join(f"{step}:{limit:g}" for step, limit in self.schedule)


def figures(outcomes: Sequence[EpisodeOutcome]) -> GuardFigures:
    """Share over budget, mean cost, mean normalised reward and guarded steps of episodes."""
    rewards = [o.normalised_reward for o in outcomes if o.normalised_reward is not None]
    return GuardFigures(
        share_over_budget=float(np.mean([o.over_budget for o in outcomes])),
        cost_mean=float(np.mean([o.cost for o in outcomes])),
        normalised_reward=float(np.mean(rewards)) if len(rewards) == len(outcomes) else None,
        guarded_steps_mean=float(np.mean([o.guarded_steps for o in outcomes])),
    )


def row_specs(
    budgets: Sequence[float], cut: tuple[float, float] | None, episode_len: int
) -> list[RowSpec]:
    """Every budget in both action modes, then the cut at mid-episode in both, unannounced and
    announced (the episodes name the cut's budget as their floor)."""
    specs = [RowSpec(budget, mean) for budget in budgets for mean in (False, True)]
    if cut is not None:
        first, then = cut
        schedule = ((0, first), (episode_len // 2, then))
        specs += [
            RowSpec(first, mean, schedule, floor)
            for floor in (None, then)
            for mean in (False, True)
        ]
    return specs


def rollout_config(
    server: str, model: str, spec: RowSpec, guard: bool, seeds: tuple[int, int]
) -> RolloutConfig:
    """`episodes` episodes of one row from seed `first`, `seeds` = (first, episodes)."""
    first, episodes = seeds
    return RolloutConfig(
        server=server, model=model, episodes=episodes, cost_limit=spec.budget,
        cost_schedule=spec.schedule, seed=first, deterministic=spec.deterministic,
        budget_guard=guard, cut_floor=spec.cut_floor, announce_cuts=False,
    )  # fmt: skip


def measure_rows(configs: list[RolloutConfig], workers: int) -> list[list[EpisodeOutcome]]:
    """Run each config's episodes, in `workers` processes when more than one."""
    if workers <= 1:
        return [run_rollouts(config) for config in configs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(run_rollouts, configs))


def guard_measurement(
    spec: RowSpec, guarded: list[EpisodeOutcome], unguarded: list[EpisodeOutcome], seed: int
) -> GuardMeasurement:
    """One row from its guarded and unguarded episodes (the same seeds)."""
    return GuardMeasurement(
        budget=spec.budget,
        action_mode=action_mode(spec.deterministic),
        cost_schedule=spec.schedule_text,
        cut_floor=spec.cut_floor,
        episodes=len(guarded),
        first_seed=seed,
        guarded=figures(guarded),
        unguarded=figures(unguarded),
    )


def describe(model: str, rows: Sequence[GuardMeasurement]) -> str:
    """One model's rows as a Markdown table."""
    lines = [
        f"\n{model}",
        "| actions | budget | over: guarded / unguarded | cost | normalised reward "
        "| guard's reward cost | guarded steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        guarded, unguarded = row.guarded, row.unguarded
        budget = row.cost_schedule or f"{row.budget:g}"
        if row.cut_floor is not None:
            budget += f", floor {row.cut_floor:g}"
        reward, cost_of_guard = "n/a", "n/a"
        if guarded.normalised_reward is not None and unguarded.normalised_reward is not None:
            reward = f"{guarded.normalised_reward:.1f} / {unguarded.normalised_reward:.1f}"
            cost_of_guard = f"{unguarded.normalised_reward - guarded.normalised_reward:+.1f}"
        lines.append(
            f"| {row.action_mode} | {budget} "
            f"| {guarded.share_over_budget:.0%} / {unguarded.share_over_budget:.0%} "
            f"| {guarded.cost_mean:.1f} / {unguarded.cost_mean:.1f} | {reward} "
            f"| {cost_of_guard} | {guarded.guarded_steps_mean:.0f} |"
        )
    return "\n".join(lines)


def scrape(server: str) -> dict[str, float]:
    """The adherence counters of `/metrics`, summed per (metric, model)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{server}/metrics", timeout=10) as response:
        text = response.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ADHERENCE:
                key = f"{sample.name}{{model={sample.labels['model']}}}"
                totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def client_counts(model: str, outcomes: Sequence[EpisodeOutcome]) -> dict[str, float]:
    """What `scrape` should have moved by for these episodes of `model`."""
    counts = (
        len(outcomes),
        sum(o.over_budget for o in outcomes),
        sum(o.guarded_steps for o in outcomes),
    )
    return {f"{name}{{model={model}}}": float(n) for name, n in zip(ADHERENCE, counts, strict=True)}


def metrics_disagreements(
    before: dict[str, float], after: dict[str, float], expected: dict[str, float]
) -> list[str]:
    """Each counter whose change differs from the client's count, as one line."""
    return [
        f"{key}: /metrics moved by {after.get(key, 0.0) - before.get(key, 0.0):g}, "
        f"the client counted {count:g}"
        for key, count in expected.items()
        if after.get(key, 0.0) - before.get(key, 0.0) != count
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_service_arguments(parser)
    parser.add_argument("--episodes", type=positive_int, default=20, help="episodes per row")
    parser.add_argument("--seed", type=int, default=7_100_000, help="first episode seed")
    parser.add_argument(
        "--budgets", type=float, nargs="+", default=list(REPORTED_BUDGETS), help="cost limits"
    )
    parser.add_argument(
        "--cut", default="40:10", help="FIRST:THEN budget cut at mid-episode ('none': no cut)"
    )
    parser.add_argument("--json", type=Path, help="write the rows and every episode here")
    parser.add_argument(
        "--workers", type=positive_int, default=1, help="client processes running rows at once"
    )
    parser.add_argument(
        "--record", action="store_true", help="write the rows into the cards (restart after)"
    )
    parser.add_argument(
        "--guard", type=guard_settings, help="budget guard settings (JSON) to measure and record"
    )
    return parser


def guard_settings(text: str) -> BudgetGuard:
    """`--guard`: a JSON object of `BudgetGuard` fields."""
    try:
        return BudgetGuard.model_validate_json(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"--guard: {error}") from None


@contextlib.contextmanager
def guarded_copy(models_dir: Path, models: Sequence[str], guard: BudgetGuard) -> Iterator[Path]:
    """A temporary models folder holding `models` with `guard` in their cards."""
    with tempfile.TemporaryDirectory(prefix="guarded-models-") as temporary:
        for model in models:
            shutil.copytree(models_dir / model, Path(temporary) / model)
            update_card(Path(temporary) / model, budget_guard=guard.model_dump(mode="json"))
        yield Path(temporary)


def parse_cut(text: str) -> tuple[float, float] | None:
    """`FIRST:THEN` as two budgets; None for `none`."""
    if text == "none":
        return None
    first, _, then = text.partition(":")
    return float(first), float(then)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.guard is not None and args.server is not None:
        raise SystemExit("--guard needs a server started here: it serves copies of the cards")
    with contextlib.ExitStack() as stack:
        served = args.models_dir
        if args.guard is not None:
            served = stack.enter_context(guarded_copy(args.models_dir, args.models, args.guard))
        rows = measure(args, argparse.Namespace(**{**vars(args), "models_dir": served}))
    if args.record:
        for model, measured in rows.items():
            update_card(args.models_dir / model, budget_guard_measured=measured)
            if args.guard is not None:
                update_card(args.models_dir / model, budget_guard=args.guard)


def measure(
    args: argparse.Namespace, service: argparse.Namespace
) -> dict[str, list[GuardMeasurement]]:
    """Every row of every model through the service `service` names; prints and returns them."""
    cut = parse_cut(args.cut)
    rows: dict[str, list[GuardMeasurement]] = {}
    kept: dict[str, list[dict[str, object]]] = {}
    with service_url(service) as url:
        for model in args.models:
            before, seeds = scrape(url), (args.seed, args.episodes)
            length = read_card(service.models_dir / model).max_episode_len
            specs = row_specs(args.budgets, cut, length)
            configs = [
                rollout_config(url, model, spec, guard, seeds)
                for spec in specs
                for guard in (True, False)
            ]
            ran = measure_rows(configs, args.workers)
            rows[model] = [
                guard_measurement(spec, ran[2 * i], ran[2 * i + 1], args.seed)
                for i, spec in enumerate(specs)
            ]
            outcomes = [outcome for episodes in ran for outcome in episodes]
            print(describe(model, rows[model]))
            wrong = metrics_disagreements(before, scrape(url), client_counts(model, outcomes))
            print("/metrics agrees with the client" if not wrong else "\n".join(wrong))
            kept[model] = [{**vars(o), "over_budget": o.over_budget} for o in outcomes]
    if args.json:
        dumped = {m: [row.model_dump(mode="json") for row in r] for m, r in rows.items()}
        args.json.write_text(json.dumps({"rows": dumped, "episodes": kept}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
