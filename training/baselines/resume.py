"""A baseline's training, resumable: its whole state is written to `progress.pt` in the output
folder every `checkpoint_every` steps (and when Ctrl-C or SIGTERM stops it), and the same command
run again continues from there, to the same weights as a run never stopped.

The Q-learning baselines take 40-80 minutes of a core for 24,000 steps, and a session that ends
every process it started would otherwise lose all of it. A learner's state is more than its
`state_dict`: optimisers, plain numbers (CPQ's alpha) and the PID multiplier's controller are
attributes. `learner_state` gathers every attribute of every submodule, so a new piece of state
cannot be forgotten; a type it cannot store raises instead of resuming wrongly. The file holds
only tensors, numbers, strings, lists and dicts (`torch.load(..., weights_only=True)`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.baselines.config import BaselineConfig
from training.checkpoint import load_checkpoint, write_checkpoint

logger = logging.getLogger(__name__)

PROGRESS_FILE = "progress.pt"

# Settings a resumed run may change: where and how fast it runs, how often it saves, how far.
FREE_TO_CHANGE = frozenset({"out", "threads", "device", "steps", "checkpoint_every"})


class ProgressMismatch(ValueError):
    """A progress file written by a run with other settings."""


@dataclass
class Progress:
    """Where the loop stands: steps taken, the batch sampler, the logged history."""

    step: int = 0
    seconds: float = 0.0
    """wall-clock time of the gradient steps so far, over every resumed part."""
    history: list[dict[str, float]] = field(default_factory=list)
    window: dict[str, list[float]] = field(default_factory=dict)
    """statistics of the steps since the last logged window."""
    resumed_from: int | None = None


def learner_state(learner: nn.Module) -> dict[str, Any]:
    """Everything an update may change: the modules' tensors, and every optimiser, number,
    tensor and controller the learner and its submodules keep as attributes."""
    attributes = {name: _capture_all(vars(module)) for name, module in learner.named_modules()}
    return {"modules": learner.state_dict(), "attributes": attributes}


def load_learner_state(learner: nn.Module, state: dict[str, Any]) -> None:
    """Put `learner_state`'s output back into a learner built with the same settings."""
    learner.load_state_dict(state["modules"])
    for name, captured in state["attributes"].items():
        module = learner.get_submodule(name)
        for key, value in captured.items():
            _restore(module, key, value)


def _capture(value: object) -> dict[str, Any] | None:
    """One attribute as a tagged, weights-only value; None for what an update never changes."""
    if isinstance(value, torch.optim.Optimizer):
        return {"optimiser": value.state_dict()}
    if isinstance(value, bool | int | float | str):
        return {"value": value}
    if isinstance(value, torch.Tensor):
        return {"tensor": value.detach().clone()}
    if value is None or isinstance(value, nn.Module) or _is_setting(value):
        return None
    if isinstance(value, dict):
        return {"items": _capture_all(value)}
    if hasattr(value, "__dict__"):
        return {"fields": _capture_all(vars(value))}
    raise TypeError(f"cannot save a learner attribute of type {type(value).__name__} to resume")


def _capture_all(attributes: dict[Any, Any]) -> dict[str, Any]:
    captured = {}
    for key, value in attributes.items():
        if not str(key).startswith("_") and (state := _capture(value)) is not None:
            captured[str(key)] = state
    return captured


def _is_setting(value: object) -> bool:
    """Frozen dataclasses (the config) are settings, not state."""
    return dataclasses.is_dataclass(value) and value.__dataclass_params__.frozen  # type: ignore[union-attr]


def _restore(holder: Any, key: str, captured: dict[str, Any]) -> None:
    """Put one captured attribute (or dict entry) of `holder` back."""
    current = holder[key] if isinstance(holder, dict) else getattr(holder, key)
    ((kind, saved),) = captured.items()
    if kind == "optimiser":
        current.load_state_dict(saved)
    elif kind == "tensor":
        current.copy_(saved)
    elif kind == "value":
        if isinstance(holder, dict):
            holder[key] = saved
        else:
            setattr(holder, key, saved)
    else:  # "items" of a dict or "fields" of an object
        for inner_key, inner in saved.items():
            _restore(current, inner_key, inner)


def _settings(config: BaselineConfig) -> dict[str, Any]:
    """The config as JSON values (paths as strings, tuples as lists)."""
    return {key: _json_value(value) for key, value in dataclasses.asdict(config).items()}


def _json_value(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def write_progress(
    path: Path,
    config: BaselineConfig,
    learner: nn.Module,
    progress: Progress,
    sampler: torch.Generator,
) -> None:
    """Save the run so far (atomically, with its settings as JSON beside it)."""
    payload: dict[str, Any] = {
        "config": _settings(config),
        "step": progress.step,
        "seconds": progress.seconds,
        "history": progress.history,
        "window": progress.window,
        "learner": learner_state(learner),
        "sampler": sampler.get_state(),
        "torch_rng": torch.get_rng_state(),
    }
    if torch.device(config.device).type == "cuda":
        payload["cuda_rng"] = torch.cuda.get_rng_state_all()
    write_checkpoint(path, payload)


def resume_progress(
    path: Path, config: BaselineConfig, learner: nn.Module, sampler: torch.Generator
) -> Progress:
    """Restore `learner`, `sampler` and the RNGs from `path` if it exists; a fresh start if not.

    Raises:
        ProgressMismatch: the file was written with other settings, or past `config.steps`.
    """
    if not path.is_file():
        return Progress()
    payload = load_checkpoint(path)
    saved, now = payload["config"], _settings(config)
    changed = sorted(
        key
        for key in saved.keys() | now.keys()
        if key not in FREE_TO_CHANGE and saved.get(key) != now.get(key)
    )
    if changed:
        differences = ", ".join(f"{key} {saved.get(key)!r} -> {now.get(key)!r}" for key in changed)
        raise ProgressMismatch(
            f"{path} holds a run with other settings ({differences}): train with those, "
            "or delete the file to start over"
        )
    if payload["step"] > config.steps:
        raise ProgressMismatch(
            f"{path} is at step {payload['step']}, past --steps {config.steps}: "
            "give at least that many, or delete the file to start over"
        )
    load_learner_state(learner, payload["learner"])
    sampler.set_state(payload["sampler"])
    torch.set_rng_state(payload["torch_rng"])
    if "cuda_rng" in payload and torch.device(config.device).type == "cuda":
        torch.cuda.set_rng_state_all(payload["cuda_rng"])
    logger.info("%s: resuming from step %d (%s)", config.algo, payload["step"], path)
    return Progress(
        step=payload["step"],
        seconds=payload["seconds"],
        history=payload["history"],
        window=payload["window"],
        resumed_from=payload["step"],
    )


def discard_progress(path: Path) -> None:
    """Remove a finished run's progress file and its settings."""
    path.unlink(missing_ok=True)
    path.with_suffix(".json").unlink(missing_ok=True)
