"""`cdt pipeline`: every stage runs once, and a rerun skips what is done."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime import sim
from runtime.card import read_card, update_card
from runtime.user_errors import UserError
from tests.runtime.toy_env import toy_env_factory
from tests.training.cdt_synthetic import write_dataset
from tests.training.held_lock import held_elsewhere
from training import pipeline, pipeline_stages
from training.collect import collection
from training.evaluation import calibrate as calibration
from training.interrupt import TrainingInterrupted
from training.learn import train as training_loop
from training.ledger import read_ledger
from training.pipeline import PipelineConfig, run_pipeline


def test_pipeline_runs_missing_stages_and_skips_finished_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ran: list[str] = []
    outputs = {name: tmp_path / f"{name}.done" for name in ("collect", "train", "select")}

    def stage(name: str) -> tuple[str, object, object]:
        def run(config: PipelineConfig) -> None:
            ran.append(name)
            if name == "train" and len([r for r in ran if r == "train"]) == 1:
                raise KeyboardInterrupt  # an interrupted stage leaves no output behind
            outputs[name].touch()

        return name, run, lambda config: outputs[name].is_file()

    stages = [stage(name) for name in outputs]
    config = PipelineConfig(task="SafetyBallRun-v0")
    assert config.model_name == "cdt-ballrun"
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(config, stages)  # type: ignore[arg-type]
    assert ran == ["collect", "train"]
    seconds = run_pipeline(config, stages)  # type: ignore[arg-type]
    assert ran == ["collect", "train", "train", "select"]  # collect is not run again
    assert seconds["collect"] == 0.0 and set(seconds) == set(outputs)
    totals = json.loads(config.stage_seconds.read_text())
    assert set(totals) == set(outputs)  # the interrupted train run counted too
    assert totals["train"] >= seconds["train"] and totals["collect"] > 0.0


def test_a_second_pipeline_of_one_name_stops_before_its_first_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ran: list[str] = []
    stages = [("collect", lambda config: ran.append("collect"), lambda config: False)]
    config = PipelineConfig(task="SafetyBallRun-v0", seed=1, name="shared")
    with held_elsewhere(config.run_dir):  # the pipeline of seed 0
        with pytest.raises(UserError, match="runs/pipeline-shared is in use"):
            run_pipeline(config, stages)  # type: ignore[arg-type]
    assert ran == []
    run_pipeline(config, stages)  # type: ignore[arg-type]
    assert ran == ["collect"]


def test_pipeline_trains_with_the_measured_recipe_of_its_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(training_loop, "cpu_has_native_bf16", lambda: False)
    default = PipelineConfig(task="SafetyCarRun-v0")
    assert default.training_args() == [
        "--preset", "cpu-budget", "--device", "cpu", "--update-steps", "24000", "--seed", "0",
    ]  # fmt: skip
    assert default.first_selected_step == default.checkpoint_every == 4_000
    cpu = PipelineConfig(task="SafetyCarRun-v0", preset="paper")
    assert cpu.training_args() == [
        "--preset", "paper", "--device", "cpu", "--update-steps", "14000", "--seed", "0",
        "--batch-size", "256",
    ]  # fmt: skip
    assert cpu.first_selected_step == 8_000
    monkeypatch.setattr(training_loop, "cpu_has_native_bf16", lambda: True)
    assert PipelineConfig(task="SafetyCarRun-v0", preset="paper").training_args()[-1] == "--bf16"
    assert "--bf16" not in PipelineConfig(task="SafetyCarRun-v0").training_args()
    gpu = PipelineConfig(task="SafetyCarRun-v0", preset="paper", device="cuda", update_steps=9_000)
    assert gpu.training_args() == [
        "--preset", "paper", "--device", "cuda", "--update-steps", "9000", "--seed", "0",
        "--bf16",
    ]  # fmt: skip
    assert gpu.first_selected_step == 6_000


def test_pipeline_collects_into_and_trains_on_the_dataset_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "fresh" / "SafetyCarRun-v0.hdf5"
    config = PipelineConfig(task="SafetyCarRun-v0", dataset=given)
    collected: list[Path] = []
    monkeypatch.setattr(collection, "learn", lambda c: collected.append(c.output_path))
    monkeypatch.setattr(collection, "finalize", lambda c: collected.append(c.output_path))
    pipeline_stages.collect(config)
    assert collected == [given, given]
    assert PipelineConfig(task="SafetyCarRun-v0").dataset_path == Path(
        "datasets/SafetyCarRun-v0.hdf5"
    )
    assert not pipeline.STAGES[0][2](config)  # collect counts as done only once that file exists
    given.parent.mkdir()
    given.touch()
    assert pipeline.STAGES[0][2](config)


def test_a_stopped_pipeline_exits_130_with_the_command_that_continues_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def stopped_in_training(config: PipelineConfig) -> dict[str, float]:
        raise TrainingInterrupted(Path("runs/pipeline-cdt-carrun/last.pt"), 139)

    monkeypatch.setattr(pipeline, "run_pipeline", stopped_in_training)
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["--task", "SafetyCarRun-v0", "--update-steps", "8000"])
    assert exit_info.value.code == 130
    assert "continue with: cdt pipeline --task SafetyCarRun-v0 --update-steps 8000" in (
        capsys.readouterr().err
    )


def test_calibration_counts_as_done_once_finished_even_when_none_counted(
    exported_policy: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = PipelineConfig(task="SafetyCarRun-v0", preset="paper")
    shutil.copytree(exported_policy[1], config.model_dir)
    assert not pipeline_stages._calibrated(config)
    assert pipeline_stages._guided(config)  # the paper preset calibrates instead

    update_card(config.model_dir, evaluation={"calibration": {"finished": False, "chosen": None}})
    assert not pipeline_stages._calibrated(config)  # interrupted mid-way: it runs again

    def nothing_counted(model_dir: Path) -> None:
        update_card(model_dir, evaluation={"calibration": {"finished": True, "chosen": None}})

    monkeypatch.setattr(calibration, "calibrate_model", nothing_counted)  # the stage imports it
    pipeline_stages.calibrate(config)  # the pipeline goes on to evaluate the uncalibrated model
    assert "keeps the graph's budget scale" in caplog.text
    assert pipeline_stages._calibrated(config)


def test_guided_presets_run_guidance_until_it_finished_instead_of_calibration(
    exported_policy: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = PipelineConfig(task="SafetyCarRun-v0")  # cpu-budget
    shutil.copytree(exported_policy[1], config.model_dir)
    assert pipeline_stages._calibrated(config) and not pipeline_stages._guided(config)
    update_card(config.model_dir, evaluation={"guidance": {"weights": [], "finished": False}})
    assert not pipeline_stages._guided(config)  # interrupted mid-way: it runs again
    update_card(config.model_dir, evaluation={"guidance": {"weights": [], "finished": True}})
    assert pipeline_stages._guided(config)


@pytest.mark.slow
def test_pipeline_smoke_runs_every_stage_on_a_tiny_dataset(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    private_ledger: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sim, "make_env", toy_env_factory)  # every episode, in this process
    dataset = write_dataset(tmp_path / "tiny.hdf5")  # BallRun's dims: 7 observations, 2 actions
    # 43 s on a loaded 2-core Intel Xeon, 31 s of it the ONNX export
    pipeline.main(["--task", "SafetyBallRun-v0", "--dataset", str(dataset), "--smoke"])
    config = PipelineConfig(task="SafetyBallRun-v0", dataset=dataset, smoke=True)
    assert config.model_name == "cdt-ballrun-smoke"
    assert sorted(p.name for p in config.run_dir.glob("step_*.pt")) == [
        "step_0000010.pt",
        "step_0000020.pt",
    ]  # a checkpoint every 10 of its 20 steps, both selected from
    card = read_card(config.model_dir)
    assert card.training_config is not None and card.training_config["update_steps"] == 20
    evaluation = card.evaluation or {}
    assert evaluation["protocol"]["rows"][0]["episodes"] == 1
    # as served (guard on), with the model alone beside it
    assert {row["budget_guard"] for row in evaluation["protocol"]["rows"]} == {True}
    assert {row["budget_guard"] for row in evaluation["protocol/unguarded"]["rows"]} == {False}
    assert config.report.is_file()
    assert config.report.with_name("evaluation_protocol_unguarded.json").is_file()
    totals = json.loads(config.stage_seconds.read_text())
    stages = ["train", "select", "export", "guidance", "critic", "shield", "cut-ready", "evaluate"]
    assert list(totals) == stages  # the dataset was there
    assert card.cost_critic is not None and (card.evaluation or {})["shield"]["finished"]
    assert (card.evaluation or {})["cut_ready"]["finished"]
    assert (card.evaluation or {})["guidance"]["finished"]
    out = capsys.readouterr().out
    assert "cdt-ballrun-smoke:" in out
    assert "cdt-ballrun-smoke: as served, on 1 selection episodes per budget" in out  # the verdict
    assert not Path(tmp_path / "datasets").exists()
    # every run the pipeline made is in the ledger, as if each command had been run by hand
    entries = read_ledger(private_ledger)
    assert [entry.command for entry in entries] == [
        "train", "select", "guidance", "critic", "shield", "cut-ready", "evaluate", "evaluate",
    ]  # fmt: skip
    assert entries[0].outcome == "done" and entries[0].steps == 20
    assert entries[0].subject == str(config.run_dir)
    assert entries[1].split == "selection" and entries[1].outcome.startswith("best step ")
    assert [entry.split for entry in entries[6:]] == ["test", "test"]
    assert entries[7].outcome.startswith("protocol: ")  # guarded, written last
    assert entries[6].outcome.startswith("protocol, unguarded: ")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--update-steps", "0"], "--update-steps must be at least 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--from-step", "-1"], "--from-step must be at least 0, got -1"),
        (["--seed", "-1"], "--seed must be at least 0, got -1"),
        (["--episodes", "0", "--seeds", "0"], "--episodes must be at least 1"),
        (["--dataset", "{tmp}/corrupt.hdf5"], "not a readable HDF5 file"),
    ],
)
def test_pipeline_refuses_values_as_given_in_one_line_before_any_stage(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.hdf5").write_text("not hdf5")
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(["--task", "SafetyBallRun-v0", *(a.format(tmp=tmp_path) for a in argv)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "collect" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.hdf5"]  # nothing started


def test_pipeline_passes_its_values_through_as_given() -> None:
    config = PipelineConfig(task="SafetyCarRun-v0", update_steps=1, from_step=0, batch_size=1)
    assert config.steps == 1 and config.first_selected_step == 0  # not replaced by defaults
    args = config.training_args()
    assert args[args.index("--update-steps") + 1] == "1"
    assert args[args.index("--batch-size") + 1] == "1"
    smoke = PipelineConfig(task="SafetyCarRun-v0", smoke=True)
    assert (smoke.steps, smoke.checkpoint_every, smoke.evaluation_episodes) == (20, 10, 1)
    assert args[args.index("--seed") + 1] == "0" and config.model_name == "cdt-carrun"
    second = PipelineConfig(task="SafetyCarRun-v0", seed=3)
    assert second.model_name == "cdt-carrun-s3"  # its own folders: it does not resume seed 0's
    args = second.training_args()
    assert args[args.index("--seed") + 1] == "3"


def test_pipeline_refuses_to_resume_another_seeds_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    run_dir = tmp_path / "runs" / "pipeline-mine"
    run_dir.mkdir(parents=True)
    (run_dir / "last.json").write_text(json.dumps({"seed": 0}))
    argv = ["--task", "SafetyBallRun-v0", "--dataset", str(dataset), "--name", "mine"]
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main([*argv, "--seed", "1"])
    assert exit_info.value.code == 2
    assert "trains seed 0, not --seed 1" in capsys.readouterr().err


def test_pipeline_leaves_a_model_it_did_not_make_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    (tmp_path / "models" / "shipped").mkdir(parents=True)
    (tmp_path / "models" / "shipped" / "model.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        pipeline.main(
            ["--task", "SafetyBallRun-v0", "--dataset", str(dataset), "--name", "shipped"]
        )
    assert exit_info.value.code == 2
    assert "did not make" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("margin", "worst", "said"),
    [(0.0, 0.0, "keeps its budgets without the shield: none set"),
     (0.0, 1.0, "no shield setting keeps the budgets (no shield: worst share over 100 %)"),
     (15.0, 0.5, "no shield setting keeps the budgets (margin 15, risk 1: worst share over 50 %)")],
)  # fmt: skip
def test_the_shield_stage_says_whether_the_budgets_are_kept(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    margin: float,
    worst: float,
    said: str,
) -> None:
    from training.evaluation import shield

    chosen = shield.ShieldCandidate(rows=[], margin=margin, risk=1.0)
    monkeypatch.setattr(shield.ShieldCandidate, "worst_share_over", property(lambda self: worst))
    monkeypatch.setattr(shield, "shield_model", lambda model_dir: chosen)
    config = PipelineConfig(task="SafetyCarRun-v0", name="m", dataset=tmp_path / "d.hdf5")
    with caplog.at_level("INFO", logger="training.pipeline_stages"):
        pipeline_stages.shield(config)
    assert said in caplog.text


@pytest.mark.parametrize(
    ("worst", "smoke", "code"), [(0.05, False, None), (1.0, False, 1), (1.0, True, None)]
)
def test_a_pipeline_whose_model_breaks_its_budgets_as_served_says_not_to_serve_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    worst: float,
    smoke: bool,
    code: int | None,
) -> None:
    record = {
        "episodes_per_row": 40, "cut": [40.0, 10.0], "finished": True,
        "chosen": {"cut_ready_from": None},
        "candidates": [{"cut_ready_from": None, "worst_share_over": worst, "cut_share_over": 0.0}],
    }  # fmt: skip
    card = type("Card", (), {"evaluation": {"cut_ready": record}})()
    monkeypatch.setattr(pipeline, "run_pipeline", lambda config: {"train": 1.0})
    monkeypatch.setattr(pipeline, "read_card", lambda model_dir: card)
    argv = ["--task", "SafetyBallRun-v0", *(["--smoke"] if smoke else [])]
    if code is None:  # a smoke run checks a set-up: its tiny model is not judged
        pipeline.main(argv)
    else:
        with pytest.raises(SystemExit) as exit_info:
            pipeline.main(argv)
        assert exit_info.value.code == code
    out, err = capsys.readouterr()
    assert ("serve it with `cdt serve`" in out) == (code is None)
    assert f"at most {worst:.0%} over any reported budget" in out
    if code is not None:
        assert "do not serve it (below)" in out and err.count("\n") == 1
        assert "breaks its budgets as served: 100% of the selection episodes" in err
        assert "train another run with --seed 1" in err
