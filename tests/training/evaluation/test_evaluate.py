"""Offline evaluation through the service's inference code, on a tiny ONNX policy."""

import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from runtime.episodes import EpisodeSpec
from runtime.sim import ENV_MEMORY_BYTES, NotEnoughMemory
from tests.service.toy_policy import write_test_policy
from training.evaluation import evaluate as evaluate_module
from training.evaluation.evaluate import (
    RolloutJob,
    evaluate_policy_dir,
    main,
    run_job,
    run_parallel,
    to_markdown,
)
from training.evaluation.sweeps import budget_change_study, plot_budget_change, plot_sweep

TASK = "SafetyBallRun-v0"  # obs_dim 7, act_dim 2, 100-step episodes


@pytest.fixture
def ballrun_policy(tmp_path: Path) -> Path:
    return write_test_policy(tmp_path / "toy", observation_dim=7, action_dim=2, context_len=4)


@pytest.mark.slow
def test_run_job_same_seeds_give_same_results(ballrun_policy: Path) -> None:
    specs = (EpisodeSpec(3, 50.0, 10.0), EpisodeSpec(4, 50.0, 10.0))
    job = RolloutJob(str(ballrun_policy), TASK, specs)
    first, second = run_job(job), run_job(job)
    assert [r.reward for r in first] == [r.reward for r in second]
    assert all(r.length == 100 for r in first)


@pytest.mark.slow
def test_evaluate_policy_dir_reports_raw_and_normalised_scores(ballrun_policy: Path) -> None:
    result = evaluate_policy_dir(ballrun_policy, episodes=2, seeds=2, task=TASK, workers=1)
    assert result["episodes"] == 4
    assert result["target_reward"] == 50.0  # the card's default target
    assert result["normalised_cost_mean"] == pytest.approx(result["cost_mean"] / 10.1)
    assert result["safe"] == (result["normalised_cost_mean"] <= 1.0)
    assert 0.0 <= result["share_over_budget"] <= 1.0 and not result["deterministic"]
    table = to_markdown(result)
    assert "| toy | sampled |" in table
    # the spreads differ: raw figures over episodes, normalised ones over the seeds' means
    assert "| reward (± episodes) |" in table and "| normalised reward (± seeds) |" in table


@pytest.mark.slow
def test_budget_change_study_records_per_step_costs(ballrun_policy: Path, tmp_path: Path) -> None:
    card = ballrun_policy / "model.json"
    card.write_text(card.read_text().replace("SafetyToyRun-v0", TASK))
    study = budget_change_study(
        ballrun_policy,
        target_reward=50.0,
        start_cost=40.0,
        end_cost=0.0,
        change_step=50,
        episodes=2,
        workers=1,
    )
    assert len(study["mean_step_costs"]) == len(study["control_mean_step_costs"]) == 100
    assert study["total_cost_mean"] == pytest.approx(sum(study["mean_step_costs"]))
    # Same seeds: identical episodes until the change.
    assert study["mean_step_costs"][:50] == study["control_mean_step_costs"][:50]
    plot_budget_change(study, tmp_path / "budget_change.png")
    assert (tmp_path / "budget_change.png").read_bytes().startswith(b"\x89PNG")


class InlinePool:
    """A process pool that runs each job at once, in the caller's process."""

    def __init__(self, **_: Any) -> None:
        pass

    def __enter__(self) -> "InlinePool":
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def submit(self, run: Callable[[RolloutJob], Any], job: RolloutJob) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(run(job))
        return future


def test_run_parallel_returns_episodes_in_the_jobs_order_however_workers_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    budgets = {1: 10.0, 2: 20.0, 3: 40.0}  # seed: budget, one job each
    specs = [
        EpisodeSpec(seed, target_reward=50.0, target_cost=cost) for seed, cost in budgets.items()
    ]
    jobs = [RolloutJob("toy", TASK, (spec,)) for spec in specs]
    monkeypatch.setattr(evaluate_module, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(evaluate_module, "run_job", lambda job: [job.specs[0].seed])

    def last_first(futures: Iterable[Future[Any]]) -> list[Future[Any]]:
        return list(futures)[::-1]

    monkeypatch.setattr(evaluate_module, "as_completed", last_first)
    assert run_parallel(jobs, workers=2, label="toy") == [1, 2, 3]


def test_run_parallel_refuses_jobs_whose_workers_together_outgrow_memory_before_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs = tuple(EpisodeSpec(seed, target_reward=50.0, target_cost=10.0) for seed in range(3))
    jobs = [RolloutJob("toy", TASK, specs), RolloutJob("toy", TASK, specs[:1])]
    monkeypatch.setattr("runtime.sim.available_memory", lambda: 5 * ENV_MEMORY_BYTES)
    monkeypatch.setattr(evaluate_module, "run_job", lambda job: pytest.fail("a job started"))
    with pytest.raises(NotEnoughMemory, match=r"^3 episodes stepped together in each of 2 "):
        run_parallel(jobs, workers=2, label="toy")
    monkeypatch.setattr(evaluate_module, "run_job", lambda job: [len(job.specs)])
    assert run_parallel(jobs, workers=1, label="toy") == [3, 1]  # one at a time fits


def test_plot_sweep_writes_a_png(tmp_path: Path) -> None:
    rows = [
        {"model": "toy", "target_cost": cost, "reward_mean": 40.0 + cost, "reward_std": 2.0}
        | {"cost_mean": 0.8 * cost, "cost_std": 1.0}
        for cost in (5.0, 10.0, 20.0)
    ]
    plot_sweep(rows, "cost", tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")


def test_cdt_evaluate_refuses_zero_episodes_before_loading_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["models/not-there", "--episodes", "0"])
    assert exit_info.value.code == 2
    assert "argument --episodes: must be at least 1, got 0" in capsys.readouterr().err


def _fake_result(model_dir: Any, **options: Any) -> dict[str, Any]:
    row = {"model": "toy", "deterministic": False, "target_reward": 50.0, "target_cost": 10.0}
    row |= dict.fromkeys(("reward_mean", "reward_std", "cost_mean", "cost_std"), 1.0)
    row |= dict.fromkeys(("normalised_reward_mean", "normalised_reward_std"), 1.0)
    row |= dict.fromkeys(("normalised_cost_mean", "normalised_cost_std"), 0.1)
    return row | {"share_over_budget": 0.0, "safe": True, "task": options["task"]}


def test_cdt_evaluate_writes_beside_a_model_from_elsewhere_never_into_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate_module, "evaluate_policy_dir", _fake_result)
    outside = write_test_policy(tmp_path / "elsewhere" / "toy", observation_dim=7, action_dim=2)
    inside = write_test_policy(tmp_path / "models" / "toy", observation_dim=7, action_dim=2)
    main([str(outside)])
    assert (outside / "evaluation_paper.json").is_file() and not (tmp_path / "reports").exists()
    main([str(inside)])
    assert (tmp_path / "reports" / "toy" / "evaluation_paper.md").is_file()
    report = tmp_path / "reports" / "toy" / "evaluation_paper.json"
    report.write_text("earlier results")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # measured results are replaced only on request
        main([str(inside)])
    assert exit_info.value.code == 2 and report.read_text() == "earlier results"
    assert "--force" in capsys.readouterr().err
    main([str(inside), "--force"])
    assert json.loads(report.read_text())["safe"] is True


def test_cdt_evaluate_runs_a_model_on_another_task_only_with_force(
    ballrun_policy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(evaluate_module, "evaluate_policy_dir", _fake_result)
    out = ["--out", str(ballrun_policy.parent / "out")]
    with pytest.raises(SystemExit) as exit_info:  # the toy card says SafetyToyRun-v0
        main([str(ballrun_policy), "--task", TASK, *out])
    assert exit_info.value.code == 2
    assert "trained on SafetyToyRun-v0, not SafetyBallRun-v0" in capsys.readouterr().err
    main([str(ballrun_policy), "--task", TASK, "--force", *out])  # BallRun reads 7, writes 2
    saved = json.loads((ballrun_policy.parent / "out" / "evaluation_paper.json").read_text())
    assert saved["task"] == TASK
    with pytest.raises(SystemExit) as exit_info:  # a task whose sizes differ: never
        main([str(ballrun_policy), "--task", "SafetyBallCircle-v0", "--force", *out])
    assert "reads 7 and writes 2" in capsys.readouterr().err


def test_cdt_evaluate_keeps_choosing_splits_apart_from_the_reported_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[str] = []
    monkeypatch.setattr(
        evaluate_module,
        "evaluate_policy_dir",
        lambda model_dir, **options: (
            seen.append(options["split"]) or _fake_result(model_dir, **options)
        ),
    )
    inside = write_test_policy(tmp_path / "models" / "toy", observation_dim=7, action_dim=2)
    main([str(inside), "--split", "selection"])
    assert seen == ["selection"]
    assert (tmp_path / "reports" / "toy" / "selection" / "evaluation_paper.json").is_file()
    assert not (tmp_path / "reports" / "toy" / "evaluation_paper.json").exists()
    with pytest.raises(SystemExit) as exit_info:  # a card holds reported (test) figures only
        main([str(inside), "--split", "validation", "--record"])
    assert exit_info.value.code == 2 and "only with --split test" in capsys.readouterr().err


@pytest.mark.slow
def test_evaluate_policy_dir_runs_the_seeds_of_the_split_it_is_given(ballrun_policy: Path) -> None:
    options: dict[str, Any] = {"episodes": 2, "seeds": 2, "task": TASK, "workers": 1}
    test = evaluate_policy_dir(ballrun_policy, **options)
    again = evaluate_policy_dir(ballrun_policy, split="test", **options)
    selection = evaluate_policy_dir(ballrun_policy, split="selection", **options)
    assert test["split"] == "test" and selection["split"] == "selection"
    assert test["reward_mean"] == again["reward_mean"]
    assert selection["reward_mean"] != test["reward_mean"]  # other seeds, other episodes
    assert selection["normalised_reward_std"] >= 0.0 and selection["episodes"] == 4


def test_cdt_evaluate_writes_unguarded_figures_beside_the_guarded_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate_module, "evaluate_policy_dir", _fake_result)
    inside = write_test_policy(tmp_path / "models" / "toy", observation_dim=7, action_dim=2)
    main([str(inside)])
    main([str(inside), "--no-budget-guard"])  # no --force needed: another file
    reports = tmp_path / "reports" / "toy"
    assert (reports / "evaluation_paper.json").is_file()
    assert (reports / "evaluation_paper_unguarded.json").is_file()
