"""What the evaluation commands (`cdt evaluate`, `calibrate`, `sweeps`, `select`) check before
their first episode: the policy loads, the task is the model's (or `--force`), and the outputs may
be written without replacing earlier results unasked. Each failure is a `UserError`: one line,
exit code 2, nothing written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.card import ModelCard
from runtime.files import CARD_FILE, check_writable, refuse_overwrite
from runtime.policy import Policy, PolicyLoadError
from runtime.sim import check_task, make_env
from runtime.user_errors import UserError


def load_policy(model_dir: Path, *, writes_card: bool = False) -> Policy:
    """Load and check the exported policy; a missing or broken one is a `UserError`, and so is
    a card the command will write (`writes_card`) in a folder it cannot write."""
    if not (model_dir / CARD_FILE).is_file():
        raise UserError(f"{model_dir} has no {CARD_FILE}")
    if writes_card:
        check_writable(model_dir / CARD_FILE)
    try:
        return Policy.load(model_dir)
    except PolicyLoadError as error:
        raise UserError(str(error)) from None


def check_task_for(card: ModelCard, task: str | None, force: bool) -> str:
    """The task to run the model on: the card's, or `task` when it exists and is the card's (or
    `force`, and the model can read its observations and write its actions). A `task` no
    simulator knows is an `UnknownTask` (a `UserError`; a card's is, once an env is made)."""
    if task is None or task == card.task:
        return card.task
    check_task(task)
    if not force:
        raise UserError(
            f"model {card.name} was trained on {card.task}, not {task}: pass --force to run it "
            "there anyway"
        )
    env = make_env(task)
    dims = (_size(env.observation_space), _size(env.action_space))
    env.close()
    if dims != (card.observation_dim, card.action_dim):
        raise UserError(
            f"{task} has {dims[0]} observations and {dims[1]} actions; model {card.name} "
            f"({card.task}) reads {card.observation_dim} and writes {card.action_dim}"
        )
    return task


def _size(space: Any) -> int:
    return int(np.prod(getattr(space, "shape", None) or (1,)))


def default_report_dir(model_dir: Path) -> Path:
    """`reports/NAME` for a model in this checkout's `models/`; the model's own folder for any
    other, so evaluating a model from elsewhere never writes into the tracked `reports/`."""
    resolved = model_dir.resolve()
    if resolved.parent == Path("models").resolve():
        return Path("reports") / resolved.name
    return model_dir


def check_report_outputs(paths: Sequence[Path], force: bool) -> None:
    """Before any episode: the report's folder is writable, earlier results replaced only with
    --force."""
    for path in paths:
        check_writable(path, option="--out")
    refuse_overwrite(paths, force, "pass --out DIR to write elsewhere, or --force to replace it")
