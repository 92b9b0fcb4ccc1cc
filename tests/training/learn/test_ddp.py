"""DistributedDataParallel on two CPU processes on gloo: both end with identical weights.

The ranks are started as torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE and the rank-0
store's address in the environment), without torchrun's launcher, which adds a third interpreter
and seconds of start and teardown to what is under test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.cdt_synthetic import write_dataset
from training.checkpoint import load_checkpoint

WORKER = Path(__file__).with_name("ddp_worker.py")
WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_ranks(dataset: Path, out_dir: Path) -> list[subprocess.Popen[bytes]]:
    store = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    base = {**os.environ, **store, "WORLD_SIZE": str(WORLD_SIZE), "OMP_NUM_THREADS": "1"}
    base["PYTHONWARNINGS"] = "ignore"
    command = [sys.executable, str(WORKER), str(dataset), str(out_dir)]
    ranks = []
    for rank in range(WORLD_SIZE):
        with (out_dir / f"rank{rank}.err").open("wb") as errors:  # a file: no pipe left unread
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            ranks.append(
                subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=errors)
            )
    return ranks


@pytest.mark.slow
def test_two_gloo_ranks_end_with_identical_weights(tmp_path: Path):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    ranks = _start_ranks(dataset, tmp_path)
    try:
        codes = [rank.wait(timeout=180) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    for rank, code in enumerate(codes):
        assert code == 0, (tmp_path / f"rank{rank}.err").read_text()[-3000:]
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
