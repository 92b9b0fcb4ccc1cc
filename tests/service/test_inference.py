"""Inference strategies: chosen once from the settings, and each keeps a failed call harmless."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from runtime.policy import Policy
from service.config import Settings
from service.episode_state import EpisodeRecord, advance, next_revision, open_episode
from service.errors import ModelError
from service.inference import (
    Inference,
    LoopInference,
    PendingAction,
    ThreadBatchInference,
    ThreadInference,
    make_inference,
)
from service.main import create_app
from service.metrics import Metrics
from service.repository import ModelRepository
from service.schemas import EpisodeCreate, StepRequest
from service.sessions import InMemorySessionStore, RedisSessionStore, SessionStore

UNREACHABLE = "redis://127.0.0.1:1/0"
MODES = {"loop-batch": LoopInference, "thread": ThreadInference}
MODES["thread-batch"] = ThreadBatchInference
START = EpisodeCreate(model="toy", target_reward=50.0, target_cost=10.0, observation=[0, 0, 1])
STEP = StepRequest(observation=[0.5, 0.0, 1.0], reward=1.0, cost=0.5)


class ExplodingSession:
    """An onnxruntime session stand-in that fails every run."""

    def run(self, *_: Any) -> Any:
        raise RuntimeError("model exploded")


@pytest.fixture
def repository(models_dir: Path) -> ModelRepository:
    repository = ModelRepository(models_dir)
    repository.reload()
    return repository


def memory_store() -> InMemorySessionStore:
    return InMemorySessionStore(ttl_s=60.0, max_episodes=10)


def redis_store() -> RedisSessionStore:
    return RedisSessionStore(UNREACHABLE, ttl_s=60.0, max_episodes=10)  # connects on first use


@pytest.fixture(params=list(MODES))
def inference(
    request: pytest.FixtureRequest, settings: Settings, repository: ModelRepository
) -> Iterator[Inference]:
    chosen = settings.model_copy(update={"inference": request.param})
    strategy = make_inference(chosen, memory_store(), repository, Metrics())
    yield strategy
    strategy.close()


@pytest.mark.parametrize(
    ("mode", "store", "expected"),
    [
        (None, memory_store, LoopInference),
        (None, redis_store, LoopInference),
        ("thread", redis_store, ThreadInference),
        ("thread-batch", memory_store, ThreadBatchInference),
    ],
)
def test_make_inference_picks_the_named_mode_or_the_default_for_the_store(
    settings: Settings, repository: ModelRepository, mode: str | None, store: Any, expected: type
) -> None:
    chosen = settings.model_copy(update={"inference": mode})
    strategy = make_inference(chosen, store(), repository, Metrics())
    assert type(strategy) is expected
    strategy.close()


def test_app_uses_the_mode_of_its_settings(settings: Settings) -> None:
    for mode, strategy in MODES.items():
        with TestClient(create_app(settings.model_copy(update={"inference": mode}))) as client:
            assert type(client.app.state.service.inference) is strategy  # type: ignore[attr-defined]


def started(inference: Inference, policy: Policy) -> EpisodeRecord:
    record = open_episode(START, policy.card, episode_id="e1", seed=3, owner="", now=0.0)
    return asyncio.run(inference.create(PendingAction(policy, record)))


def test_inference_failed_forward_pass_leaves_the_episode_unchanged(
    inference: Inference, repository: ModelRepository
) -> None:
    policy = repository.current("toy")
    before = started(inference, policy)
    broken = replace(policy, session=ExplodingSession(), fingerprint="broken")  # own batcher

    def plan(record: EpisodeRecord) -> PendingAction:
        context = advance(record.context, STEP, policy.card)
        return PendingAction(broken, next_revision(record, context, now=1.0))

    with pytest.raises(ModelError, match="exploded"):
        asyncio.run(inference.mutate("e1", "", plan))
    after = inference.store.get("e1", "")
    assert (after.revision, after.context.step) == (0, 0)
    assert after.context.last_action.tolist() == before.context.last_action.tolist()


def test_inference_plan_without_a_change_writes_nothing(
    inference: Inference, repository: ModelRepository
) -> None:
    before = started(inference, repository.current("toy"))
    kept = asyncio.run(inference.mutate("e1", "", lambda record: record))
    assert kept.revision == before.revision == inference.store.get("e1", "").revision


def test_inference_modes_sample_the_same_actions(
    settings: Settings, repository: ModelRepository
) -> None:
    policy = repository.current("toy")
    actions = []
    for mode in MODES:
        store: SessionStore = memory_store()
        chosen = settings.model_copy(update={"inference": mode})
        strategy = make_inference(chosen, store, repository, Metrics())

        def plan(record: EpisodeRecord) -> PendingAction:
            context = advance(record.context, STEP, policy.card)
            return PendingAction(policy, next_revision(record, context, now=1.0))

        first = started(strategy, policy)
        second = asyncio.run(strategy.mutate("e1", "", plan))
        strategy.close()
        actions.append([first.context.last_action.tolist(), second.context.last_action.tolist()])
    assert actions[0] == actions[1] == actions[2]


def test_loop_batch_that_fails_unexpectedly_releases_its_claims(
    settings: Settings, repository: ModelRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = make_inference(settings, memory_store(), repository, Metrics())
    policy = repository.current("toy")
    started(strategy, policy)

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug after the claims")

    def plan(record: EpisodeRecord) -> PendingAction:
        context = advance(record.context, STEP, policy.card)
        return PendingAction(policy, next_revision(record, context, now=1.0))

    with monkeypatch.context() as patched:
        patched.setattr(LoopInference, "_forward_all", broken)
        with pytest.raises(RuntimeError, match="a bug"):
            asyncio.run(strategy.mutate("e1", "", plan))
    assert asyncio.run(strategy.mutate("e1", "", plan)).revision == 1  # not held any more
    strategy.close()
