"""Turn-batched inference keeps a failed call harmless, and a failure to its own calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime.policy import Policy
from service.config import Settings
from service.episode_state import EpisodeRecord, advance, next_revision, open_episode
from service.errors import ModelError, PolicyOutputError
from service.inference import Inference, PendingAction, Plan
from service.metrics import Metrics
from service.repository import ModelRepository
from service.schemas import EpisodeCreate, StepRequest
from service.stores.memory import InMemorySessionStore

START = EpisodeCreate(model="toy", target_reward=50.0, target_cost=10.0, observation=[0, 0, 1])
STEP = StepRequest(observation=[0.5, 0.0, 1.0], reward=1.0, cost=0.5)


class ExplodingSession:
    """An onnxruntime session stand-in that fails every run."""

    def run(self, *_: Any) -> Any:
        raise RuntimeError("model exploded")


class NonFiniteSession:
    """An onnxruntime session stand-in whose actions are NaN for every window."""

    def run(self, _: Any, inputs: dict[str, Any]) -> Any:
        batch_size = len(inputs["states"])
        return np.full((batch_size, 2), np.nan, np.float32), np.zeros((batch_size, 2), np.float32)


@pytest.fixture
def repository(models_dir: Path) -> ModelRepository:
    repository = ModelRepository(models_dir)
    repository.reload()
    return repository


@pytest.fixture
def inference(settings: Settings) -> Iterator[Inference]:
    made = Inference(InMemorySessionStore(ttl_s=60.0, max_episodes=10), Metrics(), settings)
    yield made
    made.close()


def started(inference: Inference, policy: Policy, episode_id: str = "e1") -> EpisodeRecord:
    record = open_episode(START, policy.card, episode_id=episode_id, seed=3, owner="", now=0.0)
    return asyncio.run(inference.create(PendingAction(policy, record)))


def stepped_with(policy: Policy) -> Plan:
    """A step whose action `policy` is to give."""

    def plan(record: EpisodeRecord) -> PendingAction:
        context = advance(record.context, STEP, policy.card)
        return PendingAction(policy, next_revision(record, context, now=1.0))

    return plan


def test_inference_failed_forward_pass_leaves_the_episode_unchanged(
    inference: Inference, repository: ModelRepository
) -> None:
    policy = repository.current("toy")
    before = started(inference, policy)
    broken = replace(policy, session=ExplodingSession())
    with pytest.raises(ModelError, match="exploded"):
        asyncio.run(inference.mutate("e1", "", stepped_with(broken)))
    after = inference.store.get("e1", "")
    assert (after.revision, after.context.step) == (0, 0)
    assert after.context.last_action.tolist() == before.context.last_action.tolist()


def test_inference_plan_without_a_change_writes_nothing(
    inference: Inference, repository: ModelRepository
) -> None:
    before = started(inference, repository.current("toy"))
    kept = asyncio.run(inference.mutate("e1", "", lambda record: record))
    assert kept.revision == before.revision == inference.store.get("e1", "").revision


def test_non_finite_action_fails_only_the_calls_it_was_for(
    inference: Inference, repository: ModelRepository
) -> None:
    policy = repository.current("toy")
    nan_policy = replace(policy, session=NonFiniteSession())
    for episode_id in ("e1", "e2"):
        started(inference, policy, episode_id)

    async def one_batch() -> list[Any]:  # submitted in one loop turn: one batch
        new = open_episode(START, policy.card, episode_id="e3", seed=1, owner="", now=0.0)
        calls = (
            inference.mutate("e1", "", stepped_with(policy)),
            inference.mutate("e2", "", stepped_with(nan_policy)),
            inference.create(PendingAction(policy, new)),
            inference.create(PendingAction(nan_policy, replace(new, episode_id="e4"))),
        )
        return await asyncio.gather(*calls, return_exceptions=True)

    stepped, refused, created, refused_start = asyncio.run(one_batch())
    assert isinstance(stepped, EpisodeRecord) and stepped.context.step == 1
    assert isinstance(created, EpisodeRecord) and created.episode_id == "e3"
    for error in (refused, refused_start):
        assert isinstance(error, PolicyOutputError) and error.code == "non_finite_action"
    assert inference.store.get("e2", "").revision == 0  # left as it was, and not held
    assert asyncio.run(inference.mutate("e2", "", stepped_with(policy))).revision == 1
    assert inference.store.count() == 3  # e1, e2, e3: no e4
    batches = inference.metrics.batch_size.collect()[0].samples
    assert next(s.value for s in batches if s.name.endswith("_count")) == 2 + 2 + 1


def test_batch_that_fails_unexpectedly_releases_its_claims(
    inference: Inference, repository: ModelRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = repository.current("toy")
    started(inference, policy)

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug after the claims")

    with monkeypatch.context() as patched:
        patched.setattr(Inference, "_forward_all", broken)
        with pytest.raises(RuntimeError, match="a bug"):
            asyncio.run(inference.mutate("e1", "", stepped_with(policy)))
    assert asyncio.run(inference.mutate("e1", "", stepped_with(policy))).revision == 1
