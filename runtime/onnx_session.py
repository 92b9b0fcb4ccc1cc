"""Opening an exported ONNX graph (the policy's, the cost critic's) for CPU inference.

One home for the session options the service and training's evaluation share, and for the rule
that a file which is not a regular one, or which onnxruntime refuses, is a load error naming it.
Torch-free: onnxruntime is imported when a graph is opened (the episode loop imports the cost
critic's module during training).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from runtime.files import check_regular

if TYPE_CHECKING:
    import onnxruntime as ort


def open_session(
    path: Path,
    load_error: type[Exception],
    *,
    intra_op_threads: int = 1,
    inter_op_threads: int = 1,
) -> ort.InferenceSession:
    """An onnxruntime CPU session on `path` (sequential, every graph optimisation, quiet);
    raises `load_error("<path>: <why>")` for a file that is not regular or that onnxruntime
    cannot load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    try:
        check_regular(path)  # a FIFO or a device would hold onnxruntime for good
    except OSError as error:
        raise load_error(f"{path}: {error.strerror}") from error
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own types, all mean "broken file"
        raise load_error(f"{path}: {error}") from error
