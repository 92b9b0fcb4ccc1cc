"""`cdt report` end to end: a tiny grid trained, exported and evaluated (training/report/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.training.baselines.synthetic import tiny_episodes
from tests.training.placeholder_graphs import PLACEHOLDER, write_placeholder_graphs
from training.data.dataset import save_dataset
from training.ledger import read_ledger
from training.report.cli import main
from training.report.config import ReportConfig
from training.report.grid import existing_results, result_scores


def test_result_scores_from_normalised_or_raw_results() -> None:
    card = {"dataset": {"reward_return_min": 100.0, "reward_return_max": 300.0}}
    result = {"normalised_reward_mean": 30.0, "normalised_cost_mean": 2.0, "reward_mean": 1.0}
    assert result_scores(result, card, 10.0) == (30.0, 2.0)
    reward, cost = result_scores({"reward_mean": 250.0, "cost_mean": 5.0}, card, 10.0) or (0, 0)
    assert reward == pytest.approx(75.0) and cost == pytest.approx(0.5, abs=0.01)
    assert result_scores({"episodes": 3}, card, 10.0) is None


def _fake_evaluate(calls: list[dict[str, Any]]) -> Any:
    def evaluate(
        model_dir: Path,
        episodes: int,
        seeds: int,
        target_reward: float,
        target_cost: float,
        deterministic: bool,
    ) -> dict[str, Any]:
        card = json.loads((model_dir / "model.json").read_text())
        calls.append(
            {
                "algo": card["algo"],
                "episodes": episodes,
                "target_cost": target_cost,
                "mean": deterministic,
            }
        )
        safe = card["algo"] in ("bc-safe", "cdt")
        sampled_penalty = 0.0 if deterministic else 0.25
        return {
            "kappa": target_cost,
            "normalised_reward_mean": (50.0 if safe else 90.0) + (0.0 if deterministic else 5.0),
            "normalised_cost_mean": (0.5 if safe else 2.0) + sampled_penalty,
        }

    return evaluate


def _exported_cdt(model_dir: Path, training_seed: int | None = None) -> Path:
    """A CDT model folder with only its card, as `--include-existing` reads it."""
    model_dir.mkdir(parents=True)
    card: dict[str, Any] = {
        "name": model_dir.name,
        "version": "1",
        "task": "TinyTask-v0",
        "observation_dim": 3,
        "action_dim": 2,
        "action_low": [-1.0, -2.0],
        "action_high": [1.0, 2.0],
        "context_len": 3,
        "max_episode_len": 20,
        "algo": "cdt",
        "default_targets": [{"reward": 8.0, "cost": 4.0}],
        "dataset": {"reward_return_min": 0.0, "reward_return_max": 10.0},
        "evaluation": {"kappa": 4.0, "normalised_reward_mean": 80.0, "normalised_cost_mean": 0.75},
    }
    if training_seed is not None:
        card["training_config"] = {"seed": training_seed}
    (model_dir / "model.json").write_text(json.dumps(card))
    return model_dir


def test_main_runs_the_grid_and_writes_both_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, private_ledger: Path
) -> None:
    dataset = save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    existing = _exported_cdt(tmp_path / "models" / "cdt-tiny")
    calls: list[dict[str, Any]] = []
    argv = [
        "--algorithms", "bc-safe", "bcq-lag", "--datasets", str(dataset), "--seeds", "1",
        "--cost-limit", "4", "--episodes", "2", "--eval-seeds", "1",
        "--include-existing", str(existing), "--models-dir", str(tmp_path / "grid"),
        "--out", str(tmp_path / "reports"), "--train.steps", "2", "--train.batch-size", "8",
        "--train.actor-hidden", "8", "--train.critic-hidden", "8", "--train.vae-hidden", "8",
        "--train.action-low", "-1", "-2", "--train.action-high", "1", "2",
    ]  # fmt: skip
    with caplog.at_level("INFO", logger="training.report.grid"):
        main(argv, evaluate=_fake_evaluate(calls))
    assert "training bcq-lag seed 0 on TinyTask (2 steps)" in caplog.text  # said before it trains
    trained = [(entry.command, entry.algorithm) for entry in read_ledger(private_ledger)]
    assert trained == [("train", "bc-safe"), ("train", "bcq-lag")]  # the grid's runs are entered
    # The existing CDT is evaluated again (its card's scores may hold another action mode),
    # with the mean action like every row and with sampled actions beside.
    modes = [(call["algo"], call["mean"]) for call in calls]
    assert modes == [("bc-safe", True), ("bcq-lag", True), ("cdt", True), ("cdt", False)]
    assert all(call["target_cost"] == 4.0 and call["episodes"] == 2 for call in calls)
    assert not (existing / "report_evaluation.json").exists()  # nothing written beside a model
    assert (tmp_path / "grid" / "TinyTask" / "bcq-lag-s0" / "model.onnx").is_file()
    payload = json.loads((tmp_path / "reports" / "table1.json").read_text())
    assert payload["command"].startswith("cdt report --algorithms bc-safe bcq-lag")
    assert payload["compute"]["grid_baseline_settings"]["steps"] == 2
    assert payload["table"]["cdt"]["TinyTask"]["cost"] == pytest.approx(0.5)
    assert payload["table"]["cdt-sampled"]["TinyTask"]["cost"] == pytest.approx(0.75)
    assert payload["table"]["bc-safe"]["TinyTask"]["safe"] is True
    assert payload["table"]["bcq-lag"]["TinyTask"]["safe"] is False
    cards = [
        tmp_path / "grid" / "TinyTask" / f"{algo}-s0" / "model.json"
        for algo in ("bc-safe", "bcq-lag")
    ]
    seconds = [json.loads(card.read_text())["training"]["train_seconds"] for card in cards]
    assert payload["compute"]["train_seconds_total"] == pytest.approx(sum(seconds), abs=0.1)
    assert payload["compute"]["train_steps_by_algorithm"] == {"bc-safe": [2], "bcq-lag": [2]}
    markdown = (tmp_path / "reports" / "table1.md").read_text()
    assert "| CDT (sampled actions) | **55.0** | **0.75** |" in markdown  # shown, not ranked
    assert "| CDT | **50.0** ★ | **0.50** |" in markdown  # ties with BC-Safe, broken by name
    assert "Every row acts with the policy's mean action" in markdown
    assert "Gradient steps per training run: BC-Safe 2; BCQ-Lag 2." in markdown
    assert "not comparable with the paper's Table 1" in markdown  # a reviewer reads why
    calls.clear()  # a rerun with --reuse trains and evaluates nothing again
    with pytest.raises(SystemExit) as exit_info:  # the tables are there: replaced only on request
        main([*argv, "--reuse"], evaluate=_fake_evaluate(calls))
    assert exit_info.value.code == 2
    main([*argv, "--reuse", "--force"], evaluate=_fake_evaluate(calls))
    assert calls == []
    rerun = json.loads((tmp_path / "reports" / "table1.json").read_text())
    assert rerun["table"] == payload["table"]
    # exported models alone make a table of their own (no grid to train)
    only = ["--algorithms", "--include-existing", str(existing), "--cost-limit", "4"]
    only += ["--episodes", "2", "--eval-seeds", "1", "--models-dir", str(tmp_path / "grid")]
    main([*only, "--out", str(tmp_path / "reports"), "--stem", "only"], evaluate=_fake_evaluate([]))
    alone = json.loads((tmp_path / "reports" / "only.json").read_text())["table"]
    assert set(alone) == {"cdt", "cdt-sampled"}
    with pytest.raises(SystemExit) as exit_info:  # neither a grid nor models: nothing to report
        main(["--algorithms", "--out", str(tmp_path / "reports"), "--stem", "none"])
    assert exit_info.value.code == 2


def test_grid_trains_and_exports_the_sequence_models(
    tmp_path: Path, private_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_placeholder_graphs(monkeypatch)  # the grid's cells, not the graphs, are under test
    dataset = save_dataset(tmp_path / "tiny.hdf5", tiny_episodes(), {"env_id": "TinyTask-v0"})
    tiny = "--embedding-dim 8 --num-layers 1 --num-heads 2 --batch-size 4 --update-steps 2"
    tiny += " --eval-every 0 --no-tensorboard --num-threads 1 --seq-len 3"
    argv = [
        "--algorithms", "cdt", "dt", "--datasets", str(dataset), "--seeds", "1",
        "--cost-limit", "4", "--episodes", "1", "--eval-seeds", "1",
        "--models-dir", str(tmp_path / "grid"), "--out", str(tmp_path / "reports"),
        f"--sequence-args={tiny}",
    ]  # fmt: skip
    calls: list[dict[str, Any]] = []
    main(argv, evaluate=_fake_evaluate(calls))
    assert [call["algo"] for call in calls] == ["cdt", "cdt", "dt"]
    entries = read_ledger(private_ledger)  # the sequence cells are in the ledger too
    assert [(e.algorithm, e.outcome, e.steps) for e in entries] == [
        ("cdt", "done", 2),
        ("dt", "done", 2),
    ]
    assert all(e.recipe.startswith("cpu --seq-len 3 --embedding-dim 8") for e in entries)
    for algo in ("cdt", "dt"):
        card_path = tmp_path / "grid" / "TinyTask" / f"{algo}-s0" / "model.json"
        card = json.loads(card_path.read_text())
        assert card["algo"] == algo and card["context_len"] == 3
        assert (card_path.parent / "model.onnx").read_bytes() == PLACEHOLDER
        assert [target["cost"] for target in card["default_targets"]] == [4.0, 8.0, 16.0]
    table = json.loads((tmp_path / "reports" / "table1.json").read_text())["table"]
    assert set(table) == {"cdt", "cdt-sampled", "dt"}


def test_existing_models_join_under_the_seeds_they_were_trained_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _exported_cdt(tmp_path / "a", training_seed=3)
    second = _exported_cdt(tmp_path / "b", training_seed=7)
    unrecorded = _exported_cdt(tmp_path / "c")  # no seed on its card: its place in the list
    config = ReportConfig(
        algorithms=(),
        include_existing=(str(first), str(second), str(unrecorded)),
        models_dir=tmp_path / "report-models",  # its evaluations go there, not into the checkout
    )
    results = existing_results(config, _fake_evaluate([]))
    assert [(run.algo, run.seed) for run in results] == [
        ("cdt", 3), ("cdt-sampled", 3), ("cdt", 7), ("cdt-sampled", 7),
        ("cdt", 2), ("cdt-sampled", 2),
    ]  # fmt: skip
    twin = _exported_cdt(tmp_path / "d", training_seed=3)  # the same cell as `first`
    argv = ["--algorithms", "--include-existing", str(first), str(twin), "--cost-limit", "4"]
    argv += ["--episodes", "1", "--eval-seeds", "1", "--out", str(tmp_path / "reports")]
    argv += ["--models-dir", str(config.models_dir)]
    with pytest.raises(SystemExit) as exit_info:  # one run counted twice: refused, not averaged
        main(argv, evaluate=_fake_evaluate([]))
    assert exit_info.value.code == 2
    assert "cdt on TinyTask, seed 3" in capsys.readouterr().err
    assert not (tmp_path / "reports" / "table1.json").exists()
