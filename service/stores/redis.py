"""`RedisSessionStore`: the store contract over Redis, so any worker or replica serves any
episode. Records are `service.stores.codec` bytes; every check-and-write is one Lua script
(`service.stores.redis_scripts`), and a batch costs two round trips whatever its size."""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Self

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry

from service.breaker import CircuitBreaker
from service.config import Settings
from service.episode_state import EpisodeRecord
from service.errors import ServiceError, StoreUnavailableError
from service.locks import episode_busy, poll_pauses
from service.stores import redis_scripts
from service.stores.base import (
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


def _text(reply: bytes | None) -> str:
    """A Redis string reply as text ("" for none)."""
    return reply.decode() if reply else ""


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
            *(encode_record(record), record.revision, now_ms, ttl_ms, known_ms),
            *(record.episode_id, record.owner),
        ]

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""
        quota = quota_of(record.owner, self.max_per_owner)
        args = [*self._write_args(record), self.max_episodes, quota or 0]
        with self._guarded():
            created, evicted = self._create(
                keys=self._keys(record.episode_id, record.owner), args=args
            )
        self._report_evictions(int(evicted))
        if int(created) == -1:
            raise full(self.max_episodes)
        if int(created) == -2:
            raise over_quota(quota or 0)

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""
        episode_key, known_key, *_ = self._keys(episode_id, owner)
        with self._guarded():
            pipeline = self._redis.pipeline(transaction=False)
            pipeline.hmget(episode_key, ["data", "owner"])
            pipeline.get(known_key)
            (data, stored_owner), tombstone = pipeline.execute()
        if data is not None and _text(stored_owner) == owner:
            return decode_record(data)
        raise _missing(episode_id, owner, _text(tombstone))

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode after the batch holding it (any worker's or replica's) and return its
        last record; raises `EpisodeBusyError` when it is still held after `lock_wait_s`."""
        deadline = time.monotonic() + self.lock_wait_s
        keys = self._keys(episode_id, owner)
        args: list[str | int] = [owner, int(self.ended_ttl_s * 1000), episode_id]
        delete = partial(self._delete, keys=keys, args=args)
        return decode_record(self._locked(delete, episode_id, owner, deadline))

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
            return Claim(decode_record(data), token)
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

    def _commit_error(self, record: EpisodeRecord, outcome: int) -> ServiceError | None:
        """Why the commit script wrote nothing, or None when it wrote `record`."""
        if outcome == 0:  # another request took the expired lock: nothing was written
            return episode_busy(record.episode_id, self.lock_ttl_s)
        if outcome < 0:  # it was there when locked: it expired during the change
            return gone(record.episode_id, "expired")
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
