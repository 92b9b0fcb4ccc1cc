"""The embedded default store: a dict of records in this process (one worker only)."""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Self

from service.config import Settings
from service.episode_state import EpisodeRecord
from service.errors import ServiceError
from service.preconditions import unmet
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


class InMemorySessionStore:
    """Episodes in a dict, each with its idle deadline; ended ones leave a 410 tombstone.

    The event loop and the batch threads share it, so one lock guards the dicts. Requests on
    one episode are serialised before they get here (`service.inference`'s loop locks); the
    claims only keep two batches from holding one episode.
    """

    def __init__(
        self,
        *,
        ttl_s: float,
        max_episodes: int,
        max_per_owner: int | None = None,
        ended_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        on_evict: EvictionHook | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_episodes = max_episodes
        self.max_per_owner = max_per_owner
        self.ended_ttl_s = ended_ttl_s
        self._clock = clock
        self.on_evict = on_evict
        self.on_call: CallHook | None = None  # never called: nothing here is a round trip
        self._records: dict[str, EpisodeRecord] = {}
        self._deadlines: OrderedDict[str, float] = OrderedDict()  # oldest write first
        self._gone: OrderedDict[str, tuple[str, float, str]] = OrderedDict()  # reason, until, owner
        self._owned: Counter[str] = Counter()  # live episodes per owner
        self._lock = threading.Lock()  # the dicts above and the claims
        self._claimed: set[str] = set()  # episodes a batch holds (`claim_many`)

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        """The store `settings` describe."""
        return cls(
            ttl_s=settings.episode_ttl_s,
            max_episodes=settings.max_episodes,
            max_per_owner=settings.max_episodes_per_token,
            ended_ttl_s=settings.ended_ttl_s,
        )

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""
        quota = quota_of(record.owner, self.max_per_owner)
        with self._lock:
            self._sweep()
            if len(self._records) >= self.max_episodes:
                raise full(self.max_episodes)
            if quota is not None and self._owned[record.owner] >= quota:
                raise over_quota(quota, self._oldest_deadline(record.owner) - self._clock())
            self._write(record)

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""
        with self._lock:
            self._sweep()
            return self._get(episode_id, owner)

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode and return its last record (a batch still holding it writes nothing
        when it commits)."""
        with self._lock:
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
        """Store the changed records whose preconditions hold now, under the store's lock; an
        episode that expired or ended since its claim is not revived."""
        answers: list[ServiceError | None] = []
        with self._lock:
            self._sweep()
            for claim, updated in writes:
                self._claimed.discard(updated.episode_id)
                if updated is claim.record:
                    answers.append(None)
                    continue
                try:
                    stored = self._get(updated.episode_id, updated.owner)
                except ServiceError as error:
                    answers.append(error)
                    continue
                if claim.precondition is not None:
                    failed = unmet(claim.precondition, stored.revision, time.time())
                    if failed is not None:
                        answers.append(failed)
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
        tombstone = self._gone.get(episode_id)
        if tombstone is not None and tombstone[2] == owner:
            raise gone(episode_id, tombstone[0])
        raise not_found(episode_id)

    def _oldest_deadline(self, owner: str) -> float:
        """When the least recently written of `owner`'s live episodes expires (the deadlines
        are in write order: the first of the owner's is the earliest)."""
        return next(
            deadline
            for episode_id, deadline in self._deadlines.items()
            if self._records[episode_id].owner == owner
        )

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
