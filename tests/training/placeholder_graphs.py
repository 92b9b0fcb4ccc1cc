"""Exports that write a placeholder instead of tracing a graph, for tests of what surrounds an
export (a grid, a critic's overwrite rules): a traced export takes seconds, the suite's largest
single cost. The graphs themselves are tested against torch in tests/test_export_parity.py and
tests/training/test_cost_critic.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

PLACEHOLDER = b"a placeholder, not an ONNX graph"


def _write_placeholder(_module: Any, path: Path, *_args: Any) -> Path:
    path.write_bytes(PLACEHOLDER)
    return path


def write_placeholder_graphs(patch: pytest.MonkeyPatch) -> None:
    """`cdt export`'s policy graph and `cdt critic`'s critic graph become placeholders."""
    patch.setattr("training.export.export_onnx", _write_placeholder)
    patch.setattr("training.cost_critic.export_cost_critic", _write_placeholder)
