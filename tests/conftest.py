"""Fixtures shared across the test packages."""

from __future__ import annotations

import os
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


def shared_session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every pytest-xdist worker of this run sees (each worker's own base folder sits
    in it); without xdist, the session's base folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def exported_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoint, export dir) of a 3-step CDT run with every model option that changes the
    graph; exported once per run, by whichever xdist worker asks first (an export takes seconds,
    and the others wait on the lock and read its files)."""
    from filelock import FileLock

    root = shared_session_dir(tmp_path_factory) / "export"
    root.mkdir(exist_ok=True)
    checkpoint, model_dir = root / "run" / "last.pt", root / "models" / "tiny-cdt"
    with FileLock(str(root / ".lock")):
        if not (model_dir / "model.json").is_file():
            from tests.training.cdt_synthetic import tiny_config, write_dataset
            from training.export import export_checkpoint
            from training.learn.train import train

            dataset = write_dataset(root / "tiny.hdf5")
            config = tiny_config(
                dataset, root, update_steps=3, seq_len=5, cost_prediction_weight=0.02,
                cost_transform=True,
            )  # fmt: skip
            assert train(config) == checkpoint
            export_checkpoint(checkpoint, model_dir)
    return checkpoint, model_dir
