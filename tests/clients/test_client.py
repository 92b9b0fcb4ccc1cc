"""PolicyClient and AsyncPolicyClient against the real app: typed replies, errors, retries."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from clients.client import (
    AsyncPolicyClient,
    AuthenticationError,
    ConflictError,
    EpisodeGoneError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PolicyClient,
    PreconditionFailedError,
    ServerError,
    ServiceUnreachableError,
    TooManyEpisodesError,
    error_for_status,
)
from clients.retry import RetryPolicy
from service.schemas import EpisodePublic, StepResponse
from tests.clients.live_server import TOKEN

OBSERVATION = [0.1, -0.2, 0.3]


NO_BACKOFF = RetryPolicy(backoff_s=0.0)


def make_client(app_client: TestClient) -> PolicyClient:
    return PolicyClient("http://testserver", http_client=app_client)


class LosesFirstReply(httpx.BaseTransport):
    """Delivers every request to the app, but drops the first reply (a read timeout)."""

    def __init__(self, app_client: TestClient, status: int | None = None) -> None:
        self.app_client, self.status, self.calls = app_client, status, 0
        self.sent: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        self.sent.append(request)
        response = self.app_client.send(request)
        if self.calls == 1 and self.status is None:
            raise httpx.ReadTimeout("reply lost", request=request)
        status = self.status if self.calls == 1 and self.status else response.status_code
        return httpx.Response(status, headers=response.headers, content=response.content)


class RefusesFirst(httpx.BaseTransport):
    """Answers the first `times` requests itself with a refusal (never reaching the app), then
    delivers every request to the app."""

    def __init__(
        self, app_client: TestClient, status: int, code: str, retry_after: str | None, times: int
    ) -> None:
        self.app_client, self.status, self.code, self.times = app_client, status, code, times
        self.headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls > self.times:
            response = self.app_client.send(request)
            return httpx.Response(response.status_code, content=response.content)
        body = {"code": self.code, "detail": "refused", "field": None}
        return httpx.Response(self.status, headers=self.headers, json=body)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses the sync client takes between attempts (recorded, not slept)."""
    slept: list[float] = []
    monkeypatch.setattr("clients.client.time.sleep", slept.append)
    return slept


def refusing_client(transport: RefusesFirst, retry: RetryPolicy | None = None) -> PolicyClient:
    return PolicyClient(
        "http://testserver", http_client=httpx.Client(transport=transport), retry=retry
    )


def test_client_runs_an_episode_with_typed_replies(app_client: TestClient) -> None:
    with make_client(app_client) as client:
        (model,) = client.list_models()
        started = client.create_episode(model.name, 50.0, 10.0, OBSERVATION, seed=1)
        assert isinstance(started, StepResponse) and started.step == 0
        stepped = client.step(started.episode_id, OBSERVATION, 1.0, 2.0, step=1)
        assert (stepped.step, stepped.remaining_cost) == (1, 8.0)
        state = client.update_budget(started.episode_id, cost_limit=5.0)
        assert isinstance(state, EpisodePublic) and state.remaining_cost == 3.0
        assert client.get_episode(started.episode_id).total_cost == 2.0
        assert client.close_episode(started.episode_id).steps == 2
        assert client.readyz().status == "ok"
        assert client.reload_models().unchanged[0].name == "toy"


def test_client_accepts_numpy_observations(app_client: TestClient) -> None:
    np = pytest.importorskip("numpy")
    with make_client(app_client) as client:
        started = client.create_episode("toy", 50.0, 10.0, np.array(OBSERVATION, np.float32))
        assert client.step(started.episode_id, np.zeros(3), 0.0, 0.0).step == 1


def test_client_errors_map_to_typed_exceptions(app_client: TestClient) -> None:
    with make_client(app_client) as client:
        with pytest.raises(NotFoundError) as missing:
            client.create_episode("nope", 1.0, 1.0, OBSERVATION)
        assert (missing.value.status_code, missing.value.field) == (404, "model")
        with pytest.raises(InvalidRequestError) as invalid:
            client.create_episode("toy", 1.0, 1.0, [1.0])
        assert invalid.value.field == "observation"
        episode_id = client.create_episode("toy", 1.0, 1.0, OBSERVATION).episode_id
        with pytest.raises(ConflictError) as conflict:
            client.step(episode_id, OBSERVATION, 0.0, 0.0, step=7)
        assert conflict.value.code == "step_out_of_order"
        client.close_episode(episode_id)
        with pytest.raises(EpisodeGoneError):
            client.get_episode(episode_id)


def test_client_invalid_input_fails_before_sending(app_client: TestClient) -> None:
    with make_client(app_client) as client:
        with pytest.raises(InvalidRequestError) as error:
            client.step("abc", [float("nan")], 0.0, 0.0)
        assert error.value.status_code is None and error.value.field == "observation.0"
        with pytest.raises(InvalidRequestError):
            client.update_budget("abc", cost_limit=1.0, remaining_cost=1.0)


def test_error_for_status_covers_auth_cap_and_server_errors() -> None:
    assert isinstance(error_for_status(401, "x"), AuthenticationError)
    assert isinstance(error_for_status(403, "x"), PermissionDeniedError)
    assert isinstance(error_for_status(429, "x"), TooManyEpisodesError)
    assert isinstance(error_for_status(503, "x"), ServerError)


def test_client_step_retry_after_a_lost_reply_returns_the_same_action(
    app_client: TestClient,
) -> None:
    with make_client(app_client) as client:
        started = client.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=3)
        transport = LosesFirstReply(app_client)
        with (
            httpx.Client(transport=transport) as http,
            PolicyClient("http://testserver", http_client=http, retry=NO_BACKOFF) as flaky,
        ):
            stepped = flaky.step(started.episode_id, OBSERVATION, 1.0, 1.0, step=1)
        assert transport.calls == 2
        state = client.get_episode(started.episode_id)
        assert state.step == 1 and state.total_cost == 1.0  # applied once
        again = client.step(started.episode_id, OBSERVATION, 1.0, 1.0, step=1)
        assert again.action == stepped.action


def test_client_step_without_index_is_never_retried(app_client: TestClient) -> None:
    for call in ("step", "create_episode"):
        transport = LosesFirstReply(app_client)
        with (
            httpx.Client(transport=transport) as http,
            PolicyClient("http://testserver", http_client=http, retry=NO_BACKOFF) as flaky,
        ):
            with pytest.raises(ServiceUnreachableError):
                if call == "step":
                    flaky.step("abc", OBSERVATION, 1.0, 1.0)
                else:
                    flaky.create_episode("toy", 1.0, 1.0, OBSERVATION)
        assert transport.calls == 1


def test_client_change_with_a_stale_revision_raises_precondition_failed(
    app_client: TestClient,
) -> None:
    with make_client(app_client) as client:
        started = client.create_episode("toy", 50.0, 10.0, OBSERVATION)
        episode_id, revision = started.episode_id, started.revision
        changed = client.update_budget(episode_id, cost_limit=5.0, revision=revision)
        with pytest.raises(PreconditionFailedError) as stale:
            client.update_budget(episode_id, cost_limit=30.0, revision=revision)
        assert (stale.value.status_code, stale.value.code) == (412, "revision_mismatch")
        with pytest.raises(PreconditionFailedError):
            client.step(episode_id, OBSERVATION, 1.0, 0.0, revision=revision)
        stepped = client.step(episode_id, OBSERVATION, 1.0, 0.0, revision=changed.revision)
        assert (stepped.step, stepped.revision) == (1, 2)
        assert client.get_episode(episode_id).target_cost == 5.0


def test_client_deadline_s_gives_every_attempt_of_a_change_a_deadline(
    app_client: TestClient,
) -> None:
    with make_client(app_client) as client:
        started = client.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=3)
    transport = LosesFirstReply(app_client)
    with (
        httpx.Client(transport=transport) as http,
        PolicyClient("http://testserver", http_client=http, retry=NO_BACKOFF, deadline_s=5.0) as c,
    ):
        revision = started.revision
        stepped = c.step(started.episode_id, OBSERVATION, 1.0, 1.0, step=1, revision=revision)
        assert c.get_episode(started.episode_id).step == 1  # applied once
    first, retry, read = transport.sent
    for attempt in (first, retry):  # a lost answer's retry repeats the step: its action
        assert attempt.headers["if-match"] == '"0"'
        assert abs(float(attempt.headers["x-request-deadline"]) - (time.time() + 5.0)) < 2.0
    assert "x-request-deadline" not in read.headers and stepped.step == 1


def test_client_change_past_its_deadline_raises_and_changes_nothing(
    app_client: TestClient,
) -> None:
    with make_client(app_client) as client:
        episode_id = client.create_episode("toy", 50.0, 10.0, OBSERVATION).episode_id
    with PolicyClient("http://testserver", http_client=app_client, deadline_s=-1.0) as late:
        with pytest.raises(PreconditionFailedError) as refused:
            late.update_budget(episode_id, cost_limit=5.0)
        assert refused.value.code == "deadline_passed"
        assert late.get_episode(episode_id).target_cost == 10.0


def test_client_step_retries_a_503(app_client: TestClient) -> None:
    with make_client(app_client) as client:
        started = client.create_episode("toy", 50.0, 10.0, OBSERVATION)
    transport = LosesFirstReply(app_client, status=503)
    with (
        httpx.Client(transport=transport) as http,
        PolicyClient("http://testserver", http_client=http, retry=NO_BACKOFF) as flaky,
    ):
        assert flaky.step(started.episode_id, OBSERVATION, 0.0, 0.0, step=1).step == 1
    assert transport.calls == 2


def test_client_unreachable_server_raises_after_timeout() -> None:
    with PolicyClient("http://127.0.0.1:9", timeout=0.5) as client:
        with pytest.raises(ServiceUnreachableError):
            client.list_models()


@pytest.mark.anyio
async def test_async_client_runs_an_episode(live_url: str) -> None:
    async with AsyncPolicyClient(live_url) as client:
        assert [model.name for model in await client.list_models()] == ["toy"]
        started = await client.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=1)
        stepped = await client.step(started.episode_id, OBSERVATION, 1.0, 2.0, step=1)
        assert stepped.remaining_cost == 8.0
        assert (await client.update_budget(started.episode_id, remaining_cost=1.0)).target_cost == 3
        assert (await client.get_episode(started.episode_id)).step == 1
        assert (await client.close_episode(started.episode_id)).total_reward == 1.0
        assert (await client.readyz()).status == "ok"
        with pytest.raises(EpisodeGoneError):
            await client.step(started.episode_id, OBSERVATION, 0.0, 0.0)


@pytest.mark.anyio
async def test_async_client_token_is_sent(secured_url: str) -> None:
    async with AsyncPolicyClient(secured_url) as anonymous:
        with pytest.raises(AuthenticationError):
            await anonymous.list_models()
    async with AsyncPolicyClient(secured_url, token=TOKEN) as client:
        assert len(await client.list_models()) == 1


def test_sync_and_async_clients_give_the_same_actions(
    app_client: TestClient, live_url: str
) -> None:
    import asyncio

    async def run_async() -> list[float]:
        async with AsyncPolicyClient(live_url) as client:
            return (await client.create_episode("toy", 5.0, 1.0, OBSERVATION, seed=5)).action

    with make_client(app_client) as client:
        sync_action = client.create_episode("toy", 5.0, 1.0, OBSERVATION, seed=5).action
    assert asyncio.run(run_async()) == sync_action


@pytest.mark.parametrize(("status", "code"), [(409, "episode_busy"), (429, "too_many_episodes")])
def test_client_retries_a_refusal_that_changed_nothing_after_its_retry_after(
    app_client: TestClient, waits: list[float], status: int, code: str
) -> None:
    transport = RefusesFirst(app_client, status, code, "1", times=2)
    with refusing_client(transport) as client:
        started = client.create_episode("toy", 50.0, 10.0, OBSERVATION)
    assert started.step == 0 and transport.calls == 3 and waits == [1.0, 1.0]


def test_client_retries_a_503_only_for_a_numbered_step(
    app_client: TestClient, waits: list[float]
) -> None:
    with make_client(app_client) as client:
        episode_id = client.create_episode("toy", 50.0, 10.0, OBSERVATION).episode_id
    unnumbered = RefusesFirst(app_client, 503, "store_unavailable", "2", times=1)
    with refusing_client(unnumbered) as client, pytest.raises(ServerError) as refused:
        client.step(episode_id, OBSERVATION, 1.0, 1.0)  # it may have gone through: not resent
    assert unnumbered.calls == 1 and refused.value.retry_after == 2.0 and waits == []
    numbered = RefusesFirst(app_client, 503, "store_unavailable", "2", times=1)
    with refusing_client(numbered) as client:
        assert client.step(episode_id, OBSERVATION, 1.0, 1.0, step=1).step == 1
    assert numbered.calls == 2 and waits == [2.0]


def test_client_does_not_retry_without_a_hint_or_past_the_longest_wait(
    app_client: TestClient, waits: list[float]
) -> None:
    out_of_order = RefusesFirst(app_client, 409, "step_out_of_order", None, times=1)
    with refusing_client(out_of_order) as client, pytest.raises(ConflictError):
        client.step("abc", OBSERVATION, 1.0, 1.0, step=3)
    too_long = RefusesFirst(app_client, 429, "too_many_episodes", "30", times=1)
    with refusing_client(too_long) as client, pytest.raises(TooManyEpisodesError) as refused:
        client.create_episode("toy", 50.0, 10.0, OBSERVATION)
    assert (out_of_order.calls, too_long.calls, waits) == (1, 1, [])
    assert refused.value.retry_after == 30.0  # left to the caller


def test_client_gives_up_after_its_retries(app_client: TestClient, waits: list[float]) -> None:
    transport = RefusesFirst(app_client, 409, "episode_busy", "1", times=10)
    with (
        refusing_client(transport, RetryPolicy(retries=3)) as client,
        pytest.raises(ConflictError) as refused,
    ):
        client.update_budget("abc", cost_limit=1.0)
    assert transport.calls == 4 and waits == [1.0] * 3
    assert (refused.value.code, refused.value.retry_after) == ("episode_busy", 1.0)


@pytest.mark.anyio
async def test_async_client_waits_the_retry_after_of_a_busy_episode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = {"episode_id": "e", "action": [0.5], "step": 1, "remaining_reward": 1.0}
    answer |= {
        "remaining_cost": 1.0,
        "budget_exhausted": False,
        "model": "toy",
        "model_version": "1",
    }
    replies = [httpx.Response(409, headers={"Retry-After": "1"}, json={"code": "episode_busy"})]
    replies.append(httpx.Response(200, json=answer))
    transport = httpx.MockTransport(lambda request: replies.pop(0))
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("clients.client.asyncio.sleep", record)
    async with AsyncPolicyClient(http_client=httpx.AsyncClient(transport=transport)) as client:
        assert (await client.step("e", OBSERVATION, 0.0, 0.0)).action == [0.5]
    assert slept == [1.0] and not replies
