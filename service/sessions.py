"""Episode session stores: in-memory (one process) and Redis (several workers or replicas).

Both keep the same contract: `create` enforces the live-episode cap, idle episodes expire after
`ttl_s` of no writes, ended and expired ids answer 410 for `ended_ttl_s` (404 after that), and
`update` is a compare-and-set on the record's revision, so two replicas can never interleave steps
of one episode silently.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, Self

import redis

from runtime.context import EpisodeContext
from service.errors import (
    EpisodeGoneError,
    EpisodeNotFoundError,
    StepConflictError,
    StoreUnavailableError,
    TooManyEpisodesError,
)

EvictionHook = Callable[[int], None]


@dataclass(frozen=True)
class EpisodeRecord:
    """Everything the service keeps about one episode."""

    episode_id: str
    model: str
    model_version: str
    deterministic: bool
    seed: int
    context: EpisodeContext
    created_at: float
    """Unix time the episode started."""
    updated_at: float
    """Unix time of the last write."""
    revision: int = 0
    """Incremented on every write (compare-and-set)."""

    def to_json(self) -> str:
        """Serialise for Redis (the context includes its generator state)."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["context"] = self.context.to_dict()
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Self:
        """Inverse of `to_json`."""
        data: dict[str, Any] = json.loads(text)
        data["context"] = EpisodeContext.from_dict(data["context"])
        return cls(**data)


class SessionStore(Protocol):
    """Where episodes live between requests."""

    ttl_s: float
    on_evict: EvictionHook | None
    """Called with the number of idle episodes just expired (metrics)."""

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap."""

    def get(self, episode_id: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown) or `EpisodeGoneError` (ended or expired)."""

    def update(self, record: EpisodeRecord) -> None:
        """Replace the stored record whose revision is `record.revision - 1`."""

    def delete(self, episode_id: str) -> EpisodeRecord:
        """End an episode and return its last record."""

    def count(self) -> int:
        """Live episodes."""

    def ping(self) -> bool:
        """True when the store answers."""

    def close(self) -> None:
        """Release connections."""


def _not_found(episode_id: str) -> EpisodeNotFoundError:
    return EpisodeNotFoundError(f"no episode {episode_id!r}", "episode_id")


def _gone(episode_id: str, reason: str) -> EpisodeGoneError:
    return EpisodeGoneError(f"episode {episode_id!r} has {reason}", "episode_id")


def _conflict(episode_id: str) -> StepConflictError:
    return StepConflictError(f"episode {episode_id!r} was changed by a concurrent request")


class InMemorySessionStore:
    """The embedded default: a dict of records, one process only."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_episodes: int,
        ended_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        on_evict: EvictionHook | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self.ended_ttl_s = ended_ttl_s
        self._clock = clock
        self.on_evict = on_evict
        self._records: dict[str, EpisodeRecord] = {}
        self._deadlines: OrderedDict[str, float] = OrderedDict()  # oldest write first
        self._gone: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (reason, until)
        self._lock = threading.Lock()

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap."""
        with self._lock:
            self._sweep()
            if len(self._records) >= self.max_episodes:
                raise TooManyEpisodesError(
                    f"the server holds its maximum of {self.max_episodes} live episodes; "
                    "end finished episodes or retry later"
                )
            self._write(record)

    def get(self, episode_id: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown) or `EpisodeGoneError` (ended or expired)."""
        with self._lock:
            self._sweep()
            return self._get(episode_id)

    def update(self, record: EpisodeRecord) -> None:
        """Replace the stored record whose revision is `record.revision - 1`."""
        with self._lock:
            self._sweep()
            if self._get(record.episode_id).revision != record.revision - 1:
                raise _conflict(record.episode_id)
            self._write(record)

    def delete(self, episode_id: str) -> EpisodeRecord:
        """End an episode and return its last record."""
        with self._lock:
            self._sweep()
            record = self._get(episode_id)
            del self._records[episode_id]
            del self._deadlines[episode_id]
            self._gone[episode_id] = ("ended", self._clock() + self.ended_ttl_s)
            return record

    def count(self) -> int:
        """Live episodes."""
        with self._lock:
            self._sweep()
            return len(self._records)

    def ping(self) -> bool:
        """Always True."""
        return True

    def close(self) -> None:
        """Nothing to release."""

    def _get(self, episode_id: str) -> EpisodeRecord:
        record = self._records.get(episode_id)
        if record is not None:
            return record
        if episode_id in self._gone:
            raise _gone(episode_id, self._gone[episode_id][0])
        raise _not_found(episode_id)

    def _write(self, record: EpisodeRecord) -> None:
        self._records[record.episode_id] = record
        self._deadlines[record.episode_id] = self._clock() + self.ttl_s
        self._deadlines.move_to_end(record.episode_id)

    def _sweep(self) -> None:
        """Expire idle episodes and forget old tombstones (amortised O(1): oldest first)."""
        now = self._clock()
        evicted = 0
        while self._deadlines:
            episode_id, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                break
            del self._deadlines[episode_id], self._records[episode_id]
            self._gone[episode_id] = ("expired", now + self.ended_ttl_s)
            evicted += 1
        while self._gone and next(iter(self._gone.values()))[1] <= now:
            self._gone.popitem(last=False)
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)


# KEYS: episode, known, live. ARGV: data, revision, now_ms, ttl_ms, known_ttl_ms, id, max.
_CREATE = """
local evicted = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[3])
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[7]) then return {-1, evicted} end
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'revision', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], 'expired', 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[3] + ARGV[4], ARGV[6])
return {1, evicted}
"""
_UPDATE = """
local revision = redis.call('HGET', KEYS[1], 'revision')
if not revision then return -1 end
if tonumber(revision) ~= tonumber(ARGV[2]) - 1 then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'revision', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], 'expired', 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[3] + ARGV[4], ARGV[6])
return 1
"""
# KEYS: episode, known, live. ARGV: ended_ttl_ms, id.
_DELETE = """
local data = redis.call('HGET', KEYS[1], 'data')
if not data then return false end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('SET', KEYS[2], 'ended', 'PX', ARGV[1])
return data
"""


class RedisSessionStore:
    """The same contract over Redis: any worker or replica can serve any episode."""

    def __init__(
        self,
        url: str,
        *,
        ttl_s: float,
        max_episodes: int,
        ended_ttl_s: float = 3600.0,
        prefix: str = "cdt",
        on_evict: EvictionHook | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self.ended_ttl_s = ended_ttl_s
        self.prefix = prefix
        self.on_evict = on_evict
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5.0)
        self._create = self._redis.register_script(_CREATE)
        self._update = self._redis.register_script(_UPDATE)
        self._delete = self._redis.register_script(_DELETE)

    def _keys(self, episode_id: str) -> list[str]:
        return [
            f"{self.prefix}:episode:{episode_id}",
            f"{self.prefix}:known:{episode_id}",
            f"{self.prefix}:live",
        ]

    def _write_args(self, record: EpisodeRecord) -> list[str | int]:
        ttl_ms = int(self.ttl_s * 1000)
        known_ms = ttl_ms + int(self.ended_ttl_s * 1000)
        now_ms = int(time.time() * 1000)
        return [record.to_json(), record.revision, now_ms, ttl_ms, known_ms, record.episode_id]

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap."""
        with _available():
            args = [*self._write_args(record), self.max_episodes]
            created, evicted = self._create(keys=self._keys(record.episode_id), args=args)
        self._report_evictions(int(evicted))
        if int(created) < 0:
            raise TooManyEpisodesError(
                f"the service holds its maximum of {self.max_episodes} live episodes; "
                "end finished episodes or retry later"
            )

    def get(self, episode_id: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown) or `EpisodeGoneError` (ended or expired)."""
        episode_key, known_key, _ = self._keys(episode_id)
        with _available():
            pipeline = self._redis.pipeline(transaction=False)
            pipeline.hget(episode_key, "data")
            pipeline.get(known_key)
            data, reason = pipeline.execute()
        if data is not None:
            return EpisodeRecord.from_json(data)
        if reason is not None:
            raise _gone(episode_id, reason)
        raise _not_found(episode_id)

    def update(self, record: EpisodeRecord) -> None:
        """Replace the stored record whose revision is `record.revision - 1`."""
        with _available():
            outcome = int(
                self._update(keys=self._keys(record.episode_id), args=self._write_args(record))
            )
        if outcome == 0:
            raise _conflict(record.episode_id)
        if outcome < 0:
            self.get(record.episode_id)  # raises the precise 404 or 410
            raise _conflict(record.episode_id)

    def delete(self, episode_id: str) -> EpisodeRecord:
        """End an episode and return its last record."""
        args: list[str | int] = [int(self.ended_ttl_s * 1000), episode_id]
        with _available():
            data = self._delete(keys=self._keys(episode_id), args=args)
        if not data:
            self.get(episode_id)  # raises the precise 404 or 410
            raise _not_found(episode_id)
        return EpisodeRecord.from_json(data)

    def count(self) -> int:
        """Live episodes (expired ones are swept first)."""
        live_key = f"{self.prefix}:live"
        with _available():
            evicted = self._redis.zremrangebyscore(live_key, "-inf", int(time.time() * 1000))
            live = self._redis.zcard(live_key)
        self._report_evictions(int(evicted))
        return int(live)

    def ping(self) -> bool:
        """True when Redis answers."""
        try:
            return bool(self._redis.ping())
        except redis.RedisError:
            return False

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def _report_evictions(self, evicted: int) -> None:
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)


@contextmanager
def _available() -> Iterator[None]:
    """Turn Redis connection problems into a 503 for the client."""
    try:
        yield
    except redis.RedisError as error:
        raise StoreUnavailableError(f"session store unavailable: {error}") from error
