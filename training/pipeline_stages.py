"""The stages of `cdt pipeline` (`training.pipeline`), each a function of its `PipelineConfig`,
and the checks that tell whether a stage's output is already there."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.card import read_card
from runtime.evaluation_protocol import SELECTION_BUDGET_SCALES, SelectionRule
from runtime.files import CARD_FILE, COST_CRITIC_FILE, ONNX_FILE
from training.card_update import record_evaluation
from training.collect.settings import CollectConfig
from training.learn.config import parse_config

if TYPE_CHECKING:
    from training.pipeline import PipelineConfig

logger = logging.getLogger(__name__)


# The stages import their engines when they run: torch, onnx and the simulator take ~2 s to import,
# and `--help`, a mistake or a skipped stage needs none of them.
def collect(config: PipelineConfig) -> None:
    from training.collect.collection import finalize, learn

    collect_config = CollectConfig(task=config.task, out=config.dataset_path)
    if config.smoke:  # one short epoch in the run's folder: the stage runs, nothing is learnt
        collect_config = dataclasses.replace(
            collect_config,
            run_dir=config.run_dir / "collect",
            epochs=1,
            steps_per_epoch=1_000,
            num_envs=2,
        )
    learn(collect_config)
    finalize(collect_config)


def train(config: PipelineConfig) -> None:
    from training.learn.recorded import train_and_record

    args = ["--dataset", str(config.dataset_path), *config.training_args()]
    args += ["--eval-every", "0", "--checkpoint-every", str(config.checkpoint_every)]
    args += ["--keep-checkpoints"]
    args += ["--out-dir", str(config.run_dir.parent), "--run-name", config.run_dir.name]
    if (config.run_dir / "last.pt").is_file():  # an interrupted run continues where it stopped
        args += ["--resume", str(config.run_dir / "last.pt")]
    train_and_record(parse_config(args))


def select(config: PipelineConfig) -> None:
    from training.evaluation.select_checkpoint import record_selection, select_best

    episodes = 1 if config.smoke else None
    # guided presets get no fed-budget calibration: guidance acts on the cost token instead
    scales = SELECTION_BUDGET_SCALES if config.preset == "paper" and not config.smoke else (1.0,)
    _, chosen = select_best(
        config.run_dir, SelectionRule(), config.first_selected_step, scales, episodes
    )
    record_selection(config.run_dir, chosen)


def export(config: PipelineConfig) -> None:
    from training.export import export_checkpoint, quiet_exporter_logs

    quiet_exporter_logs()
    export_checkpoint(config.run_dir / "best.pt", config.model_dir, config.model_name)


def guide(config: PipelineConfig) -> None:
    from training.evaluation.guidance import guide_model

    if config.smoke:
        chosen = guide_model(config.model_dir, weights=(0.0,), episodes=1, workers=1)
    else:
        chosen = guide_model(config.model_dir)
    if chosen is None:
        logger.warning("no guidance weight keeps the budgets: the model ships unguided, unsafe")


def critic(config: PipelineConfig) -> None:
    from training.cost_critic import CriticConfig
    from training.critic_cli import write_critic

    steps = 20 if config.smoke else CriticConfig.update_steps
    card = read_card(config.model_dir)
    write_critic(config.model_dir, card, config.dataset_path, CriticConfig(update_steps=steps))


def _has_critic(config: PipelineConfig) -> bool:
    if not (config.model_dir / COST_CRITIC_FILE).is_file():
        return False
    return read_card(config.model_dir).cost_critic is not None


def shield(config: PipelineConfig) -> None:
    from training.evaluation.shield import MAX_SHARE_OVER, shield_model

    if config.smoke:
        chosen = shield_model(config.model_dir, settings=((15.0, 1.0),), episodes=1, workers=1)
    else:
        chosen = shield_model(config.model_dir)
    if chosen.worst_share_over > MAX_SHARE_OVER:
        logger.info(
            "no shield setting keeps the budgets (%s: worst share over %.0f %%)",
            chosen.setting,
            100 * chosen.worst_share_over,
        )
    elif chosen.margin == 0:
        logger.info("the budget guard keeps its budgets without the shield: none set")


def cut_ready(config: PipelineConfig) -> None:
    from training.evaluation.cut_ready import cut_ready_model

    if config.smoke:
        chosen = cut_ready_model(config.model_dir, settings=(0.0,), episodes=1, workers=1)
    else:
        chosen = cut_ready_model(config.model_dir)
    logger.info("budget cuts: %s", chosen.setting)


def _finished(config: PipelineConfig, record_key: str) -> bool:
    """Has the stage that writes `evaluation[record_key]` of the model's card finished? An
    interrupted one left its rows there, unfinished: it runs again."""
    if not (config.model_dir / CARD_FILE).is_file():
        return False
    record = (read_card(config.model_dir).evaluation or {}).get(record_key) or {}
    return bool(record.get("finished"))


def _guided(config: PipelineConfig) -> bool:
    """Has guidance finished on this model, or does its preset calibrate instead?"""
    return config.preset == "paper" or _finished(config, "guidance")


def calibrate(config: PipelineConfig) -> None:
    # imported here, as the other stages' modules are: `cdt pipeline --help` loads none of them
    from training.evaluation.calibrate import calibrate_model

    if config.smoke:
        chosen = calibrate_model(config.model_dir, scales=(1.0,), episodes=1)
    else:
        chosen = calibrate_model(config.model_dir)
    if chosen is None:
        logger.warning("the mean action keeps the graph's budget scale: no calibration counted")


def _calibrated(config: PipelineConfig) -> bool:
    """Has calibration finished on this model (whether or not a calibration counted)?
    `cpu-budget` and `cpu` models are guided instead (docs/decisions/cost-guidance.md)."""
    from training.evaluation.calibrate import CALIBRATIONS

    # the mean action's record: the stage calibrates it
    return config.preset != "paper" or _finished(config, CALIBRATIONS[True].record_key)


def evaluate(config: PipelineConfig) -> None:
    """The reported protocol as served (budget guard on), and the model alone beside it; the
    guarded report goes last, since its file marks the stage done."""
    from training.evaluation.evaluate import evaluate_protocol, record_report, write_report

    for guarded in (False, True):
        result = evaluate_protocol(
            config.model_dir,
            episodes=config.evaluation_episodes,
            seeds=config.evaluation_seeds,
            workers=1 if config.smoke else 2,
            budget_guard=guarded,
        )
        stem = write_report(result, config.report.parent, "protocol", guarded)
        record_report(config.model_dir, stem, "protocol", guarded, config.task, "test")
        record_evaluation(config.model_dir, "protocol" if guarded else "protocol/unguarded", result)


def _trained(config: PipelineConfig) -> bool:
    """Has the run reached its step total? (Its .json beside last.pt holds no step.)"""
    from training.checkpoint import load_checkpoint

    last = config.run_dir / "last.pt"
    return last.is_file() and int(load_checkpoint(last)["step"]) >= config.steps


Stage = tuple[str, Callable[["PipelineConfig"], None], Callable[["PipelineConfig"], bool]]
"""A stage: its name, what it runs, and whether its output is there already."""
STAGES: list[Stage] = [
    ("collect", collect, lambda c: c.dataset_path.is_file()),
    ("train", train, _trained),
    ("select", select, lambda c: (c.run_dir / "best.pt").is_file()),  # training writes none
    ("export", export, lambda c: (c.model_dir / ONNX_FILE).is_file()),
    ("guidance", guide, _guided),
    ("calibrate", calibrate, _calibrated),
    ("critic", critic, _has_critic),
    ("shield", shield, lambda c: _finished(c, "shield")),
    ("cut-ready", cut_ready, lambda c: _finished(c, "cut_ready")),
    ("evaluate", evaluate, lambda c: c.report.is_file()),
]
