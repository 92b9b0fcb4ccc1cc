"""The training loop's own checks of its inputs (training/learn/checks.py): what `cdt train`
refuses up front, the loop refuses too for the callers that build a config themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import training.learn.train as train_module
from runtime.user_errors import UserError
from tests.training.cdt_synthetic import STATE_DIM, tiny_config, write_dataset
from training.data.dataset import load_dataset
from training.learn import checks, recorded
from training.learn.train import prepare_training, train


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "tiny.hdf5")


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Give back torch's thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_context_may_be_as_long_as_the_longest_episode_and_no_longer(
    dataset_path: Path,
) -> None:
    dataset = load_dataset(dataset_path)
    longest = checks.longest_episode(dataset)
    assert longest == max(episode.length for episode in dataset.episodes)
    fits = tiny_config(dataset_path, Path("runs"), seq_len=longest)
    assert checks.context_problems(fits, dataset) == []
    (problem,) = checks.context_problems(
        tiny_config(dataset_path, Path("r"), seq_len=1000), dataset
    )
    assert problem.startswith(f"--seq-len must be at most {longest} (") and "got 1000" in problem


def test_the_loop_refuses_a_context_longer_than_any_episode_before_writing(
    dataset_path: Path, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match="--seq-len must be at most"):
        train(tiny_config(dataset_path, tmp_path, seq_len=1000))
    assert list(tmp_path.iterdir()) == []  # refused before the run folder was made


def test_the_step_memory_floor_counts_windows_and_block_inputs(dataset_path: Path) -> None:
    dataset = load_dataset(dataset_path)
    config = tiny_config(dataset_path, Path("runs"), batch_size=3, seq_len=2)
    per_position = 4 * (STATE_DIM + 2 + 3) + 17 + 4 * 3 * config.embedding_dim * config.num_layers
    assert checks.step_memory_floor(config, dataset) == 3 * 2 * per_position


def test_a_batch_is_refused_only_where_its_step_cannot_fit(
    dataset_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = load_dataset(dataset_path)
    config = tiny_config(dataset_path, Path("runs"), batch_size=100_000_000)
    need = checks.step_memory_floor(config, dataset)
    monkeypatch.setattr(checks, "device_memory", lambda device: need)
    assert checks.batch_problems(config, dataset) == []
    monkeypatch.setattr(checks, "device_memory", lambda device: need - 1)
    (problem,) = checks.batch_problems(config, dataset)
    assert problem.startswith("--batch-size 100000000: one training step needs at least")
    monkeypatch.setattr(checks, "device_memory", lambda device: None)  # unknown: not refused
    assert checks.batch_problems(config, dataset) == []


def test_this_machines_memory_is_known() -> None:
    memory = checks.device_memory("cpu")
    assert memory is None or memory > 2**26


def test_the_thread_cap_is_four_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert checks.thread_cap() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one core
    assert checks.thread_cap() == 4


def test_the_loop_caps_threads_a_resumed_run_brought_from_a_larger_machine(
    dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_threads: None
) -> None:
    monkeypatch.setattr(train_module, "thread_cap", lambda: 2)
    state = prepare_training(tiny_config(dataset_path, tmp_path, num_threads=3))
    assert torch.get_num_threads() == 2
    assert state.config.num_threads == 3  # the setting is kept; only this machine's use is capped
    if state.log is not None:
        state.log.close()


CPU_ALLOCATION_FAILURE = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 57600000 bytes. Error code 12 (Cannot allocate memory)"
)


def test_a_step_out_of_memory_is_one_line_naming_the_batch_and_other_errors_pass(
    dataset_path: Path,
) -> None:
    config = tiny_config(dataset_path, Path("runs"), batch_size=400_000)
    refusal = checks.out_of_memory(RuntimeError(CPU_ALLOCATION_FAILURE), config)
    assert refusal is not None and "\n" not in str(refusal)
    assert str(refusal) == (
        "--batch-size 400000: a training step ran out of cpu memory (an allocation of 0.1 GB "
        "failed); use a smaller --batch-size"
    )
    cuda = checks.out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), config)
    assert cuda is not None and str(cuda).startswith("--batch-size 400000: a training step ran")
    assert (
        checks.out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), config)
        is None
    )
    assert checks.out_of_memory(ValueError("out of memory"), config) is None


def test_training_out_of_memory_stops_in_one_line_and_is_in_the_ledger(
    dataset_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_ledger: Path
) -> None:
    def allocation_fails(*args: object, **kwargs: object) -> Path:
        raise RuntimeError(CPU_ALLOCATION_FAILURE)

    monkeypatch.setattr(recorded, "train", allocation_fails)
    with pytest.raises(UserError, match=r"^--batch-size 400000: a training step ran out of"):
        recorded.train_and_record(tiny_config(dataset_path, tmp_path, batch_size=400_000))
    assert "can't allocate memory" in private_ledger.read_text()  # the run's end, as it was
