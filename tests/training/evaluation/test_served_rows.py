"""The selection rows as served: which episodes each budget and action mode runs."""

from pathlib import Path
from typing import Any

import pytest

from runtime.evaluation_protocol import SELECTION_SEED_BASE
from runtime.policy import Policy
from tests.training.evaluation.guard_rows import write_selection_toy
from training.evaluation import served_rows as served_rows_module
from training.evaluation.evaluate import RolloutJob
from training.evaluation.served_rows import served_selection_results, served_selection_rows


@pytest.fixture
def toy_policy(tmp_path: Path) -> Path:
    return write_selection_toy(tmp_path / "toy")


def test_the_two_action_modes_run_on_disjoint_selection_seeds(
    toy_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card = Policy.load(toy_policy).card
    jobs: list[RolloutJob] = []

    def recorded(run: list[RolloutJob], *args: Any) -> list[Any]:
        jobs.extend(run)
        return []

    monkeypatch.setattr(served_rows_module, "run_parallel", recorded)
    served_selection_results(toy_policy, card, [10.0, 40.0], 3, 1, "toy", ((5, 10.0),))
    seeds = {
        (spec.target_cost, spec.deterministic): [spec.seed for spec in job.specs]
        for job in jobs
        for spec in job.specs[:1]
    }
    first = SELECTION_SEED_BASE
    for budget in (10.0, 40.0):
        assert seeds[budget, False] == [first, first + 1, first + 2]
        assert seeds[budget, True] == [first + 3, first + 4, first + 5]
    specs = [spec for job in jobs for spec in job.specs]
    assert all(spec.budget_guard and spec.cost_schedule == ((5, 10.0),) for spec in specs)


def test_rows_of_both_modes_come_back_in_budget_then_mode_order(toy_policy: Path) -> None:
    card = Policy.load(toy_policy).card
    rows = served_selection_rows(toy_policy, card, 2, 1, "toy", [10.0, 20.0])
    assert [(row.target_cost, row.deterministic, row.episodes) for row in rows] == [
        (10.0, False, 2), (10.0, True, 2), (20.0, False, 2), (20.0, True, 2),
    ]  # fmt: skip
