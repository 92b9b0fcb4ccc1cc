"""`ReportConfig`: the grid `cdt report` runs and where its tables go."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from training.baselines.config import BaselineConfig


@dataclass(frozen=True)
class ReportConfig:
    """The grid to run and where the tables go."""

    algorithms: tuple[str, ...] = (
        "bc-all",
        "bc-safe",
        "bc-frontier",
        "bcq-lag",
        "bear-lag",
        "cpq",
        "coptidice",
    )
    """algorithms to train (names as in `cdt train --algo`, the sequence models included)."""
    datasets: tuple[str, ...] = (
        "datasets/SafetyCarRun-v0.hdf5",
        "datasets/SafetyBallRun-v0.hdf5",
    )
    """dataset files, each PATH or LABEL=PATH (the label names the table column)."""
    seeds: int = 3
    """training seeds per algorithm and task."""
    cost_limit: float = 10.0
    """cost threshold kappa for training, evaluation and the safety mark."""
    episodes: int = 20
    """evaluation episodes per evaluation seed."""
    eval_seeds: int = 3
    """evaluation seeds per trained model."""
    include_existing: tuple[str, ...] = ()
    """exported model dirs (DIR or LABEL=DIR) to add, e.g. CDT's."""
    include_runs: tuple[str, ...] = ()
    """runs an earlier report scored, from its JSON (FILE, or ALGO[,ALGO...]=FILE for only those
    rows, ALGO>ROW to show them in row ROW, @TASK[,TASK...] before the `=` for only those
    columns): rows measured in earlier sessions join the table without training again."""
    models_dir: Path = Path("runs/report-models")
    """where the grid's models are exported and every evaluation is kept."""
    out: Path = Path("reports")
    """where the tables are written."""
    stem: str = "table1"
    """file name of the tables: <out>/<stem>.md and <out>/<stem>.json."""
    reuse: bool = False
    """skip training where the model dir already holds a model card."""
    force: bool = False
    """replace <out>/<stem>.md and .json when they exist already (the shipped tables, say)."""
    title: str = "Table 1: normalised reward and cost"
    """heading of the Markdown table."""
    train: BaselineConfig = field(default_factory=BaselineConfig)
    """per-run training settings (algo, dataset, seed, out and cost limit are set by the grid)."""
    average: bool = True
    """add the Average column (`--no-average` where the columns are not tasks, e.g. one task's
    full and reduced datasets)."""
    sampled_beside: tuple[str, ...] = ("cdt",)
    """algorithms also evaluated with sampled actions, in an extra `<algo>-sampled` row (the
    table's convention is the mean action for every row)."""
    sequence_args: str = ""
    """extra `cdt train` flags for cdt, dt-cost and dt, in one string, given with `=`:
    `--sequence-args="--update-steps 2000"`."""
