"""`cdt rollout`: drive a simulator through a running policy service.

The env runs here; every step its observation, reward and cost go to the service, which keeps the
episode's context window and budgets and answers with the action. A cost schedule
(`--cost-schedule 0:20,100:5`) changes the episode's cost limit mid-episode through
`PATCH /v1/episodes/{id}/budget`, as a controller would. Also usable as a library:
`run_rollouts(RolloutConfig(...))`.

Everything is checked before the first episode: the values, the `--json` file (an existing one is
replaced only with `--force`), the model and the task (a model runs on a task other than its own
only with `--force`), and the cost schedule (a change past the episode's end is refused). The
summary is one JSON line; `safe` means that no episode went over its budget.

An episode the service fails (an error, no answer, an answer that breaks the API's contract) is
reported in one line, `seed S: FAILED: ...`, and the next episode runs; the summary covers the
episodes that finished and counts the others (`episodes_failed`), and the command exits with 1.
After `MAX_UNANSWERED_IN_A_ROW` episodes in a row without an answer (refused connections,
timeouts: a dead or frozen service), the rest are not run (`seeds A-B: NOT RUN: ...`, counted as
failed), so that a frozen service costs a few timeouts and not one per episode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from clients.answers import check_action
from clients.client import PolicyClient
from clients.errors import PolicyClientError, ServiceUnreachableError
from clients.rollout_results import EpisodeFailure as EpisodeFailure
from clients.rollout_results import EpisodeOutcome as EpisodeOutcome
from clients.rollout_results import described
from clients.rollout_results import printed_summary as printed_summary
from clients.rollout_results import summarise as summarise
from runtime.arguments import (
    CommandParser,
    budget,
    finite_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from runtime.evaluation_protocol import target_reward_for
from runtime.files import check_writable, refuse_overwrite, write_atomic
from runtime.scores import normalised_cost, normalised_reward
from runtime.user_errors import UserError, one_line, stop
from service.schemas import MAX_SEED, ModelPublic

logger = logging.getLogger(__name__)

MAX_UNANSWERED_IN_A_ROW = 3
"""Episodes in a row the service does not answer before the rest are not run."""


@dataclass(frozen=True)
class RolloutConfig:
    """What to roll out, against which server."""

    server: str
    model: str
    task: str | None = None
    episodes: int = 5
    cost_limit: float = 10.0
    target_reward: float | None = None
    cost_schedule: tuple[tuple[int, float], ...] = ()
    seed: int = 0
    deterministic: bool = False
    token: str | None = None
    timeout: float = 10.0
    """Seconds for each request's connection and answer (`--timeout`)."""
    force: bool = False
    """Run the model on a task other than its card's (observation sizes must still match)."""
    budget_guard: bool = True
    """The service's budget guard for these episodes (`--no-budget-guard`: off)."""
    cut_floor: float | None = None
    """The lowest budget the episodes may be cut to, for the guard to keep ready (`--cut-floor`;
    None: what `announce_cuts` gives)."""
    announce_cuts: bool = True
    """Without a `cut_floor`: a schedule that cuts below its starting limit names its lowest
    later limit as the episodes' cut floor, as a controller that knows its schedule would
    (`--no-announce-cuts`: say nothing, as one that does not)."""

    def announced_floor(self) -> float | None:
        """The cut floor the episodes name at their creation (None: none, the card's)."""
        if self.cut_floor is not None or not self.announce_cuts:
            return self.cut_floor
        schedule = dict(self.cost_schedule)
        start = schedule.pop(0, self.cost_limit)
        lowest = min(schedule.values(), default=start)
        return lowest if lowest < start else None


def parse_cost_schedule(text: str) -> tuple[tuple[int, float], ...]:
    """Parse `step:limit,step:limit` (e.g. `0:20,100:5`) into sorted (step, cost limit) pairs."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, sep, limit = part.partition(":")
        try:
            pair = (int(step), float(limit))
        except ValueError:
            pair = (-1, -1.0)
        if not sep or pair[0] < 0 or not (0.0 <= pair[1] < float("inf")):
            raise ValueError(f"bad cost schedule entry {part!r}: expected STEP:LIMIT, both >= 0")
        pairs.append(pair)
    return tuple(sorted(pairs))


def _target_reward(model: ModelPublic, config: RolloutConfig, cost_limit: float) -> float:
    if config.target_reward is not None:
        return config.target_reward
    if not model.default_targets:
        raise ValueError(f"model {model.name} has no default targets: pass --target-reward")
    return target_reward_for(model.default_targets, cost_limit)


def _normalised(
    model: ModelPublic, reward: float, cost: float, kappa: float
) -> tuple[float | None, float]:
    reward_range = model.reward_return_range
    scaled = None
    if reward_range is not None and reward_range[1] > reward_range[0]:
        scaled = normalised_reward(reward, reward_range)
    return scaled, normalised_cost(cost, kappa)


def run_episode(
    client: PolicyClient, env: Any, model: ModelPublic, config: RolloutConfig, seed: int
) -> EpisodeOutcome:
    """Play one episode of `env` with actions from the service."""
    schedule = dict(config.cost_schedule)
    initial_limit = cost_limit = schedule.pop(0, config.cost_limit)
    cut_floor = config.announced_floor()
    observation, _ = env.reset(seed=seed)
    answer = client.create_episode(
        config.model,
        _target_reward(model, config, cost_limit),
        cost_limit,
        np.asarray(observation, dtype=float).tolist(),
        seed=seed,
        deterministic=config.deterministic,
        budget_guard=config.budget_guard,
        cut_floor=cut_floor,
    )
    episode_id, steps, totals, changes = answer.episode_id, 0, [0.0, 0.0], []
    warnings = dict.fromkeys(answer.warnings)
    try:
        while True:
            check_action(answer.action, model)  # the client checks too, when it has the card
            observation, reward, terminated, truncated, info = env.step(
                np.asarray(answer.action, dtype=np.float32)
            )
            cost = float(info.get("cost", 0.0))
            steps, totals = steps + 1, [totals[0] + float(reward), totals[1] + cost]
            if terminated or truncated:  # the last cost reaches the service's summary too
                client.step(episode_id, _listed(observation), float(reward), cost, step=steps)
                break
            if steps in schedule:
                cost_limit = schedule[steps]
                changed = client.update_budget(episode_id, cost_limit=cost_limit)
                warnings |= dict.fromkeys(changed.warnings)
                changes.append((steps, cost_limit))
            answer = client.step(
                episode_id, np.asarray(observation, dtype=float).tolist(), float(reward), cost,
                step=steps,
            )  # fmt: skip
            warnings |= dict.fromkeys(answer.warnings)
    except ServiceUnreachableError:
        raise  # a service that did not answer the step will not answer the close: its TTL ends it
    except BaseException:
        with contextlib.suppress(PolicyClientError):  # the first error is the one to report
            client.close_episode(episode_id)
        raise
    ended = client.close_episode(episode_id)
    scores = _normalised(model, totals[0], totals[1], cost_limit)
    return EpisodeOutcome(
        seed, steps, totals[0], totals[1], initial_limit, cost_limit, *scores, changes,
        list(warnings), ended.guarded_steps, cut_floor,
    )  # fmt: skip


def _listed(observation: Any) -> list[float]:
    return list(np.asarray(observation, dtype=float).tolist())


def run_rollouts(
    config: RolloutConfig, failures: list[EpisodeFailure] | None = None
) -> list[EpisodeOutcome]:
    """Run `config.episodes` episodes through the service (the library entry point).

    With `failures`, an episode the service fails (`PolicyClientError`) is appended there and
    the next one runs, unless `MAX_UNANSWERED_IN_A_ROW` episodes in a row got no answer: then
    the rest are appended as not run. Without, the error is raised."""
    from runtime.sim import check_task, make_env, seed_simulator

    if config.seed + config.episodes - 1 > MAX_SEED:
        raise ValueError(
            f"seeds {config.seed}..{config.seed + config.episodes - 1} pass {MAX_SEED}"
        )
    if config.task is not None:
        check_task(config.task)  # before the server is asked anything
    with PolicyClient(config.server, token=config.token, timeout=config.timeout) as client:
        models = {model.name: model for model in client.list_models()}
        if config.model not in models:
            raise ValueError(
                f"the server has no model {config.model!r}; it serves {sorted(models)}"
            )
        model = models[config.model]
        task = config.task or model.task
        env = make_env(task)
        _check_task(env, model, config.task, config.force)
        check_schedule(config.cost_schedule, episode_length(env, model))
        env.close()
        outcomes, unanswered = [], 0
        for index in tqdm(range(config.episodes), desc=f"rollout {config.model}", unit="episode"):
            if failures is not None and unanswered == MAX_UNANSWERED_IN_A_ROW:
                reason = f"the service did not answer the {unanswered} episodes before"
                failures.extend(
                    EpisodeFailure(config.seed + rest, reason, ran=False)
                    for rest in range(index, config.episodes)
                )
                break
            # A fresh simulator per episode, seeded by the episode's own seed: Bullet-Safety-Gym's
            # drones keep state across `reset` (a reused env cost 18 where a fresh one cost 0,
            # docs/decisions/budget-guard.md), and seed s must give one episode whatever runs
            # before it.
            seed = config.seed + index
            seed_simulator(seed)
            env = make_env(task)
            try:
                outcomes.append(run_episode(client, env, model, config, seed))
                unanswered = 0
            except PolicyClientError as error:
                if failures is None:
                    raise
                failures.append(EpisodeFailure(seed, one_line(error)))
                unanswered = unanswered + 1 if isinstance(error, ServiceUnreachableError) else 0
            finally:
                env.close()
    return outcomes


def _check_task(env: Any, model: ModelPublic, task: str | None, force: bool = False) -> None:
    """Refuse an env the model cannot read, and a task other than the model's unless `force`."""
    shape = getattr(env.observation_space, "shape", None) or ()
    if int(np.prod(shape)) != model.observation_dim:
        raise ValueError(
            f"{task} observations have {int(np.prod(shape))} values; model {model.name} "
            f"({model.task}) reads {model.observation_dim}"
        )
    if task is not None and task != model.task:
        if not force:
            raise ValueError(
                f"model {model.name} was trained on {model.task}, not {task}: pass --force to"
                " run it there anyway"
            )
        logger.warning("model %s was trained on %s, not %s", model.name, model.task, task)


def episode_length(env: Any, model: ModelPublic) -> int:
    """The env's time limit (its spec's), else the longest episode the model was trained on."""
    spec = getattr(env, "spec", None)
    limit = getattr(spec, "max_episode_steps", None)
    return int(limit) if limit else model.max_episode_len


def check_schedule(schedule: tuple[tuple[int, float], ...], length: int) -> None:
    """Refuse a budget change at or after the episode's last step: it would never apply."""
    late = [step for step, _ in schedule if step >= length]
    if late:
        raise ValueError(
            f"--cost-schedule changes the limit at step {late[0]}, but episodes end after"
            f" {length} steps (the last change may come at step {length - 1})"
        )


def _schedule_argument(text: str) -> tuple[tuple[int, float], ...]:
    try:
        return parse_cost_schedule(text)
    except ValueError as error:  # argparse shows an ArgumentTypeError's text, not a ValueError's
        raise argparse.ArgumentTypeError(str(error)) from None


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="cdt rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="service base URL")
    parser.add_argument("--model", required=True, help="model name (GET /v1/models)")
    parser.add_argument("--task", help="gymnasium env id (default: the model's task)")
    parser.add_argument("--episodes", type=positive_int, default=5)
    parser.add_argument("--cost-limit", type=budget, default=10.0, help="episode cost budget")
    parser.add_argument(
        "--target-reward", type=finite_float, help="default: the model card's target"
    )
    parser.add_argument(
        "--cost-schedule",
        default="",
        type=_schedule_argument,
        help="STEP:LIMIT,... e.g. 0:20,100:5 changes the limit at step 100",
    )
    parser.add_argument("--seed", type=non_negative_int, default=0, help="first episode's seed")
    parser.add_argument("--deterministic", action="store_true", help="use the mean action")
    parser.add_argument(
        "--no-budget-guard",
        dest="budget_guard",
        action="store_false",
        help="turn the service's budget guard off for these episodes (the unguarded figures)",
    )
    parser.add_argument(
        "--cut-floor",
        type=budget,
        help="the lowest limit the episodes may be cut to: the guard keeps it unspent through "
        "the card's share of each episode (half by default), at some reward (default: the "
        "lowest limit a --cost-schedule cuts to)",
    )
    parser.add_argument(
        "--no-announce-cuts",
        dest="announce_cuts",
        action="store_false",
        help="do not tell the service about a --cost-schedule's cut in advance",
    )
    parser.add_argument("--token", help="bearer token, if the service requires one")
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=10.0,
        help="seconds for each request's connection and answer (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="write per-episode results and summary here")
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --json file; run the model on a --task other than its own",
    )
    return parser


def _check_json(path: Path | None, force: bool) -> None:
    """Before any episode: the --json file can be written and replaces nothing unasked."""
    if path is None:
        return
    try:
        check_writable(path, create_folders=False, option="--json")
        refuse_overwrite([path], force)
    except UserError as error:
        stop("cdt rollout", error)


def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt rollout`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    args = _parser().parse_args(argv)
    config = RolloutConfig(
        server=args.server,
        model=args.model,
        task=args.task,
        episodes=args.episodes,
        cost_limit=args.cost_limit,
        target_reward=args.target_reward,
        cost_schedule=args.cost_schedule,
        seed=args.seed,
        deterministic=args.deterministic,
        token=args.token,
        timeout=args.timeout,
        force=args.force,
        budget_guard=args.budget_guard,
        cut_floor=args.cut_floor,
        announce_cuts=args.announce_cuts,
    )
    _check_json(args.json, args.force)
    if (
        args.cost_schedule
        and args.cost_schedule[0][0] == 0
        and "--cost-limit" in (argv or sys.argv)
    ):
        logger.warning("--cost-schedule sets the limit at step 0; --cost-limit is not used")
    failures: list[EpisodeFailure] = []
    try:
        outcomes = run_rollouts(config, failures)
    except ServiceUnreachableError as error:
        stop("cdt rollout", f"cannot reach {args.server} ({error}); is `cdt serve` running there?")
    except (PolicyClientError, ValueError) as error:
        stop("cdt rollout", str(error))
    for line in described([*outcomes, *failures]):
        print(line)  # noqa: T201
    for warning in dict.fromkeys(w for outcome in outcomes for w in outcome.warnings):
        print(f"server warning: {one_line(warning)}")  # noqa: T201
    summary = summarise(outcomes, len(failures))
    print(printed_summary(summary))  # noqa: T201
    if args.json:
        record: dict[str, Any] = {"summary": summary, "episodes": [asdict(o) for o in outcomes]}
        if failures:
            record["failed"] = [asdict(failure) for failure in failures]
        text = json.dumps(record, indent=2)
        write_atomic(args.json, lambda temporary: temporary.write_text(text))
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
