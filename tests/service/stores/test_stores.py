"""Both session stores honour one contract: cap, quota, TTL, 410 tombstones, owners, claims."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from runtime.context import EpisodeContext
from service.breaker import CircuitBreaker
from service.episode_state import EpisodeRecord
from service.errors import (
    DeadlinePassedError,
    EpisodeBusyError,
    EpisodeGoneError,
    EpisodeNotFoundError,
    EpisodeQuotaError,
    RevisionMismatchError,
    ServiceError,
    StoreUnavailableError,
    TooManyEpisodesError,
)
from service.preconditions import Precondition
from service.stores.base import Claim, SessionStore
from service.stores.codec import encode_context
from service.stores.memory import InMemorySessionStore
from service.stores.redis import RedisSessionStore
from tests.service.clock import FakeClock
from tests.service.toy_policy import REDIS_URL

OWNER = "alice"


def make_record(episode_id: str, seed: int = 0, owner: str = OWNER) -> EpisodeRecord:
    context = EpisodeContext.start([0.0], 1.0, 1.0, context_len=2, action_dim=1, seed=seed)
    return EpisodeRecord(episode_id, "toy", "1", False, seed, context, 0.0, 0.0, owner=owner)


def next_revision(record: EpisodeRecord) -> EpisodeRecord:
    return replace(record, revision=record.revision + 1)


def bump(store: SessionStore, episode_id: str, owner: str = OWNER) -> EpisodeRecord:
    """Claim the episode, write its next revision and return it; raises what the claim or the
    commit answers (`EpisodeBusyError` while another batch holds it)."""
    (claim,) = store.claim_many([(episode_id, owner)])
    if claim is None:
        raise EpisodeBusyError(f"{episode_id} is held")
    if not isinstance(claim, Claim):
        raise claim
    updated = next_revision(claim.record)
    (failure,) = store.commit_many([(claim, updated)])
    if failure is not None:
        raise failure
    return updated


StoreFactory = Callable[..., SessionStore]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """Builds stores of one kind (Redis: all on one prefix, like replicas); closes them after."""
    made: list[SessionStore] = []

    def make(**options: float) -> SessionStore:
        if request.param == "memory":
            options.pop("lock_wait_s", None)  # nothing waits in memory: the loop serialises
            store: SessionStore = InMemorySessionStore(ttl_s=60.0, max_episodes=2, **options)
        else:
            prefix = request.getfixturevalue("redis_prefix")
            store = RedisSessionStore(
                REDIS_URL, ttl_s=60.0, max_episodes=2, prefix=prefix, **options
            )
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> SessionStore:
    return make_store()


def test_store_create_then_get_round_trips_the_record(store: SessionStore) -> None:
    record = make_record("a", seed=5)
    record.context.rng.standard_normal(2)
    store.create(record)
    loaded = store.get("a", OWNER)
    assert encode_context(loaded.context) == encode_context(record.context)
    assert (loaded.model, loaded.seed, loaded.revision, loaded.owner) == ("toy", 5, 0, OWNER)


def test_store_get_unknown_raises_not_found(store: SessionStore) -> None:
    with pytest.raises(EpisodeNotFoundError):
        store.get("missing", OWNER)


def test_store_create_over_the_cap_raises_too_many(store: SessionStore) -> None:
    store.create(make_record("a"))
    store.create(make_record("b", owner="bob"))
    with pytest.raises(TooManyEpisodesError) as refused:
        store.create(make_record("c", owner="carol"))
    assert refused.value.retry_after is not None
    assert store.count() == 2


def test_store_create_over_the_owner_quota_raises_quota(make_store: StoreFactory) -> None:
    store = make_store(max_per_owner=1)
    store.create(make_record("a"))
    with pytest.raises(EpisodeQuotaError) as refused:
        store.create(make_record("b"))
    assert refused.value.status_code == 429 and refused.value.retry_after is not None
    store.create(make_record("c", owner="bob"))  # another owner has a quota of its own
    store.delete("a", OWNER)
    store.create(make_record("d"))  # an ended episode no longer counts


def test_store_quota_does_not_apply_without_auth(make_store: StoreFactory) -> None:
    store = make_store(max_per_owner=1)
    store.create(make_record("a", owner=""))
    store.create(make_record("b", owner=""))  # "" is everyone: only the cap applies


def test_store_delete_leaves_a_gone_tombstone(store: SessionStore) -> None:
    store.create(make_record("a"))
    assert store.delete("a", OWNER).episode_id == "a"
    with pytest.raises(EpisodeGoneError, match="ended"):
        store.get("a", OWNER)
    with pytest.raises(EpisodeGoneError):
        store.delete("a", OWNER)
    assert store.count() == 0


def test_store_hides_an_episode_from_other_owners(store: SessionStore) -> None:
    store.create(make_record("a"))
    with pytest.raises(EpisodeNotFoundError):
        store.get("a", "mallory")
    (claim,) = store.claim_many([("a", "mallory")])
    assert isinstance(claim, EpisodeNotFoundError)
    with pytest.raises(EpisodeNotFoundError):
        store.delete("a", "mallory")
    assert store.get("a", OWNER).revision == 0
    store.delete("a", OWNER)
    with pytest.raises(EpisodeNotFoundError):  # nor does its tombstone say it existed
        store.get("a", "mallory")


def test_store_claimed_episode_is_held_for_every_other_batch(make_store: StoreFactory) -> None:
    first = make_store(lock_wait_s=0.05)
    replica = make_store(lock_wait_s=0.05) if isinstance(first, RedisSessionStore) else first
    first.create(make_record("a"))
    first.create(make_record("b"))
    (claim,) = first.claim_many([("a", OWNER)])
    assert isinstance(claim, Claim)
    assert replica.claim_many([("a", OWNER)]) == [None]  # held: try again later
    assert bump(replica, "b").revision == 1  # other episodes are free
    assert first.commit_many([(claim, next_revision(claim.record))]) == [None]
    assert bump(replica, "a").revision == 2  # it saw the held write


def test_store_claim_many_answers_each_episode_and_commit_many_writes_the_changed(
    store: SessionStore,
) -> None:
    store.create(make_record("a"))
    store.create(make_record("b"))
    store.delete("b", OWNER)
    claims = store.claim_many([("a", OWNER), ("b", OWNER), ("c", OWNER), ("a", "mallory")])
    claim, gone, unknown, others = claims
    assert isinstance(claim, Claim) and claim.record.episode_id == "a"
    assert isinstance(gone, EpisodeGoneError) and isinstance(unknown, EpisodeNotFoundError)
    assert isinstance(others, EpisodeNotFoundError)  # another owner's: 404, not 410
    assert store.claim_many([("a", OWNER)]) == [None]  # held until committed: try again later
    assert store.commit_many([(claim, next_revision(claim.record))]) == [None]
    (again,) = store.claim_many([("a", OWNER)])
    assert isinstance(again, Claim) and again.record.revision == 1
    assert store.commit_many([(again, again.record)]) == [None]  # only released
    assert bump(store, "a").revision == 2


def test_store_commit_with_an_unmet_precondition_writes_nothing(store: SessionStore) -> None:
    store.create(make_record("a"))
    refused: list[ServiceError | None] = []
    for precondition in (Precondition(revision=1), Precondition(deadline=time.time() + 0.05)):
        (claim,) = store.claim_many([("a", OWNER)])
        assert isinstance(claim, Claim)
        time.sleep(0.1)  # the deadline passes between claim and write (a replica frozen)
        conditional = replace(claim, precondition=precondition)
        refused += store.commit_many([(conditional, next_revision(claim.record))])
    stale, late = refused
    assert isinstance(stale, RevisionMismatchError) and stale.revision == 0
    assert isinstance(late, DeadlinePassedError)
    assert store.get("a", OWNER).revision == 0  # nothing written, and the claims were released
    (claim,) = store.claim_many([("a", OWNER)])
    assert isinstance(claim, Claim)
    met = replace(claim, precondition=Precondition(revision=0, deadline=time.time() + 30))
    assert store.commit_many([(met, next_revision(claim.record))]) == [None]
    assert store.get("a", OWNER).revision == 1


@pytest.mark.redis
def test_redis_store_end_waits_for_the_claim_of_another_replica(redis_prefix: str) -> None:
    store, replica = (
        RedisSessionStore(
            REDIS_URL, ttl_s=60.0, max_episodes=2, prefix=redis_prefix, lock_wait_s=0.05
        )
        for _ in range(2)
    )
    store.create(make_record("a"))
    (claim,) = store.claim_many([("a", OWNER)])
    assert isinstance(claim, Claim)
    with pytest.raises(EpisodeBusyError) as busy:  # held past its wait: retryable
        replica.delete("a", OWNER)
    assert busy.value.retry_after is not None
    store.commit_many([(claim, next_revision(claim.record))])
    assert replica.delete("a", OWNER).revision == 1  # the held write, then the end
    store.close()
    replica.close()


@pytest.fixture
def redis_with_episode_a(redis_prefix: str) -> Iterator[tuple[RedisSessionStore, Any]]:
    """A Redis store holding episode "a", and a raw connection to the same Redis."""
    import redis

    store = RedisSessionStore(REDIS_URL, ttl_s=60.0, max_episodes=1, prefix=redis_prefix)
    store.create(make_record("a"))
    connection = redis.Redis.from_url(REDIS_URL)
    yield store, connection
    connection.close()
    store.close()


@pytest.mark.redis
def test_redis_store_reloads_its_scripts_after_a_script_flush(
    redis_with_episode_a: tuple[RedisSessionStore, Any],
) -> None:
    store, connection = redis_with_episode_a
    connection.script_flush()  # what a Redis restart does to the script cache
    (claim,) = store.claim_many([("a", OWNER)])
    assert isinstance(claim, Claim)
    connection.script_flush()
    assert store.commit_many([(claim, next_revision(claim.record))]) == [None]
    assert store.get("a", OWNER).revision == 1


def test_memory_store_idle_episode_expires_with_410_and_counts_eviction() -> None:
    clock, evicted = FakeClock(), []
    store = InMemorySessionStore(ttl_s=10.0, max_episodes=1, clock=clock, on_evict=evicted.append)
    store.create(make_record("a"))
    clock.now = 5.0
    bump(store, "a")  # a write keeps it alive
    clock.now = 14.0
    assert store.get("a", OWNER).revision == 1
    clock.now = 16.0
    with pytest.raises(EpisodeGoneError, match="expired"):
        store.get("a", OWNER)
    assert evicted == [1]
    store.create(make_record("b"))  # the expired one no longer counts against the cap


def test_memory_store_tombstones_are_forgotten_after_ended_ttl() -> None:
    clock = FakeClock()
    store = InMemorySessionStore(ttl_s=10.0, max_episodes=1, ended_ttl_s=5.0, clock=clock)
    store.create(make_record("a"))
    store.delete("a", OWNER)
    clock.now = 6.0
    with pytest.raises(EpisodeNotFoundError):
        store.get("a", OWNER)


@pytest.mark.redis
def test_redis_store_idle_episode_expires_with_410(redis_prefix: str) -> None:
    evicted: list[int] = []
    store = RedisSessionStore(
        REDIS_URL, ttl_s=0.05, max_episodes=1, prefix=redis_prefix, on_evict=evicted.append
    )
    store.create(make_record("a"))
    time.sleep(0.12)
    with pytest.raises(EpisodeGoneError, match="expired"):
        store.get("a", OWNER)
    store.create(make_record("b"))  # the expired one was swept from the live set
    assert evicted == [1]
    store.close()


@pytest.mark.redis
def test_redis_store_lock_of_a_dead_replica_expires(
    redis_with_episode_a: tuple[RedisSessionStore, Any], redis_prefix: str
) -> None:
    store, connection = redis_with_episode_a
    connection.set(f"{redis_prefix}:lock:a", "dead-replica", px=50)  # it died holding the lock
    assert store.claim_many([("a", OWNER)]) == [None]
    assert store.delete("a", OWNER).episode_id == "a"  # waited for the lock to expire


def test_redis_store_unreachable_raises_store_unavailable() -> None:
    store = RedisSessionStore("redis://127.0.0.1:1/0", ttl_s=1.0, max_episodes=1)
    with pytest.raises(StoreUnavailableError) as refused:
        store.get("a", OWNER)
    assert "127.0.0.1" not in refused.value.detail and refused.value.retry_after is not None
    assert not store.ping()


def test_redis_store_hung_server_times_out_then_fails_fast() -> None:
    clock = FakeClock()
    with socket.create_server(("127.0.0.1", 0)) as hung:  # accepts, never answers
        port = hung.getsockname()[1]
        store = RedisSessionStore(
            f"redis://127.0.0.1:{port}/0",
            ttl_s=1.0,
            max_episodes=1,
            socket_timeout_s=0.05,
            breaker=CircuitBreaker(2, cooldown_s=30.0, clock=clock),
        )
        for _ in range(2):
            with pytest.raises(StoreUnavailableError) as timed_out:
                store.get("a", OWNER)
            assert str(port) not in timed_out.value.detail
        with pytest.raises(StoreUnavailableError, match="retry in 1 s") as fast:
            store.create(make_record("a"))  # the breaker is open: Redis is not even tried
        assert fast.value.retry_after == 1  # a probe closes it as soon as Redis answers
        assert store.unavailable_for() == 30.0 and not store.ping()
        clock.now = 31.0  # cooled down: tried again, and one more failure trips it again
        with pytest.raises(StoreUnavailableError, match=r"unavailable$"):
            store.get("a", OWNER)
        with pytest.raises(StoreUnavailableError, match="retry in"):
            store.get("a", OWNER)
        store.close()
