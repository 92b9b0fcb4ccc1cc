"""`runtime.onnx_session.open_session`: a graph opens, anything else is the caller's load error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.onnx_session import open_session
from tests.service.toy_policy import write_test_policy


class _Refused(Exception):
    pass


def test_an_exported_graph_opens_with_one_thread_each(tmp_path: Path) -> None:
    model = write_test_policy(tmp_path / "model", observation_dim=3, action_dim=2)
    session = open_session(model / "model.onnx", _Refused)
    assert "states" in {node.name for node in session.get_inputs()}


def test_a_junk_file_is_the_callers_error_naming_the_file(tmp_path: Path) -> None:
    junk = tmp_path / "model.onnx"
    junk.write_bytes(b"not a graph")
    with pytest.raises(_Refused, match=f"^{junk}: "):
        open_session(junk, _Refused)


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)  # onnxruntime would block on it for good
    with pytest.raises(_Refused, match="not a regular file"):
        open_session(fifo, _Refused)
