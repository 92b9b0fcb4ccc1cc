"""Prometheus metrics, one registry per app (so several apps can live in one test process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.schemas import EpisodeSummary

LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
COST_RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
"""Total cost / cost limit of ended episodes: over 1.0 is over budget."""
COST_RATIO_CAP = 10.0
"""Ratios above this (and any cost against a limit of 0) are observed as this, so the histogram's
sum stays finite."""


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
        self.store_latency = Histogram(
            "cdt_store_latency_seconds",
            "Round trips to the session store (Redis) by operation, failed ones included.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.store_breaker_open = Gauge(
            "cdt_store_breaker_open",
            "1 while the Redis breaker answers 503 without trying Redis, else 0.",
            registry=self.registry,
        )

        self._add_adherence_metrics()

    def _add_adherence_metrics(self) -> None:
        """Budget adherence per model: what operators watch to see a model break budgets."""
        by_model = ["model", "budget_guard"]
        self.episodes_ended = Counter(
            "cdt_episodes_ended_total", "Episodes ended by their client, by model and guard.",
            by_model, registry=self.registry,
        )  # fmt: skip
        self.episodes_over_budget = Counter(
            "cdt_episodes_over_budget_total",
            "Ended episodes whose total cost exceeded the cost limit in force at their end.",
            by_model, registry=self.registry,
        )  # fmt: skip
        self.budget_overruns = Counter(
            "cdt_budget_overruns_total",
            "Steps whose cost took an episode's total past its cost limit, counted as they"
            " happen (episodes that later expire unended included), by model and guard.",
            by_model, registry=self.registry,
        )  # fmt: skip
        self.cost_ratio = Histogram(
            "cdt_episode_cost_ratio",
            f"Ended episodes' total cost / cost limit (capped at {COST_RATIO_CAP:g}).",
            by_model, buckets=COST_RATIO_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.guarded_steps = Counter(
            "cdt_budget_guard_steps_total",
            "Actions the budget guard changed, by model and what it did; counted as episodes end.",
            ["model", "action"], registry=self.registry,
        )  # fmt: skip
        self.model_step_latency = Histogram(
            "cdt_model_step_latency_seconds",
            "Time to choose an action (store and forward pass included), by model.",
            ["model", "kind"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.model_errors = Counter(
            "cdt_model_errors_total",
            "Forward passes that failed or gave a non-finite action, by model.",
            ["model", "code"], registry=self.registry,
        )  # fmt: skip

    def record_episode_end(self, summary: EpisodeSummary) -> None:
        """Count an ended episode's budget adherence and guarded steps."""
        labels = (summary.model, "on" if summary.budget_guard else "off")
        self.episodes_ended.labels(*labels).inc()
        if summary.over_budget:
            self.episodes_over_budget.labels(*labels).inc()
        self.cost_ratio.labels(*labels).observe(cost_ratio(summary))
        for action, steps in summary.guarded_steps_by_action.items():
            if steps:
                self.guarded_steps.labels(summary.model, action).inc(steps)

    def record_overrun(self, model: str, budget_guard: bool) -> None:
        """Count a step that took its episode over its cost limit."""
        self.budget_overruns.labels(model, "on" if budget_guard else "off").inc()

    def track_active_episodes(self, count: Callable[[], float]) -> None:
        """Read the live-episode gauge from the store at scrape time."""
        self.active_episodes.set_function(lambda: float(count()))

    def record_evictions(self, evicted: int) -> None:
        """Hook for the session store."""
        self.evictions.inc(evicted)

    def track_store(self, unavailable_for: Callable[[], float]) -> None:
        """Read the breaker gauge from the store (`SessionStore.unavailable_for`) at scrape time."""
        self.store_breaker_open.set_function(lambda: float(unavailable_for() > 0))

    def record_store_call(self, operation: str, seconds: float) -> None:
        """Hook for the session store (`SessionStore.on_call`)."""
        self.store_latency.labels(operation).observe(seconds)


def cost_ratio(summary: EpisodeSummary) -> float:
    """Total cost / cost limit, capped at `COST_RATIO_CAP` (any cost against a limit of 0: the
    cap; none: 0)."""
    limit = summary.target_cost or 0.0
    if limit <= 0.0:
        return COST_RATIO_CAP if summary.total_cost > 0.0 else 0.0
    return min(summary.total_cost / limit, COST_RATIO_CAP)
