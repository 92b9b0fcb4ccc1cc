"""Both session stores honour one contract: cap, TTL, 410 tombstones, compare-and-set."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from runtime.context import EpisodeContext
from service.errors import (
    EpisodeGoneError,
    EpisodeNotFoundError,
    StepConflictError,
    TooManyEpisodesError,
)
from service.sessions import EpisodeRecord, InMemorySessionStore, RedisSessionStore, SessionStore
from tests.service.conftest import REDIS_URL


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_record(episode_id: str, seed: int = 0) -> EpisodeRecord:
    context = EpisodeContext.start([0.0], 1.0, 1.0, context_len=2, action_dim=1, seed=seed)
    return EpisodeRecord(episode_id, "toy", "1", False, seed, context, 0.0, 0.0)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore(ttl_s=60.0, max_episodes=2)
        return
    prefix = request.getfixturevalue("redis_prefix")
    redis_store = RedisSessionStore(REDIS_URL, ttl_s=60.0, max_episodes=2, prefix=prefix)
    yield redis_store
    redis_store.close()


def test_store_create_then_get_round_trips_the_record(store: SessionStore) -> None:
    record = make_record("a", seed=5)
    record.context.rng.standard_normal(2)
    store.create(record)
    loaded = store.get("a")
    assert loaded.context.to_dict() == record.context.to_dict()
    assert (loaded.model, loaded.seed, loaded.revision) == ("toy", 5, 0)


def test_store_get_unknown_raises_not_found(store: SessionStore) -> None:
    with pytest.raises(EpisodeNotFoundError):
        store.get("missing")


def test_store_create_over_the_cap_raises_too_many(store: SessionStore) -> None:
    store.create(make_record("a"))
    store.create(make_record("b"))
    with pytest.raises(TooManyEpisodesError):
        store.create(make_record("c"))
    assert store.count() == 2


def test_store_delete_leaves_a_gone_tombstone(store: SessionStore) -> None:
    store.create(make_record("a"))
    assert store.delete("a").episode_id == "a"
    with pytest.raises(EpisodeGoneError, match="ended"):
        store.get("a")
    with pytest.raises(EpisodeGoneError):
        store.delete("a")
    assert store.count() == 0


def test_store_update_requires_the_next_revision(store: SessionStore) -> None:
    record = make_record("a")
    store.create(record)
    store.update(replace(record, revision=1))
    with pytest.raises(StepConflictError):
        store.update(replace(record, revision=1))  # a concurrent writer lost the race
    assert store.get("a").revision == 1


def test_store_update_ended_episode_raises_gone(store: SessionStore) -> None:
    record = make_record("a")
    store.create(record)
    store.delete("a")
    with pytest.raises(EpisodeGoneError):
        store.update(replace(record, revision=1))


def test_memory_store_idle_episode_expires_with_410_and_counts_eviction() -> None:
    clock, evicted = FakeClock(), []
    store = InMemorySessionStore(ttl_s=10.0, max_episodes=1, clock=clock, on_evict=evicted.append)
    store.create(make_record("a"))
    clock.now = 5.0
    store.update(replace(store.get("a"), revision=1))  # a write keeps it alive
    clock.now = 14.0
    assert store.get("a").revision == 1
    clock.now = 16.0
    with pytest.raises(EpisodeGoneError, match="expired"):
        store.get("a")
    assert evicted == [1]
    store.create(make_record("b"))  # the expired one no longer counts against the cap


def test_memory_store_tombstones_are_forgotten_after_ended_ttl() -> None:
    clock = FakeClock()
    store = InMemorySessionStore(ttl_s=10.0, max_episodes=1, ended_ttl_s=5.0, clock=clock)
    store.create(make_record("a"))
    store.delete("a")
    clock.now = 6.0
    with pytest.raises(EpisodeNotFoundError):
        store.get("a")


@pytest.mark.redis
def test_redis_store_idle_episode_expires_with_410(redis_prefix: str) -> None:
    evicted: list[int] = []
    store = RedisSessionStore(
        REDIS_URL, ttl_s=0.05, max_episodes=1, prefix=redis_prefix, on_evict=evicted.append
    )
    store.create(make_record("a"))
    time.sleep(0.12)
    with pytest.raises(EpisodeGoneError, match="expired"):
        store.get("a")
    store.create(make_record("b"))  # the expired one was swept from the live set
    assert evicted == [1]
    store.close()


def test_redis_store_unreachable_raises_store_unavailable() -> None:
    from service.errors import StoreUnavailableError

    store = RedisSessionStore("redis://127.0.0.1:1/0", ttl_s=1.0, max_episodes=1)
    with pytest.raises(StoreUnavailableError):
        store.get("a")
    assert not store.ping()
