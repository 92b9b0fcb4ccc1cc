"""`cdt select`: best.pt by the selection protocol, budget calibration included."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from runtime.episodes import EpisodeResult, EpisodeSpec
from runtime.evaluation_protocol import SelectionRule
from runtime.user_errors import UserError
from training.checkpoint import load_checkpoint
from training.evaluation import checkpoint_scores
from training.evaluation.select_checkpoint import select_best
from training.export import policy_from_checkpoint


def fake_evaluate(
    calls: list[float],
    cost_per_budget: float = 1.2,
    mean_action_cost_per_budget: float | None = None,
) -> Any:
    """Episodes costing cost_per_budget x budget x budget_scale (mean-action ones their own
    factor, when given): at 1.2 only a scale of 0.6 keeps 0.9 x budget."""

    def evaluate(
        model: Any, stats: Any, task: str, specs: Sequence[EpisodeSpec], budget_scale: float
    ) -> list[EpisodeResult]:
        calls.append(budget_scale)
        results = []
        for spec in specs:
            factor = cost_per_budget
            if spec.deterministic and mean_action_cost_per_budget is not None:
                factor = mean_action_cost_per_budget
            results.append(EpisodeResult(spec, 100.0, factor * spec.target_cost * budget_scale, 10))
        return results

    return evaluate


def keep_checkpoints(source: Path, run_dir: Path, steps: Sequence[int]) -> None:
    """A run folder holding `source` as each of the kept `step_<N>.pt` checkpoints."""
    for step in steps:
        shutil.copy(source, run_dir / f"step_{step:07d}.pt")


def test_select_best_tries_scales_largest_first_and_keeps_the_admissible_one(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3])
    calls: list[float] = []
    monkeypatch.setattr(checkpoint_scores, "evaluate_model", fake_evaluate(calls))
    path, evaluation = select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert calls == [1.0, 0.8, 0.6]
    assert evaluation["admissible"] and evaluation["budget_scale"] == 0.6
    best = load_checkpoint(path)
    assert best["budget_scale"] == 0.6 and best["evaluation"]["step"] == 3
    # the exported graph feeds 0.6 x the remaining budget
    assert policy_from_checkpoint(best).cost_scale == pytest.approx(
        0.6 * best["stats"]["cost_scale"]
    )
    listed = json.loads((tmp_path / "selection.json").read_text())
    assert [row["budget_scale"] for row in listed] == [1.0, 0.8, 0.6]


def test_select_refuses_a_folder_without_kept_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--keep-checkpoints"):
        select_best(tmp_path, SelectionRule())
    (tmp_path / "step_0000003.pt").touch()
    with pytest.raises(UserError, match="from step 4 "):
        select_best(tmp_path, SelectionRule(), from_step=4)


def test_select_reuses_what_it_measured_until_a_checkpoint_changes(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3, 4])
    calls: list[float] = []
    measure = fake_evaluate(calls)

    def interrupted_after_three(*args: Any) -> list[EpisodeResult]:
        if len(calls) == 3:
            raise KeyboardInterrupt
        return measure(*args)  # type: ignore[no-any-return]

    monkeypatch.setattr(checkpoint_scores, "evaluate_model", interrupted_after_three)
    with pytest.raises(KeyboardInterrupt):
        select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert len(json.loads((tmp_path / "selection.json").read_text())) == 3  # step 3, kept

    monkeypatch.setattr(checkpoint_scores, "evaluate_model", measure)
    calls.clear()
    _, evaluation = select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert calls == [1.0, 0.8, 0.6]  # step 4 only
    assert evaluation["admissible"] and evaluation["budget_scale"] == 0.6

    calls.clear()
    _, evaluation = select_best(tmp_path, SelectionRule(0.5, 0.2))  # a stricter rule
    assert calls == [] and not evaluation["admissible"]  # re-scored, not re-measured

    (tmp_path / "step_0000004.pt").touch()  # a rewritten checkpoint is measured again
    select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert calls == [1.0, 0.8, 0.6]


def test_select_with_more_episodes_measures_again_on_that_many(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3])
    episodes_asked: list[int] = []

    def measure(
        model: Any, stats: Any, task: str, specs: Sequence[EpisodeSpec], scale: float
    ) -> list[EpisodeResult]:
        per_row = len(specs) // len({(spec.target_cost, spec.deterministic) for spec in specs})
        episodes_asked.append(per_row)
        return fake_evaluate([])(model, stats, task, specs, scale)  # type: ignore[no-any-return]

    monkeypatch.setattr(checkpoint_scores, "evaluate_model", measure)
    rule = SelectionRule(0.9, 0.2)
    select_best(tmp_path, rule, budget_scales=(0.6,))
    select_best(tmp_path, rule, budget_scales=(0.6,), episodes=7)
    select_best(tmp_path, rule, budget_scales=(0.6,), episodes=7)  # reused
    # no count asked: the 7-episode rows are reused
    _, evaluation = select_best(tmp_path, rule, budget_scales=(0.6,))
    default = load_checkpoint(checkpoint)["config"]["eval_episodes"]
    assert episodes_asked == [default, 7]
    assert {row["episodes"] for row in evaluation["rows"]} == {7}


def test_select_on_fewer_checkpoints_or_other_scales_keeps_earlier_rows(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3, 4])
    monkeypatch.setattr(checkpoint_scores, "evaluate_model", fake_evaluate([]))
    rule = SelectionRule(0.9, 0.2)
    select_best(tmp_path, rule, budget_scales=(1.0,))
    select_best(tmp_path, rule, from_step=4, budget_scales=(0.6,))
    listed = json.loads((tmp_path / "selection.json").read_text())
    assert [(row["checkpoint"], row["budget_scale"]) for row in listed] == [
        ("step_0000003.pt", 1.0),
        ("step_0000004.pt", 1.0),
        ("step_0000004.pt", 0.6),
    ]
    select_best(tmp_path, rule, from_step=4, budget_scales=(0.6,))  # reused, not doubled
    assert len(json.loads((tmp_path / "selection.json").read_text())) == 3


def test_select_calibrates_each_action_mode_when_no_one_scale_serves_both(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sampled episodes cost 1.2 x budget x scale (only x0.6 keeps the margin), mean-action
    ones 0.8 x (x1 keeps it; at x0.6 they idle at the loose budgets)."""
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3])
    calls: list[float] = []
    monkeypatch.setattr(checkpoint_scores, "evaluate_model", fake_evaluate(calls, 1.2, 0.8))
    # the toy data's frontier is flat; here it rises, so idle loose budgets count as failures
    monkeypatch.setattr(checkpoint_scores, "for_data", lambda rule, _: rule)
    path, evaluation = select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert calls == [1.0, 0.8, 0.6]
    assert evaluation["admissible"] and not evaluation["failures"]
    assert (evaluation["budget_scale"], evaluation["mean_action_budget_scale"]) == (0.6, 1.0)
    costs = {
        (row["target_cost"], row["deterministic"]): row["cost_mean"] for row in evaluation["rows"]
    }
    assert costs[(40.0, False)] == pytest.approx(1.2 * 40 * 0.6)
    assert costs[(40.0, True)] == pytest.approx(0.8 * 40)
    best = load_checkpoint(path)
    assert (best["budget_scale"], best["mean_action_budget_scale"]) == (0.6, 1.0)
    # the listing keeps what was measured: one record per scale, both modes at that scale
    listed = json.loads((tmp_path / "selection.json").read_text())
    assert [(row["budget_scale"], row["mean_action_budget_scale"]) for row in listed] == [
        (1.0, None),
        (0.8, None),
        (0.6, None),
    ]


def test_select_keeps_one_scale_when_it_serves_both_modes(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint, _ = exported_policy
    keep_checkpoints(checkpoint, tmp_path, [3])
    monkeypatch.setattr(checkpoint_scores, "evaluate_model", fake_evaluate([]))
    _, evaluation = select_best(tmp_path, SelectionRule(0.9, 0.2))
    assert evaluation["mean_action_budget_scale"] is None
