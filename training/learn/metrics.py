"""Scalar logging for training runs: one CSV file per stream plus (optionally) TensorBoard."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ScalarLog:
    """Appends rows of scalars to `<run_dir>/<stream>.csv` and to TensorBoard (`<run_dir>/tb`).

    Columns are fixed by the first row a stream receives; a resumed run keeps appending, after
    dropping rows beyond the step it resumes from so the file reads as one uninterrupted run.
    """

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: int | None = None) -> None:
        self.run_dir = run_dir
        self.resume_step = resume_step
        self.columns: dict[str, list[str]] = {}
        self.writer: Any = None
        if tensorboard:
            try:  # deferred on purpose: only --tensorboard runs need it
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is an optional part of the [train] extra
                logger.warning("tensorboard is not installed; writing CSV only")
            else:
                self.writer = SummaryWriter(log_dir=str(run_dir / "tb"))

    def write(self, stream: str, step: int, values: dict[str, float]) -> None:
        path = self.run_dir / f"{stream}.csv"
        if stream not in self.columns:
            self.columns[stream] = ["step", *values]
            self._prepare(path)
        with path.open("a", newline="") as file:
            writer = csv.writer(file)
            if file.tell() == 0:
                writer.writerow(self.columns[stream])
            writer.writerow([step, *(values.get(key, "") for key in self.columns[stream][1:])])
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"{stream}/{key}", value, step)

    def _prepare(self, path: Path) -> None:
        """Fresh run: start the file anew. Resumed run: keep rows up to the resume step."""
        if not path.exists():
            return
        if self.resume_step is None:
            path.unlink()
            return
        with path.open(newline="") as file:
            rows = list(csv.reader(file))
        if rows and rows[0] != self.columns[path.stem]:
            self.columns[path.stem] = rows[0]
        kept = [rows[0]] + [row for row in rows[1:] if int(row[0]) <= self.resume_step]
        with path.open("w", newline="") as file:
            csv.writer(file).writerows(kept if rows else [])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
