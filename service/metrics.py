"""Prometheus metrics, one registry per app (so several apps can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The service's metrics: step latency, batch sizes, episodes, evictions and errors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.step_latency = Histogram(
            "cdt_step_latency_seconds",
            "Time to answer start/step requests, store and forward pass included.",
            ["transport", "kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "cdt_batch_size",
            "Episodes per onnxruntime forward pass.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.active_episodes = Gauge(
            "cdt_active_episodes", "Live episodes in the session store.", registry=self.registry
        )
        self.evictions = Counter(
            "cdt_episode_evictions_total", "Episodes expired after the idle TTL.",
            registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "cdt_errors_total", "Error answers by kind.", ["kind"], registry=self.registry
        )
        self.models = Gauge(
            "cdt_models_loaded", "Model versions served to new episodes.", registry=self.registry
        )

    def track_active_episodes(self, count: Callable[[], float]) -> None:
        """Read the live-episode gauge from the store at scrape time."""
        self.active_episodes.set_function(lambda: float(count()))

    def record_evictions(self, evicted: int) -> None:
        """Hook for the session store."""
        self.evictions.inc(evicted)
