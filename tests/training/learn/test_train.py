"""The training loop: smoke run, checkpoints, resume, ablations and the CLI (learn/train.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from tests.training.cdt_synthetic import tiny_config, write_dataset
from training.checkpoint import load_checkpoint
from training.learn.config import PRESETS, TrainConfig, parse_config
from training.learn.state import CheckpointScore, TrainState
from training.learn.train import cpu_has_native_bf16, train


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "tiny.hdf5")


def test_train_smoke_writes_a_weights_only_checkpoint(dataset_path: Path, tmp_path: Path):
    path = train(tiny_config(dataset_path, tmp_path, update_steps=2))
    assert path == tmp_path / "run" / "last.pt"
    payload = torch.load(path, weights_only=True)
    assert payload["step"] == 2
    assert payload["dataset"]["task"] == "SafetyBallRun-v0"
    config = json.loads(path.with_suffix(".json").read_text())
    assert config["update_steps"] == 2 and config["dataset"] == str(dataset_path)
    with (tmp_path / "run" / "train.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["step"]) for row in rows] == [1, 2]
    assert {"loss", "nll", "entropy", "steps_per_s", "temperature"} <= set(rows[0])
    assert not list((tmp_path / "run").glob("*.tmp*"))  # atomic writes leave nothing behind


def test_resume_reproduces_an_uninterrupted_run(dataset_path: Path, tmp_path: Path):
    settings = {"dropout": 0.1, "cost_prediction_weight": 0.02, "checkpoint_every": 3,
                "weight_averaging": 0.9}  # fmt: skip
    straight = train(tiny_config(dataset_path, tmp_path / "a", update_steps=6, **settings))
    first = train(tiny_config(dataset_path, tmp_path / "b", update_steps=3, **settings))
    resumed = train(tiny_config(dataset_path, tmp_path / "c", update_steps=6, resume=first))
    assert resumed == first  # a resumed run continues in its own run directory
    expected, actual = load_checkpoint(straight), load_checkpoint(resumed)
    assert actual["step"] == 6
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name
    assert torch.equal(expected["temperature"]["log_temperature"],
                       actual["temperature"]["log_temperature"])  # fmt: skip
    with (first.parent / "train.csv").open() as file:
        assert [int(row["step"]) for row in csv.DictReader(file)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "overrides",
    [
        {"algo": "dt-cost"},
        {"algo": "dt"},
        {"deterministic": True},
        {"entropy": False},
        {"augment": False, "cost_weighted_sampling": False},
        {"learn_temperature": False, "cost_transform": True, "outlier_filter": True},
        {"fused_attention": False, "association": "best"},
    ],
)
def test_ablations_train(dataset_path: Path, tmp_path: Path, overrides: dict[str, object]):
    path = train(tiny_config(dataset_path, tmp_path, **overrides))
    payload = load_checkpoint(path)
    config = TrainConfig.from_json_dict(payload["config"])
    assert payload["model_config"]["stochastic"] == config.stochastic
    assert payload["model_config"]["cost_conditioned"] == config.cost_conditioned
    assert ("temperature" in payload) == (config.stochastic and config.entropy and
                                          config.learn_temperature)  # fmt: skip


def test_loss_decreases_on_a_learnable_dataset(dataset_path: Path, tmp_path: Path):
    config = tiny_config(
        dataset_path, tmp_path, update_steps=60, batch_size=32, learning_rate=3e-3,
        warmup_steps=1, deterministic=True, log_every=10,
    )  # fmt: skip
    train(config)
    with (tmp_path / "run" / "train.csv").open() as file:
        losses = [float(row["loss"]) for row in csv.DictReader(file)]
    assert losses[-1] < 0.6 * losses[0]


def test_parse_config_applies_presets_and_ablation_flags():
    paper = parse_config(["--preset", "paper"])
    assert paper == PRESETS["paper"]
    assert (paper.batch_size, paper.update_steps, paper.dropout) == (2048, 100_000, 0.1)
    config = parse_config(
        ["--preset=paper", "--no-augment", "--no-entropy", "--deterministic", "--batch-size", "8"]
    )
    assert not config.augment and not config.entropy and config.deterministic
    assert config.batch_size == 8 and config.update_steps == 100_000
    dt_cost = parse_config(["--algo", "dt-cost"])
    assert not dt_cost.stochastic and not dt_cost.uses_augmentation and dt_cost.cost_conditioned
    dt = parse_config(["--algo", "dt"])
    assert not dt.stochastic and not dt.uses_augmentation and not dt.cost_conditioned


def test_the_recipe_names_the_preset_and_the_flags_that_change_what_is_learned():
    assert parse_config(["--preset", "cpu-budget"]).recipe() == "cpu-budget"
    ablation = parse_config(
        ["--preset", "cpu-budget", "--no-augment", "--betas", "0.9", "0.99", "--seed", "2"]
    )
    assert ablation.recipe() == "cpu-budget --no-augment --betas 0.9 0.99"
    # where and how long it runs, how it is evaluated and selected: not the recipe
    bookkeeping = [
        "--eval-every",
        "0",
        "--update-steps",
        "9",
        "--num-threads",
        "2",
        "--no-tensorboard",
    ]
    assert parse_config(["--preset", "paper", *bookkeeping]).recipe() == "paper"


def test_config_json_round_trip():
    config = TrainConfig(eval_budgets=(10.0, 30.0), resume=Path("x/last.pt"))
    assert TrainConfig.from_json_dict(config.to_json_dict()) == config


def test_config_rejects_nonpositive_eval_costs():
    with pytest.raises(ValueError, match="eval budgets"):
        TrainConfig(eval_budgets=(10.0, 0.0))


def test_cpu_has_native_bf16_reads_the_flags(tmp_path: Path):
    flags = tmp_path / "cpuinfo"
    flags.write_text("flags\t: fpu avx512f amx_bf16 amx_tile\n")
    assert cpu_has_native_bf16(flags)
    flags.write_text("flags\t: fpu avx512f avx512_bf16 avx512_vnni\n")  # AMD EPYC (Zen 4)
    assert cpu_has_native_bf16(flags)
    flags.write_text("flags\t: fpu avx2 avx512f\n")
    assert not cpu_has_native_bf16(flags)
    assert not cpu_has_native_bf16(tmp_path / "missing")


def test_resume_alone_keeps_the_runs_step_total(dataset_path: Path, tmp_path: Path):
    finished = train(tiny_config(dataset_path, tmp_path, update_steps=2))
    assert parse_config(["--resume", str(finished)]).update_steps == 2  # not the preset's 5,000
    longer = parse_config(["--resume", str(finished), "--update-steps", "4"])
    assert longer.update_steps == 4


def test_train_scores_checkpoints_with_the_evaluation_it_is_given(
    dataset_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    scores = iter([1.0, 3.0, 2.0])
    steps: list[int] = []

    def evaluate_checkpoint(state: TrainState) -> CheckpointScore:
        steps.append(state.step)
        score = next(scores)
        record = {"step": state.step, "score": score}
        return CheckpointScore(score, record, [], {"score": score}, f"score {score}")

    config = tiny_config(dataset_path, tmp_path / "a", update_steps=3, eval_every=1)
    train(config, evaluate_checkpoint=evaluate_checkpoint)
    assert steps == [1, 2, 3]
    best = load_checkpoint(tmp_path / "a" / "run" / "best.pt")
    assert best["step"] == 2 and best["evaluation"] == {"step": 2, "score": 3.0}
    train(tiny_config(dataset_path, tmp_path / "b", update_steps=2, eval_every=1))
    assert not (tmp_path / "b" / "run" / "best.pt").exists()  # no evaluation given: no best.pt
    assert "no checkpoint evaluation given" in caplog.text
