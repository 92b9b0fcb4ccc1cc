"""`cdt pipeline --task T`: from nothing to a served, measured policy, resumable at every stage.

Stages, each skipped when its output is already there (run the command again to continue):
collect (`datasets/<task>.hdf5`), train (`runs/pipeline-<name>/`, kept checkpoints, resumed from
`last.pt`), select (`best.pt` by the reported protocol), export (`models/<name>/`), calibrate
(the mean action, budget by budget, recorded in the card) and evaluate
(`reports/<name>/evaluation_protocol.json`, recorded in the card).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from runtime.card import CARD_FILE, read_card
from runtime.evaluation_protocol import SelectionRule
from runtime.files import write_atomic
from runtime.policy import ONNX_FILE
from runtime.sim import check_task
from training.card_update import record_evaluation
from training.collect.cli import CollectConfig
from training.collect.cli import finalize as finalize_dataset
from training.collect.cli import learn as collect_rollouts
from training.evaluation.calibrate import CALIBRATIONS, calibrate_model
from training.evaluation.evaluate import evaluate_protocol, write_report
from training.evaluation.select_checkpoint import select_best
from training.export import export_checkpoint, quiet_exporter_logs
from training.learn.checkpoint import load_checkpoint
from training.learn.config import parse_config
from training.learn.train import cpu_has_native_bf16
from training.learn.train import train as train_run

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    """Collect, train, select, export and evaluate one task."""

    task: str = "SafetyCarRun-v0"
    """gymnasium env id (Bullet-Safety-Gym task)."""
    preset: Literal["cpu", "paper"] = "paper"
    """training preset; `paper` is the one that kept its budgets on the reported protocol."""
    device: str = "cpu"
    """training device (`cuda` on a GPU machine)."""
    batch_size: int | None = None
    """default: the preset's on a GPU; 256 on a CPU, the recipe that trained `cdt-carrun-cpu`
    (the paper's 2,048 takes ~1.8 s per step on 2 cores)."""
    update_steps: int | None = None
    """gradient steps; default 18,000 on a GPU, 14,000 on a CPU (where the shipped `paper`-preset
    CarRun models were chosen)."""
    from_step: int | None = None
    """first kept checkpoint selection considers; default 6,000 on a GPU, 8,000 on a CPU."""
    name: str | None = None
    """model name; default cdt-<task>, e.g. cdt-carrun."""
    dataset: Path | None = None
    """dataset to train on, collected there when missing; default datasets/<task>.hdf5 (shipped
    for every paper task, so give another path to time the pipeline from nothing)."""
    episodes: int = 10
    """evaluation episodes per seed, per budget and action mode."""
    seeds: int = 2
    """evaluation seeds."""

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def steps(self) -> int:
        return self.update_steps or (18_000 if self.on_gpu else 14_000)

    @property
    def first_selected_step(self) -> int:
        return self.from_step or (6_000 if self.on_gpu else 8_000)

    def training_args(self) -> list[str]:
        """`cdt train` options beyond the paths: the preset and the recipe for this device."""
        args = ["--preset", self.preset, "--device", self.device, "--update-steps", str(self.steps)]
        batch_size = self.batch_size or (None if self.on_gpu else 256)
        args += ["--batch-size", str(batch_size)] if batch_size else []
        # bf16 halves the paper model's CPU step where the CPU multiplies bf16 natively (else it is
        # ~10x slower); the `cpu` preset's narrow model runs 2-3x slower with it either way.
        native = self.preset == "paper" and cpu_has_native_bf16()
        args += ["--bf16"] if self.on_gpu or native else []
        return args

    @property
    def model_name(self) -> str:
        return self.name or "cdt-" + self.task.removeprefix("Safety").rsplit("-v", 1)[0].lower()

    @property
    def dataset_path(self) -> Path:
        return self.dataset or Path("datasets") / f"{self.task}.hdf5"

    @property
    def run_dir(self) -> Path:
        return Path("runs") / f"pipeline-{self.model_name}"

    @property
    def model_dir(self) -> Path:
        return Path("models") / self.model_name

    @property
    def stage_seconds(self) -> Path:
        return self.run_dir / "stage_seconds.json"

    @property
    def report(self) -> Path:
        return Path("reports") / self.model_name / "evaluation_protocol.json"


def collect(config: PipelineConfig) -> None:
    collect_config = CollectConfig(task=config.task, out=config.dataset_path)
    collect_rollouts(collect_config)
    finalize_dataset(collect_config)


def train(config: PipelineConfig) -> None:
    args = ["--dataset", str(config.dataset_path), *config.training_args()]
    args += ["--eval-every", "0", "--checkpoint-every", "2000", "--keep-checkpoints"]
    args += ["--out-dir", str(config.run_dir.parent), "--run-name", config.run_dir.name]
    if (config.run_dir / "last.pt").is_file():  # an interrupted run continues where it stopped
        args += ["--resume", str(config.run_dir / "last.pt")]
    train_run(parse_config(args))


def select(config: PipelineConfig) -> None:
    select_best(config.run_dir, SelectionRule(), config.first_selected_step)


def export(config: PipelineConfig) -> None:
    quiet_exporter_logs()
    export_checkpoint(config.run_dir / "best.pt", config.model_dir, config.model_name)


def calibrate(config: PipelineConfig) -> None:
    if calibrate_model(config.model_dir) is None:
        logger.warning("the mean action keeps the graph's budget scale: no calibration counted")


def _calibrated(config: PipelineConfig) -> bool:
    """Has calibration finished on this model (whether or not a calibration counted)? An
    interrupted one left its rows in the card, unfinished: it runs again."""
    if not (config.model_dir / CARD_FILE).is_file():
        return False
    record_key = CALIBRATIONS[True].record_key  # the mean action's: the stage calibrates it
    record = (read_card(config.model_dir).evaluation or {}).get(record_key) or {}
    return bool(record.get("finished"))


def evaluate(config: PipelineConfig) -> None:
    result = evaluate_protocol(config.model_dir, episodes=config.episodes, seeds=config.seeds)
    write_report(result, config.report.parent, "protocol")
    record_evaluation(config.model_dir, "protocol", result)


def _trained(config: PipelineConfig) -> bool:
    """Has the run reached its step total? (Its .json beside last.pt holds no step.)"""
    last = config.run_dir / "last.pt"
    return last.is_file() and int(load_checkpoint(last)["step"]) >= config.steps


Stage = tuple[str, Callable[[PipelineConfig], None], Callable[[PipelineConfig], bool]]
STAGES: list[Stage] = [
    ("collect", collect, lambda c: c.dataset_path.is_file()),
    ("train", train, _trained),
    ("select", select, lambda c: (c.run_dir / "best.pt").is_file()),  # training writes none
    ("export", export, lambda c: (c.model_dir / ONNX_FILE).is_file()),
    ("calibrate", calibrate, _calibrated),
    ("evaluate", evaluate, lambda c: c.report.is_file()),
]


def _stage_seconds(path: Path) -> dict[str, float]:
    """Each stage's wall time over every run of this pipeline so far."""
    totals: dict[str, float] = json.loads(path.read_text()) if path.is_file() else {}
    return totals


def _add_stage_seconds(path: Path, stage: str, seconds: float) -> None:
    totals = _stage_seconds(path)
    totals[stage] = totals.get(stage, 0.0) + seconds
    write_atomic(path, lambda temporary: temporary.write_text(json.dumps(totals, indent=1)))


def run_pipeline(config: PipelineConfig, stages: list[Stage] = STAGES) -> dict[str, float]:
    """Run every stage whose output is missing; returns the seconds each stage ran (0 = skipped).

    Each stage's wall time, an interrupted one's included, is also added to `stage_seconds.json`
    in the run's folder, so the time from nothing to a served policy survives stops and resumes.
    """
    seconds: dict[str, float] = {}
    for number, (name, run, done) in enumerate(stages, start=1):
        if done(config):
            logger.info("[%d/%d] %s: done already, skipped", number, len(stages), name)
            seconds[name] = 0.0
            continue
        logger.info("[%d/%d] %s ...", number, len(stages), name)
        started = time.perf_counter()
        try:
            run(config)
        finally:
            seconds[name] = time.perf_counter() - started
            _add_stage_seconds(config.stage_seconds, name, seconds[name])
        logger.info("[%d/%d] %s: %.0f s", number, len(stages), name, seconds[name])
    return seconds


def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt pipeline`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = sys.argv[1:] if argv is None else argv
    config = tyro.cli(PipelineConfig, args=args, prog="cdt pipeline")
    try:
        check_task(config.task)
    except ValueError as error:
        raise SystemExit(f"cdt pipeline: {error}") from None
    try:
        seconds = run_pipeline(config)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM during training: every stage resumes
        print(
            f"cdt pipeline: stopped; continue with: cdt pipeline {' '.join(args)}", file=sys.stderr
        )
        raise SystemExit(130) from None
    totals = _stage_seconds(config.stage_seconds)
    stages = ", ".join(f"{name} {value:.0f}" for name, value in totals.items())
    print(
        f"{config.model_name}: {sum(seconds.values()):.0f} s this run, "
        f"{sum(totals.values()):.0f} s over every run ({stages}); "
        f"serve it with `cdt serve`, results in {config.report}"
    )


if __name__ == "__main__":
    main()
