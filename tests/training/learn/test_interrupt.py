"""Ctrl-C during training: a consistent last.pt, then an exact resume (interrupt.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import training.learn.train as train_module
from tests.training.cdt_synthetic import tiny_config, write_dataset
from training.checkpoint import load_checkpoint
from training.interrupt import StopRequest, TrainingInterrupted
from training.learn.train import train
from training.train_cli import main


@pytest.fixture(autouse=True)
def python_sigint_handler() -> Iterator[None]:
    """Python's own Ctrl-C handler, as in a terminal: a process started in the background
    inherits SIGINT ignored, and these tests check that the handler before them comes back."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def interrupt_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """Send this process SIGINT in the middle of gradient step `step`."""
    original, calls = train_module.train_step, []

    def step_then_signal(*args: object) -> object:
        calls.append(None)
        if len(calls) == step:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(train_module, "train_step", step_then_signal)


def test_ctrl_c_saves_the_step_it_stopped_at_and_resume_continues_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    settings = {"dropout": 0.1, "update_steps": 6, "checkpoint_every": 1000}
    straight = train(tiny_config(dataset, tmp_path / "a", **settings))
    with monkeypatch.context() as patch:
        interrupt_at(patch, 3)
        with pytest.raises(TrainingInterrupted) as stopped:
            train(tiny_config(dataset, tmp_path / "b", **settings))
    assert stopped.value.step == 3
    assert load_checkpoint(stopped.value.checkpoint)["step"] == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler given back
    resumed = train(
        tiny_config(dataset, tmp_path / "c", update_steps=6, resume=stopped.value.checkpoint)
    )
    expected, actual = load_checkpoint(straight), load_checkpoint(resumed)
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


def test_the_cli_exits_130_after_an_interrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    interrupt_at(monkeypatch, 2)
    argv = ["--dataset", str(dataset), "--out-dir", str(tmp_path), "--run-name", "run",
            "--embedding-dim", "16", "--num-layers", "1", "--num-heads", "2", "--batch-size", "4",
            "--update-steps", "5", "--eval-every", "0", "--no-tensorboard"]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 130
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 2


def test_a_second_signal_reaches_the_previous_handler():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
