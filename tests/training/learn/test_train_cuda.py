"""Training on CUDA (training/learn/train.py): resume, bf16 autocast and export of a GPU checkpoint.

Skipped where torch sees no GPU (CI); run on a GPU machine with `pytest -m gpu`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from runtime.context import WINDOW_NAMES
from tests.test_export_parity import random_windows
from tests.training.cdt_synthetic import tiny_config, write_dataset
from training.checkpoint import load_checkpoint
from training.export import export_checkpoint, policy_from_checkpoint
from training.learn.train import prepare_training, train, train_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "tiny.hdf5")


def test_batches_are_gathered_on_the_gpu(dataset_path: Path, tmp_path: Path):
    state = prepare_training(tiny_config(dataset_path, tmp_path, device="cuda"))
    batch = state.sampler.sample()
    assert all(tensor.device.type == "cuda" for tensor in batch)
    assert state.sampler.buffer.lengths.device.type == "cpu"  # indices drawn on the host
    assert torch.isfinite(train_step(state, batch).loss)


def test_resume_on_cuda_continues_the_run(dataset_path: Path, tmp_path: Path):
    settings = {"device": "cuda", "dropout": 0.1, "checkpoint_every": 3}
    straight = train(tiny_config(dataset_path, tmp_path / "a", update_steps=6, **settings))
    first = train(tiny_config(dataset_path, tmp_path / "b", update_steps=3, **settings))
    resumed = train(tiny_config(dataset_path, tmp_path / "c", update_steps=6, resume=first))
    expected, actual = load_checkpoint(straight), load_checkpoint(resumed)
    assert actual["step"] == 6
    for name, tensor in expected["model"].items():
        # GPU reductions may add in another order: equal up to float rounding, not bit for bit
        torch.testing.assert_close(actual["model"][name], tensor, rtol=0, atol=1e-5, msg=name)


def test_bf16_autocast_follows_the_fp32_loss_curve(dataset_path: Path, tmp_path: Path):
    curves = []
    for bf16 in (False, True):
        config = tiny_config(dataset_path, tmp_path / str(bf16), device="cuda", bf16=bf16)
        state = prepare_training(config)
        curves.append(
            [float(train_step(state, state.sampler.sample()).loss.detach()) for _ in range(10)]
        )
    fp32, bf16_curve = np.array(curves[0]), np.array(curves[1])
    assert np.all(np.abs(bf16_curve - fp32) <= 0.02 * np.abs(fp32) + 0.02)


def test_a_gpu_checkpoint_exports_for_the_cpu_service(dataset_path: Path, tmp_path: Path):
    checkpoint = train(tiny_config(dataset_path, tmp_path, device="cuda", update_steps=3))
    out_dir = export_checkpoint(checkpoint, tmp_path / "models" / "gpu-cdt")
    policy = policy_from_checkpoint(load_checkpoint(checkpoint))
    session = ort.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = random_windows(4, 3, policy.model.config.seq_len, seed=0)
    with torch.no_grad():
        expected = policy(*(torch.from_numpy(inputs[name]) for name in WINDOW_NAMES))
    actual = session.run(None, inputs)
    for want, got in zip(expected, actual, strict=True):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=0)
