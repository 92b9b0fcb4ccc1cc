"""Selection rows as served: the episodes the guard choices (`cdt guidance`, `cdt shield`,
`cdt cut-ready`) measure a model variant by, on the selection seeds with the budget guard on.

The two action modes run on disjoint seeds. Wherever the guard watches the whole budget it takes
the mean action while the episode can still go over, so on shared seeds a sampled row and a mean
row were the same episodes (cdt-dronecircle at budget 10: equal to the last digit), and a choice
saw one sample of the tail where it paid for two (docs/decisions/budget-guard.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from runtime.card import ModelCard
from runtime.episodes import EpisodeResult
from runtime.evaluation_protocol import REPORTED_BUDGETS, BudgetRow, selection_specs, summarise
from runtime.user_errors import UserError
from training.evaluation.evaluate import RolloutJob, run_parallel


def served_selection_rows(
    model_dir: Path,
    card: ModelCard,
    episodes: int,
    workers: int,
    label: str,
    budgets: Sequence[float] = REPORTED_BUDGETS,
) -> list[BudgetRow]:
    """`budgets` (the reported ones) in both action modes on the selection seeds, as served
    (budget guard on): the rows `cdt guidance`, `cdt shield` and `cdt cut-ready` choose by.
    `model_dir` may be a variant of `card`'s model (another guidance or guard), whose card the
    workers load."""
    results = served_selection_results(model_dir, card, budgets, episodes, workers, label)
    return summarise(results, selection_reward_range(card))


def selection_reward_range(card: ModelCard) -> tuple[float, float]:
    """The card's dataset reward range, which the selection rows are scored on; a `UserError`
    for a card without it or without default targets."""
    if card.reward_return_range is None or not card.default_targets:
        raise UserError(
            f"{card.name}: the card names no default targets or dataset reward range"
            " (re-export the model, or `cdt card-update` it)"
        )
    return card.reward_return_range


def served_selection_results(
    model_dir: Path,
    card: ModelCard,
    budgets: Sequence[float],
    episodes: int,
    workers: int,
    label: str,
    schedule: tuple[tuple[int, float], ...] = (),
) -> list[EpisodeResult]:
    """The episodes of each budget in both action modes on the selection seeds, as served
    (budget guard on, with `schedule`'s budget changes), one job per budget and mode; the mean
    action's episodes on the `episodes` seeds after the sampled ones'."""
    selection_reward_range(card)
    targets = [target.model_dump() for target in card.default_targets or []]
    jobs = [
        RolloutJob(
            str(model_dir),
            card.task,
            tuple(
                replace(
                    spec,
                    seed=spec.seed + (episodes if deterministic else 0),
                    budget_guard=True,
                    cost_schedule=schedule,
                )
                for spec in selection_specs(targets, [budget], [deterministic], episodes)
            ),
        )
        for budget in budgets
        for deterministic in (False, True)
    ]
    return run_parallel(jobs, workers, label)
