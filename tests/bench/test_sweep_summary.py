"""The sweep summary: what `cdt select` measured, one row per run and checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from bench.sweep_summary import scored


def _row(budget: float, deterministic: bool, cost: float) -> dict[str, object]:
    return {
        "target_cost": budget, "deterministic": deterministic, "normalised_cost": cost,
        "share_over_budget": 0.1, "normalised_reward": 50.0,
    }  # fmt: skip


def test_sweep_summary_keeps_scale_one_and_ranks_by_the_worst_mean_action_cost(
    tmp_path: Path,
) -> None:
    for run, worst in (("a", 2.0), ("b", 0.8)):
        (tmp_path / run).mkdir()
        entries = [
            {"budget_scale": scale, "step": 4000, "rows": [
                _row(10, True, worst), _row(10, False, 3.0), _row(20, True, 0.5),
                _row(20, False, 0.6),
            ]}
            for scale in (1.0, 0.8)
        ]  # fmt: skip
        (tmp_path / run / "selection.json").write_text(json.dumps(entries))
    found = scored(tmp_path)
    assert len(found) == 2  # the 0.8 scale is left out
    assert [entry.run for entry in sorted(found, key=lambda e: e.worst_mean_cost())] == ["b", "a"]
    assert found[0].budgets[20.0][False]["normalised_cost"] == 0.6
