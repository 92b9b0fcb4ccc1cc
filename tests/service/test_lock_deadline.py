"""One wait per request: the loop's lock and another replica's Redis lock share one deadline, so a
busy episode answers 409 after `episode_lock_wait_s` in all, and a request's own deadline ends
that wait sooner with 412 `deadline_passed` (REST and websocket), changing nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from service.config import Settings
from service.errors import EpisodeBusyError
from service.locks import LockWait, waiting_within
from service.main import create_app
from service.stores.redis import RedisSessionStore
from tests.service.stores.test_stores import OWNER, make_record
from tests.service.test_episodes import START, STEP, serving
from tests.service.toy_policy import REDIS_URL

pytestmark = pytest.mark.redis
LOCK_WAIT_S = 0.3
MARGIN_S = 0.15
"""What a request may take past its wait: the last try and the answer."""


@pytest.fixture
def busy_settings(redis_settings: Settings) -> Settings:
    """Redis settings with a short lock wait."""
    return redis_settings.model_copy(update={"episode_lock_wait_s": LOCK_WAIT_S})


@pytest.fixture
def connection() -> Iterator[redis.Redis]:
    with redis.Redis.from_url(REDIS_URL) as made:
        yield made


def hold_lock(connection: redis.Redis, settings: Settings, episode_id: str) -> None:
    """Another replica takes the episode's lock (as `ACQUIRE` does) and keeps it."""
    connection.set(f"{settings.redis_prefix}:lock:{episode_id}", "other-replica", px=5_000)


async def timed(call: Awaitable[httpx.Response]) -> tuple[httpx.Response, float]:
    """The answer of `call` and the seconds it took."""
    started = time.monotonic()
    reply = await call
    return reply, time.monotonic() - started


def answered(replies: list[tuple[httpx.Response, float]]) -> list[tuple[int, str]]:
    return [(reply.status_code, reply.json()["code"]) for reply, _ in replies]


@pytest.mark.parametrize("method", ["DELETE", "POST"])
def test_concurrent_requests_on_a_held_episode_wait_the_lock_wait_once(
    busy_settings: Settings, connection: redis.Redis, method: str
) -> None:
    async def scenario() -> list[tuple[httpx.Response, float]]:
        async with serving([create_app(busy_settings)]) as (client,):
            started = await client.post("/v1/episodes", json=START)
            episode_id = started.json()["episode_id"]
            path = f"/v1/episodes/{episode_id}" + ("/step" if method == "POST" else "")
            body = STEP if method == "POST" else None
            hold_lock(connection, busy_settings, episode_id)
            # the first waits on Redis; the others wait on the loop's lock, then on Redis
            calls = (client.request(method, path, json=body) for _ in range(4))
            return await asyncio.gather(*(timed(call) for call in calls))

    replies = asyncio.run(scenario())
    assert answered(replies) == [(409, "episode_busy")] * 4
    waits = [elapsed for _, elapsed in replies]
    assert min(waits) >= LOCK_WAIT_S - 0.02, waits  # they did wait
    assert max(waits) < LOCK_WAIT_S + MARGIN_S, waits  # once: not in line, then on Redis


def test_step_with_a_deadline_before_the_lock_wait_gets_412_at_its_deadline(
    redis_settings: Settings, connection: redis.Redis
) -> None:
    settings = redis_settings.model_copy(update={"episode_lock_wait_s": 1.0})

    async def scenario() -> tuple[list[tuple[httpx.Response, float]], dict[str, Any]]:
        async with serving([create_app(settings)]) as (client,):
            started = await client.post("/v1/episodes", json=START)
            episode_id = started.json()["episode_id"]
            path = f"/v1/episodes/{episode_id}"
            hold_lock(connection, settings, episode_id)
            deadline = {"X-Request-Deadline": str(time.time() + 0.3)}
            # waits on Redis: its deadline ends it
            alone = await timed(client.post(f"{path}/step", json=STEP, headers=deadline))
            change = asyncio.create_task(
                timed(client.patch(f"{path}/budget", json={"cost_limit": 20.0}))
            )
            await asyncio.sleep(0.05)  # the budget change waits on Redis, the step in line
            deadline = {"X-Request-Deadline": str(time.time() + 0.3)}
            in_line = await timed(client.post(f"{path}/step", json=STEP, headers=deadline))
            connection.delete(f"{settings.redis_prefix}:lock:{episode_id}")  # the other lets go
            changed = await change
            state = (await client.get(path)).json()
        return [alone, changed, in_line], state

    (alone, changed, in_line), state = asyncio.run(scenario())
    assert answered([alone, in_line]) == [(412, "deadline_passed")] * 2
    assert changed[0].status_code == 200  # applied once the other replica let go
    for _, elapsed in (alone, in_line):
        assert 0.3 - 0.05 <= elapsed < 0.3 + MARGIN_S
    assert (state["step"], state["target_cost"], state["revision"]) == (0, 20.0, 1)


def test_stream_step_with_a_deadline_on_a_held_episode_gets_412_at_its_deadline(
    redis_settings: Settings, connection: redis.Redis
) -> None:
    settings = redis_settings.model_copy(update={"episode_lock_wait_s": 1.0})
    with TestClient(create_app(settings)) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "start", **START})
        episode_id = ws.receive_json()["episode_id"]
        hold_lock(connection, settings, episode_id)
        step = {"type": "step", "episode_id": episode_id, **STEP}
        sent = time.monotonic()
        ws.send_json(step | {"deadline": time.time() + 0.3})
        refused = ws.receive_json()
        elapsed = time.monotonic() - sent
    assert (refused["status"], refused["code"]) == (412, "deadline_passed")
    assert 0.3 - 0.05 <= elapsed < 0.3 + MARGIN_S


def test_redis_store_delete_ends_with_the_calling_requests_wait(
    redis_prefix: str, connection: redis.Redis
) -> None:
    store = RedisSessionStore(REDIS_URL, ttl_s=60.0, max_episodes=2, prefix=redis_prefix)
    store.create(make_record("a"))
    connection.set(f"{redis_prefix}:lock:a", "other-replica", px=5_000)
    wait = LockWait.start("a", 0.2)  # the store's own lock wait is 2 s
    started = time.monotonic()
    with pytest.raises(EpisodeBusyError):
        waiting_within(wait, lambda: store.delete("a", OWNER))
    assert time.monotonic() - started < 0.2 + MARGIN_S
    store.close()
