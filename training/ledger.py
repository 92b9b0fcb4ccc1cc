"""The ledger: one JSON line per training, selection, calibration or evaluation run, appended by
the commands themselves, so "every run attempted" is a file and not a memory.

Each line says what ran (command, task, algorithm, recipe, seed, steps), how long, on which CPU,
which seed split it used, and how it ended. `cdt report` renders `reports/ledger.md` from it.
The file is `reports/ledger.jsonl` unless `CDT_LEDGER` names another one (the tests' fixture
points it at a temporary file; `CDT_LEDGER=off` writes nothing).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from training.interrupt import TrainingInterrupted

DEFAULT_LEDGER = Path("reports") / "ledger.jsonl"


NATIVE_BF16_FLAGS = {"amx_bf16": "AMX", "avx512_bf16": "AVX-512 BF16"}
"""The flags of CPUs that multiply bf16 natively (Intel AMX tiles; AMD Zen 4 and later), by the
kind they name."""


def read_cpuinfo(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str | None, list[str] | None]:
    """The first CPU's model name and flags (None where unknown)."""
    name, flags = None, None
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name is None:
                name = value.strip()
            elif key.strip() == "flags" and flags is None:
                flags = value.split()
    except OSError:
        pass
    return name, flags


def cpu_kind(flags: Sequence[str]) -> str:
    """The instruction set that decides training speed here: bf16 runs ~10x slower without
    AMX or AVX-512 BF16, and "AMD EPYC" alone does not tell Zen 3 from Zen 4."""
    for flag, kind in NATIVE_BF16_FLAGS.items():
        if flag in flags:
            return kind
    if "avx512f" in flags:  # fp32 runs wider than on AVX2, bf16 still without native support
        return "AVX-512, no BF16"
    return "AVX2 only" if "avx2" in flags else "no AVX2"


def cpu_name() -> str:
    """The CPU's model name and kind (/proc/cpuinfo), for every figure's provenance, e.g.
    "AMD EPYC (AVX2 only)"."""
    name, flags = read_cpuinfo()
    name = name or platform.processor() or "unknown CPU"
    return f"{name} ({cpu_kind(flags)})" if flags is not None else name


@dataclass(frozen=True)
class LedgerEntry:
    """One run and its fate."""

    command: str
    """`train`, `select`, `calibrate`, `evaluate`, `pipeline`, ..."""
    subject: str
    """The run folder or model folder the command worked on."""
    outcome: str
    """How it ended: `done`, `stopped: <why>`, `admissible`, `not admissible: <why>`, ..."""
    task: str = ""
    algorithm: str = ""
    recipe: str = ""
    """The training preset (and any flag that changes the recipe), as given."""
    seed: int | None = None
    steps: int | None = None
    split: str = ""
    """The evaluation seed split used (`selection`, `validation`, `test`), if any."""
    wall_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    cpu: str = field(default_factory=cpu_name)
    time: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def device_details(device: str) -> dict[str, Any]:
    """The accelerator a run trained on, for its entry's details ({} on the CPU: `cpu` says it)."""
    if not device.startswith("cuda"):
        return {}
    import torch  # only a run that already trained on the GPU asks, so torch is loaded

    return {"device": device, "gpu": torch.cuda.get_device_name(torch.device(device))}


def record_training(
    subject: str,
    outcome: str,
    *,
    started: float,
    device: str,
    task: str,
    algorithm: str,
    seed: int,
    steps: int | None,
    recipe: str = "",
) -> None:
    """Enter one training run, timed from `started` (its `time.perf_counter()` at the start),
    with the accelerator it trained on where that was not the CPU."""
    record(
        LedgerEntry(
            "train",
            subject,
            outcome,
            task=task,
            algorithm=algorithm,
            recipe=recipe,
            seed=seed,
            steps=steps,
            wall_s=time.perf_counter() - started,
            details=device_details(device),
        )
    )


def training_ending(error: BaseException) -> tuple[str, int | None]:
    """How a training run that raised `error` ended, as its entry says (outcome, steps taken
    where known): stopped by Ctrl-C or SIGTERM and resumable, or failed."""
    if isinstance(error, TrainingInterrupted):
        return "interrupted (resumable)", error.step
    return f"failed: {type(error).__name__}: {error}", None


def ledger_path() -> Path | None:
    """Where entries go now (None: `CDT_LEDGER=off`)."""
    value = os.environ.get("CDT_LEDGER", "")
    if value == "off":
        return None
    return Path(value) if value else DEFAULT_LEDGER


def record(entry: LedgerEntry) -> None:
    """Append `entry` as one line (a single write, so concurrent runs do not interleave)."""
    path = ledger_path()
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(asdict(entry), sort_keys=True, default=str) + "\n"
    with path.open("a", encoding="utf-8") as file:
        file.write(line)


def read_ledger(path: Path) -> list[LedgerEntry]:
    """Every entry of a ledger file, oldest first (a missing file has none)."""
    if not path.is_file():
        return []
    return [LedgerEntry(**json.loads(line)) for line in path.read_text().splitlines() if line]


def format_ledger(entries: Sequence[LedgerEntry]) -> str:
    """A Markdown table of the ledger, oldest first."""
    columns = ["time", "command", "task", "algorithm", "recipe", "seed", "steps", "split"]
    columns += ["wall", "CPU", "subject", "outcome"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for entry in entries:
        wall = "" if entry.wall_s is None else f"{entry.wall_s / 60:.1f} min"
        cells = [
            entry.time, entry.command, entry.task, entry.algorithm, entry.recipe,
            "" if entry.seed is None else str(entry.seed),
            "" if entry.steps is None else str(entry.steps),
            entry.split, wall, entry.cpu, entry.subject, entry.outcome.replace("|", "/"),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
