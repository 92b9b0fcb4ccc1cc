"""Episode session stores: in-memory (one process) and Redis (several workers or replicas).

Both keep the same contract: `create` enforces the live-episode cap and the per-owner quota, idle
episodes expire after `ttl_s` of no writes, ended and expired ids answer 410 for `ended_ttl_s`
(404 after that), an episode is visible to its owner only (404 for everyone else), and `mutate`
runs a change under the episode's lock (`claim_many` and `commit_many` do the same for a batch of
episodes), so concurrent requests on one episode (from any worker or replica) apply one after the
other instead of failing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, Self

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry

from service.breaker import CircuitBreaker
from service.config import Settings
from service.episode_state import EpisodeRecord
from service.errors import (
    EpisodeGoneError,
    EpisodeNotFoundError,
    EpisodeQuotaError,
    ServiceError,
    StoreUnavailableError,
    TooManyEpisodesError,
)
from service.locks import ThreadLocks, episode_busy, poll_pauses

logger = logging.getLogger(__name__)
EvictionHook = Callable[[int], None]
ScriptCall = tuple[Script, list[str], list[Any]]
"""A registered Lua script, its keys and its arguments."""
Change = Callable[[EpisodeRecord], EpisodeRecord]
"""A mutation: the new record, or its argument itself when nothing is to be written."""


@dataclass(frozen=True)
class Claim:
    """An episode read for a mutation and held (on Redis, locked) until `commit_many`."""

    record: EpisodeRecord
    token: str = ""
    """The Redis lock's token ("" in memory, where the store keeps the held ids itself)."""


Claimed = Claim | ServiceError | None
"""`claim_many`'s answer per episode: the claim, 404/410/503, or None while another request
(another batch, worker or replica) holds the episode: try again shortly."""


class SessionStore(Protocol):
    """Where episodes live between requests."""

    ttl_s: float
    on_evict: EvictionHook | None
    """Called with the number of idle episodes just expired (metrics)."""

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""

    def mutate(self, episode_id: str, owner: str, change: Change) -> EpisodeRecord:
        """Run `change` on the episode under its lock, store its answer and return it."""

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode (after any mutation in flight) and return its last record."""

    def claim_many(self, episodes: list[tuple[str, str]]) -> list[Claimed]:
        """Read and hold several (episode_id, owner) at once, for one batch."""

    def commit_many(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[ServiceError | None]:
        """Store each claim's new record (or only release it when the record is the claimed one
        itself); per claim None, or why nothing was written."""

    def count(self) -> int:
        """Live episodes."""

    def ping(self) -> bool:
        """True when the store answers."""

    def unavailable_for(self) -> float:
        """Seconds the store keeps refusing calls without trying them (a tripped breaker); 0
        when calls go through. `/readyz` sends it as `Retry-After`."""

    def close(self) -> None:
        """Release connections."""


def _not_found(episode_id: str) -> EpisodeNotFoundError:
    return EpisodeNotFoundError(f"no episode {episode_id!r}", "episode_id")


def _gone(episode_id: str, reason: str) -> EpisodeGoneError:
    return EpisodeGoneError(f"episode {episode_id!r} has {reason}", "episode_id")


def _full(max_episodes: int) -> TooManyEpisodesError:
    return TooManyEpisodesError(
        f"the service holds its maximum of {max_episodes} live episodes; "
        "end finished episodes or retry later"
    )


def _over_quota(quota: int) -> EpisodeQuotaError:
    return EpisodeQuotaError(
        f"this token holds its quota of {quota} live episodes; end finished episodes or retry later"
    )


def _quota_of(owner: str, max_per_owner: int | None) -> int | None:
    """The owner's live-episode quota: none for "" (auth off: one shared principal)."""
    return max_per_owner if owner else None


class InMemorySessionStore:
    """The embedded default: a dict of records, one process only."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_episodes: int,
        max_per_owner: int | None = None,
        ended_ttl_s: float = 3600.0,
        lock_wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_evict: EvictionHook | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self.max_per_owner = max_per_owner
        self.ended_ttl_s = ended_ttl_s
        self.lock_wait_s = lock_wait_s
        self._clock = clock
        self.on_evict = on_evict
        self._records: dict[str, EpisodeRecord] = {}
        self._deadlines: OrderedDict[str, float] = OrderedDict()  # oldest write first
        self._gone: OrderedDict[str, tuple[str, float, str]] = OrderedDict()  # reason, until, owner
        self._owned: Counter[str] = Counter()  # live episodes per owner
        self._lock = threading.Lock()  # the dicts above
        self._episode_locks = ThreadLocks()  # one episode across a whole mutation
        self._claimed: set[str] = set()  # episodes a batch holds (`claim_many`)

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The store `settings` describe."""
        return cls(
            ttl_s=settings.episode_ttl_s,
            max_episodes=settings.max_episodes,
            max_per_owner=settings.max_episodes_per_token,
            ended_ttl_s=settings.ended_ttl_s,
            lock_wait_s=settings.episode_lock_wait_s,
        )

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""
        quota = _quota_of(record.owner, self.max_per_owner)
        with self._lock:
            self._sweep()
            if len(self._records) >= self.max_episodes:
                raise _full(self.max_episodes)
            if quota is not None and self._owned[record.owner] >= quota:
                raise _over_quota(quota)
            self._write(record)

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""
        with self._lock:
            self._sweep()
            return self._get(episode_id, owner)

    def mutate(self, episode_id: str, owner: str, change: Change) -> EpisodeRecord:
        """Run `change` on the episode under its lock, store its answer and return it."""
        with self._episode_locks.hold(episode_id, self.lock_wait_s):
            current = self.get(episode_id, owner)
            updated = change(current)
            if updated is not current:
                with self._lock:
                    self._sweep()
                    self._get(episode_id, owner)  # it may have expired during `change`
                    self._write(updated)
            return updated

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode (after any mutation in flight) and return its last record."""
        with self._episode_locks.hold(episode_id, self.lock_wait_s), self._lock:
            self._sweep()
            record = self._get(episode_id, owner)
            self._forget(record, "ended", self._clock())
            return record

    def claim_many(self, episodes: list[tuple[str, str]]) -> list[Claimed]:
        """Read several episodes and hold them until `commit_many` (None for one held already:
        a request whose caller gave up may still be running in another batch)."""
        claims: list[Claimed] = []
        with self._lock:
            self._sweep()
            for episode_id, owner in episodes:
                try:
                    record = self._get(episode_id, owner)
                except ServiceError as error:
                    claims.append(error)
                    continue
                if episode_id in self._claimed:
                    claims.append(None)
                    continue
                self._claimed.add(episode_id)
                claims.append(Claim(record))
        return claims

    def commit_many(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[ServiceError | None]:
        """Store the changed records; an episode that expired since its claim is not revived."""
        answers: list[ServiceError | None] = []
        with self._lock:
            self._sweep()
            for claim, updated in writes:
                self._claimed.discard(updated.episode_id)
                if updated is claim.record:
                    answers.append(None)
                    continue
                try:
                    self._get(updated.episode_id, updated.owner)
                except ServiceError as error:
                    answers.append(error)
                    continue
                self._write(updated)
                answers.append(None)
        return answers

    def count(self) -> int:
        """Live episodes."""
        with self._lock:
            self._sweep()
            return len(self._records)

    def ping(self) -> bool:
        """Always True."""
        return True

    def unavailable_for(self) -> float:
        """Always 0: nothing to wait for."""
        return 0.0

    def close(self) -> None:
        """Nothing to release."""

    def _get(self, episode_id: str, owner: str) -> EpisodeRecord:
        record = self._records.get(episode_id)
        if record is not None and record.owner == owner:
            return record
        gone = self._gone.get(episode_id)
        if gone is not None and gone[2] == owner:
            raise _gone(episode_id, gone[0])
        raise _not_found(episode_id)

    def _write(self, record: EpisodeRecord) -> None:
        if record.episode_id not in self._records:
            self._owned[record.owner] += 1
        self._records[record.episode_id] = record
        self._deadlines[record.episode_id] = self._clock() + self.ttl_s
        self._deadlines.move_to_end(record.episode_id)

    def _forget(self, record: EpisodeRecord, reason: str, now: float) -> None:
        """Drop a live episode, leaving a tombstone that answers 410 to its owner."""
        del self._records[record.episode_id], self._deadlines[record.episode_id]
        self._owned[record.owner] -= 1
        if not self._owned[record.owner]:
            del self._owned[record.owner]
        self._gone[record.episode_id] = (reason, now + self.ended_ttl_s, record.owner)

    def _sweep(self) -> None:
        """Expire idle episodes and forget old tombstones (amortised O(1): oldest first)."""
        now = self._clock()
        evicted = 0
        while self._deadlines:
            episode_id, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            self._forget(self._records[episode_id], "expired", now)
            evicted += 1
        while self._gone and next(iter(self._gone.values()))[1] <= now:
            self._gone.popitem(last=False)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)


# Every script gets KEYS: episode (hash: data, revision, owner), known (the 410 tombstone,
# "reason:owner"), live (all live ids by deadline), owned (the owner's live ids), lock.
# A write's ARGV: data, revision, now_ms, ttl_ms, known_ttl_ms, id, owner.
_WRITE = """
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'revision', ARGV[2], 'owner', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], 'expired:' .. ARGV[7], 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[3] + ARGV[4], ARGV[6])
redis.call('ZADD', KEYS[4], ARGV[3] + ARGV[4], ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
"""
# ARGV: a write's, then the cap and the owner's quota (0: none).
_CREATE = (
    """
local evicted = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[8]) then return {-1, evicted} end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[3])
local quota = tonumber(ARGV[9])
if quota > 0 and redis.call('ZCARD', KEYS[4]) >= quota then return {-2, evicted} end
"""
    + _WRITE
    + "return {1, evicted}"
)
# The episode as {1, data} if ARGV[1] owns it, else {-1, tombstone or ''} (404 or 410).
_FIND = """
local found = redis.call('HMGET', KEYS[1], 'data', 'owner')
if not found[1] or (found[2] or '') ~= ARGV[1] then
  return {-1, redis.call('GET', KEYS[2]) or ''}
end
"""
# ARGV: owner, token, lock_ttl_ms. {0, ''} while another request holds the lock.
_ACQUIRE = (
    _FIND
    + """
if not redis.call('SET', KEYS[5], ARGV[2], 'NX', 'PX', ARGV[3]) then return {0, ''} end
return {1, found[1]}
"""
)
# ARGV: a write's, then the lock token. 0: the lock expired (the step outlived lock_ttl_s).
_COMMIT = (
    """
if redis.call('GET', KEYS[5]) ~= ARGV[8] then return 0 end
redis.call('DEL', KEYS[5])
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
"""
    + _WRITE
    + "return 1"
)
# KEYS: lock. ARGV: token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
# ARGV: owner, ended_ttl_ms, id. {0, ''} while a mutation holds the lock.
_DELETE = (
    _FIND
    + """
if redis.call('EXISTS', KEYS[5]) == 1 then return {0, ''} end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[4], ARGV[3])
redis.call('SET', KEYS[2], 'ended:' .. ARGV[1], 'PX', ARGV[2])
return {1, found[1]}
"""
)


def _text(reply: bytes | None) -> str:
    """A Redis string reply as text ("" for none)."""
    return reply.decode() if reply else ""


def _missing(episode_id: str, owner: str, tombstone: str) -> ServiceError:
    """410 when `owner`'s episode ended or expired, 404 otherwise (others' tombstones too)."""
    reason, _, ended_owner = tombstone.partition(":")
    if reason and ended_owner == owner:
        return _gone(episode_id, reason)
    return _not_found(episode_id)


class RedisSessionStore:
    """The same contract over Redis: any worker or replica can serve any episode.

    Calls time out after `socket_timeout_s`, and after `breaker.failures` failures in a row
    answer 503 at once for `breaker.cooldown_s`, so a hung Redis holds no request for long.
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        max_episodes: int,
        max_per_owner: int | None = None,
        ended_ttl_s: float = 3600.0,
        prefix: str = "cdt",
        lock_ttl_s: float = 5.0,
        lock_wait_s: float = 2.0,
        socket_timeout_s: float = 0.25,
        connect_timeout_s: float = 0.25,
        breaker: CircuitBreaker | None = None,
        on_evict: EvictionHook | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self.max_per_owner = max_per_owner
        self.ended_ttl_s = ended_ttl_s
        self.prefix = prefix
        self.lock_ttl_s = lock_ttl_s
        self.lock_wait_s = lock_wait_s
        self.on_evict = on_evict
        self._breaker = breaker if breaker is not None else CircuitBreaker(3, 2.0)
        self._redis = redis.Redis.from_url(
            url,  # replies stay bytes: records are binary (`EpisodeRecord.to_bytes`)
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),  # redis-py retries 3 times by default: 4 timeouts
        )
        self._episode_locks = ThreadLocks()  # this process's requests queue here, not on Redis
        self._create = self._redis.register_script(_CREATE)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._commit = self._redis.register_script(_COMMIT)
        self._release = self._redis.register_script(_RELEASE)
        self._delete = self._redis.register_script(_DELETE)

    @classmethod
    def from_settings(cls, url: str, settings: Settings) -> Self:
        """The store `settings` describe, on the Redis at `url`."""
        return cls(
            url,
            ttl_s=settings.episode_ttl_s,
            max_episodes=settings.max_episodes,
            max_per_owner=settings.max_episodes_per_token,
            ended_ttl_s=settings.ended_ttl_s,
            prefix=settings.redis_prefix,
            lock_ttl_s=settings.redis_lock_ttl_s,
            lock_wait_s=settings.episode_lock_wait_s,
            socket_timeout_s=settings.redis_socket_timeout_s,
            connect_timeout_s=settings.redis_connect_timeout_s,
            breaker=CircuitBreaker(
                settings.redis_breaker_failures, settings.redis_breaker_cooldown_s
            ),
        )

    def _keys(self, episode_id: str, owner: str) -> list[str]:
        prefix = self.prefix
        return [
            f"{prefix}:episode:{episode_id}",
            f"{prefix}:known:{episode_id}",
            f"{prefix}:live",
            f"{prefix}:owned:{owner}",
            f"{prefix}:lock:{episode_id}",
        ]

    def _write_args(self, record: EpisodeRecord) -> list[bytes | str | int]:
        ttl_ms = int(self.ttl_s * 1000)
        known_ms = ttl_ms + int(self.ended_ttl_s * 1000)
        now_ms = int(time.time() * 1000)
        return [
            *(record.to_bytes(), record.revision, now_ms, ttl_ms, known_ms),
            *(record.episode_id, record.owner),
        ]

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""
        quota = _quota_of(record.owner, self.max_per_owner)
        args = [*self._write_args(record), self.max_episodes, quota or 0]
        with self._guarded():
            created, evicted = self._create(
                keys=self._keys(record.episode_id, record.owner), args=args
            )
        self._report_evictions(int(evicted))
        if int(created) == -1:
            raise _full(self.max_episodes)
        if int(created) == -2:
            raise _over_quota(quota or 0)

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""
        episode_key, known_key, *_ = self._keys(episode_id, owner)
        with self._guarded():
            pipeline = self._redis.pipeline(transaction=False)
            pipeline.hmget(episode_key, ["data", "owner"])
            pipeline.get(known_key)
            (data, stored_owner), tombstone = pipeline.execute()
        if data is not None and _text(stored_owner) == owner:
            return EpisodeRecord.from_bytes(data)
        raise _missing(episode_id, owner, _text(tombstone))

    def mutate(self, episode_id: str, owner: str, change: Change) -> EpisodeRecord:
        """Run `change` on the episode under its lock, store its answer and return it.

        Two round trips: lock and read, then write and unlock (or unlock alone).
        """
        deadline = time.monotonic() + self.lock_wait_s
        keys, token = self._keys(episode_id, owner), secrets.token_hex(8)
        with self._episode_locks.hold(episode_id, self.lock_wait_s):
            args: list[str | int] = [owner, token, int(self.lock_ttl_s * 1000)]
            acquire = partial(self._acquire, keys=keys, args=args)
            data = self._locked(acquire, episode_id, owner, deadline)
            try:
                current = EpisodeRecord.from_bytes(data)
                updated = change(current)
            except BaseException:
                self._unlock(keys, token)
                raise
            if updated is current:
                self._unlock(keys, token)
            else:
                self._store(updated, keys, token)
            return updated

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode (after any mutation in flight) and return its last record."""
        deadline = time.monotonic() + self.lock_wait_s
        keys = self._keys(episode_id, owner)
        args: list[str | int] = [owner, int(self.ended_ttl_s * 1000), episode_id]
        with self._episode_locks.hold(episode_id, self.lock_wait_s):
            delete = partial(self._delete, keys=keys, args=args)
            data = self._locked(delete, episode_id, owner, deadline)
        return EpisodeRecord.from_bytes(data)

    def claim_many(self, episodes: list[tuple[str, str]]) -> list[Claimed]:
        """Lock and read several episodes in one round trip (a pipeline of lock scripts)."""
        lock_ms = int(self.lock_ttl_s * 1000)
        tokens = [secrets.token_hex(8) for _ in episodes]
        calls: list[ScriptCall] = [
            (self._acquire, self._keys(episode_id, owner), [owner, token, lock_ms])
            for (episode_id, owner), token in zip(episodes, tokens, strict=True)
        ]
        with self._guarded():
            replies = self._pipelined(calls)
        claims: list[Claimed] = []
        for (episode_id, owner), (_, keys, _), token, (outcome, value) in zip(
            episodes, calls, tokens, replies, strict=True
        ):
            if int(outcome) == 1:
                claims.append(self._claimed(value, keys, token))
            elif int(outcome) == 0:
                claims.append(None)
            else:
                claims.append(_missing(episode_id, owner, _text(value)))
        return claims

    def _claimed(self, data: bytes, keys: list[str], token: str) -> Claim | ServiceError:
        """The claim of a locked record, or why it cannot be read (its lock released)."""
        try:
            return Claim(EpisodeRecord.from_bytes(data), token)
        except ServiceError as unreadable:  # another replica's format: left as it is
            self._unlock(keys, token)
            return unreadable

    def commit_many(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[ServiceError | None]:
        """Write the changed records and release every claim, in one round trip."""
        calls: list[ScriptCall] = []
        for claim, updated in writes:
            keys = self._keys(updated.episode_id, updated.owner)
            if updated is claim.record:
                calls.append((self._release, keys[4:], [claim.token]))
            else:
                calls.append((self._commit, keys, [*self._write_args(updated), claim.token]))
        with self._guarded():
            replies = self._pipelined(calls)
        return [
            None if updated is claim.record else self._commit_error(updated, int(outcome))
            for (claim, updated), outcome in zip(writes, replies, strict=True)
        ]

    def count(self) -> int:
        """Live episodes (expired ones are swept first)."""
        live_key = f"{self.prefix}:live"
        with self._guarded():
            evicted = self._redis.zremrangebyscore(live_key, "-inf", int(time.time() * 1000))
            live = self._redis.zcard(live_key)
        self._report_evictions(int(evicted))
        return int(live)

    def ping(self) -> bool:
        """True when Redis answers (False at once while the breaker is open)."""
        try:
            with self._guarded():
                return bool(self._redis.ping())
        except StoreUnavailableError:
            return False

    def unavailable_for(self) -> float:
        """Seconds the tripped breaker keeps answering 503 without trying Redis; 0 when closed."""
        return self._breaker.open_for()

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def _locked(
        self, attempt: Callable[[], Any], episode_id: str, owner: str, deadline: float
    ) -> bytes:
        """Run a lock-respecting script until no other request holds the episode; its data.

        Raises 404 or 410 when `owner` has no such episode, `EpisodeBusyError` when the lock is
        still held at `deadline` (monotonic).
        """
        pauses = poll_pauses(episode_id, self.lock_wait_s, deadline)
        while True:
            with self._guarded():
                outcome, value = attempt()
            if int(outcome) == 1:
                return bytes(value)
            if int(outcome) < 0:
                raise _missing(episode_id, owner, _text(value))
            time.sleep(next(pauses))

    def _store(self, record: EpisodeRecord, keys: list[str], token: str) -> None:
        """Write a mutated record and release its lock in one script."""
        with self._guarded():
            outcome = int(self._commit(keys=keys, args=[*self._write_args(record), token]))
        error = self._commit_error(record, outcome)
        if error is not None:
            raise error

    def _commit_error(self, record: EpisodeRecord, outcome: int) -> ServiceError | None:
        """Why the commit script wrote nothing, or None when it wrote `record`."""
        if outcome == 0:  # another request took the expired lock: nothing was written
            return episode_busy(record.episode_id, self.lock_ttl_s)
        if outcome < 0:  # it was there when locked: it expired during the change
            return _gone(record.episode_id, "expired")
        return None

    def _unlock(self, keys: list[str], token: str) -> None:
        # best effort: if Redis is unreachable the lock expires after lock_ttl_s
        with contextlib.suppress(StoreUnavailableError), self._guarded():
            self._release(keys=keys[4:], args=[token])

    def _pipelined(self, calls: list[ScriptCall]) -> list[Any]:
        """Run scripts in one pipeline of EVALSHA; their replies.

        redis-py's own pipelined scripts ask SCRIPT EXISTS first, an extra round trip per
        pipeline; here a script is loaded only when Redis answers NOSCRIPT (after a restart),
        and then only the calls that were refused run again.
        """
        replies = self._evalsha(calls)
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        for script in {id(calls[i][0]): calls[i][0] for i in refused}.values():
            self._redis.script_load(script.script)
        for i, reply in zip(refused, self._evalsha([calls[i] for i in refused]), strict=True):
            replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def _evalsha(self, calls: list[ScriptCall]) -> list[Any]:
        if not calls:
            return []
        pipeline = self._redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipeline.evalsha(script.sha, len(keys), *keys, *args)
        return list(pipeline.execute(raise_on_error=False))

    def _report_evictions(self, evicted: int) -> None:
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)

    @contextmanager
    def _guarded(self) -> Iterator[None]:
        """Turn Redis failures into a 503 that names no address; fail fast while tripped."""
        open_for = self._breaker.open_for()
        if open_for > 0:
            retry_after = math.ceil(open_for)
            detail = f"session store unavailable; retry in {retry_after} s"
            raise StoreUnavailableError(detail, retry_after=retry_after)
        try:
            yield
        except redis.RedisError as error:
            self._breaker.failed()
            logger.warning("session store call failed: %s", error)  # the address stays here
            raise StoreUnavailableError("session store unavailable") from error
        self._breaker.succeeded()
