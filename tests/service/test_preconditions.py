"""Preconditions of a change: a stale revision or a passed deadline gets 412 and changes nothing,
on REST and the websocket, in memory and on Redis, however late a frozen replica applies it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.errors import DeadlinePassedError, InvalidInputError, RevisionMismatchError
from service.main import create_app
from service.preconditions import Precondition, parse_if_match, unmet
from service.stores.base import Claimed, SessionStore
from tests.service.test_episodes import START, STEP, ForwardGate, serving


def test_parse_if_match_reads_one_revision_or_any() -> None:
    assert [parse_if_match(value) for value in ('"7"', " 7 ", "*", None)] == [7, 7, None, None]
    for value in ('W/"7"', '"1", "2"', '"x"', ""):
        with pytest.raises(InvalidInputError):
            parse_if_match(value)


def test_unmet_names_the_stored_revision_or_the_passed_deadline() -> None:
    assert unmet(Precondition(revision=3, deadline=10.0), 3, now=9.0) is None
    stale = unmet(Precondition(revision=2), 3, now=0.0)
    assert isinstance(stale, RevisionMismatchError) and stale.revision == 3
    assert stale.headers() == {"ETag": '"3"'} and stale.status_code == 412
    assert isinstance(unmet(Precondition(deadline=10.0), 3, now=10.5), DeadlinePassedError)
    assert Precondition.of(None, None) is None


# ---- REST, one replica ---------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def served(request: pytest.FixtureRequest, settings: Settings) -> Iterator[TestClient]:
    """A client of one app, on the in-memory store or on Redis."""
    if request.param == "redis":
        settings = request.getfixturevalue("redis_settings")
    with TestClient(create_app(settings)) as client:
        yield client


def if_match(reply: httpx.Response) -> dict[str, str]:
    """The header that makes a change apply only to the revision `reply` left."""
    return {"If-Match": reply.headers["etag"]}


def test_answers_carry_the_revision_as_etag(served: TestClient) -> None:
    started = served.post("/v1/episodes", json=START)
    path = f"/v1/episodes/{started.json()['episode_id']}"
    stepped = served.post(f"{path}/step", json=STEP, headers=if_match(started))
    changed = served.patch(f"{path}/budget", json={"cost_limit": 5.0}, headers=if_match(stepped))
    replies = [started, stepped, changed, served.get(path)]
    assert [reply.headers["etag"] for reply in replies] == ['"0"', '"1"', '"2"', '"2"']
    assert [reply.json()["revision"] for reply in replies] == [0, 1, 2, 2]


def test_stale_budget_change_returns_412_and_keeps_the_budget(served: TestClient) -> None:
    started = served.post("/v1/episodes", json=START)
    path = f"/v1/episodes/{started.json()['episode_id']}"
    first = served.patch(f"{path}/budget", json={"cost_limit": 5.0}, headers=if_match(started))
    newer = served.patch(f"{path}/budget", json={"cost_limit": 30.0}, headers=if_match(first))
    replayed = served.patch(f"{path}/budget", json={"cost_limit": 5.0}, headers=if_match(started))
    assert (first.status_code, newer.status_code, replayed.status_code) == (200, 200, 412)
    assert replayed.json()["code"] == "revision_mismatch"
    assert "revision 2" in replayed.json()["detail"] and replayed.headers["etag"] == '"2"'
    state = served.get(path).json()
    assert (state["target_cost"], state["revision"]) == (30.0, 2)


def test_stale_step_returns_412_but_a_retried_step_gets_its_action(served: TestClient) -> None:
    started = served.post("/v1/episodes", json=START)
    path = f"/v1/episodes/{started.json()['episode_id']}"
    stepped = served.post(f"{path}/step", json=STEP, headers=if_match(started))
    replayed = served.post(f"{path}/step", json=STEP, headers=if_match(started))  # no index
    assert (stepped.status_code, replayed.status_code) == (200, 412)
    assert replayed.json()["code"] == "revision_mismatch"
    numbered = STEP | {"step": 2}
    second = served.post(f"{path}/step", json=numbered, headers=if_match(stepped))
    retried = served.post(f"{path}/step", json=numbered, headers=if_match(stepped))
    assert retried.status_code == 200 and retried.json()["action"] == second.json()["action"]
    state = served.get(path).json()
    assert (state["step"], state["total_cost"]) == (2, 1.0)


def test_change_past_its_deadline_returns_412_and_changes_nothing(served: TestClient) -> None:
    path = f"/v1/episodes/{served.post('/v1/episodes', json=START).json()['episode_id']}"
    late = {"X-Request-Deadline": f"{time.time() - 0.5:.6f}"}
    refused = [
        served.post(f"{path}/step", json=STEP, headers=late),
        served.patch(f"{path}/budget", json={"cost_limit": 5.0}, headers=late),
    ]
    assert [(reply.status_code, reply.json()["code"]) for reply in refused] == [
        (412, "deadline_passed")
    ] * 2
    state = served.get(path).json()
    assert (state["step"], state["target_cost"], state["revision"]) == (0, 10.0, 0)
    soon = {"X-Request-Deadline": str(time.time() + 30)}
    assert served.post(f"{path}/step", json=STEP, headers=soon).status_code == 200


@pytest.mark.parametrize(
    ("header", "value"),
    [("If-Match", 'W/"0"'), ("X-Request-Deadline", "soon"), ("X-Request-Deadline", "inf")],
)
def test_unreadable_precondition_returns_422(client: TestClient, header: str, value: str) -> None:
    path = f"/v1/episodes/{client.post('/v1/episodes', json=START).json()['episode_id']}"
    reply = client.post(f"{path}/step", json=STEP, headers={header: value})
    assert reply.status_code == 422 and reply.json()["code"] in {
        "invalid_input",
        "validation_error",
    }
    assert client.get(path).json()["step"] == 0


# ---- frozen replicas ---------------------------------------------------------------------------


class Freeze:
    """Holds a replica's next store claim in its batch thread: a replica stopped (SIGSTOP)
    after it received a request and before it applied it."""

    def __init__(self, store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered, self.resumed = threading.Event(), threading.Event()
        claim_many = store.claim_many

        def frozen(episodes: list[tuple[str, str]]) -> list[Claimed]:
            self.entered.set()
            self.resumed.wait(5)
            return claim_many(episodes)

        monkeypatch.setattr(store, "claim_many", frozen)

    async def frozen_call(self, call: Any) -> asyncio.Task[httpx.Response]:
        """`call` sent and held before it applies (resume with `resumed.set()`)."""
        task = asyncio.create_task(call)
        await asyncio.to_thread(self.entered.wait, 5)
        return task


@pytest.mark.redis
def test_frozen_replica_cannot_revert_a_newer_budget(
    redis_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[httpx.Response]:
        apps = [create_app(redis_settings), create_app(redis_settings)]
        async with serving(apps) as (frozen, other):
            started = await frozen.post("/v1/episodes", json=START)
            budget = f"/v1/episodes/{started.json()['episode_id']}/budget"
            freeze = Freeze(apps[0].state.service.store, monkeypatch)
            change = {"json": {"cost_limit": 5.0}, "headers": if_match(started)}
            held = await freeze.frozen_call(frozen.patch(budget, **change))
            resent = await other.patch(budget, **change)  # the client gave up on the frozen one
            newer = {"cost_limit": 30.0}
            changed = await other.patch(budget, json=newer, headers=if_match(resent))
            freeze.resumed.set()
            return [resent, changed, await held, await other.get(budget.removesuffix("/budget"))]

    resent, changed, replayed, state = asyncio.run(scenario())
    assert (resent.status_code, changed.status_code, replayed.status_code) == (200, 200, 412)
    assert replayed.json()["code"] == "revision_mismatch" and replayed.headers["etag"] == '"2"'
    assert state.json()["target_cost"] == 30.0


@pytest.mark.redis
def test_frozen_replica_does_not_apply_an_unnumbered_step_after_its_deadline(
    redis_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[httpx.Response]:
        apps = [create_app(redis_settings), create_app(redis_settings)]
        async with serving(apps) as (frozen, other):
            started = await frozen.post("/v1/episodes", json=START)
            path = f"/v1/episodes/{started.json()['episode_id']}"
            freeze = Freeze(apps[0].state.service.store, monkeypatch)
            deadline = {"X-Request-Deadline": str(time.time() + 0.3)}
            held = await freeze.frozen_call(
                frozen.post(f"{path}/step", json=STEP, headers=deadline)
            )
            resent = await other.post(f"{path}/step", json=STEP)  # the client gave up at 0.3 s
            await asyncio.sleep(0.4)
            freeze.resumed.set()
            return [resent, await held, await other.get(path)]

    resent, replayed, state = asyncio.run(scenario())
    assert (resent.status_code, replayed.status_code) == (200, 412)
    assert replayed.json()["code"] == "deadline_passed"
    assert (state.json()["step"], state.json()["total_cost"]) == (1, 0.5)  # applied once


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store_settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """Settings of one app on the in-memory store, or on Redis."""
    if request.param == "redis":
        redis_settings: Settings = request.getfixturevalue("redis_settings")
        return redis_settings
    return settings


def test_change_held_past_its_deadline_before_applying_changes_nothing(
    store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.inference.Inference.inline_lone_calls", False)  # held off loop

    async def scenario() -> list[httpx.Response]:
        app = create_app(store_settings)
        async with serving([app]) as (client,):
            started = await client.post("/v1/episodes", json=START)
            path = f"/v1/episodes/{started.json()['episode_id']}"
            freeze = Freeze(app.state.service.store, monkeypatch)
            deadline = {"X-Request-Deadline": str(time.time() + 0.2)}
            change = client.patch(f"{path}/budget", json={"cost_limit": 5.0}, headers=deadline)
            held = await freeze.frozen_call(change)
            await asyncio.sleep(0.3)
            freeze.resumed.set()
            return [await held, await client.get(path)]

    replayed, state = asyncio.run(scenario())
    assert (replayed.status_code, replayed.json()["code"]) == (412, "deadline_passed")
    assert (state.json()["target_cost"], state.json()["revision"]) == (10.0, 0)


def test_deadline_passing_during_the_forward_pass_refuses_the_step(
    store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = ForwardGate(monkeypatch)  # the episode is claimed (on Redis, locked) meanwhile

    async def scenario() -> list[httpx.Response]:
        app = create_app(store_settings)
        async with serving([app]) as (client,):
            started = await client.post("/v1/episodes", json=START)
            path = f"/v1/episodes/{started.json()['episode_id']}"
            gate.close()
            deadline = {"X-Request-Deadline": str(time.time() + 0.2)}
            stepping = asyncio.create_task(client.post(f"{path}/step", json=STEP, headers=deadline))
            await asyncio.to_thread(gate.entered.wait, 5)
            await asyncio.sleep(0.3)
            gate.opened.set()
            return [await stepping, await client.get(path)]

    refused, state = asyncio.run(scenario())
    assert (refused.status_code, refused.json()["code"]) == (412, "deadline_passed")
    assert (state.json()["step"], state.json()["revision"]) == (0, 0)


# ---- websocket ---------------------------------------------------------------------------------


def test_stream_stale_or_late_frames_get_412_error_frames_and_change_nothing(
    served: TestClient,
) -> None:
    with served.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "start", **START})
        episode_id = (started := ws.receive_json())["episode_id"]
        assert started["revision"] == 0
        budget = {"type": "budget", "episode_id": episode_id, "cost_limit": 5.0}
        ws.send_json(budget | {"revision": 0, "request_id": "b1"})
        assert ws.receive_json()["revision"] == 1
        step = {"type": "step", "episode_id": episode_id, **STEP}
        frames = [
            budget | {"cost_limit": 30.0, "revision": 0, "request_id": "stale"},
            step | {"revision": 0},
            step | {"revision": 1, "deadline": time.time() - 1},
            budget | {"revision": 1, "deadline": time.time() - 1},
        ]
        refusals = []
        for frame in frames:
            ws.send_json(frame)
            refusals.append(ws.receive_json())
        ws.send_json(step | {"revision": 1, "deadline": time.time() + 30})
        stepped = ws.receive_json()
    assert [(error["status"], error["code"]) for error in refusals] == [
        (412, "revision_mismatch"),
        (412, "revision_mismatch"),
        (412, "deadline_passed"),
        (412, "deadline_passed"),
    ]
    assert refusals[0]["revision"] == 1 and refusals[0]["request_id"] == "stale"
    assert (stepped["type"], stepped["step"], stepped["revision"]) == ("action", 1, 2)
    assert served.get(f"/v1/episodes/{episode_id}").json()["target_cost"] == 5.0
