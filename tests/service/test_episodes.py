"""REST API v1: episodes from start to end, budgets, retries, races and every way to get it
wrong."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.config import Settings
from service.episode_state import Outputs
from service.inference import Inference
from service.main import create_app
from service.stores.memory import InMemorySessionStore
from tests.service.clock import FakeClock

OBSERVATION = [0.1, -0.2, 0.3]
START = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION}
STEP = {"observation": OBSERVATION, "reward": 1.0, "cost": 0.5}


def start(client: TestClient, **overrides: Any) -> dict[str, Any]:
    body = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION}
    response = client.post("/v1/episodes", json=body | overrides)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def step(client: TestClient, episode_id: str, **overrides: Any) -> Any:
    body = {"observation": OBSERVATION, "reward": 1.0, "cost": 0.5} | overrides
    return client.post(f"/v1/episodes/{episode_id}/step", json=body)


def run(client: TestClient, seed: int, steps: int = 5, **overrides: Any) -> list[list[float]]:
    started = start(client, seed=seed, **overrides)
    actions = [started["action"]]
    for _ in range(steps):
        actions.append(step(client, started["episode_id"]).json()["action"])
    return actions


def test_create_episode_returns_first_action_and_budgets(client: TestClient) -> None:
    started = start(client, seed=1)
    assert started["step"] == 0 and started["model_version"] == "1"
    assert started["remaining_reward"] == 50.0 and started["remaining_cost"] == 10.0
    assert len(started["action"]) == 2 and not started["budget_exhausted"]


def test_step_subtracts_reward_and_cost(client: TestClient) -> None:
    started = start(client)
    reply = step(client, started["episode_id"], reward=2.0, cost=3.0).json()
    assert (reply["step"], reply["remaining_reward"], reply["remaining_cost"]) == (1, 48.0, 7.0)


def test_episode_same_seed_gives_same_actions(client: TestClient) -> None:
    assert run(client, seed=3) == run(client, seed=3)
    # sampled actions: the budget guard would act with the mean at 10 left of 100 steps
    assert run(client, seed=3, budget_guard=False) != run(client, seed=4, budget_guard=False)


def test_episode_actions_stay_within_the_action_bounds(client: TestClient) -> None:
    for action in run(client, seed=0, steps=20):
        assert all(-1.0 <= value <= 1.0 for value in action)


def test_episode_deterministic_returns_the_mean(client: TestClient) -> None:
    first = run(client, seed=1, deterministic=True)
    assert first == run(client, seed=2, deterministic=True)


def test_step_exhausted_budget_clamps_at_zero_and_says_so(client: TestClient) -> None:
    started = start(client, target_cost=1.0)
    reply = step(client, started["episode_id"], cost=5.0).json()
    assert reply["remaining_cost"] == 0.0 and reply["budget_exhausted"]
    state = client.get(f"/v1/episodes/{started['episode_id']}").json()
    assert state["total_cost"] == 5.0 and state["remaining_cost"] == 0.0


def test_budget_change_changes_the_next_action(client: TestClient) -> None:
    actions = []
    for cost_limit in (None, 40.0):
        started = start(client, seed=0, deterministic=True)
        if cost_limit is not None:
            patched = client.patch(
                f"/v1/episodes/{started['episode_id']}/budget", json={"cost_limit": cost_limit}
            )
            assert patched.status_code == 200 and patched.json()["remaining_cost"] == 40.0
        actions.append(step(client, started["episode_id"], cost=0.0).json()["action"])
    assert actions[0] != actions[1]


def test_budget_cost_limit_subtracts_cost_already_spent(client: TestClient) -> None:
    episode_id = start(client)["episode_id"]
    step(client, episode_id, cost=4.0)
    state = client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 6.0}).json()
    assert state["remaining_cost"] == 2.0 and state["target_cost"] == 6.0
    state = client.patch(f"/v1/episodes/{episode_id}/budget", json={"remaining_cost": 9.0}).json()
    assert state["remaining_cost"] == 9.0 and state["target_cost"] == 13.0


def test_a_cut_below_the_cost_spent_says_the_episode_is_over_budget(client: TestClient) -> None:
    episode_id = start(client, target_cost=40.0)["episode_id"]
    step(client, episode_id, cost=14.0)
    assert not client.get(f"/v1/episodes/{episode_id}").json()["over_budget"]
    cut = client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 10.0}).json()
    assert cut["over_budget"] and cut["remaining_cost"] == 0.0
    assert (
        cut["warnings"][0] == "cost spent 14 exceeds the cost limit 10: the episode is over budget"
    )
    assert client.get(f"/v1/episodes/{episode_id}").json()["over_budget"]
    raised = client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 20.0}).json()
    assert not raised["over_budget"] and not raised["warnings"]


def test_a_step_whose_cost_passes_the_limit_answers_that_the_episode_is_over_budget(
    client: TestClient,
) -> None:
    episode_id = start(client, target_cost=10.0)["episode_id"]
    within = step(client, episode_id, cost=10.0).json()
    assert not within["over_budget"] and not within["warnings"]
    over = step(client, episode_id, cost=1.0).json()
    assert over["over_budget"] and over["remaining_cost"] == 0.0
    assert over["warnings"] == [
        "cost spent 11 exceeds the cost limit 10: the episode is over budget"
    ]
    fractional = start(client, target_cost=0.3)["episode_id"]
    for _ in range(3):
        met = step(client, fractional, cost=0.1).json()  # 0.30000000000000004 in all
    assert not met["over_budget"] and "exceeds" not in str(met["warnings"])


def test_budget_outside_validated_range_warns(client: TestClient) -> None:
    assert start(client, target_cost=100.0)["warnings"]
    episode_id = start(client, target_cost=10.0)["episode_id"]
    state = client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 1.0}).json()
    assert "validated range" in state["warnings"][0]
    assert "validated range" in step(client, episode_id).json()["warnings"][0]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"cost_limit": 1.0, "remaining_cost": 1.0},
        {"cost_limit": -1.0},
        {"target_reward": "lots"},
        {"cost_limit": 1.0, "surprise": 1},
    ],
)
def test_budget_invalid_body_returns_422_and_keeps_the_episode(
    client: TestClient, body: dict[str, Any]
) -> None:
    episode_id = start(client)["episode_id"]
    before = client.get(f"/v1/episodes/{episode_id}").json()
    response = client.patch(f"/v1/episodes/{episode_id}/budget", json=body)
    assert response.status_code == 422 and response.json()["code"] == "validation_error"
    assert client.get(f"/v1/episodes/{episode_id}").json() == before


def test_step_retry_of_the_last_step_returns_the_same_action(client: TestClient) -> None:
    episode_id = start(client, seed=2)["episode_id"]
    first = step(client, episode_id, step=1).json()
    again = step(client, episode_id, step=1).json()
    assert again == first
    assert client.get(f"/v1/episodes/{episode_id}").json()["total_reward"] == 1.0


def test_step_out_of_order_returns_409_step_out_of_order(client: TestClient) -> None:
    episode_id = start(client)["episode_id"]
    response = step(client, episode_id, step=5)
    assert response.status_code == 409 and response.json()["field"] == "step"
    assert response.json()["code"] == "step_out_of_order"
    assert "retry-after" not in response.headers  # the step count is wrong: do not retry
    assert step(client, episode_id, step=0).status_code == 200  # a retry of action 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"observation": [0.1, 0.2]}, "observation"),
        ({"observation": [0.1, 0.2, "nan"]}, "observation.2"),
        ({"observation": [0.1, 0.2, 1e300]}, "observation.2"),
        ({"observation": "abc"}, "observation"),
        ({"observation": []}, "observation"),
        ({"reward": "Infinity"}, "reward"),
        ({"reward": None}, "reward"),
        ({"reward": True}, "reward"),
        ({"observation": ["0.1", 0.2, 0.3]}, "observation.0"),
        ({"cost": -1.0}, "cost"),
        ({"step": -1}, "step"),
        ({"extra": 1}, "extra"),
    ],
)
def test_step_bad_input_returns_422_naming_the_field_and_keeps_the_episode(
    client: TestClient, overrides: dict[str, Any], field: str
) -> None:
    episode_id = start(client)["episode_id"]
    before = client.get(f"/v1/episodes/{episode_id}").json()
    response = step(client, episode_id, **overrides)
    assert response.status_code == 422
    assert response.json()["field"] == field
    assert client.get(f"/v1/episodes/{episode_id}").json() == before


def test_step_malformed_json_returns_422(client: TestClient) -> None:
    episode_id = start(client)["episode_id"]
    response = client.post(
        f"/v1/episodes/{episode_id}/step",
        content=b'{"observation": [1,',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422 and response.json()["code"] == "validation_error"


@pytest.mark.parametrize(
    ("overrides", "status", "field"),
    [
        ({"model": "nope"}, 404, "model"),
        ({"model": "../etc"}, 422, "model"),
        ({"target_cost": -1.0}, 422, "target_cost"),
        ({"observation": [1.0]}, 422, "observation"),
        ({"seed": -3}, 422, "seed"),
        ({"deterministic": "maybe"}, 422, "deterministic"),
    ],
)
def test_create_episode_bad_input_returns_4xx_naming_the_field(
    client: TestClient, overrides: dict[str, Any], status: int, field: str
) -> None:
    body = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION}
    response = client.post("/v1/episodes", json=body | overrides)
    assert response.status_code == status
    assert response.json()["field"] == field


def test_step_oversized_body_returns_413(client: TestClient) -> None:
    episode_id = start(client)["episode_id"]
    response = step(client, episode_id, observation=[0.123456789] * 30_000)
    assert response.status_code == 413 and response.json()["code"] == "payload_too_large"


def test_streamed_oversized_body_returns_413(client: TestClient) -> None:
    chunks = (b"x" * 100_000 for _ in range(4))  # no content-length: chunked upload
    response = client.post("/v1/episodes", content=chunks)
    assert response.status_code == 413


def test_step_unknown_episode_returns_404(client: TestClient) -> None:
    response = step(client, "0123456789abcdef")
    assert response.status_code == 404 and response.json()["field"] == "episode_id"


def test_end_episode_returns_summary_then_410(client: TestClient) -> None:
    episode_id = start(client)["episode_id"]
    step(client, episode_id, reward=3.0, cost=1.0)
    summary = client.delete(f"/v1/episodes/{episode_id}").json()
    assert (summary["steps"], summary["total_reward"], summary["total_cost"]) == (2, 3.0, 1.0)
    assert step(client, episode_id).status_code == 410
    assert client.get(f"/v1/episodes/{episode_id}").status_code == 410
    assert client.delete(f"/v1/episodes/{episode_id}").status_code == 410


def test_episode_idle_past_ttl_returns_410(settings: Settings) -> None:
    clock = FakeClock()
    store = InMemorySessionStore(ttl_s=30.0, max_episodes=10, clock=clock)
    with TestClient(create_app(settings, store=store)) as client:
        episode_id = start(client)["episode_id"]
        clock.now = 31.0
        response = step(client, episode_id)
        assert response.status_code == 410 and "expired" in response.json()["detail"]
        assert "cdt_episode_evictions_total 1.0" in client.get("/metrics").text


def test_create_episode_over_the_cap_returns_429(settings: Settings) -> None:
    capped = settings.model_copy(update={"max_episodes": 1})
    with TestClient(create_app(capped)) as client:
        start(client)
        response = client.post(
            "/v1/episodes",
            json={"model": "toy", "target_reward": 1, "target_cost": 1, "observation": OBSERVATION},
        )
        assert response.status_code == 429 and "maximum of 1" in response.json()["detail"]
        assert response.json()["code"] == "too_many_episodes"
        assert response.headers["retry-after"] == "1"


def test_create_episode_over_the_token_quota_returns_429_with_retry_after(
    settings: Settings,
) -> None:
    tokens = {"api_tokens": frozenset({"a", "b"}), "max_episodes_per_token": 1}
    with TestClient(create_app(settings.model_copy(update=tokens))) as client:
        first, second = {"Authorization": "Bearer a"}, {"Authorization": "Bearer b"}
        assert client.post("/v1/episodes", json=START, headers=first).status_code == 201
        response = client.post("/v1/episodes", json=START, headers=first)
        assert response.status_code == 429  # a slot frees when the first episode expires
        assert response.headers["retry-after"] == str(int(settings.episode_ttl_s))
        assert response.json()["code"] == "episode_quota_exceeded"
        assert client.post("/v1/episodes", json=START, headers=second).status_code == 201


def test_get_episode_reports_state_and_totals(client: TestClient) -> None:
    episode_id = start(client, seed=9)["episode_id"]
    step(client, episode_id, reward=2.0, cost=1.0)
    state = client.get(f"/v1/episodes/{episode_id}").json()
    assert state["seed"] == 9 and state["step"] == 1
    assert (state["total_reward"], state["total_cost"]) == (2.0, 1.0)
    assert state["expires_at"] > state["created_at"]


def test_concurrent_steps_share_forward_passes_and_keep_their_own_actions(
    settings: Settings,
) -> None:
    app = create_app(settings)
    body = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION}

    async def six_episodes() -> tuple[list[list[list[float]]], float]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                started = await asyncio.gather(
                    *(client.post("/v1/episodes", json=body | {"seed": seed}) for seed in range(6))
                )
                ids = [response.json()["episode_id"] for response in started]
                step_body = {"observation": OBSERVATION, "reward": 1.0, "cost": 0.5}
                stepped = await asyncio.gather(
                    *(client.post(f"/v1/episodes/{id_}/step", json=step_body) for id_ in ids)
                )
            batch_count = app.state.service.metrics.batch_size.collect()[0].samples
            passes = next(sample.value for sample in batch_count if sample.name.endswith("_count"))
        pairs = zip(started, stepped, strict=True)
        actions = [[first.json()["action"], second.json()["action"]] for first, second in pairs]
        return actions, passes

    together, forward_passes = asyncio.run(six_episodes())
    assert forward_passes < 12  # 12 actions from fewer onnxruntime calls
    with TestClient(create_app(settings)) as client:
        for seed, actions in enumerate(together):
            np.testing.assert_allclose(actions, run(client, seed=seed, steps=1), rtol=1e-6)


# ---- concurrent requests on one episode ---------------------------------------------------------

AppsFactory = Callable[..., list[FastAPI]]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def make_apps(request: pytest.FixtureRequest, settings: Settings) -> AppsFactory:
    """The apps of one way of serving: one app in memory, or two replicas over one Redis (then
    requests on one episode go to different replicas)."""

    def make(**overrides: Any) -> list[FastAPI]:
        if request.param == "redis":
            redis_settings: Settings = request.getfixturevalue("redis_settings")
            shared = redis_settings.model_copy(update=overrides)
            return [create_app(shared), create_app(shared)]
        app = create_app(settings.model_copy(update=overrides))
        return [app, app]

    return make


@asynccontextmanager
async def serving(apps: list[FastAPI]) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Started apps and a client of each, on this event loop."""
    async with AsyncExitStack() as stack:
        for app in dict.fromkeys(apps):  # each distinct app started once
            await stack.enter_async_context(app.router.lifespan_context(app))
        clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
            for app in apps
        ]
        for client in clients:
            await stack.enter_async_context(client)
        yield clients


class ForwardGate:
    """Holds every forward pass (in a batch thread) while closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.opened = threading.Event(), threading.Event()
        self.opened.set()
        monkeypatch.setattr(Inference, "forward", self._held(Inference.forward))
        monkeypatch.setattr(Inference, "inline_lone_calls", False)  # held off the loop

    def _held(self, forward: Callable[..., Outputs]) -> Any:
        def held(inference: Inference, *args: Any) -> Outputs:
            self.entered.set()
            self.opened.wait(5)
            return forward(inference, *args)

        return held

    def close(self) -> None:
        self.entered.clear()
        self.opened.clear()


async def during_a_step(
    apps: list[FastAPI],
    gate: ForwardGate,
    *calls: tuple[str, str, dict[str, Any]],
    hold_s: float | None = 0.2,
) -> tuple[list[httpx.Response], dict[str, Any]]:
    """Step 1 of a new episode, `calls` (method, path suffix, body) sent to the other replica
    while its forward pass is held for `hold_s` (None: until the calls answer); the step's
    reply, the calls' replies and the final state."""
    async with serving(apps) as (first, other):
        path = "/v1/episodes/" + (await first.post("/v1/episodes", json=START)).json()["episode_id"]
        gate.close()
        stepping = asyncio.create_task(first.post(f"{path}/step", json=STEP | {"step": 1}))
        await asyncio.to_thread(gate.entered.wait, 5)
        sent = [
            asyncio.create_task(other.request(method, path + suffix, json=body))
            for method, suffix, body in calls
        ]
        await asyncio.wait(sent, timeout=hold_s)  # unserialised, they finish here: a broken step
        gate.opened.set()
        replies = [await stepping, *[await task for task in sent]]
        return replies, (await first.get(path)).json()


def test_budget_change_and_retry_during_a_step_wait_for_it_and_all_succeed(
    make_apps: AppsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ForwardGate(monkeypatch)
    calls = [("PATCH", "/budget", {"cost_limit": 20.0}), ("POST", "/step", STEP | {"step": 1})]
    replies, state = asyncio.run(during_a_step(make_apps(), gate, *calls))
    assert [reply.status_code for reply in replies] == [200, 200, 200], [r.text for r in replies]
    stepped, _, retried = (reply.json() for reply in replies)
    assert retried["action"] == stepped["action"] and retried["step"] == 1
    assert (state["step"], state["total_cost"], state["target_cost"]) == (1, 0.5, 20.0)
    assert state["remaining_cost"] == 19.5


def test_request_held_past_the_lock_wait_gets_a_retryable_409(
    make_apps: AppsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ForwardGate(monkeypatch)
    apps = make_apps(episode_lock_wait_s=0.05)
    replies, state = asyncio.run(during_a_step(apps, gate, ("DELETE", "", {}), hold_s=None))
    stepped, refused = replies
    assert stepped.status_code == 200 and refused.status_code == 409
    assert refused.json()["code"] == "episode_busy" and refused.headers["retry-after"] == "1"
    assert state["step"] == 1


def test_concurrent_budget_changes_and_numbered_steps_all_succeed(make_apps: AppsFactory) -> None:
    async def many_episodes() -> tuple[list[httpx.Response], list[dict[str, Any]]]:
        async with serving(make_apps()) as (first, other):
            started = await asyncio.gather(
                *(first.post("/v1/episodes", json=START | {"seed": seed}) for seed in range(16))
            )
            paths = ["/v1/episodes/" + reply.json()["episode_id"] for reply in started]
            replies: list[httpx.Response] = []
            for t in (1, 2, 3):  # each step sent twice (a retry) racing a budget change
                numbered = STEP | {"step": t}
                replies += await asyncio.gather(
                    *(
                        call
                        for path in paths
                        for call in (
                            first.post(f"{path}/step", json=numbered),
                            other.patch(f"{path}/budget", json={"cost_limit": 10.0 + t}),
                            other.post(f"{path}/step", json=numbered),
                        )
                    )
                )
            states = await asyncio.gather(*(first.get(path) for path in paths))
        return replies, [state.json() for state in states]

    replies, states = asyncio.run(many_episodes())
    failed = [reply.text for reply in replies if reply.status_code != 200]
    assert not failed, f"{len(failed)} of {len(replies)} failed: {failed[:3]}"
    answers = [reply.json() for reply in replies]
    for step_reply, _, retry_reply in zip(answers[::3], answers[1::3], answers[2::3], strict=True):
        assert step_reply["action"] == retry_reply["action"]
    for state in states:
        assert (state["step"], state["total_cost"], state["target_cost"]) == (3, 1.5, 13.0)
        assert state["remaining_cost"] == 11.5
