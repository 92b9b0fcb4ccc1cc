"""What `cdt train` checks before any training work beyond each flag's own range: the settings
against the dataset (context length, the memory of one step) and against this machine (threads).

Each check names the flag and what is allowed, so the command stops in one line (exit code 2)
before a run folder or a ledger line exists (`training/train_cli.py`). `prepare_training` runs the
dataset checks too, for the callers that build a `TrainConfig` themselves (pipeline, report grid).
No torch at import: `cdt train --help` stays fast.
"""

from __future__ import annotations

import os
import re

from runtime.arguments import Requirement
from runtime.user_errors import UserError
from training.data.dataset import OfflineDataset
from training.learn.config import TrainConfig

MAX_SEED = 2**63 - 1
"""The largest seed: torch's generators take 64 bits and the loop adds 1 + rank to the seed."""

SEED_RANGE = Requirement(lambda value: 0 <= value <= MAX_SEED, "must lie in [0, 2**63 - 1]")

THREADS_PER_CORE = 4
"""Why 4 per core: torch's intra-op threads beyond the cores only wait for one (on 2 busy cores
even 2 threads ran 2-3x slower than 1, see `TrainConfig.num_threads`), so 4x leaves room to try
oversubscription while refusing the counts whose thread stacks exhaust the process' limits
(`--num-threads 100000` crashed libgomp with a segfault). A 256-core host still allows 1,024."""


def thread_cap() -> int:
    """The most torch threads a run may ask for on this machine."""
    return THREADS_PER_CORE * (os.cpu_count() or 1)


def longest_episode(dataset: OfflineDataset) -> int:
    """Steps of the dataset's longest episode."""
    return max(episode.length for episode in dataset.episodes)


def context_problems(config: TrainConfig, dataset: OfflineDataset) -> list[str]:
    """A context longer than the longest episode: every window ends at one step of one episode
    and is left-padded to seq_len, so the extra positions are padding only, yet the buffer, the
    batches and attention all grow with them (--seq-len 1000 on 100-step episodes took ~24 GB)."""
    longest = longest_episode(dataset)
    if config.seq_len <= longest:
        return []
    return [
        f"--seq-len must be at most {longest} (the longest episode of {config.dataset}, in "
        f"steps: a longer window is padding only), got {config.seq_len}"
    ]


def step_memory_floor(config: TrainConfig, dataset: OfflineDataset) -> int:
    """Bytes one training step needs at least: the batch's windows (float inputs and per-step
    cost, int64 row index and time step, padding flag) and every block's input over at least 3
    tokens per step (return, cost, state), which the backward pass keeps. A floor, so a batch it
    refuses cannot fit: attention, the MLP, gradients and the optimiser come on top."""
    inputs = 4 * (dataset.observation_dim + dataset.action_dim + 3) + 8 + 8 + 1
    activations = 4 * 3 * config.embedding_dim * config.num_layers
    return config.batch_size * config.seq_len * (inputs + activations)


def device_memory(device: str) -> int | None:
    """Bytes of memory on `device`: the GPU's, or this machine's RAM (None where unknown)."""
    if device.startswith("cuda"):
        import torch  # only for a GPU run, after `check_device` imported it

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return None


def _gigabytes(size: int) -> str:
    return f"{size / 1e9:,.1f} GB"


def batch_problems(config: TrainConfig, dataset: OfflineDataset) -> list[str]:
    """A batch whose step cannot fit in the device's memory (it would fail at the first step,
    after the run folder exists, or be killed by the kernel)."""
    need, memory = step_memory_floor(config, dataset), device_memory(config.device)
    if memory is None or need <= memory:
        return []
    holder = f"{config.device}'s" if config.device.startswith("cuda") else "this machine's"
    return [
        f"--batch-size {config.batch_size}: one training step needs at least {_gigabytes(need)} "
        f"(at --seq-len {config.seq_len}), more than {holder} {_gigabytes(memory)} of memory; "
        "use a smaller --batch-size"
    ]


def out_of_memory(error: BaseException, config: TrainConfig) -> UserError | None:
    """The one-line refusal for a step that ran out of memory (torch's allocation error: a
    batch above the `batch_problems` floor that does not fit after all), None for other errors."""
    text = str(error)
    if not isinstance(error, RuntimeError) or not (
        "can't allocate memory" in text or "out of memory" in text.lower()
    ):
        return None
    tried = re.search(r"tried to allocate (\d+) bytes", text)
    failed = f" (an allocation of {_gigabytes(int(tried[1]))} failed)" if tried else ""
    return UserError(
        f"--batch-size {config.batch_size}: a training step ran out of {config.device} "
        f"memory{failed}; use a smaller --batch-size"
    )


def check_training_data(config: TrainConfig, dataset: OfflineDataset) -> None:
    """Raise `UserError` naming every setting this dataset cannot train with on this machine."""
    if problems := context_problems(config, dataset) + batch_problems(config, dataset):
        raise UserError("; ".join(problems))
