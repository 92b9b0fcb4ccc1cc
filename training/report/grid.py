"""The grid of `cdt report`: train and export each (task, algorithm, seed), then evaluate it.

Baselines train through `training.baselines`; the sequence models (`cdt`, `dt-cost`, `dt`) through
the training loop with the `cpu` preset plus `--sequence-args`, exporting `best.pt` (the
checkpoint chosen by in-env evaluation, `checkpoint_scores.score_in_training`) for CDT and the
last checkpoint for the DTs, which are not selected for safety. Already exported models (shipped
CDT policies, earlier runs) join the grid with `--include-existing DIR`: the card's `algo` and
`task` place them.

Every model is evaluated by `evaluate(model_dir, episodes, seeds, target_reward, target_cost,
deterministic)` (`training.evaluation.evaluate.evaluate_policy_dir` unless a test passes its own).
Scores are the evaluator's `normalised_reward_mean` and `normalised_cost_mean` (paper section 5);
a result with only raw `reward_mean` and `cost_mean` is normalised by `runtime.scores`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_type_hints

from runtime.card import CardError, read_card
from runtime.evaluation_protocol import action_mode, target_reward_for
from runtime.files import CARD_FILE, write_atomic
from runtime.scores import normalised_cost, normalised_reward
from runtime.user_errors import UserError
from training.card_update import record_default_targets
from training.data.dataset import load_dataset, read_task
from training.data.frontiers import derive_default_targets
from training.evaluation.calibrate import calibration_online_episodes
from training.learn.config import TrainConfig, parse_config
from training.report.config import ReportConfig
from training.report.tables import (
    SAMPLED_SUFFIX,
    RunResult,
    card_training,
    row_algorithm,
    short_task,
)

logger = logging.getLogger(__name__)

EvaluateFunction = Callable[..., dict[str, Any]]

SEQUENCE_ALGORITHMS: tuple[str, ...] = get_args(get_type_hints(TrainConfig)["algo"])
"""`cdt train --algo` values the training loop trains (cdt, dt-cost, dt): `TrainConfig.algo`'s."""


def result_scores(
    result: dict[str, Any], card: dict[str, Any], cost_limit: float
) -> tuple[float, float] | None:
    """(normalised reward, normalised cost) of one evaluation result, or None if it has none.

    Takes the evaluator's `normalised_reward_mean` / `normalised_cost_mean` when present, else
    normalises raw mean returns (`reward_mean` / `cost_mean`) with `runtime.scores`, as `cdt
    evaluate` does.
    """
    if "normalised_reward_mean" in result and "normalised_cost_mean" in result:
        return float(result["normalised_reward_mean"]), float(result["normalised_cost_mean"])
    if "reward_mean" not in result or "cost_mean" not in result:
        return None
    data = card.get("dataset") or {}
    reward_range = (
        float(data.get("reward_return_min", 0.0)),
        float(data.get("reward_return_max", 1.0)),
    )
    reward = normalised_reward(float(result["reward_mean"]), reward_range)
    return reward, normalised_cost(float(result["cost_mean"]), cost_limit)


def split_label(entry: str) -> tuple[str | None, Path]:
    label, separator, path = entry.partition("=")
    return (label, Path(path)) if separator else (None, Path(entry))


def _evaluate_dir(
    model_dir: Path,
    label: str,
    card: dict[str, Any],
    config: ReportConfig,
    evaluate: EvaluateFunction,
    *,
    mean: bool,
) -> dict[str, Any]:
    """The evaluation result of one exported model (`card`: its model card), with mean or
    sampled actions.

    The result is kept under `<models_dir>/evaluations/` (never beside a shipped model), so a
    rerun with `--reuse` after an interruption skips the evaluations already done with the same
    episodes, seeds, cost limit, action mode and model.
    """
    settings = {
        "episodes": config.episodes,
        "seeds": config.eval_seeds,
        "target_cost": config.cost_limit,
        "deterministic": mean,
        "model_dir": str(model_dir),
        "card_created_at": card.get("created_at"),
    }
    mode = action_mode(mean)
    saved_path = config.models_dir / "evaluations" / f"{label}-{model_dir.name}-{mode}.json"
    if config.reuse and saved_path.is_file():
        saved = json.loads(saved_path.read_text())
        if saved.get("settings") == settings:
            return dict(saved["result"])
    result = evaluate(
        model_dir=model_dir,
        episodes=config.episodes,
        seeds=config.eval_seeds,
        target_reward=target_reward_for(
            read_card(model_dir).default_targets or [], config.cost_limit
        ),
        target_cost=config.cost_limit,
        deterministic=mean,
    )
    text = json.dumps({"settings": settings, "result": result}, default=float) + "\n"
    write_atomic(saved_path, lambda temporary: temporary.write_text(text))
    return result


def _evaluated_results(
    model_dir: Path, task: str, seed: int, config: ReportConfig, evaluate: EvaluateFunction
) -> list[RunResult]:
    """The model's row under the table's one convention (the Gaussian's mean action, as the
    authors evaluate CDT), plus a `<algo>-sampled` row for the algorithms in `sampled_beside`."""
    card = json.loads((model_dir / CARD_FILE).read_text())
    algo = row_algorithm(card) or model_dir.name
    modes = [(algo, True)]
    if algo in config.sampled_beside:
        modes.append((algo + SAMPLED_SUFFIX, False))
    results = []
    for name, mean in modes:
        result = _evaluate_dir(model_dir, task, card, config, evaluate, mean=mean)
        scores = result_scores(result, card, config.cost_limit)
        if scores is None:
            raise ValueError(f"{model_dir}: evaluation has no reward/cost returns")
        online = calibration_online_episodes(card, deterministic=mean)
        results.append(RunResult(name, task, seed, *scores, *card_training(card), online))
        logger.info("%s %s seed %d: reward %.2f cost %.2f", task, name, seed, *scores)
    return results


# The cells import the trainers only when they train: torch and onnx take ~2 s to import, and
# `cdt report --help`, a mistake or a reused model needs neither.
def _train_cell(config: ReportConfig, dataset_path: Path, label: str, algo: str, seed: int) -> Path:
    model_dir = config.models_dir / label / f"{algo}-s{seed}"
    if config.reuse and (model_dir / CARD_FILE).is_file():
        return model_dir
    # Said before it starts: a cell missing from a --reuse grid trains at the grid's own settings.
    steps = (
        "the sequence settings" if algo in SEQUENCE_ALGORITHMS else f"{config.train.steps:,} steps"
    )
    logger.info(
        "training %s seed %d on %s (%s): no model in %s", algo, seed, label, steps, model_dir
    )
    if algo in SEQUENCE_ALGORITHMS:
        return _train_sequence_cell(config, dataset_path, model_dir, algo, seed)
    from training.baselines.registry import train_and_export
    from training.baselines.resume import ProgressMismatch

    run = dataclasses.replace(
        config.train,
        algo=algo,  # type: ignore[arg-type]
        dataset=dataset_path,
        seed=seed,
        out=model_dir,
        cost_limit=config.cost_limit,
    )
    try:
        return train_and_export(run, load_dataset(dataset_path))
    except ProgressMismatch as error:  # other --train.* settings than the cell's unfinished run
        raise UserError(f"{error}, or give the grid another --models-dir") from None


def _train_sequence_cell(
    config: ReportConfig, dataset_path: Path, model_dir: Path, algo: str, seed: int
) -> Path:
    """`cdt train` + `cdt export` + default targets from the data, for one sequence model."""
    from training.evaluation.checkpoint_scores import score_in_training
    from training.export import export_checkpoint
    from training.learn.recorded import train_and_record

    args = ["--dataset", str(dataset_path), "--algo", algo, "--seed", str(seed)]
    args += ["--out-dir", str(model_dir.parent / "runs"), "--run-name", model_dir.name]
    if algo != "cdt":
        args += ["--eval-every", "0"]  # the unselected last checkpoint is what is exported
    run_config = parse_config([*args, *shlex.split(config.sequence_args)])
    last = train_and_record(run_config, evaluate_checkpoint=score_in_training)
    best = last.with_name("best.pt")
    model_dir.mkdir(parents=True, exist_ok=True)
    export_checkpoint(best if algo == "cdt" and best.is_file() else last, model_dir)
    dataset = load_dataset(dataset_path)
    thresholds = (config.cost_limit, 2 * config.cost_limit, 4 * config.cost_limit)
    targets = derive_default_targets(dataset.cost_returns, dataset.reward_returns, thresholds)
    record_default_targets(model_dir, targets)
    return model_dir


def _dataset_label(entry: str) -> tuple[str, Path]:
    """The table column of a `--datasets` entry (its LABEL, else the task's short name), and the
    file; a cell's folder is `<models_dir>/<column>/<algo>-s<seed>`."""
    label, path = split_label(entry)
    if label is None:
        label = short_task(read_task(path))
    return label, path


def unfinished_elsewhere(config: ReportConfig) -> list[str]:
    """Baseline cells whose unfinished run (`progress.pt`, which the grid would continue) was
    trained on another dataset file than the grid names for that column, one phrase each: said
    before the first run, not after the hours of the cells before it."""
    found = []
    for entry in config.datasets:
        label, path = _dataset_label(entry)
        for algo in (name for name in config.algorithms if name not in SEQUENCE_ALGORITHMS):
            for seed in range(config.seeds):
                cell = config.models_dir / label / f"{algo}-s{seed}"
                if config.reuse and (cell / CARD_FILE).is_file():
                    continue  # reused as it is: its progress is never read
                saved = _unfinished_dataset(cell)
                if saved is not None and saved != str(path):
                    found.append(
                        f"{cell} holds an unfinished {algo} run on dataset {saved}, not {path}:"
                        f" give {path} its own column (--datasets LABEL={path}) or the grid"
                        f" another --models-dir, or delete {cell / 'progress.pt'} to train that"
                        " cell again from step 0"
                    )
    return found


def _unfinished_dataset(cell: Path) -> str | None:
    """The dataset an unfinished baseline run in `cell` trains on (its `progress.json`, the
    settings beside `progress.pt`), or None where there is none."""
    if not (cell / "progress.pt").is_file():
        return None
    try:
        settings = json.loads((cell / "progress.json").read_text())
    except (OSError, ValueError):
        return None
    dataset = settings.get("dataset") if isinstance(settings, dict) else None
    return dataset if isinstance(dataset, str) else None


def run_grid(config: ReportConfig, evaluate: EvaluateFunction) -> list[RunResult]:
    """Train, export and evaluate every (dataset, algorithm, seed) of the grid."""
    results: list[RunResult] = []
    for entry in config.datasets:
        label, path = _dataset_label(entry)
        for algo in config.algorithms:
            for seed in range(config.seeds):
                model_dir = _train_cell(config, path, label, algo, seed)
                results += _evaluated_results(model_dir, label, seed, config, evaluate)
    return results


def existing_results(config: ReportConfig, evaluate: EvaluateFunction) -> list[RunResult]:
    """Already exported models, evaluated like the grid's (a card's own evaluation may have used
    another action convention, so it is never taken as the row)."""
    results = []
    for index, entry in enumerate(config.include_existing):
        label, model_dir = split_label(entry)
        card = json.loads((model_dir / CARD_FILE).read_text())
        task = label or short_task(str(card.get("task", model_dir.name)))
        results += _evaluated_results(model_dir, task, card_seed(card, index), config, evaluate)
    return results


def card_seed(card: dict[str, Any], fallback: int) -> int:
    """The training seed a model card records (`fallback` for a card without one): two models
    of one algorithm and task are two seeds of its cell only if they were trained on two."""
    seed = (card.get("training_config") or {}).get("seed")
    return fallback if seed is None else int(seed)


def missing_inputs(config: ReportConfig) -> list[str]:
    """Dataset files and model cards the grid names but that are not there: said before the
    first training run, not after an hour of them."""
    missing = [
        f"no dataset {path}"
        for path in (split_label(entry)[1] for entry in config.datasets)
        if not path.is_file()
    ]
    for model_dir in (split_label(entry)[1] for entry in config.include_existing):
        if not (model_dir / CARD_FILE).is_file():
            missing.append(f"{model_dir} has no {CARD_FILE}")
            continue
        try:
            read_card(model_dir)
        except CardError as error:
            missing.append(str(error))
    return missing
