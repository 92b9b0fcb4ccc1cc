"""Wall time of the test suite, one process against the README's `-n 2`, in one run.

The suite must finish in under two minutes on the 2-core CPUs these machines have, the slowest
kind included. It is single-threaded almost everywhere (torch runs with one thread in the
tests), so pytest-xdist's two workers use the second core. Both runs go one after the other on
the same machine; their ratio is the figure to compare across CPUs:

    python bench/suite_time.py                 # both runs (about 4 minutes on a Zen 3)
    python bench/suite_time.py --only parallel
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from training.ledger import cpu_name

BASE_COMMAND = [sys.executable, "-m", "pytest", "-q", "-W", "error", "-p", "no:cacheprovider"]
RUNS = {"serial": ["-p", "no:xdist"], "parallel": ["-n", "2"]}


def time_suite(extra: list[str]) -> tuple[float, str]:
    """(wall seconds, pytest's last line) of one run of the whole suite."""
    started = time.perf_counter()
    done = subprocess.run([*BASE_COMMAND, *extra], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    lines = done.stdout.strip().splitlines()
    return seconds, lines[-1] if lines else f"exit {done.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RUNS), help="time one of the two runs")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}")
    times = {}
    for name, extra in RUNS.items():
        if args.only and name != args.only:
            continue
        seconds, summary = time_suite(extra)
        times[name] = seconds
        print(f"{name:8s} {seconds:6.1f} s  ({' '.join(extra)}): {summary}")
    if len(times) == 2:
        print(f"serial / parallel: {times['serial'] / times['parallel']:.2f}x")


if __name__ == "__main__":
    main()
