"""Guard alternatives: what a row prints and the model told its episode began at the release."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.guard_alternatives import main, parse_alternative, released_as_new, row
from runtime.episodes import EpisodeResult, EpisodeSpec
from runtime.sim import ENV_MEMORY_BYTES
from runtime.user_errors import USER_ERROR_EXIT


def test_a_row_gives_the_reward_earned_by_mid_episode_in_points_of_the_range() -> None:
    spec = EpisodeSpec(seed=0, target_reward=100.0, target_cost=10.0)
    results = [
        EpisodeResult(spec, 60.0, 12.0, 4, [5.0, 5.0, 2.0, 0.0], [10.0, 20.0, 10.0, 20.0]),
        EpisodeResult(spec, 60.0, 4.0, 4, [0.0, 0.0, 2.0, 2.0], [10.0, 10.0, 20.0, 20.0]),
    ]
    reward, figures = row(results, 10.0, (20.0, 220.0), float("nan"), mid=2)
    assert reward == pytest.approx(20.0)  # (60 - 20) / 200
    over, mean_cost, *_, by_mid, earned = (cell.strip() for cell in figures.split("|"))
    assert (over, mean_cost, by_mid) == ("50%", "8.0", "5.0")
    assert earned == "12.5"  # 25 of a 200-wide range; the range's low end is not subtracted


def test_the_bench_fields_are_kept_apart_from_the_guard_s() -> None:
    name, fields = parse_alternative('fresh={"cut_floor": 10, "release_as_new": true}')
    assert name == "fresh" and fields == {"cut_floor": 10, "release_as_new": True}


def test_windows_past_the_release_are_told_their_episode_began_there() -> None:
    seen: list[tuple[dict[str, Any], list[float | None]]] = []

    def predict(windows: dict[str, Any], weights: Any) -> tuple[Any, Any]:
        seen.append((windows, list(weights)))
        return np.zeros((2, 1)), np.zeros((2, 1))

    told = released_as_new(predict, release=100, target_reward=500.0, guidance=0.0)
    windows = {
        "time_steps": np.array([[99], [130]], np.int64),
        "returns_to_go": np.array([[420.0], [150.0]], np.float32),
        "costs_to_go": np.array([[7.0], [30.0]], np.float32),
    }
    told(windows, [None, 4.0])
    ((fed, weights),) = seen
    assert fed["time_steps"].tolist() == [[99], [30]]
    assert fed["returns_to_go"].tolist() == [[420.0], [500.0]]
    assert fed["costs_to_go"] is windows["costs_to_go"]  # the budget left is the guard's
    assert weights == [None, 0.0]


def test_more_episodes_than_memory_holds_is_one_line_before_a_model_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("runtime.sim.available_memory", lambda: 3 * ENV_MEMORY_BYTES)
    with pytest.raises(SystemExit) as exited:
        main(["--model", "absent", "--models-dir", "/nonexistent", "--episodes", "4"])
    assert exited.value.code == USER_ERROR_EXIT
    said = capsys.readouterr().err.strip()
    assert said.startswith("bench/guard_alternatives.py: 4 episodes stepped together need about")
    assert "\n" not in said
