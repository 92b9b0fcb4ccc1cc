"""Service settings, read from `CDT_*` environment variables (and `.env`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    Field,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URL schemes redis-py connects with."""


class Settings(BaseSettings):
    """Everything the service can be told; passed into `create_app(settings)`."""

    model_config = SettingsConfigDict(
        env_prefix="CDT_", env_file=".env", extra="ignore", populate_by_name=True
    )

    models_dir: Path = Path("models")
    """Model repository: every `models_dir/*/model.json` (+ `model.onnx`) is served by name."""
    keep_versions: PositiveInt = 3
    """Versions per model name kept loaded after reloads, for episodes pinned to them."""
    redis_url: str | None = Field(
        default=None, validation_alias=AliasChoices("CDT_REDIS_URL", "REDIS_URL")
    )
    """Session store: Redis when set (several workers or replicas), in-memory otherwise."""
    redis_prefix: str = Field(default="cdt", min_length=1, max_length=64)
    """Key prefix in Redis, so several deployments can share one server."""
    redis_socket_timeout_s: PositiveFloat = 0.25
    """Longest wait for one Redis reply; a hung Redis answers 503 after this, not after minutes.
    A local Redis answers in well under a millisecond."""
    redis_connect_timeout_s: PositiveFloat = 0.25
    """Longest wait for a Redis connection."""
    redis_breaker_failures: PositiveInt = 3
    """Consecutive Redis failures after which calls answer 503 at once, without trying Redis."""
    redis_breaker_cooldown_s: PositiveFloat = 2.0
    """Longest time the tripped breaker answers 503 without trying Redis; a probe closes it
    sooner, as soon as Redis answers again."""
    redis_probe_interval_s: PositiveFloat = 0.1
    """While the breaker is open, or locks of calls that timed out may linger, a background
    probe tries Redis this often; its first success closes the breaker and releases those
    locks, so a short stall costs about this much after Redis is back, not the cool-down."""
    redis_lock_ttl_s: PositiveFloat = 5.0
    """Expiry of a Redis episode lock, so a replica that dies mid-step frees the episode."""
    episode_lock_wait_s: PositiveFloat = 2.0
    """How long a request waits for another request on the same episode (a step's forward pass)
    before answering 409 `episode_busy` with `Retry-After`."""
    episode_ttl_s: PositiveFloat = 600.0
    """Idle episodes expire after this many seconds."""
    ended_ttl_s: PositiveFloat = 3600.0
    """How long ended or expired episode ids answer 410 instead of 404."""
    max_episodes: PositiveInt = 10_000
    """Cap on live episodes; creating one more answers 429."""
    max_episodes_per_token: PositiveInt = 1_000
    """Live episodes one token may hold; one more answers 429 `episode_quota_exceeded`, so a
    client that abandons episodes cannot lock the others out. Without tokens (one shared
    principal) only `max_episodes` applies."""
    max_body_bytes: PositiveInt = 256 * 1024
    """Larger request bodies answer 413; also the websocket frame limit."""
    api_tokens: Annotated[frozenset[str], NoDecode] = frozenset()
    """Bearer tokens accepted on /v1 (comma-separated in the env); empty disables auth. Each
    token is its own principal: it sees only the episodes it started."""
    admin_tokens: Annotated[frozenset[str], NoDecode] = frozenset()
    """Tokens that may also call /v1/admin/* (comma-separated); they are added to `api_tokens`.
    With no token configured at all, /v1/admin/* is open like the rest (local use)."""
    intra_op_threads: PositiveInt = 1
    """onnxruntime threads per forward pass. 1 on purpose: concurrent episodes already run
    their forward passes in parallel threads (onnxruntime releases the GIL); 2 threads served
    about 20 % fewer steps/s at 64 episodes (docs/serving.md#settings has the figures)."""
    inter_op_threads: PositiveInt = 1
    """onnxruntime threads across independent graph branches (sequential executor: 1)."""
    batch_max_size: PositiveInt = 32
    """Largest batch of calls: those of one event-loop turn run as one batch (store reads, one
    onnxruntime call per model, store writes; `service.inference`)."""
    batch_threads: PositiveInt = 2
    """Batches in flight at once, each in its own thread. onnxruntime releases the GIL, so on 2
    cores two batches' forward passes run in parallel while the loop serves."""

    # connection guards: the HTTP timeouts and limits are applied by
    # `service.http_guard.GuardedHTTPProtocol`
    # (`cdt serve`, or `uvicorn --http service.http_guard:GuardedHTTPProtocol`)
    http_header_timeout_s: PositiveFloat = 10.0
    """A connection must send a complete request head within this many seconds of opening or of
    its previous response, or it is closed (uvicorn has no header timeout of its own)."""
    http_keep_alive_s: PositiveFloat = 5.0
    """Idle keep-alive connections close after this many seconds (replaces uvicorn's
    `--timeout-keep-alive`)."""
    http_body_timeout_s: PositiveFloat = 20.0
    """A request body must be complete within this many seconds of its head, or the connection
    gets 408 `request_timeout` and is closed (the head timeout ends once the head is read)."""
    http_max_connections: PositiveInt = 1000
    """Open connections (websockets included) per worker; a new connection past it gets 503 and
    is closed (a few may first send one `GET /livez`: `service.http_guard`). Keep it below the
    process's file limit (`ulimit -n`, often 1024): a 2-core worker serves far fewer active
    clients than this, so it only bounds idle or slow sockets."""
    ws_idle_timeout_s: PositiveFloat = 60.0
    """A websocket on which no message (text or binary frame) arrives for this many seconds is
    closed with 1001, so idle sockets cannot hold `http_max_connections` for ever. Pings do not
    count: client libraries send them on their own, whether or not the client is in use."""
    ws_max_invalid_frames: PositiveInt = 20
    """Consecutive invalid websocket frames (bad JSON, schema violations) before close 1008."""
    ws_max_episodes_per_socket: PositiveInt = 256
    """Live episodes one websocket may have started (and not ended over it); one more `start`
    answers 429 `socket_episode_limit`, so one socket cannot pile up episodes that outlive it."""
    public_metrics: bool = False
    """With tokens configured, serve `/metrics` without a token too (off: it needs one of the
    API tokens, like /v1). Without tokens everything is open anyway."""
    public_docs: bool = False
    """With tokens configured, serve `/docs`, `/redoc` and `/openapi.json` without a token too
    (off: they need one of the API tokens). Without tokens everything is open anyway."""
    not_ready_retry_after_s: PositiveInt = 5
    """`Retry-After` of a 503 `/readyz` (no model, refused models, a failing store), unless the
    Redis breaker's cool-down is longer."""

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(REDIS_SCHEMES):
            raise ValueError(f"must start with one of {', '.join(REDIS_SCHEMES)}")
        return value

    @field_validator("api_tokens", "admin_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            return frozenset(token.strip() for token in value.split(",") if token.strip())
        return value

    @model_validator(mode="after")
    def _admins_are_api_tokens(self) -> Settings:
        # one set for every auth check (REST and websocket); admin rights are checked on top
        self.api_tokens = self.api_tokens | self.admin_tokens
        return self
