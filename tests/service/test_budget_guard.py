"""The budget guard as served: on by default, `budget_guard: false` turns it off, every answer
says what it did, summaries and `/metrics` count it, on both stores and after budget changes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.runtime.toy_critic import write_test_critic

OBSERVATION = [0.1, -0.2, 0.3]
START = {
    "model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION,
    "seed": 5,
}  # fmt: skip
GUARD = {
    "fallback_margin": 2.0, "mean_action_pace": 0.045, "full_noise_pace": 0.055,
    "hidden_reserve": 0.0,
}  # fmt: skip
"""With the toy's 100 steps, about 98 left: the fallback at <= 2 left, the mean action at <= 4.4,
less noise below 5.4."""


def guard_card(models_dir: Path, guard: dict[str, Any]) -> None:
    """Give the toy model's card these guard thresholds."""
    path = models_dir / "toy" / "model.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"budget_guard": guard}))


@pytest.fixture
def guarded_settings(settings: Settings) -> Settings:
    guard_card(settings.models_dir, GUARD)
    return settings


@pytest.fixture
def guarded_client(guarded_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(guarded_settings)) as test_client:
        yield test_client


def step(client: TestClient, episode_id: str, cost: float, number: int) -> dict[str, Any]:
    body = {"observation": OBSERVATION, "reward": 1.0, "cost": cost, "step": number}
    response = client.post(f"/v1/episodes/{episode_id}/step", json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def guard_actions(client: TestClient, costs: list[float], **start: Any) -> list[str]:
    """Start an episode, step it with `costs`; what the guard did to each action."""
    answer = client.post("/v1/episodes", json=START | start).json()
    actions = [answer["guard_action"]]
    for number, cost in enumerate(costs, start=1):
        actions.append(step(client, answer["episode_id"], cost, number)["guard_action"])
    return actions


def test_guard_is_on_by_default_and_each_answer_says_what_it_did(
    guarded_client: TestClient,
) -> None:
    started = guarded_client.post("/v1/episodes", json=START).json()
    assert started["budget_guard"] and not started["guarded"]
    assert started["guard_action"] == "none"
    episode_id, answers = started["episode_id"], []
    for number, cost in enumerate([5.0, 1.0, 2.0, 0.0], start=1):  # 5, 4, 2, 2 left
        answers.append(step(guarded_client, episode_id, cost, number))
    assert [a["guard_action"] for a in answers] == [
        "less_noise", "mean_action", "fallback", "fallback",
    ]  # fmt: skip
    assert all(answer["guarded"] for answer in answers)
    state = guarded_client.get(f"/v1/episodes/{episode_id}").json()
    assert state["budget_guard"] and state["guarded_steps"] == 4
    summary = guarded_client.delete(f"/v1/episodes/{episode_id}").json()
    assert summary["guarded_steps"] == 4 and summary["budget_guard"]
    assert summary["guarded_steps_by_action"] == {
        "less_noise": 1, "mean_action": 1, "fallback": 2, "shield": 0,
    }  # fmt: skip
    assert summary["target_cost"] == 10.0 and not summary["over_budget"]


def test_guard_off_at_creation_leaves_every_action_to_the_model(
    guarded_client: TestClient,
) -> None:
    actions = guard_actions(guarded_client, [5.0, 1.0, 2.0, 9.0], budget_guard=False)
    assert actions == ["none"] * 5
    started = guarded_client.post("/v1/episodes", json=START | {"budget_guard": False}).json()
    assert not started["budget_guard"]
    summary = guarded_client.delete(f"/v1/episodes/{started['episode_id']}").json()
    assert not summary["budget_guard"] and summary["guarded_steps"] == 0


def test_guard_null_means_on_and_a_string_is_refused(guarded_client: TestClient) -> None:
    assert guarded_client.post("/v1/episodes", json=START | {"budget_guard": None}).json()[
        "budget_guard"
    ]
    refused = guarded_client.post("/v1/episodes", json=START | {"budget_guard": "false"})
    assert refused.status_code == 422 and refused.json()["field"] == "budget_guard"


def test_fallback_is_the_model_told_no_cost_left_with_the_mean_action(settings: Settings) -> None:
    guard_card(settings.models_dir, GUARD | {"fallback_margin": 100.0})
    with TestClient(create_app(settings)) as client:
        guarded = client.post("/v1/episodes", json=START).json()  # sampled, 10 left
        plain = START | {"target_cost": 0.0, "deterministic": True, "budget_guard": False}
        told_nothing_left = client.post("/v1/episodes", json=plain).json()
    assert guarded["guard_action"] == "fallback"
    assert guarded["action"] == told_nothing_left["action"]
    assert guarded["remaining_cost"] == 10.0  # the episode's own budget is untouched


def test_guard_follows_a_budget_changed_mid_episode_at_once(guarded_client: TestClient) -> None:
    started = guarded_client.post("/v1/episodes", json=START | {"target_cost": 40.0}).json()
    episode_id = started["episode_id"]
    assert step(guarded_client, episode_id, 1.0, 1)["guard_action"] == "none"
    patched = guarded_client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 3.0})
    assert patched.status_code == 200 and patched.json()["remaining_cost"] == 2.0
    assert step(guarded_client, episode_id, 0.0, 2)["guard_action"] == "fallback"
    guarded_client.patch(f"/v1/episodes/{episode_id}/budget", json={"cost_limit": 40.0})
    assert step(guarded_client, episode_id, 0.0, 3)["guard_action"] == "none"


def test_an_episode_that_names_a_cut_floor_is_guarded_as_that_budget_until_half_way(
    guarded_client: TestClient,
) -> None:
    """40 to spend, but a cut to 5 may come: early steps are guarded as a budget of 5 would be."""
    start = {"target_cost": 40.0, "cut_floor": 5.0}
    assert guard_actions(guarded_client, [4.0], target_cost=40.0) == ["none", "none"]
    assert guard_actions(guarded_client, [4.0], **start) == ["less_noise", "fallback"]
    started = guarded_client.post("/v1/episodes", json=START | start).json()
    state = guarded_client.get(f"/v1/episodes/{started['episode_id']}").json()
    assert state["cut_floor"] == 5.0 and state["remaining_cost"] == 40.0
    refused = guarded_client.post("/v1/episodes", json=START | {"cut_floor": -1.0})
    assert refused.status_code == 422 and refused.json()["field"] == "cut_floor"


def test_a_cut_without_notice_warns_where_the_card_measured_cuts_missed(
    guarded_settings: Settings,
) -> None:
    path = guarded_settings.models_dir / "toy" / "model.json"
    figures = {"share_over_budget": 0.95, "cost_mean": 14.0}
    missed = {
        "budget": 40.0, "action_mode": "mean", "cost_schedule": "0:40,50:10", "episodes": 20,
        "first_seed": 7, "guarded": figures, "unguarded": figures,
    }  # fmt: skip
    path.write_text(json.dumps(json.loads(path.read_text()) | {"budget_guard_measured": [missed]}))

    def cut(start: dict[str, Any], steps: int, limit: float) -> list[str]:
        with TestClient(create_app(guarded_settings)) as client:
            started = client.post("/v1/episodes", json=START | start).json()
            for number in range(1, steps + 1):
                step(client, started["episode_id"], 0.0, number)
            budget = {"cost_limit": limit}
            patched = client.patch(f"/v1/episodes/{started['episode_id']}/budget", json=budget)
            return list(patched.json()["warnings"])

    (warning,) = cut({"target_cost": 40.0}, 2, 10.0)
    assert "over the new limit in 95% of 20 episodes measured with a cut they were not" in warning
    assert cut({"target_cost": 40.0, "cut_floor": 10.0}, 2, 10.0) == []  # announced
    assert cut({"target_cost": 40.0, "cut_floor": 20.0}, 2, 10.0) != []  # below its floor
    assert cut({"target_cost": 20.0}, 2, 40.0) == []  # a raise
    assert cut({"target_cost": 40.0}, 0, 10.0) == []  # before any step: nothing spent


def test_retried_step_repeats_the_guards_answer_and_counts_once(
    guarded_client: TestClient,
) -> None:
    episode_id = guarded_client.post("/v1/episodes", json=START).json()["episode_id"]
    first = step(guarded_client, episode_id, 9.0, 1)
    assert step(guarded_client, episode_id, 9.0, 1) == first
    assert first["guard_action"] == "fallback"
    summary = guarded_client.delete(f"/v1/episodes/{episode_id}").json()
    assert summary["guarded_steps"] == 1 and summary["over_budget"] is False


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_guard_state_survives_the_store(
    store: str, guarded_settings: Settings, request: pytest.FixtureRequest
) -> None:
    settings = guarded_settings
    if store == "redis":
        prefix = request.getfixturevalue("redis_prefix")
        settings = settings.model_copy(
            update={"redis_url": "redis://127.0.0.1:6379/0", "redis_prefix": prefix}
        )
    with TestClient(create_app(settings)) as client:
        actions = guard_actions(client, [5.0, 1.0, 2.0])
        off = guard_actions(client, [5.0, 1.0, 2.0], budget_guard=False)
        episode_id = client.post("/v1/episodes", json=START).json()["episode_id"]
        step(client, episode_id, 9.0, 1)
        summary = client.delete(f"/v1/episodes/{episode_id}").json()
    assert actions == ["none", "less_noise", "mean_action", "fallback"]
    assert off == ["none"] * 4
    assert summary["guarded_steps_by_action"]["fallback"] == 1


def test_stream_start_takes_budget_guard_and_its_end_counts_guarded_steps(
    guarded_client: TestClient,
) -> None:
    with guarded_client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "start", **START, "budget_guard": False})
        started = ws.receive_json()
        assert started["type"] == "action" and started["budget_guard"] is False
        ws.send_json({"type": "start", **START})
        guarded = ws.receive_json()
        ws.send_json(
            {"type": "step", "episode_id": guarded["episode_id"], "observation": OBSERVATION,
             "reward": 0.0, "cost": 9.0}
        )  # fmt: skip
        assert ws.receive_json()["guard_action"] == "fallback"
        ws.send_json({"type": "end", "episode_id": guarded["episode_id"]})
        ended = ws.receive_json()
        ws.send_json({"type": "start", **START, "target_cost": 40.0, "cut_floor": 5.0})
        assert ws.receive_json()["guard_action"] == "less_noise"  # guarded as a budget of 5
    assert ended["type"] == "ended" and ended["guarded_steps"] == 1


def test_shield_replaces_what_its_critic_calls_costly_and_is_counted(settings: Settings) -> None:
    directory = settings.models_dir / "toy"
    write_test_critic(directory, observation_dim=3, action_dim=2, bias=2.0)  # safe: a_0 < -0.4
    path = directory / "model.json"
    critic = {
        "discount": 0.9, "dataset": "toy.hdf5", "update_steps": 10, "validation_mse": 0.1,
        "target_variance": 1.0,
    }  # fmt: skip
    shield = {"shield_margin": 8.0, "shield_risk": 1.0, "fallback_margin": 0.0}
    path.write_text(
        json.dumps(json.loads(path.read_text()) | {"budget_guard": shield, "cost_critic": critic})
    )
    with TestClient(create_app(settings)) as client:
        started = client.post("/v1/episodes", json=START).json()  # 10 left: not yet
        answer = step(client, started["episode_id"], 3.0, 1)  # 7 left: the shield checks
        assert started["guard_action"] == "mean_action" and answer["guard_action"] == "shield"
        assert -0.7 < answer["action"][0] < -0.4  # the nearest the critic calls safe
        summary = client.delete(f"/v1/episodes/{started['episode_id']}").json()
        assert summary["guarded_steps_by_action"]["shield"] == 1
        text = client.get("/metrics").text
    assert 'cdt_budget_guard_steps_total{action="shield",model="toy"} 1.0' in text


def test_metrics_count_ended_episodes_over_budget_their_cost_ratio_and_guarded_steps(
    guarded_client: TestClient,
) -> None:
    client = guarded_client
    for cost, guard in ((12.0, True), (5.0, True), (11.0, False)):
        episode_id = client.post("/v1/episodes", json=START | {"budget_guard": guard}).json()[
            "episode_id"
        ]
        step(client, episode_id, cost, 1)
        client.delete(f"/v1/episodes/{episode_id}")
    client.post("/v1/episodes", json=START)  # live episodes are not counted yet
    text = client.get("/metrics").text
    on, off = 'budget_guard="on",model="toy"', 'budget_guard="off",model="toy"'
    assert f"cdt_episodes_ended_total{{{on}}} 2.0" in text
    assert f"cdt_episodes_ended_total{{{off}}} 1.0" in text
    assert f"cdt_episodes_over_budget_total{{{on}}} 1.0" in text
    assert f"cdt_episodes_over_budget_total{{{off}}} 1.0" in text
    bucket = 'cdt_episode_cost_ratio_bucket{{budget_guard="on",le="{}",model="toy"}}'
    assert f"{bucket.format(0.5)} 1.0" in text  # 5 of 10
    assert f"{bucket.format(1.0)} 1.0" in text and f"{bucket.format(1.25)} 2.0" in text  # 12
    assert f"cdt_episode_cost_ratio_sum{{{off}}} 1.1" in text
    assert 'cdt_budget_guard_steps_total{action="fallback",model="toy"} 1.0' in text
    assert 'cdt_budget_guard_steps_total{action="less_noise",model="toy"} 1.0' in text
    assert 'cdt_model_step_latency_seconds_count{kind="start",model="toy"} 4.0' in text
    assert 'cdt_model_step_latency_seconds_count{kind="step",model="toy"} 3.0' in text


def test_metrics_count_an_overrun_at_its_step_once_even_if_the_episode_never_ends(
    guarded_client: TestClient,
) -> None:
    client = guarded_client
    ended = client.post("/v1/episodes", json=START).json()["episode_id"]
    step(client, ended, 6.0, 1)  # 6 of 10
    step(client, ended, 6.0, 2)  # 12: over
    step(client, ended, 6.0, 2)  # the same step again (a client's retry): not a second overrun
    step(client, ended, 1.0, 3)  # still over: not a new one
    client.delete(f"/v1/episodes/{ended}")
    abandoned = client.post("/v1/episodes", json=START | {"budget_guard": False}).json()
    step(client, abandoned["episode_id"], 11.0, 1)  # its client goes away: it will expire
    text = client.get("/metrics").text
    assert 'cdt_budget_overruns_total{budget_guard="on",model="toy"} 1.0' in text
    assert 'cdt_budget_overruns_total{budget_guard="off",model="toy"} 1.0' in text
    assert 'cdt_episodes_over_budget_total{budget_guard="off",model="toy"}' not in text


def test_policy_client_sends_budget_guard_false_only_when_asked(
    guarded_client: TestClient,
) -> None:
    from clients.client import PolicyClient

    with PolicyClient("http://testserver", http_client=guarded_client) as client:
        default = client.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=1)
        off = client.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=1, budget_guard=False)
        ended = client.close_episode(off.episode_id)
    assert default.budget_guard and not off.budget_guard
    assert not ended.budget_guard and ended.guarded_steps == 0


def test_policy_client_sends_an_episodes_cut_floor(guarded_client: TestClient) -> None:
    from clients.client import PolicyClient

    with PolicyClient("http://testserver", http_client=guarded_client) as client:
        ready = client.create_episode("toy", 50.0, 40.0, OBSERVATION, seed=1, cut_floor=5.0)
        plain = client.create_episode("toy", 50.0, 40.0, OBSERVATION, seed=1)
    assert ready.guard_action == "less_noise" and plain.guard_action == "none"


class CostlyEnv:
    """Three steps, each costing 4 and ending with a terminal observation."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, seed: int | None = None) -> tuple[list[float], dict[str, Any]]:
        self.steps = 0
        return OBSERVATION, {}

    def step(self, action: Any) -> tuple[list[float], float, bool, bool, dict[str, Any]]:
        self.steps += 1
        return OBSERVATION, 1.0, False, self.steps >= 3, {"cost": 4.0}


@pytest.mark.parametrize("guard", [True, False])
def test_rollout_reports_the_last_cost_and_the_guarded_steps_the_server_counted(
    guarded_client: TestClient, guard: bool
) -> None:
    from clients.client import PolicyClient
    from clients.rollout import RolloutConfig, run_episode
    from service.schemas import ModelPublic

    model = ModelPublic.model_validate(guarded_client.get("/v1/models/toy").json())
    config = RolloutConfig(server="http://testserver", model="toy", budget_guard=guard)
    with PolicyClient("http://testserver", http_client=guarded_client) as client:
        outcome = run_episode(client, CostlyEnv(), model, config, seed=3)
    assert (outcome.steps, outcome.cost, outcome.over_budget) == (3, 12.0, True)
    metrics = guarded_client.get("/metrics").text
    labels = f'budget_guard="{"on" if guard else "off"}",model="toy"'
    assert f"cdt_episodes_over_budget_total{{{labels}}} 1.0" in metrics  # the last cost counted
    # 10 left at the start, then 6 (pace 0.06: left alone), 2 and, reported last, 0: fallback
    assert outcome.guarded_steps == (2 if guard else 0)
