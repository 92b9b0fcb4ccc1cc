"""Wire types: strict requests, tolerant answers, websocket frames by `type`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.schemas import (
    MAX_SEED,
    BudgetUpdate,
    EpisodeCreate,
    StepResponse,
    StreamMessage,
    StreamReply,
    StreamStep,
)

ANSWER = {
    "episode_id": "a",
    "action": [0.1],
    "step": 0,
    "remaining_reward": 1.0,
    "remaining_cost": 1.0,
    "budget_exhausted": False,
    "model": "toy",
    "model_version": "1",
}


def test_step_response_ignores_fields_from_newer_servers() -> None:
    assert StepResponse.model_validate(ANSWER | {"added_later": 1}).step == 0


def test_episode_create_rejects_unknown_fields_and_huge_seeds() -> None:
    body = {"model": "toy", "target_reward": 1, "target_cost": 1, "observation": [0.0]}
    with pytest.raises(ValidationError, match="typo"):
        EpisodeCreate.model_validate(body | {"typo": 1})
    with pytest.raises(ValidationError, match="seed"):
        EpisodeCreate.model_validate(body | {"seed": MAX_SEED + 1})


def test_budget_update_schema_states_the_validator_rules() -> None:
    schema = BudgetUpdate.model_json_schema()
    assert len(schema["anyOf"]) == 4 and len(schema["allOf"]) == 2
    assert BudgetUpdate(cost_limit=1.0, target_reward=2.0).cost_limit == 1.0
    with pytest.raises(ValidationError):
        BudgetUpdate(cost_limit=None)


def test_stream_message_dispatches_on_type() -> None:
    frame = '{"type": "step", "episode_id": "e", "observation": [1], "reward": 0, "cost": 0}'
    assert isinstance(StreamMessage.model_validate_json(frame).root, StreamStep)
    reply = StreamReply.model_validate({"type": "action", **ANSWER}).root
    assert reply.type == "action"
