"""Collector speed: env steps/s of `cdt collect`'s rollout loop against the bare simulator.

    python bench/collect_throughput.py --task SafetyCarRun-v0 --steps 4000

Prints figures measured in the same run: the bare simulator (random actions, one env; alone, then
two copies in two processes at once), then for the envs in this process and split over
`--env-workers` processes, the collector's rollout loop alone (policy forward passes included)
and a full collector epoch (rollout + GAE + PPO update).
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import numpy as np
import torch

from runtime.sim import make_env
from training.collect.env_workers import open_envs
from training.collect.ppo_lagrangian import ActorCritic, PpoSettings, RunningNormaliser, ppo_update
from training.collect.rollout_collector import EpisodeRecorder, collect_epoch


def bare_simulator(task: str, steps: int) -> float:
    """Env steps/s of one env driven by random actions."""
    env = make_env(task)
    env.reset(seed=0)
    started = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - started)


def collector(task: str, steps: int, num_envs: int, workers: int) -> tuple[float, float]:
    """Env steps/s of the rollout loop alone, and of a whole epoch with the PPO update."""
    envs = open_envs(task, num_envs, workers)
    try:
        observation_dim = int(np.prod(envs.observation_space.shape or (1,)))
        action_dim = int(np.prod(envs.action_space.shape or (1,)))
        torch.manual_seed(0)
        model = ActorCritic(observation_dim, action_dim)
        normaliser = RunningNormaliser(observation_dim)
        recorder = EpisodeRecorder(envs, seed=0)
        started = time.perf_counter()
        rollout = collect_epoch(recorder, model, normaliser, steps, 0.99, 0.95)
        rollout_time = time.perf_counter() - started
        optimiser = torch.optim.Adam(model.parameters(), lr=3e-4)
        ppo_update(model, optimiser, rollout.batch, 0.5, PpoSettings(), torch.Generator())
        return steps / rollout_time, steps / (time.perf_counter() - started)
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="SafetyCarRun-v0")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--env-workers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    np.random.seed(0)
    bare = bare_simulator(args.task, args.steps)
    with multiprocessing.get_context("spawn").Pool(2) as pool:  # what each core does beside a twin
        twins = pool.starmap(bare_simulator, [(args.task, args.steps)] * 2)
    print(f"task {args.task}, {args.steps} steps, {args.num_envs} envs in the collector")
    print(f"bare simulator                 {bare:8.0f} steps/s")
    print(f"bare simulator, 2 side by side {min(twins):8.0f} / {max(twins):.0f} steps/s each")
    collector(args.task, 400, args.num_envs, 1)  # the first PPO update pays torch's set-up
    for workers in (1, args.env_workers):
        rollout, epoch = collector(args.task, args.steps, args.num_envs, workers)
        where = "this process" if workers == 1 else f"{workers} workers"
        print(f"rollout, {where:<14}        {rollout:8.0f} steps/s  ({rollout / bare:.0%} of bare)")
        print(f"epoch+PPO, {where:<14}      {epoch:8.0f} steps/s  ({epoch / bare:.0%} of bare)")


if __name__ == "__main__":
    main()
