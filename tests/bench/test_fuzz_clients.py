"""The client fuzzer itself: a handful of cases against its hostile server find nothing, and its
checks catch what they are there for (so that `bench/fuzz_clients.py` cannot rot)."""

from __future__ import annotations

import math

import pytest

from bench.fuzz_clients import (
    FuzzEnv,
    error_problem,
    fuzz,
    report,
    rollout_problems,
    value_problem,
)
from clients.client import PolicyClientError, ServerError
from service.schemas import StepResponse


def test_a_handful_of_cases_on_every_surface_break_no_invariant() -> None:
    results = fuzz(seed=7, cases=range(16))  # REST, websocket and rollout cases, a few seconds
    assert [violation for result in results for violation in result.violations] == []
    surfaces = {result.kind.split()[0] for result in results}
    assert surfaces == {"rest", "ws", "rollout"}
    assert "16 cases, 0 violations" in report(results)


def _answer(action: list[float], episode_id: str = "ep-1") -> StepResponse:
    return StepResponse(
        episode_id=episode_id, action=action, step=1, remaining_reward=0.0, remaining_cost=0.0,
        budget_exhausted=False, model="toy", model_version="1",
    )  # fmt: skip


def test_the_value_check_catches_bad_actions_and_other_episodes() -> None:
    assert value_problem(_answer([0.5, -0.5]), StepResponse, "step") is None
    assert "length 3" in str(value_problem(_answer([0.0, 0.0, 0.0]), StepResponse, "step"))
    assert "bounds" in str(value_problem(_answer([math.nan, 0.0]), StepResponse, "step"))
    assert "bounds" in str(value_problem(_answer([1.5, 0.0]), StepResponse, "step"))
    assert "episode" in str(value_problem(_answer([0.0, 0.0], "ep-9"), StepResponse, "step"))
    assert value_problem(_answer([0.0, 0.0], "ep-9"), StepResponse, "create") is None
    assert "not StepResponse" in str(value_problem([], StepResponse, "step"))


def test_the_error_check_wants_typed_one_line_errors_with_a_detail() -> None:
    assert error_problem(ServerError("boom", status_code=500)) is None
    assert "untyped ValueError" in str(error_problem(ValueError("x")))
    assert "not one line" in str(error_problem(PolicyClientError("a\nb")))
    assert "without detail" in str(error_problem(PolicyClientError(" ", status_code=599)))


def test_the_rollout_check_wants_every_episode_in_one_line_and_the_finished_kept() -> None:
    fine = "seed 0: steps 6 reward 1\nseed 1: FAILED: 500 x\nseed 2: steps 6 reward 1\n{}\n"
    FuzzEnv.bad_actions = []
    assert rollout_problems(1, fine, "", fault_at=10, closed=[8]) == []
    assert rollout_problems(2, "", "cdt rollout: cannot reach\n", fault_at=0, closed=[]) == []
    lost = rollout_problems(2, "", "cdt rollout: 500 x\n", fault_at=10, closed=[8])
    assert lost == ["stopped, losing episodes that had finished"]
    traceback = rollout_problems(1, fine, "Traceback (most recent call last):\nKeyError", 10, [])
    assert traceback[0].startswith("traceback")
    assert "episode 1 reported in 0 lines" in rollout_problems(0, "seed 0: steps 6\n", "", 0, [])


def test_a_client_that_stops_checking_actions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("clients.client.check_answer", lambda *args: None)
    monkeypatch.setattr("clients.stream.check_answer", lambda *args: None)
    results = fuzz(seed=7, cases=[12, 16, 22, 33])  # the bad-action cases among the first 40
    violations = [violation for result in results for violation in result.violations]
    assert any(
        "silently" in violation and "--seed 7 --case" in violation for violation in violations
    )
