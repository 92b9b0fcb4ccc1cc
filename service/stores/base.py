"""The session store contract both stores keep, and the errors they answer with.

`create` enforces the live-episode cap and the per-owner quota, idle episodes expire after
`ttl_s` of no writes, ended and expired ids answer 410 for `ended_ttl_s` (404 after that), and an
episode is visible to its owner only (404 for everyone else). A batch holds its episodes from
`claim_many` to `commit_many` (on Redis with a lock other workers and replicas respect), so
concurrent requests on one episode apply one after the other instead of failing. A claim's
precondition (`service.preconditions`: the revision the change requires, its deadline) is checked
in the same atomic step as its write.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.episode_state import EpisodeRecord
from service.errors import (
    EpisodeGoneError,
    EpisodeNotFoundError,
    EpisodeQuotaError,
    ServiceError,
    TooManyEpisodesError,
)
from service.preconditions import Precondition

EvictionHook = Callable[[int], None]
CallHook = Callable[[str, float], None]
"""Called with an operation ("claim", "commit", "get"...) and the seconds its store round trip
took (the store-latency metric)."""


@dataclass(frozen=True)
class Claim:
    """An episode read for a change and held (on Redis, locked) until `commit_many`."""

    record: EpisodeRecord
    token: str = ""
    """The Redis lock's token ("" in memory, where the store keeps the held ids itself)."""
    precondition: Precondition | None = None
    """What the change requires; `commit_many` checks it atomically with the write and writes
    nothing when it fails (412). Set by the caller (`dataclasses.replace`) after the claim."""


Claimed = Claim | ServiceError | None
"""`claim_many`'s answer per episode: the claim, 404/410/503, or None while another request
(another batch, worker or replica) holds the episode: try again shortly."""


class SessionStore(Protocol):
    """Where episodes live between requests."""

    ttl_s: float
    on_evict: EvictionHook | None
    """Called with the number of idle episodes just expired (metrics)."""
    on_call: CallHook | None
    """Called after each round trip to a remote store (metrics); never in memory."""

    def create(self, record: EpisodeRecord) -> None:
        """Store a new episode; raises `TooManyEpisodesError` at the cap or the owner's quota."""

    def get(self, episode_id: str, owner: str) -> EpisodeRecord:
        """Raises `EpisodeNotFoundError` (unknown, or not `owner`'s) or `EpisodeGoneError`."""

    def delete(self, episode_id: str, owner: str) -> EpisodeRecord:
        """End an episode and return its last record."""

    def claim_many(self, episodes: list[tuple[str, str]]) -> list[Claimed]:
        """Read and hold several (episode_id, owner) at once, for one batch."""

    def commit_many(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[ServiceError | None]:
        """Store each claim's new record (or only release it when the record is the claimed one
        itself) if the claim's precondition still holds; per claim None, or why nothing was
        written."""

    def count(self) -> int:
        """Live episodes."""

    def ping(self) -> bool:
        """True when the store answers."""

    def unavailable_for(self) -> float:
        """Seconds the store keeps refusing calls without trying them (a tripped breaker); 0
        when calls go through. `/readyz` sends it as `Retry-After`."""

    def close(self) -> None:
        """Release connections."""


def not_found(episode_id: str) -> EpisodeNotFoundError:
    """404: no episode `episode_id` (or not the caller's)."""
    return EpisodeNotFoundError(f"no episode {episode_id!r}", "episode_id")


def gone(episode_id: str, reason: str) -> EpisodeGoneError:
    """410: the caller's episode has `reason` ("ended", "expired")."""
    return EpisodeGoneError(f"episode {episode_id!r} has {reason}", "episode_id")


def full(max_episodes: int) -> TooManyEpisodesError:
    """429: the store holds `max_episodes` live episodes."""
    return TooManyEpisodesError(
        f"the service holds its maximum of {max_episodes} live episodes; "
        "end finished episodes or retry later"
    )


def over_quota(quota: int, frees_in_s: float) -> EpisodeQuotaError:
    """429: the owner holds its quota of live episodes, the oldest idle of which expires in
    `frees_in_s` (its `Retry-After`: a slot frees only when an episode ends or expires)."""
    retry_after = max(1, math.ceil(frees_in_s))
    return EpisodeQuotaError(
        f"this token holds its quota of {quota} live episodes; end finished episodes, or retry "
        f"in {retry_after} s when its least recently used episode expires",
        retry_after=retry_after,
    )


def quota_of(owner: str, max_per_owner: int | None) -> int | None:
    """The owner's live-episode quota: none for "" (auth off: one shared principal)."""
    return max_per_owner if owner else None
