"""Time of one `PolicyClient.step` against a local `cdt serve`, this checkout's clients against
another checkout's, interleaved in one run on one server:

    git worktree add /tmp/before <commit> && python bench/client_step.py --other /tmp/before

Each round runs one episode of `--steps` numbered steps of `--model` (an all-zero observation)
with each checkout's `clients/`, in a subprocess of its own, and prints the mean milliseconds per
step; the last line gives the mean over the rounds of each. Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
from bench.local_server import ROOT, running_server
from training.ledger import cpu_name

EPISODE = """
import json, sys, time
from clients.client import PolicyClient
url, model, steps, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with PolicyClient(url) as client:
    client.list_models()
    answer = client.create_episode(model, 400.0, 10.0, [0.0] * dim)
    started = time.perf_counter()
    for step in range(1, steps + 1):
        client.step(answer.episode_id, [0.0] * dim, 1.0, 0.0, step=step)
    print(json.dumps((time.perf_counter() - started) / steps * 1000))
    client.close_episode(answer.episode_id)
"""


def step_ms(checkout: Path, url: str, model: str, steps: int, dim: int) -> float:
    """Mean milliseconds per step of one episode driven by `checkout`'s clients."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "-c", EPISODE, url, model, str(steps), str(dim)]
    done = subprocess.run(command, env=env, cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr.strip().splitlines()[-1]}")
    return float(json.loads(done.stdout))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="another checkout of the repo")
    parser.add_argument("--model", default="cdt-carrun-cpu")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=149, help="steps per episode (< its end)")
    args = parser.parse_args(argv)
    card = json.loads((ROOT / "models" / args.model / "model.json").read_text())
    checkouts = {"this": ROOT, "other": args.other.resolve()}
    times: dict[str, list[float]] = {name: [] for name in checkouts}
    with running_server(ROOT / "models") as url:
        for round_ in range(args.rounds):
            for name, checkout in checkouts.items():
                ms = step_ms(checkout, url, args.model, args.steps, card["observation_dim"])
                times[name].append(ms)
                print(f"round {round_}: {name} {ms:.3f} ms per step", flush=True)
    means = {name: sum(values) / len(values) for name, values in times.items()}
    ratio = means["this"] / means["other"]
    print(f"{cpu_name()}: this {means['this']:.3f} ms, other ({args.other}) "
          f"{means['other']:.3f} ms per step, ratio {ratio:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
