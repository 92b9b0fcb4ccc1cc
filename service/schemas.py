"""Wire types of API v1, shared by the service and the clients.

This module imports only pydantic, so `clients/` gets the wire types without FastAPI. Every
number that reaches the model is finite and bounded and every list has a maximum length, so the
OpenAPI schema is tight enough to be fuzzed (schemathesis) without turning into 500s.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, RootModel, model_validator
from pydantic.config import JsonDict

MAX_ABS_VALUE = 1e9
"""Largest magnitude accepted for observations, rewards, costs and budgets (fits float32)."""
MAX_OBSERVATION_DIM = 4096
MAX_SEED = 2**53 - 1
"""Seeds stay exact in JSON numbers (float64) and in JavaScript clients."""
MAX_UNIX_TIME = 1e10
"""Latest deadline accepted (unix seconds, the year 2286)."""

FiniteFloat = Annotated[float, Field(ge=-MAX_ABS_VALUE, le=MAX_ABS_VALUE, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0.0, le=MAX_ABS_VALUE, allow_inf_nan=False)]
Observation = Annotated[
    list[FiniteFloat],
    Field(min_length=1, max_length=MAX_OBSERVATION_DIM, description="raw env observation"),
]
ModelName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
EpisodeId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
RequestId = Annotated[str, Field(min_length=1, max_length=128)]
GuardActionName = Literal["none", "less_noise", "mean_action", "fallback", "shield"]
"""What the budget guard did to one action (`runtime.budget_guard.GuardAction`'s values)."""


def _integral_float_to_int(value: object) -> object:
    """JSON Schema counts 2.0 as an integer; pydantic's strict int would refuse it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# constraints before the validator, or pydantic writes `ge`/`le` instead of minimum/maximum
StepIndex = Annotated[int, Field(ge=0, le=2**31 - 1), BeforeValidator(_integral_float_to_int)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), BeforeValidator(_integral_float_to_int)]
Revision = Annotated[int, Field(ge=0, le=2**63 - 1), BeforeValidator(_integral_float_to_int)]
Deadline = Annotated[float, Field(gt=0.0, le=MAX_UNIX_TIME, allow_inf_nan=False)]
REVISION_DOC = (
    "the episode's revision this answer leaves it at; a step or budget change that sends it "
    "back (REST If-Match, a frame's revision) applies only to this revision"
)


class WireModel(BaseModel):
    """Base of the answers: unknown fields are ignored, so older clients read newer servers."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class RequestModel(WireModel):
    """Base of the requests: strict types, unknown fields rejected (a typo must not pass).

    Strict, so the server accepts exactly what the OpenAPI schema says: no `true` for a number,
    no `"1.5"` string for a float (JSON integers are still numbers).
    """

    model_config = ConfigDict(extra="forbid", strict=True)


class TargetPair(WireModel):
    """A (reward, cost) target pair from the model card."""

    reward: float
    cost: float


class ModelPublic(WireModel):
    """A served policy as listed by `GET /v1/models`."""

    name: str
    version: str
    task: str
    algo: str | None = None
    observation_dim: int
    action_dim: int
    action_low: list[float]
    action_high: list[float]
    context_len: int
    max_episode_len: int
    validated_cost_range: tuple[float, float] | None = Field(
        default=None, description="target costs the model was measured to honour"
    )
    default_targets: list[TargetPair] = Field(default_factory=list)
    reward_return_range: tuple[float, float] | None = Field(
        default=None, description="(min, max) reward return of the training data (normalisation)"
    )


class ModelList(WireModel):
    """All policies currently served."""

    models: list[ModelPublic]


class EpisodeCreate(RequestModel):
    """Start an episode with the first observation and the episode's reward and cost targets."""

    model: ModelName
    target_reward: FiniteFloat
    target_cost: NonNegativeFloat
    observation: Observation
    seed: Seed | None = None
    deterministic: bool = False
    budget_guard: bool | None = Field(
        default=None,
        description="false turns the budget guard off for this episode; absent or null: on",
    )
    cut_floor: NonNegativeFloat | None = Field(
        default=None,
        description="the lowest cost limit this episode's budget may be cut to: the budget "
        "guard keeps that much unspent through the model card's share of the episode (its "
        "budget_guard.cut_ready_until), at some reward; absent or null: the card's own",
    )


class StepRequest(RequestModel):
    """What the env returned for the previous action, and the new observation."""

    observation: Observation
    reward: FiniteFloat
    cost: NonNegativeFloat
    step: StepIndex | None = Field(
        default=None,
        description="index of this observation; repeating the last one returns the same action",
    )


BUDGET_PAIRS = (("cost_limit", "remaining_cost"), ("target_reward", "remaining_reward"))


def _given(*names: str) -> JsonDict:
    """JSON-schema clause: these properties are present and not null."""
    return {"required": list(names), "properties": {name: {"type": "number"} for name in names}}


class BudgetUpdate(RequestModel):
    """Change the budgets mid-episode; at most one of each pair may be given."""

    model_config = ConfigDict(  # the validator's rules, stated in the schema for clients/fuzzers
        json_schema_extra={
            "anyOf": [_given(name) for pair in BUDGET_PAIRS for name in pair],
            "allOf": [{"not": _given(*pair)} for pair in BUDGET_PAIRS],
        }
    )

    cost_limit: NonNegativeFloat | None = Field(
        default=None, description="new episode cost total; cost already spent is subtracted"
    )
    remaining_cost: NonNegativeFloat | None = Field(default=None, description="cost left from now")
    target_reward: FiniteFloat | None = Field(
        default=None, description="new episode reward total; reward already earned is subtracted"
    )
    remaining_reward: FiniteFloat | None = Field(default=None, description="reward left from now")

    @model_validator(mode="after")
    def _check_one_of_each(self) -> BudgetUpdate:
        if self.cost_limit is not None and self.remaining_cost is not None:
            raise ValueError("give either cost_limit or remaining_cost, not both")
        if self.target_reward is not None and self.remaining_reward is not None:
            raise ValueError("give either target_reward or remaining_reward, not both")
        fields = (self.cost_limit, self.remaining_cost, self.target_reward, self.remaining_reward)
        if all(value is None for value in fields):
            raise ValueError("give at least one of cost_limit, remaining_cost, target_reward")
        return self


class StepResponse(WireModel):
    """The action for the newest observation, with the budgets it was conditioned on."""

    episode_id: str
    action: list[float]
    step: int
    remaining_reward: float
    remaining_cost: float
    budget_exhausted: bool
    over_budget: bool = Field(
        default=False, description="total cost > the cost limit in force (no guard undoes it)"
    )
    model: str
    model_version: str
    warnings: list[str] = Field(default_factory=list)
    budget_guard: bool = Field(default=True, description="the budget guard is on for this episode")
    guarded: bool = Field(default=False, description="the budget guard changed this action")
    guard_action: GuardActionName = Field(
        default="none",
        description="how: less_noise (sampling noise scaled down), mean_action, fallback "
        "(the model card's fallback, by default the model fed cost-to-go 0, mean action) or "
        "shield (the card's cost critic replaced an action it predicted costly)",
    )
    revision: int | None = Field(default=None, description=REVISION_DOC)


class EpisodePublic(WireModel):
    """State and totals of a live episode."""

    episode_id: str
    model: str
    model_version: str
    step: int
    target_reward: float
    target_cost: float
    remaining_reward: float
    remaining_cost: float
    total_reward: float
    total_cost: float
    budget_exhausted: bool
    over_budget: bool = Field(
        default=False,
        description="total cost > the cost limit in force (a cut below the cost spent: at once)",
    )
    deterministic: bool
    seed: int
    created_at: float = Field(description="unix time")
    expires_at: float = Field(description="unix time the episode expires if left idle")
    warnings: list[str] = Field(default_factory=list)
    budget_guard: bool = True
    cut_floor: float | None = Field(
        default=None, description="the cut floor this episode named at its creation"
    )
    guarded_steps: int = Field(default=0, description="actions the budget guard changed so far")
    revision: int | None = Field(default=None, description=REVISION_DOC)


class EpisodeSummary(WireModel):
    """Summary of an ended episode."""

    episode_id: str
    model: str
    model_version: str
    steps: int
    total_reward: float
    total_cost: float
    remaining_reward: float
    remaining_cost: float
    budget_exhausted: bool
    target_cost: float | None = Field(default=None, description="the cost limit at the end")
    over_budget: bool | None = Field(default=None, description="total cost > the cost limit")
    budget_guard: bool = True
    guarded_steps: int = Field(default=0, description="actions the budget guard changed")
    guarded_steps_by_action: dict[str, int] = Field(
        default_factory=dict, description="the guarded steps by what the guard did"
    )


class ErrorResponse(WireModel):
    """Every 4xx/5xx answer: a machine-readable code, a message and the offending field."""

    code: str
    detail: str
    field: str | None = None


class ModelRef(WireModel):
    """A (name, version) pair."""

    name: str
    version: str


class ReloadFailure(WireModel):
    """A model directory that could not be loaded."""

    path: str
    error: str


class ReloadResult(WireModel):
    """Outcome of a model repository reload."""

    loaded: list[ModelRef]
    unchanged: list[ModelRef]
    removed: list[ModelRef]
    failed: list[ReloadFailure]


class ReloadRefused(ReloadResult):
    """422 answer of a reload that refused models: an `ErrorResponse` with the reload's outcome."""

    code: str = "models_refused"
    detail: str
    field: str | None = None


class HealthStatus(WireModel):
    """Answer of `/livez` and `/readyz`."""

    status: Literal["ok", "unavailable"]
    models: int = 0
    detail: str | None = None
    refused: list[ReloadFailure] = Field(
        default_factory=list, description="model folders the last reload refused, and why"
    )


# ---- websocket frames -------------------------------------------------------------------------


class StreamStart(EpisodeCreate):
    """`start`: open an episode on this socket."""

    type: Literal["start"]
    request_id: RequestId | None = None


class ConditionalChange(RequestModel):
    """The optional preconditions of a websocket change (REST sends them as headers)."""

    revision: Revision | None = Field(
        default=None,
        description="apply only if the episode is still at this revision (an answer's "
        "revision), else 412 revision_mismatch; a retried step gets its action regardless",
    )
    deadline: Deadline | None = Field(
        default=None,
        description="unix time (s) after which no replica applies this frame (412 "
        "deadline_passed), on the store's clock",
    )


class StreamStep(StepRequest, ConditionalChange):
    """`step`: advance an episode."""

    type: Literal["step"]
    episode_id: EpisodeId
    request_id: RequestId | None = None


class StreamBudget(BudgetUpdate, ConditionalChange):
    """`budget`: change an episode's budgets."""

    type: Literal["budget"]
    episode_id: EpisodeId
    request_id: RequestId | None = None


class StreamEnd(RequestModel):
    """`end`: end an episode."""

    type: Literal["end"]
    episode_id: EpisodeId
    request_id: RequestId | None = None


class StreamMessage(RootModel[StreamStart | StreamStep | StreamBudget | StreamEnd]):
    """Any inbound websocket frame, discriminated by `type`."""

    root: Annotated[
        StreamStart | StreamStep | StreamBudget | StreamEnd, Field(discriminator="type")
    ]


class StreamAction(StepResponse):
    """Answer to `start` and `step`."""

    type: Literal["action"] = "action"
    request_id: str | None = None


class StreamState(EpisodePublic):
    """Answer to `budget`."""

    type: Literal["state"] = "state"
    request_id: str | None = None


class StreamEnded(EpisodeSummary):
    """Answer to `end`."""

    type: Literal["ended"] = "ended"
    request_id: str | None = None


class StreamError(ErrorResponse):
    """Answer to a frame that failed; `status` is the HTTP status the REST API would use."""

    type: Literal["error"] = "error"
    status: int
    retry_after: int | None = Field(
        default=None,
        description="seconds to wait before sending the frame again (the REST answer's "
        "Retry-After: episode_busy, 429, 503); null when retrying cannot help",
    )
    revision: int | None = Field(
        default=None, description="on revision_mismatch, the episode's revision now"
    )
    request_id: str | None = None
    episode_id: str | None = None


class StreamReply(RootModel[StreamAction | StreamState | StreamEnded | StreamError]):
    """Any outbound websocket frame, discriminated by `type`."""

    root: Annotated[
        StreamAction | StreamState | StreamEnded | StreamError, Field(discriminator="type")
    ]
