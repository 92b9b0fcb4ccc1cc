"""`cdt pipeline --task T`: from nothing to a served, measured policy, resumable at every stage.

Stages, each skipped when its output is already there (run the command again to continue):
collect (`datasets/<task>.hdf5`), train (`runs/pipeline-<name>/`, kept checkpoints, resumed from
`last.pt`), select (`best.pt` by the reported protocol), export (`models/<name>/`), guidance
(`cpu-budget`, `cpu`) or calibration (`paper`), recorded in the card, the cost critic
(`cost_critic.onnx`) and the budget guard's shield chosen with it (in the card), whether the
guard holds large budgets for a cut (in the card), and evaluate
(`reports/<name>/evaluation_protocol.json` as served, budget guard on, and
`evaluation_protocol_unguarded.json`, both recorded in the card). Every value is used as given
and checked before the first stage, with the dataset (when it exists) and the model folder (one
the pipeline did not make is never calibrated or re-evaluated). `--smoke` runs every stage
quickly on a tiny model, to check a set-up end to end. The stages themselves:
`training.pipeline_stages`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runtime.arguments import AT_LEAST_0, AT_LEAST_1, unmet
from runtime.card import read_card
from runtime.evaluation_protocol import SelectionRule
from runtime.files import CARD_FILE, check_writable, write_atomic
from runtime.sim import check_task
from runtime.user_errors import UserError, exit_on_user_errors
from training.card_update import check_model_name
from training.data.dataset import load_dataset
from training.learn.config import PRESETS, parse_config
from training.ledger import cpu_name
from training.pipeline_stages import STAGES, Stage
from training.run_lock import run_folder_lock
from training.train_cli import check_config, check_device
from training.tyro_cli import parse

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    """Collect, train, select, export, guide or calibrate, shield, cut-ready, evaluate a task;
    rerun to go on.

    Stages, each skipped when its output is there (times: docs/decisions/pipeline.md):
    - collect: datasets/<task>.hdf5 (or --dataset); 47 min for CarRun's paper schedule (Zen 3)
    - train: runs/pipeline-<name>/step_*.pt; `cpu-budget`: 24,000 steps in ~7 min on a free
      Zen 4 core, ~14 min on a Zen 1 core beside a second pipeline; `paper` at batch 256:
      0.6 s a step on Zen 3 (14,000 in ~2.5 h)
    - select: runs/pipeline-<name>/best.pt, on the selection seeds
    - export: models/<name>/model.onnx and model.json
    - guidance (`cpu-budget`, `cpu`): the cost guidance in model.json, 4 weights x 120 episodes
    - calibrate (`paper`): the scales in models/<name>/model.json; 60 episodes per measured row
    - critic: models/<name>/cost_critic.onnx, fit on the dataset (~3 min on a core)
    - shield: the budget guard's shield in model.json, 240 selection episodes without a
      shield, then 240 for each of 6 settings (160 at margin 25: its budget-10 rows are
      margin 15's episodes; none where no episode went over without one)
    - cut-ready: whether the guard holds budgets for a mid-episode cut, in model.json, 320
      selection episodes without a hold, then 240 and 160 for the two holds, as many again
      with the guidance off while held (a card with guidance), and 320 for each of those with
      a shield of its own (a card with a critic); none where no hold keeps every cut
    - evaluate: reports/<name>/evaluation_protocol.json (guard on, as served) and
      evaluation_protocol_unguarded.json

    `--smoke` runs every stage on a tiny model (20 steps, one episode per row) as the model
    <name>-smoke, to check a set-up end to end in minutes.
    """

    task: str = "SafetyCarRun-v0"
    """gymnasium env id (Bullet-Safety-Gym task)."""
    preset: Literal["cpu-budget", "paper", "cpu"] = "cpu-budget"
    """training preset: `cpu-budget`, the recipe for every task on a CPU (24,000 steps of a
    2 x 64 x 4 model with context 1; docs/decisions/return-tokens.md), or `paper` (the paper's
    model, which kept CarRun's budgets at batch 256 over 14,000 steps on a CPU)."""
    device: str = "cpu"
    """training device (`cuda` on a GPU machine)."""
    batch_size: int | None = None
    """default: the preset's on a GPU; 256 on a CPU, the recipe that trained `cdt-carrun-cpu`
    (the paper's 2,048 takes ~1.8 s per step on 2 cores); 16 with --smoke."""
    update_steps: int | None = None
    """gradient steps; default the preset's (24,000 for `cpu-budget`); `paper`: 18,000 on a GPU,
    14,000 on a CPU (where the shipped `paper` CarRun models were chosen); 20 with --smoke."""
    from_step: int | None = None
    """first kept checkpoint selection considers; default the preset's first checkpoint (`paper`:
    6,000 on a GPU, 8,000 on a CPU), 0 with --smoke."""
    seed: int = 0
    """training seed (`cdt train --seed`): another seed is another run of the recipe, a second
    chance where one run's model keeps no budget."""
    name: str | None = None
    """model name (letters, digits, '.', '_', '-'; no leading '.' or '-'); default cdt-<task>,
    e.g. cdt-carrun (cdt-carrun-s1 with --seed 1, cdt-carrun-smoke with --smoke)."""
    dataset: Path | None = None
    """dataset to train on, collected there when missing; default datasets/<task>.hdf5 (shipped
    for every paper task, so give another path to time the pipeline from nothing)."""
    episodes: int | None = None
    """evaluation episodes per seed, per budget and action mode (default 10; 1 with --smoke)."""
    seeds: int | None = None
    """evaluation seeds (default 2; 1 with --smoke)."""
    smoke: bool = False
    """check the set-up end to end quickly: a tiny model, a checkpoint every few steps, one
    episode per selection, calibration and evaluation row, one candidate calibration scale; a
    missing dataset is collected small into the run folder, never into datasets/."""

    def __post_init__(self) -> None:
        """Refuse values no pipeline can run with (a `UserError`: one line, exit 2)."""
        counts = {"--batch-size": self.batch_size, "--update-steps": self.update_steps}
        counts |= {"--episodes": self.episodes, "--seeds": self.seeds}
        at_least_0 = {"--from-step": self.from_step, "--seed": self.seed}
        problems = unmet(AT_LEAST_1, counts) + unmet(AT_LEAST_0, at_least_0)
        if problems:
            raise UserError("; ".join(problems))
        if self.name:  # it names the run's and the model's folders: never a path
            check_model_name(self.name, f"--name {self.name}")

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def steps(self) -> int:
        if self.update_steps is not None:
            return self.update_steps
        if self.smoke:
            return 20
        if self.preset != "paper":
            return PRESETS[self.preset].update_steps
        return 18_000 if self.on_gpu else 14_000

    @property
    def first_selected_step(self) -> int:
        if self.from_step is not None:
            return self.from_step
        if self.smoke:
            return 0
        if self.preset != "paper":
            return min(self.checkpoint_every, self.steps)
        return 6_000 if self.on_gpu else 8_000

    @property
    def checkpoint_every(self) -> int:
        if self.smoke:
            return max(1, self.steps // 2)
        return PRESETS[self.preset].checkpoint_every if self.preset != "paper" else 2_000

    @property
    def evaluation_episodes(self) -> int:
        return self.episodes if self.episodes is not None else 1 if self.smoke else 10

    @property
    def evaluation_seeds(self) -> int:
        return self.seeds if self.seeds is not None else 1 if self.smoke else 2

    def training_args(self) -> list[str]:
        """`cdt train` options beyond the paths: the preset and the recipe for this device."""
        if self.smoke:
            return self._smoke_training_args()
        args = ["--preset", self.preset, "--device", self.device, "--update-steps", str(self.steps)]
        args += ["--seed", str(self.seed)]
        batch_size = self.batch_size
        if batch_size is None and not self.on_gpu and self.preset == "paper":
            batch_size = 256
        args += ["--batch-size", str(batch_size)] if batch_size else []
        # bf16 halves the paper model's CPU step where the CPU multiplies bf16 natively (else it is
        # ~10x slower); the `cpu` preset's narrow model runs 2-3x slower with it either way.
        # The training loop imports torch (~2 s): only now, after parsing.
        from training.learn.train import cpu_has_native_bf16

        native = self.preset == "paper" and cpu_has_native_bf16()
        args += ["--bf16"] if self.on_gpu or native else []
        return args

    def _smoke_training_args(self) -> list[str]:
        """A tiny model for a few steps: the stages run, nothing is learnt."""
        args = ["--preset", "cpu", "--device", self.device, "--update-steps", str(self.steps)]
        args += ["--seed", str(self.seed)]
        args += ["--batch-size", str(self.batch_size or 16), "--embedding-dim", "16"]
        args += ["--num-layers", "1", "--num-heads", "2", "--warmup-steps", "0"]
        return [*args, "--eval-episodes", "1", "--no-tensorboard"]

    @property
    def model_name(self) -> str:
        if self.name:
            return self.name
        short = self.task.removeprefix("Safety").rsplit("-v", 1)[0].lower()
        seed = f"-s{self.seed}" if self.seed else ""
        return f"cdt-{short}{seed}" + ("-smoke" if self.smoke else "")

    @property
    def dataset_path(self) -> Path:
        if self.dataset is not None:
            return self.dataset
        shared = Path("datasets") / f"{self.task}.hdf5"
        if self.smoke and not shared.is_file():  # a smoke run's tiny data stays in its folder
            return self.run_dir / f"{self.task}.hdf5"
        return shared

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
    with run_folder_lock(config.run_dir, "cdt pipeline"):  # its training stage re-enters it
        return _run_stages(config, stages)


def _run_stages(config: PipelineConfig, stages: list[Stage]) -> dict[str, float]:
    seconds: dict[str, float] = {}
    (config.run_dir / "cpu.txt").write_text(cpu_name() + "\n")  # for bench/pipeline_stages.py
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


def check_before_running(config: PipelineConfig) -> None:
    """Before the first stage: the task, the training settings, an existing dataset, the folders
    written, and that an existing model folder is this pipeline's own."""
    check_task(config.task)  # an unknown task: `UnknownTask`, a one-line UserError
    check_device(config.device)
    # The training values as `cdt train` checks them (any existing file stands in for the data).
    check_config(parse_config(["--dataset", __file__, *config.training_args()]))
    if config.dataset_path.is_file():
        load_dataset(config.dataset_path)  # a corrupt file: one line now, not after "collect"
    else:
        check_writable(config.dataset_path, option="--dataset")
    for folder in (config.run_dir, config.model_dir, config.report.parent):
        check_writable(folder, folder=True)
    if (config.model_dir / CARD_FILE).exists() and not config.run_dir.is_dir():
        raise UserError(
            f"{config.model_dir} holds a model this pipeline did not make (no {config.run_dir}):"
            " give another --name"
        )
    trained = config.run_dir / "last.json"  # the training config `cdt train` keeps beside last.pt
    seed = json.loads(trained.read_text()).get("seed") if trained.is_file() else None
    if seed is not None and seed != config.seed:
        raise UserError(
            f"{config.run_dir} trains seed {seed}, not --seed {config.seed}: give another --name"
        )


@exit_on_user_errors("cdt pipeline")
def main(argv: list[str] | None = None) -> None:
    """Entry point of `cdt pipeline`."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = sys.argv[1:] if argv is None else argv
    config = parse(PipelineConfig, args, "cdt pipeline")
    check_before_running(config)
    try:
        seconds = run_pipeline(config)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM during training: every stage resumes
        print(
            f"cdt pipeline: stopped; continue with: cdt pipeline {' '.join(args)}", file=sys.stderr
        )
        raise SystemExit(130) from None
    from training.evaluation.cut_ready_record import served_verdict, served_worst_share_over

    evaluation = read_card(config.model_dir).evaluation or {}
    worst, allowed = served_worst_share_over(evaluation), SelectionRule().max_share_over
    unfit = not config.smoke and worst is not None and worst > allowed  # smoke: a set-up check
    totals = _stage_seconds(config.stage_seconds)
    stages = ", ".join(f"{name} {value:.0f}" for name, value in totals.items())
    print(
        f"{config.model_name}: {sum(seconds.values()):.0f} s this run, "
        f"{sum(totals.values()):.0f} s over every run ({stages}); "
        f"{'do not serve it (below)' if unfit else 'serve it with `cdt serve`'}, results in "
        f"{config.report}"
    )
    verdict = served_verdict(evaluation)
    if verdict is not None:
        print(f"{config.model_name}: {verdict}")
    if unfit:
        print(
            f"cdt pipeline: {config.model_dir} breaks its budgets as served: {worst:.0%} of the "
            f"selection episodes went over a reported budget (the selection rule allows "
            f"{allowed:.0%}); train another run with --seed {config.seed + 1}",
            file=sys.stderr,
        )
        raise SystemExit(1)


if __name__ == "__main__":
    main()
