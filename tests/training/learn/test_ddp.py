"""DistributedDataParallel under torchrun: two CPU processes on gloo end with identical weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.cdt_synthetic import write_dataset
from training.checkpoint import load_checkpoint

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.slow
def test_two_gloo_ranks_end_with_identical_weights(tmp_path: Path):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(WORKER), str(dataset), str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), name
    checkpoint = load_checkpoint(tmp_path / "run" / "last.pt")
    assert checkpoint["step"] == 3
    assert len(checkpoint["sampler_states"]) == 2  # each rank's batch stream, for --resume
    assert not torch.equal(*checkpoint["sampler_states"])  # ranks draw different batches
    for name, tensor in rank0.items():
        assert torch.equal(tensor, checkpoint["model"][name]), name
