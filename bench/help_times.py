"""Wall time of `cdt <command> --help` for every command, with the CPU it ran on.

Every `--help` must answer in under a second after the README's main install (issue 31): the
commands import torch, onnx, h5py, matplotlib and the simulator only after parsing, and
tests/test_cli.py fails when parsing loads one. Run it with the interpreter of the install to
measure; each command runs in a fresh process, and the best of `--repeat` runs is shown:

    .venv/bin/python bench/help_times.py
    /tmp/mainvenv/bin/python bench/help_times.py --repeat 5   # the README's main install
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import NamedTuple

from cdt_cli import SUBCOMMANDS
from runtime.arguments import positive_int
from training.ledger import cpu_name

LIMIT_SECONDS = 1.0


class HelpTime(NamedTuple):
    """One command's `--help`: its best wall time and what it answered."""

    command: str
    seconds: float
    answer: str
    """"help", or the one line the command gave instead (an extra to install)."""


def time_help(command: str, repeat: int) -> HelpTime:
    """Best wall time of `python -m cdt_cli <command> --help`, each run in a fresh process."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "cdt_cli", command, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        best = min(best, time.perf_counter() - started)
    lines = result.stderr.strip().splitlines()
    answer = "help" if result.returncode == 0 else (lines or ["no output"])[-1]
    return HelpTime(command, best, answer)


def format_table(times: list[HelpTime], cpu: str) -> str:
    """A Markdown table of the times, then the slowest against the limit."""
    lines = [f"`cdt <command> --help`, best wall time on {cpu}", ""]
    lines += ["| command | seconds | answer |", "|---|---|---|"]
    lines += [f"| {entry.command} | {entry.seconds:.2f} | {entry.answer} |" for entry in times]
    slowest = max(times, key=lambda entry: entry.seconds)
    verdict = "within" if slowest.seconds < LIMIT_SECONDS else "OVER"
    lines += ["", f"slowest: {slowest.command}, {slowest.seconds:.2f} s ({verdict} the 1 s limit)"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per command")
    args = parser.parse_args()
    times = [time_help(command, args.repeat) for command in SUBCOMMANDS]
    print(format_table(times, cpu_name()))


if __name__ == "__main__":
    main()
