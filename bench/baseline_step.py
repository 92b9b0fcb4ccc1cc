"""Seconds per gradient step of the baselines, as `cdt train --algo` runs them, optionally
against another checkout of this repository in the same run.

    python bench/baseline_step.py                                    # the four Q-learning ones
    python bench/baseline_step.py --algorithms bcq-lag --steps 5 --rounds 1   # smoke check
    git worktree add /tmp/before HEAD~1 && python bench/baseline_step.py --against /tmp/before

Each measurement is a fresh process (so settings one run makes for the whole process, such as
the heap's, stay with it) that trains through `training.baselines.trainer.train_with` with its
loop (`fit`) replaced by a timer: a few warm-up updates, then `--steps` timed updates on batches
from the real dataset. Rounds interleave the algorithms and the two checkouts; the best round per
(algorithm, checkout) is kept, since the machine may be shared. The figures are ratios within one
run: name the CPU with them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 3


def _child(algo: str, dataset: str, steps: int, batch_size: int, threads: int) -> None:
    """Runs in the measured checkout (on PYTHONPATH): prints seconds per update."""
    import torch

    from training.baselines import trainer
    from training.baselines.config import BaselineConfig
    from training.baselines.data import TransitionData
    from training.baselines.registry import train_baseline
    from training.data.dataset import load_dataset

    def timed_fit(
        learner: trainer.Learner, data: TransitionData, config: BaselineConfig
    ) -> list[dict[str, float]]:
        generator = torch.Generator().manual_seed(config.seed)
        for _ in range(WARM_UP):
            learner.update(data.sample(batch_size, generator))
        started = time.perf_counter()
        for _ in range(steps):
            learner.update(data.sample(batch_size, generator))
        print(f"{(time.perf_counter() - started) / steps:.6f}")
        return []

    trainer.fit = timed_fit  # the loop `train_with` calls, now a timer
    config = BaselineConfig(
        algo=algo,  # type: ignore[arg-type]
        dataset=Path(dataset),
        steps=steps,
        batch_size=batch_size,
        threads=threads,
    )
    train_baseline(config, load_dataset(config.dataset))


def _measure(root: Path, algo: str, args: argparse.Namespace) -> float:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", algo]
    command += ["--dataset", str(Path(args.dataset).resolve()), "--steps", str(args.steps)]
    command += ["--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    environment = {**os.environ, "PYTHONPATH": str(root), "CDT_LEDGER": "off"}
    done = subprocess.run(
        command, cwd=root, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{algo} in {root} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--algorithms", nargs="+", default=["bcq-lag", "bear-lag", "cpq", "coptidice"]
    )
    parser.add_argument("--dataset", default=str(ROOT / "datasets/SafetyCarRun-v0.hdf5"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--against", type=Path, help="another checkout, timed beside this one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.dataset, args.steps, args.batch_size, args.threads)
        return
    sides = {"this checkout": ROOT}
    if args.against is not None:
        sides["--against"] = args.against.resolve()
    best: dict[tuple[str, str], float] = {}
    for round_index in range(args.rounds):
        for algo in args.algorithms:
            for side, root in sides.items():
                seconds = _measure(root, algo, args)
                key = (algo, side)
                best[key] = min(best.get(key, seconds), seconds)
                print(
                    f"round {round_index + 1}: {algo:10s} {side:14s} {seconds * 1e3:7.1f} ms/step"
                )
    from training.ledger import cpu_name

    print(
        f"\nCPU: {cpu_name()}; batch {args.batch_size}, {args.threads} thread(s), best of "
        f"{args.rounds} rounds of {args.steps} steps after {WARM_UP} warm-up steps"
    )
    paired = args.against is not None
    columns = ["algorithm", *(f"{side}, ms/step" for side in sides)]
    columns += ["--against / this"] if paired else []
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for algo in args.algorithms:
        cells = [algo, *(f"{best[algo, side] * 1e3:.1f}" for side in sides)]
        if paired:
            cells.append(f"{best[algo, '--against'] / best[algo, 'this checkout']:.2f}x")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
