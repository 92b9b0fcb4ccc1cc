"""A stopped baseline run continues from `progress.pt` to the weights of a run never stopped."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from training.baselines import ALGORITHMS
from training.baselines.config import BaselineConfig
from training.baselines.registry import LEARNERS, train_and_export, train_baseline
from training.baselines.resume import PROGRESS_FILE, ProgressMismatch, learner_state
from training.data.dataset import OfflineDataset
from training.interrupt import TrainingInterrupted
from training.ledger import read_ledger


@pytest.fixture
def stop_at_update(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, int], None]:
    """`stop_at_update(algo, n)`: SIGTERM this process during the algorithm's n-th update."""

    def arm(algo: str, n: int) -> None:
        learner_class = LEARNERS[algo]
        original = learner_class.update  # type: ignore[attr-defined]
        calls = iter(range(1, n + 1))

        def update(self: object, batch: object) -> object:
            stats = original(self, batch)
            if next(calls, None) == n:
                os.kill(os.getpid(), signal.SIGTERM)
            return stats

        monkeypatch.setattr(learner_class, "update", update)

    return arm


def _same_state(first: torch.nn.Module, second: torch.nn.Module) -> None:
    one, two = learner_state(first), learner_state(second)
    assert one["modules"].keys() == two["modules"].keys()
    for key, tensor in one["modules"].items():
        assert torch.equal(tensor, two["modules"][key]), key
    assert repr(one["attributes"]) == repr(two["attributes"])  # optimisers, alpha, PID state


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_stopped_run_resumes_to_the_weights_of_an_unstopped_one(
    algo: str,
    tiny_dataset: OfflineDataset,
    tiny_config: Callable[..., BaselineConfig],
    stop_at_update: Callable[[str, int], None],
    tmp_path: Path,
) -> None:
    config = tiny_config(algo, steps=14, log_every=4, checkpoint_every=0)
    straight = train_baseline(config, tiny_dataset)
    progress_file = tmp_path / algo / PROGRESS_FILE
    stop_at_update(algo, 9)  # mid-window: the partial statistics must survive too
    with pytest.raises(TrainingInterrupted) as stopped:
        train_baseline(config, tiny_dataset, progress_file)
    assert stopped.value.step == 9 and progress_file.is_file()
    resumed = train_baseline(config, tiny_dataset, progress_file)
    assert resumed.resumed_from == 9
    _same_state(straight.learner, resumed.learner)  # type: ignore[arg-type]
    assert resumed.history == straight.history


def test_progress_is_written_every_checkpoint_interval_and_removed_once_exported(
    tiny_dataset: OfflineDataset,
    tiny_config: Callable[..., BaselineConfig],
    stop_at_update: Callable[[str, int], None],
    private_ledger: Path,
) -> None:
    config = tiny_config("cpq", steps=12, checkpoint_every=5)
    progress_file = config.output_dir(tiny_dataset.task) / PROGRESS_FILE
    stop_at_update("cpq", 7)
    with pytest.raises(TrainingInterrupted):
        train_and_export(config, tiny_dataset)
    out_dir = train_and_export(config, tiny_dataset)
    assert (out_dir / "model.onnx").is_file() and not progress_file.exists()
    assert not progress_file.with_suffix(".json").exists()
    outcomes = [(entry.outcome, entry.steps) for entry in read_ledger(private_ledger)]
    assert outcomes == [("interrupted (resumable)", 7), ("done (resumed at step 7)", 12)]


def test_progress_from_other_settings_is_refused_not_mixed(
    tiny_dataset: OfflineDataset,
    tiny_config: Callable[..., BaselineConfig],
    stop_at_update: Callable[[str, int], None],
    tmp_path: Path,
) -> None:
    config = tiny_config("bc-safe", steps=10)
    progress_file = tmp_path / PROGRESS_FILE
    stop_at_update("bc-safe", 6)
    with pytest.raises(TrainingInterrupted):
        train_baseline(config, tiny_dataset, progress_file)
    with pytest.raises(ProgressMismatch, match=r"seed 0 -> 1"):
        train_baseline(tiny_config("bc-safe", steps=10, seed=1), tiny_dataset, progress_file)
    with pytest.raises(ProgressMismatch, match=r"past --steps 4"):
        train_baseline(tiny_config("bc-safe", steps=4), tiny_dataset, progress_file)
    # More steps, more threads: the same run, continued.
    longer = tiny_config("bc-safe", steps=12, threads=1)
    assert train_baseline(longer, tiny_dataset, progress_file).resumed_from == 6


def test_state_a_learner_cannot_save_is_an_error_not_a_silent_loss() -> None:
    learner = torch.nn.Linear(2, 2)
    learner.seen = {1, 2}  # type: ignore[assignment]  # a set: no value, tensor, dict or fields
    with pytest.raises(TypeError, match="set"):
        learner_state(learner)
