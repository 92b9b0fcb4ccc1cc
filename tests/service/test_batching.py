"""Micro-batching gives every episode exactly its own row of a batched forward pass."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from runtime.context import EpisodeContext
from runtime.policy import Policy
from service.batching import MicroBatcher, TurnBatcher
from service.config import Settings
from service.main import create_app
from tests.service.toy_policy import write_test_policy


def test_micro_batcher_returns_each_window_its_own_outputs(tmp_path: Path) -> None:
    policy = Policy.load(write_test_policy(tmp_path / "toy"))
    sizes: list[int] = []
    batcher = MicroBatcher(policy.predict, max_size=8, max_wait_s=0.01, on_batch=sizes.append)
    contexts = [
        EpisodeContext.start([0.1 * i, 0.0, 1.0], 0.0, float(i), context_len=4, action_dim=2)
        for i in range(16)
    ]
    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(lambda c: batcher.predict_one(c.window()), contexts))
    batcher.close()
    for context, (mean, _) in zip(contexts, outputs, strict=True):
        expected, _ = policy.predict({k: v[None] for k, v in context.window().items()})
        np.testing.assert_allclose(mean, expected[0], rtol=1e-6)
    assert sum(sizes) == 16 and max(sizes) > 1


def test_micro_batcher_does_not_hold_a_lone_episode_for_company(tmp_path: Path) -> None:
    policy = Policy.load(write_test_policy(tmp_path / "toy"))
    sizes: list[int] = []
    batcher = MicroBatcher(policy.predict, max_size=8, max_wait_s=5.0, on_batch=sizes.append)
    context = EpisodeContext.start([0.1, 0.0, 1.0], 0.0, 1.0, context_len=4, action_dim=2)
    started = time.monotonic()
    for _ in range(3):  # one episode stepping alone: no batch ever had company
        batcher.predict_one(context.window())
    batcher.close()
    assert sizes == [1, 1, 1]
    assert time.monotonic() - started < 2.5  # a 5 s wait per call would take 15 s


def test_micro_batcher_hands_errors_to_every_waiting_request() -> None:
    def fail(_: dict[str, Any]) -> Any:
        raise RuntimeError("model exploded")

    batcher = MicroBatcher(fail, max_size=4, max_wait_s=0.0)
    window = {name: np.zeros(1) for name in ("states", "actions", "returns_to_go")}
    window |= {name: np.zeros(1) for name in ("costs_to_go", "time_steps", "padding_mask")}
    with pytest.raises(RuntimeError, match="exploded"):
        batcher.predict_one(window)
    batcher.close()


@pytest.mark.parametrize("mode", ["loop-batch", "thread-batch"])
def test_batched_inference_serves_the_same_actions_as_unbatched(
    settings: Settings, mode: str
) -> None:
    body = {"model": "toy", "target_reward": 5.0, "target_cost": 10.0, "observation": [1, 2, 3]}
    actions = []
    for inference in ("thread", mode):
        with TestClient(create_app(settings.model_copy(update={"inference": inference}))) as client:
            started = client.post("/v1/episodes", json=body | {"seed": 8}).json()
            path = f"/v1/episodes/{started['episode_id']}/step"
            stepped = client.post(path, json={"observation": [3, 2, 1], "reward": 1, "cost": 1})
            actions.append([started["action"], stepped.json()["action"]])
    np.testing.assert_allclose(actions[0], actions[1], rtol=1e-6)


def test_turn_batcher_runs_one_turn_in_batches_of_at_most_max_size() -> None:
    batches: list[list[int]] = []

    def doubled(jobs: list[int]) -> list[int | Exception]:
        batches.append(jobs)
        return [2 * job for job in jobs]

    batcher: TurnBatcher[int, int] = TurnBatcher(doubled, max_size=4, inline=True)

    async def together() -> list[int]:
        return await asyncio.gather(*(batcher.submit(job) for job in range(10)))

    assert asyncio.run(together()) == [2 * job for job in range(10)]
    batcher.close()
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_turn_batcher_gathers_the_next_batch_while_one_runs_in_its_thread() -> None:
    threads: list[str] = []
    release = threading.Event()

    def run(jobs: list[int]) -> list[int | Exception]:
        threads.append(threading.current_thread().name)
        release.wait(5)
        return list(jobs)

    batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=32, inline=True)

    async def overlapping() -> list[int]:
        first = asyncio.gather(*(batcher.submit(job) for job in (0, 1)))  # company: a thread
        await asyncio.sleep(0.05)  # the loop is free while the first batch runs
        later = asyncio.gather(*(batcher.submit(job) for job in (2, 3, 4)))
        await asyncio.sleep(0.05)
        release.set()
        return [*await first, *await later]

    assert asyncio.run(overlapping()) == [0, 1, 2, 3, 4]
    batcher.close()
    assert len(threads) == 2 and all(name.startswith("cdt-turn-batch") for name in threads)


def test_turn_batcher_runs_a_lone_job_inline_only_when_allowed() -> None:
    for inline, expected in ((True, "MainThread"), (False, "cdt-turn-batch")):
        where: list[str] = []

        def run(jobs: list[int], where: list[str] = where) -> list[int | Exception]:
            where.append(threading.current_thread().name)
            return list(jobs)

        batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=inline)
        assert asyncio.run(batcher.submit(7)) == 7
        batcher.close()
        assert where[0].startswith(expected)


def test_turn_batcher_hands_each_job_its_outcome_and_a_crash_to_every_job() -> None:
    def per_job(jobs: list[int]) -> list[int | Exception]:
        return [RuntimeError(f"job {job} refused") if job % 2 else job for job in jobs]

    def crash(jobs: list[int]) -> list[int | Exception]:
        raise RuntimeError("batch exploded")

    async def three(batcher: TurnBatcher[int, int]) -> list[Any]:
        calls = (batcher.submit(job) for job in range(3))
        return await asyncio.gather(*calls, return_exceptions=True)

    for run, expected in (
        (per_job, ["0", "job 1 refused", "2"]),
        (crash, ["batch exploded"] * 3),
    ):
        batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=False)
        assert [str(outcome) for outcome in asyncio.run(three(batcher))] == expected
        batcher.close()


def test_turn_batcher_skips_a_job_cancelled_before_its_batch_starts() -> None:
    ran: list[int] = []

    def run(jobs: list[int]) -> list[int | Exception]:
        ran.extend(jobs)
        return list(jobs)

    batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=False)

    async def one_cancelled() -> list[int]:
        gone = asyncio.ensure_future(batcher.submit(1))
        kept = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0)  # both queued, the flush not yet run
        gone.cancel()
        return [await kept]

    assert asyncio.run(one_cancelled()) == [2]
    batcher.close()
    assert ran == [2]
