"""`cdt report`'s Table 1 rendering on hand-built results (training/report/tables.py)."""

from __future__ import annotations

import pytest

from training.report.tables import (
    AVERAGE,
    DISPLAY_NAMES,
    RunResult,
    build_table,
    card_training,
    online_episodes_by_algorithm,
    render_markdown,
    row_algorithm,
    table_json,
)

RESULTS = [
    RunResult("bc-all", "CarRun", 0, reward=90.0, cost=2.0),
    RunResult("bc-all", "CarRun", 1, reward=70.0, cost=1.6),
    RunResult("bc-all", "BallRun", 0, reward=80.0, cost=1.5),
    RunResult("bc-safe", "CarRun", 0, reward=50.0, cost=0.4),
    RunResult("bc-safe", "BallRun", 0, reward=60.0, cost=0.2),
    RunResult("cdt", "CarRun", 0, reward=70.0, cost=0.8),
    RunResult("cdt", "BallRun", 0, reward=30.0, cost=1.2),
]


def test_build_table_averages_seeds_then_tasks() -> None:
    table = build_table(RESULTS)
    assert table.tasks == ["CarRun", "BallRun", AVERAGE]
    assert table.algorithms == ["bc-all", "bc-safe", "cdt"]
    car = table.cells["bc-all", "CarRun"]
    assert (car.reward, car.cost, car.runs) == (pytest.approx(80.0), pytest.approx(1.8), 2)
    assert car.reward_std == pytest.approx(14.142, abs=1e-3)  # sample sd (n - 1) of 90 and 70
    assert table.cells["cdt", AVERAGE].reward == pytest.approx(50.0)
    assert table.cells["cdt", AVERAGE].cost == pytest.approx(1.0)
    assert table.best_safe("CarRun") == "cdt"
    assert table.best_safe("BallRun") == "bc-safe"
    assert table.best_safe(AVERAGE) == "bc-safe"  # cdt's average cost is exactly 1: safe
    assert table.cells["cdt", AVERAGE].safe


def test_build_table_partial_row_has_no_average() -> None:
    table = build_table([*RESULTS, RunResult("cpq", "CarRun", 0, reward=10.0, cost=0.1)])
    assert ("cpq", AVERAGE) not in table.cells
    markdown = render_markdown(table, "T", "cdt report", 10.0)
    assert "n/a" in markdown
    # bc-all has 2 seeds on CarRun: the rows differ, so each says its seeds and missing tasks
    assert "Training seeds per cell: BC-All 1/2; BC-Safe 1; CDT 1; CPQ 1 (CarRun)." in markdown
    assert "Training seeds per cell" not in render_markdown(build_table(RESULTS[2:]), "T", "", 1)


def test_render_markdown_marks_safe_unsafe_and_best_safe() -> None:
    markdown = render_markdown(build_table(RESULTS), "Table 1", "cdt report --seeds 2", 10.0)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in markdown.splitlines()}
    # two seeds: mean +- sample sd; the Average column averages task means, with no spread
    assert lines["BC-All"].startswith("| BC-All | 80.0 ± 14.1† | 1.80 ± 0.28† | 80.0† | 1.50† |")
    assert lines["BC-All"].endswith("| 80.0† | 1.65† |")
    assert "| **70.0** ★ | **0.80** |" in lines["CDT"]  # best safe on CarRun
    assert "| 30.0† | 1.20† |" in lines["CDT"]  # unsafe on BallRun
    assert "| **60.0** ★ | **0.20** |" in lines["BC-Safe"]
    header = markdown.splitlines()[2]
    assert "CarRun reward ↑" in header and "Average cost ↓" in header
    assert "Made by: `cdt report --seeds 2`" in markdown
    assert "kappa = 10" in markdown


def test_render_markdown_names_the_cpu_of_the_episodes() -> None:
    markdown = render_markdown(build_table(RESULTS), "T", "cdt report", 10.0, None, "Zen 3")
    assert "Made by: `cdt report`, episodes on Zen 3" in markdown


def test_a_calibrated_row_says_how_many_online_episodes_its_calibration_used() -> None:
    calibrated = [
        RunResult("cdt-calibrated", "CarRun", seed, 72.0, 0.5, online_episodes=episodes)
        for seed, episodes in enumerate((360, 480, 1_200))
    ]
    mt_bc = RunResult("mt-bc-calibrated", "CarRun", 0, 60.0, 0.9, online_episodes=240)
    results = [*RESULTS, *calibrated, mt_bc]
    online = online_episodes_by_algorithm(results)
    # the plain rows spent none
    assert online == {"cdt-calibrated": [360, 480, 1_200], "mt-bc-calibrated": [240]}
    markdown = render_markdown(build_table(results), "T", "", 10.0, online=online)
    assert (
        "Online episodes before the test (calibration, on the selection seeds): "
        "CDT + calibration 360-1,200 per model (2,040 in all); "
        "MT-BC + calibration 240 per model (240 in all)." in markdown
    )
    assert "Online episodes" not in render_markdown(build_table(RESULTS), "T", "", 10.0)


def test_table_json_flags_safety_and_best() -> None:
    payload = table_json(build_table(RESULTS))
    assert payload["cdt"]["CarRun"]["best_safe"] is True
    assert payload["bc-all"]["CarRun"]["safe"] is False
    assert payload["bc-safe"]["BallRun"]["runs"] == 1


def test_card_training_prefers_the_selected_checkpoints_step() -> None:
    planned = {"training_config": {"update_steps": 100_000}, "training": {"train_seconds": 5.0}}
    assert card_training(planned) == (100_000, 5.0)
    assert card_training({**planned, "training_step": 18_000}) == (18_000, 5.0)
    assert card_training({"training_config": {"steps": 5_000}}) == (5_000, None)


def test_build_table_without_the_average_column() -> None:
    table = build_table(RESULTS, average=False)
    assert table.tasks == ["CarRun", "BallRun"]
    assert not any(task == AVERAGE for _, task in table.cells)


def test_an_ablated_cdt_is_its_own_row_named_as_in_the_paper() -> None:
    def card(algo: str, **settings: bool) -> dict[str, object]:
        config = {"augment": True, "entropy": True, "deterministic": False, **settings}
        return {"algo": algo, "training_config": config}

    assert row_algorithm(card("cdt")) == "cdt"
    assert row_algorithm(card("cdt", augment=False)) == "cdt-no-augment"
    assert DISPLAY_NAMES["cdt-no-entropy"] == "CDT (w/o entropy)"
    assert row_algorithm(card("cdt", deterministic=True)) == "cdt-deterministic"
    both = row_algorithm(card("cdt", augment=False, entropy=False))
    assert both == "cdt-no-augment+cdt-no-entropy"
    # DT-Cost trains without augmentation by definition: it stays DT-Cost
    assert row_algorithm(card("dt-cost", augment=False, deterministic=True)) == "dt-cost"
    assert row_algorithm({"algo": "bc-safe"}) == "bc-safe"
