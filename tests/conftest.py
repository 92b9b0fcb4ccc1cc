"""Fixtures shared across the test packages."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # starlette asks for httpx2; the project pins httpx (pyproject [client]) for now. Imported
    # here, before any test module, so every later `from fastapi.testclient import` is quiet.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    import fastapi.testclient  # noqa: F401


@pytest.fixture(autouse=True)
def private_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Commands under test append to a ledger of their own, never to reports/ledger.jsonl."""
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("CDT_LEDGER", str(path))
    return path


@pytest.fixture(scope="session")
def exported_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint, export dir) of a 3-step CDT run with every model option that changes the
    graph; exported once per session (an export takes seconds)."""
    from tests.training.cdt_synthetic import tiny_config, write_dataset
    from training.export import export_checkpoint
    from training.learn.train import train

    root = tmp_path_factory.mktemp("export")
    dataset = write_dataset(root / "tiny.hdf5")
    config = tiny_config(
        dataset, root, update_steps=3, seq_len=5, cost_prediction_weight=0.02, cost_transform=True
    )
    checkpoint = train(config)
    return checkpoint, export_checkpoint(checkpoint, root / "models" / "tiny-cdt")
