"""`RedisSessionStore`: the store contract over Redis, so any worker or replica serves any
episode. Records are `service.stores.codec` bytes; every check-and-write is one Lua script
(`service.stores.redis_scripts`), and a batch costs two round trips whatever its size.

A Redis stall must not outlast itself. Calls time out after `socket_timeout_s` and a breaker
then fails fast, but a background probe closes it as soon as Redis answers again. A call that
timed out may still reach Redis once it resumes: its lock scripts would then take locks that
nobody releases for `lock_ttl_s`. So the tokens of every failed call that may hold locks are
abandoned: the probe releases their locks and marks the tokens, and a lock script carrying a
marked token takes nothing, whichever of the two Redis runs first.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry

from service.breaker import CircuitBreaker, Prober
from service.config import Settings
from service.episode_state import EpisodeRecord
from service.errors import ServiceError, StoreUnavailableError
from service.locks import current_wait, episode_busy, poll_pauses
from service.preconditions import deadline_passed, revision_mismatch
from service.stores import redis_scripts
from service.stores.base import (
    CallHook,
    Claim,
    Claimed,
    EvictionHook,
    full,
    gone,
    not_found,
    over_quota,
    quota_of,
)
from service.stores.codec import decode_record, encode_record

logger = logging.getLogger(__name__)
ScriptCall = tuple[Script, list[str], list[Any]]
"""A registered Lua script, its keys and its arguments."""
Lock = tuple[str, str]
"""A lock key and the token a call locks it with."""
ABANDONED_TTL_S = 60.0
"""How long an abandoned token stays marked: a lock script of it that reaches Redis later than
this (a stall of over a minute) takes its lock after all, which expires after `lock_ttl_s`."""
MAX_ABANDONED = 10_000
"""Abandoned tokens remembered for release; beyond it the oldest are left to expire."""
PROBE_BATCH = 1_000
"""Abandoned locks one probe releases (one pipeline)."""


def _text(reply: bytes | None) -> str:
    """A Redis string reply as text ("" for none)."""
    return reply.decode() if reply else ""


def _condition_args(claim: Claim) -> list[str | int]:
    """`COMMIT`'s precondition arguments: the revision required and the deadline in unix
    microseconds ('' each when not required)."""
    precondition = claim.precondition
    if precondition is None:
        return ["", ""]
    revision, deadline = precondition.revision, precondition.deadline
    return [
        "" if revision is None else revision,
        "" if deadline is None else math.floor(deadline * 1_000_000),
    ]


def _missing(episode_id: str, owner: str, tombstone: str) -> ServiceError:
    """410 when `owner`'s episode ended or expired, 404 otherwise (others' tombstones too)."""
    reason, _, ended_owner = tombstone.partition(":")
    if reason and ended_owner == owner:
        return gone(episode_id, reason)
    return not_found(episode_id)


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
        probe_interval_s: float = 0.1,
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
        self.on_call: CallHook | None = None
        self._breaker = breaker if breaker is not None else CircuitBreaker(3, 2.0)
        self._abandoned: dict[str, str] = {}  # token -> lock key, oldest first
        self._abandoned_lock = threading.Lock()
        self._prober = Prober(self._probe, self._probe_needed, probe_interval_s)
        self._redis = redis.Redis.from_url(
            url,  # replies stay bytes: records are binary (`encode_record`)
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),  # redis-py retries 3 times by default: 4 timeouts
        )
        self._create = self._redis.register_script(redis_scripts.CREATE)
        self._acquire = self._redis.register_script(redis_scripts.ACQUIRE)
        self._commit = self._redis.register_script(redis_scripts.COMMIT)
        self._release = self._redis.register_script(redis_scripts.RELEASE)
        self._delete = self._redis.register_script(redis_scripts.DELETE)
        self._abandon_script = self._redis.register_script(redis_scripts.ABANDON)

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
            probe_interval_s=settings.redis_probe_interval_s,
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

    def _marker(self, token: str) -> str:
        """The key that marks `token` abandoned (`redis_scripts.ABANDON`)."""
        return f"{self.prefix}:abandoned:{token}"

    def _write_args(self, record: EpisodeRecord, now_ms: int = 0) -> list[bytes | str | int]:
        ttl_ms = int(self.ttl_s * 1000)
        known_ms = ttl_ms + int(self.ended_ttl_s * 1000)
        now_ms = now_ms or int(time.time() * 1000)
        return [
            *(encode_record(record), record.revision, now_ms, ttl_ms, known_ms),
            *(record.episode_id, record.owner),
        ]

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""
        quota = quota_of(record.owner, self.max_per_owner)
        now_ms = int(time.time() * 1000)
        args = [*self._write_args(record, now_ms), self.max_episodes, quota or 0]
        with self._guarded("create"):
            created, evicted, *oldest = self._create(
                keys=self._keys(record.episode_id, record.owner), args=args
            )
        self._report_evictions(int(evicted))
        if int(created) == -1:
            raise full(self.max_episodes)
        if int(created) == -2:  # a slot frees when an episode ends, or the oldest idle expires
            raise over_quota(quota or 0, (float(oldest[0]) - now_ms) / 1000)

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""
        episode_key, known_key, *_ = self._keys(episode_id, owner)
        with self._guarded("get"):
            pipeline = self._redis.pipeline(transaction=False)
            pipeline.hmget(episode_key, ["data", "owner"])
            pipeline.get(known_key)
            (data, stored_owner), tombstone = pipeline.execute()
        if data is not None and _text(stored_owner) == owner:
            return decode_record(data)
        raise _missing(episode_id, owner, _text(tombstone))

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode after the batch holding it (any worker's or replica's) and return its
        last record; raises `EpisodeBusyError` when it is still held after `lock_wait_s` (or
        at the end of the calling request's wait: `service.locks.waiting_within`), and
        `RecordFormatError` for a record this release cannot read, which stays as it is.

        The record is read and decoded first, then deleted only if its revision is still the
        one decoded: two round trips (ending is rare), and nothing unreadable is deleted.
        """
        keys = self._keys(episode_id, owner)
        pauses = poll_pauses(current_wait(episode_id, self.lock_wait_s))
        record, revision = None, ""  # nothing read yet: the script answers without deleting
        while True:
            args: list[str | int] = [owner, int(self.ended_ttl_s * 1000), episode_id, revision]
            with self._guarded("delete"):
                outcome, value = self._delete(keys=keys, args=args)
            if int(outcome) == 1 and record is not None:
                return record
            if int(outcome) == 2:  # read (again): another revision was written meanwhile
                record = decode_record(value)
                revision = str(record.revision)
            elif int(outcome) < 0:
                raise _missing(episode_id, owner, _text(value))
            else:  # a batch holds the episode
                time.sleep(next(pauses))

    def claim_many(self, episodes: list[tuple[str, str]]) -> list[Claimed]:
        """Lock and read several episodes in one round trip (a pipeline of lock scripts)."""
        lock_ms = int(self.lock_ttl_s * 1000)
        tokens = [secrets.token_hex(8) for _ in episodes]
        calls: list[ScriptCall] = []
        locks: list[Lock] = []
        for (episode_id, owner), token in zip(episodes, tokens, strict=True):
            keys = self._keys(episode_id, owner)
            calls.append((self._acquire, [*keys, self._marker(token)], [owner, token, lock_ms]))
            locks.append((keys[4], token))
        try:
            with self._guarded("claim"):
                replies = self._pipelined(calls)
        except StoreUnavailableError as failed:
            if failed.__cause__ is not None:  # sent: Redis may run the scripts when it resumes
                self._abandon(locks)
            raise
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
            return Claim(decode_record(data), token)
        except ServiceError as unreadable:  # another replica's format: left as it is
            self._unlock(keys, token)
            return unreadable

    def commit_many(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[ServiceError | None]:
        """Write the changed records and release every claim, in one round trip."""
        calls: list[ScriptCall] = []
        locks: list[Lock] = []
        for claim, updated in writes:
            keys = self._keys(updated.episode_id, updated.owner)
            locks.append((keys[4], claim.token))
            if updated is claim.record:
                calls.append((self._release, keys[4:], [claim.token]))
            else:
                args = [*self._write_args(updated), claim.token, *_condition_args(claim)]
                calls.append((self._commit, keys, args))
        try:
            with self._guarded("commit"):
                replies = self._pipelined(calls)
        except StoreUnavailableError:  # sent or not, the claims' locks are held: release them
            self._abandon(locks)
            raise
        return [
            None if updated is claim.record else self._commit_error(claim, int(outcome))
            for (claim, updated), outcome in zip(writes, replies, strict=True)
        ]

    def count(self) -> int:
        """Live episodes (expired ones are swept first)."""
        live_key = f"{self.prefix}:live"
        with self._guarded("count"):
            evicted = self._redis.zremrangebyscore(live_key, "-inf", int(time.time() * 1000))
            live = self._redis.zcard(live_key)
        self._report_evictions(int(evicted))
        return int(live)

    def ping(self) -> bool:
        """True when Redis answers (False at once while the breaker is open)."""
        try:
            with self._guarded("ping"):
                return bool(self._redis.ping())
        except StoreUnavailableError:
            return False

    def unavailable_for(self) -> float:
        """Seconds the tripped breaker keeps answering 503 unless a probe gets through first; 0
        when closed."""
        return self._breaker.open_for()

    def close(self) -> None:
        """Stop the probe and close the connection pool."""
        self._prober.close()
        self._redis.close()

    def _commit_error(self, claim: Claim, outcome: int) -> ServiceError | None:
        """Why the commit script wrote nothing for `claim`, or None when it wrote."""
        episode_id, precondition = claim.record.episode_id, claim.precondition
        if outcome == 1:
            return None
        if outcome == 0:  # another request took the expired lock: nothing was written
            return episode_busy(episode_id, self.lock_ttl_s)
        if outcome == -1:  # it was there when locked: it expired during the change
            return gone(episode_id, "expired")
        assert precondition is not None  # only its arguments make the script answer -2 or -3
        if outcome == -2:  # the lock was held since the claim: the claimed revision is stored
            return revision_mismatch(precondition, claim.record.revision)
        return deadline_passed(precondition)

    def _unlock(self, keys: list[str], token: str) -> None:
        try:
            with self._guarded("commit"):
                self._release(keys=keys[4:], args=[token])
        except StoreUnavailableError:  # released by the probe once Redis answers
            self._abandon([(keys[4], token)])

    def _abandon(self, locks: Iterable[Lock]) -> None:
        """Have the probe release these locks, now or whenever their scripts reach Redis."""
        with self._abandoned_lock:
            for lock_key, token in locks:
                self._abandoned[token] = lock_key
            while len(self._abandoned) > MAX_ABANDONED:  # the oldest expire by themselves
                del self._abandoned[next(iter(self._abandoned))]
        self._prober.wake()

    def _probe_needed(self) -> bool:
        return bool(self._abandoned) or self._breaker.open_for() > 0

    def _probe(self) -> None:
        """One probe (the prober's thread): release abandoned locks, or PING; a success closes
        the breaker."""
        with self._abandoned_lock:
            abandoned = list(self._abandoned.items())[:PROBE_BATCH]
        marker_ms = int(ABANDONED_TTL_S * 1000)
        calls: list[ScriptCall] = [
            (self._abandon_script, [lock_key, self._marker(token)], [token, marker_ms])
            for token, lock_key in abandoned
        ]
        try:
            if calls:
                self._pipelined(calls)
            else:
                self._redis.ping()
        except redis.ResponseError as refused:  # Redis answered: these locks are left to expire
            logger.warning("releasing abandoned locks failed: %s", refused)
        except redis.RedisError as error:
            self._breaker.failed()
            logger.debug("session store probe failed: %s", error)
            return
        else:
            self._breaker.succeeded()
        with self._abandoned_lock:
            for token, _ in abandoned:
                self._abandoned.pop(token, None)

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
    def _guarded(self, operation: str) -> Iterator[None]:
        """Turn Redis failures into a 503 that names no address; fail fast while tripped.

        `operation` labels the call's duration for `on_call` (the store-latency metric).
        """
        if self._breaker.open_for() > 0:
            # the probe closes the breaker as soon as Redis answers: retrying soon may work
            retry_after = math.ceil(min(self._breaker.open_for(), self._prober.interval_s)) or 1
            detail = f"session store unavailable; retry in {retry_after} s"
            raise StoreUnavailableError(detail, retry_after=retry_after)
        started = time.perf_counter()
        try:
            yield
        except redis.RedisError as error:
            self._breaker.failed()
            self._prober.wake()  # closes the breaker once Redis answers again
            logger.warning("session store call failed: %s", error)  # the address stays here
            raise StoreUnavailableError("session store unavailable") from error
        finally:
            if self.on_call is not None:
                self.on_call(operation, time.perf_counter() - started)
        self._breaker.succeeded()
