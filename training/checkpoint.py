"""Checkpoint files: atomic writes, `weights_only` loading, the resolved config beside each one.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so
`torch.load(path, weights_only=True)` reads it without unpickling arbitrary objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from runtime.files import write_atomic

CHECKPOINT_FORMAT = 1


def write_checkpoint(path: Path, payload: dict[str, Any]) -> Path:
    """Save `payload` to `path` and its `config` entry to `path.with_suffix('.json')`."""
    payload = {"format": CHECKPOINT_FORMAT, **payload}
    write_atomic(path, lambda target: torch.save(payload, target))
    config_text = json.dumps(payload.get("config", {}), indent=2, sort_keys=True) + "\n"
    write_atomic(path.with_suffix(".json"), lambda target: target.write_text(config_text))
    return path


class CheckpointError(ValueError):
    """A file that is not a readable CDT checkpoint: one line for the user."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU with `weights_only=True`."""
    try:
        payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises pickle, zip and runtime errors for a bad file
        kind = type(error).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint (torch.load: {kind})") from error
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a CDT checkpoint (format {CHECKPOINT_FORMAT})")
    return payload
