"""`cdt rollout`: a real simulator driven through a real server, with a budget change."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.rollout import RolloutConfig, main, parse_cost_schedule, run_rollouts, summarise
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
    assert all("limit 20 -> 5 at step 30" in line for line in lines)
    assert all(line.endswith(("within budget", "OVER budget")) for line in lines)
    assert '"episodes_over_budget"' in out and '"share_over_budget"' in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--episodes", "0"], "must be at least 1"),
        (["--cost-schedule", "100"], "expected STEP:LIMIT"),
        (["--json", "/no/such/dir/out.json"], "does not exist"),
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
