"""`cdt rollout`: a real simulator driven through a real server, with a budget change."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from clients.rollout import (
    EpisodeOutcome,
    RolloutConfig,
    check_schedule,
    main,
    parse_cost_schedule,
    printed_summary,
    run_rollouts,
    summarise,
)
from service.config import Settings
from tests.clients.live_server import serve_in_thread
from tests.service.toy_policy import write_test_policy

TASK = "SafetyBallRun-v0"  # obs 7, act 2, 100-step episodes


@pytest.fixture(scope="module")
def ballrun_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models: Path = tmp_path_factory.mktemp("rollout-models")
    policy = write_test_policy(models / "toy", observation_dim=7, action_dim=2, context_len=4)
    card = policy / "model.json"
    data = json.loads(card.read_text())
    data["task"] = TASK
    data["dataset"] = {"reward_return_min": 0.0, "reward_return_max": 100.0}
    card.write_text(json.dumps(data))
    settings = Settings(_env_file=None, models_dir=models, redis_url=None, api_tokens=frozenset())
    yield from serve_in_thread(settings)


def test_parse_cost_schedule_sorts_pairs() -> None:
    assert parse_cost_schedule("100:5, 0:20") == ((0, 20.0), (100, 5.0))
    assert parse_cost_schedule("") == ()


@pytest.mark.parametrize("text", ["5", "a:1", "3:-1", "-1:4", "2:inf"])
def test_parse_cost_schedule_rejects_bad_entries(text: str) -> None:
    with pytest.raises(ValueError, match="bad cost schedule entry"):
        parse_cost_schedule(text)


@pytest.mark.slow
def test_run_rollouts_plays_whole_episodes_and_changes_the_budget(ballrun_url: str) -> None:
    config = RolloutConfig(
        server=ballrun_url, model="toy", episodes=2, cost_schedule=((0, 20.0), (30, 5.0))
    )
    outcomes = run_rollouts(config)
    assert [o.steps for o in outcomes] == [100, 100]
    assert all(o.cut_floor == 5.0 for o in outcomes)  # the schedule's cut, announced
    assert all(o.budget_changes == [(30, 5.0)] for o in outcomes)
    assert all(o.cost_limit == 5.0 for o in outcomes)
    assert all(o.normalised_reward == pytest.approx(o.reward) for o in outcomes)  # range 0..100
    assert summarise(outcomes)["episodes"] == 2


@pytest.mark.slow
def test_rollout_cli_unknown_model_exits_2(
    ballrun_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", ballrun_url, "--model", "nope", "--episodes", "1"])
    assert exit_info.value.code == 2
    assert "no model 'nope'" in capsys.readouterr().err


@pytest.mark.slow
def test_rollout_cli_prints_verdicts_budget_changes_and_the_share_over(
    ballrun_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--server", ballrun_url, "--model", "toy", "--episodes", "2",
          "--cost-schedule", "0:20,30:5"])  # fmt: skip
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("seed ")]
    assert len(lines) == 2
    assert all("limit 20 -> 5 at step 30, cut floor 5 announced" in line for line in lines)
    assert all(line.endswith(("within budget", "OVER budget")) for line in lines)
    summary = json.loads(out.splitlines()[-1])  # the summary is the last line, one JSON line
    assert summary["episodes"] == 2 and summary["safe"] == (summary["episodes_over_budget"] == 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cost-schedule", "0:20,5000:5"], "episodes end after 100 steps"),
        (["--cost-schedule", "100:5"], "changes the limit at step 100"),
        (["--task", "SafetyCarRun-v0"], "pass --force"),  # the same sizes, another task
        (["--task", "Nope-v0"], "no simulator task 'Nope-v0'"),
    ],
)
def test_rollout_cli_refuses_before_the_first_episode(
    ballrun_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--server", ballrun_url, "--model", "toy", "--episodes", "1", *argv])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count("\n") == 1
    assert "seed 0" not in captured.out  # no episode ran


def _outcome(seed: int, cost: float) -> EpisodeOutcome:
    return EpisodeOutcome(seed, 100, 400.0 + seed, cost, 10.0, 10.0, 0.8, cost / 10.0)


def test_a_schedule_that_cuts_announces_its_lowest_later_limit_unless_told_not_to() -> None:
    cut = RolloutConfig(server="s", model="m", cost_schedule=((0, 40.0), (100, 10.0), (150, 20.0)))
    assert cut.announced_floor() == 10.0
    assert replace(cut, announce_cuts=False).announced_floor() is None
    assert replace(cut, cut_floor=5.0, announce_cuts=False).announced_floor() == 5.0
    raised = RolloutConfig(server="s", model="m", cost_limit=10.0, cost_schedule=((50, 40.0),))
    assert raised.announced_floor() is None  # no cut below the start: nothing to keep ready
    assert RolloutConfig(server="s", model="m").announced_floor() is None


def test_summary_is_safe_only_when_no_episode_went_over() -> None:
    outcomes = [_outcome(0, 5.0), _outcome(1, 7.0), _outcome(2, 11.0)]  # the README's example
    summary = summarise(outcomes)
    assert summary["episodes_over_budget"] == 1 and summary["safe"] is False
    assert summary["mean_within_budget"] is True  # the paper's verdict on the mean alone
    assert summarise(outcomes[:2])["safe"] is True
    line = printed_summary(summary)
    assert "\n" not in line and json.loads(line)["cost_mean"] == 7.667  # rounded to print


def test_check_schedule_refuses_changes_that_would_never_apply() -> None:
    check_schedule(((0, 20.0), (99, 5.0)), 100)
    with pytest.raises(ValueError, match="at step 100, but episodes end after 100 steps"):
        check_schedule(((0, 20.0), (100, 5.0)), 100)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episodes", "0"], "must be at least 1"),
        (["--cost-schedule", "100"], "expected STEP:LIMIT"),
        (["--json", "/no/such/dir/out.json"], "does not exist"),
        (["--seed", "-1"], "must be at least 0, got -1"),
        (["--cut-floor", "-5"], "--cut-floor: must be a finite number >= 0"),
        (["--target-reward", "-1e9", "--episodes", "0"], "--episodes: must be at least 1"),
        (["--server", "http://127.0.0.1:9"], "is `cdt serve` running"),
    ],
)
def test_rollout_cli_refuses_bad_input_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "toy", "--server", "http://127.0.0.1:9", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_an_episode_is_the_same_whatever_ran_before_it(ballrun_url: str) -> None:
    # seed 6 alone, and seed 6 after seed 5 in the same rollout: one episode, the same figures
    together = run_rollouts(RolloutConfig(server=ballrun_url, model="toy", episodes=2, seed=5))
    alone = run_rollouts(RolloutConfig(server=ballrun_url, model="toy", episodes=1, seed=6))
    assert (together[1].reward, together[1].cost) == (alone[0].reward, alone[0].cost)
    assert together[0].reward != together[1].reward
