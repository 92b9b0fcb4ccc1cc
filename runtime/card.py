"""The model card (`model.json`): one typed model that exporters build, the service reads, and
evaluations update (docs/ARTIFACT.md). Required keys are typed and checked; extra keys stay."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from runtime.budget_guard import (
    CUT_TARGET_SHARE_OVER,
    DEFAULT_GUARD,
    GUARD_TARGET_SHARE_OVER,
    BudgetGuard,
)
from runtime.files import CARD_FILE, read_regular, write_atomic
from runtime.user_errors import UserError


class CardError(UserError, ValueError):
    """A `model.json` that is missing, unreadable or breaks the contract: one line for the user."""


CARD_LIMIT = 16 * 2**20
"""The largest `model.json` read (bytes): cards are tens of kilobytes."""


def _describe(error: OSError | ValueError) -> str:
    """One line: each validation problem as `field: message`, or the OS's reason."""
    if isinstance(error, ValidationError):
        problems = [
            f"{'.'.join(map(str, item['loc'])) or 'file'}: {item['msg']}" for item in error.errors()
        ]
        return "not a valid model card: " + "; ".join(problems)
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error)


FINITE = ConfigDict(allow_inf_nan=False)
"""Every number a card states is finite: JSON's NaN and Infinity are refused as the card is read,
not found later as a null in `/v1/models` or a comparison that is always false."""


class CardTarget(BaseModel):
    """A (reward, cost) target pair users can start an episode from."""

    model_config = FINITE

    reward: float
    cost: float


class CostCurvePoint(BaseModel):
    """One measured point of the target-cost -> actual-cost curve."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    target_cost: float
    actual_cost: float


class BudgetScale(BaseModel):
    """The calibration measured at one cost budget: the network is fed `scale` x the budget left."""

    model_config = FINITE

    budget: float = Field(gt=0)
    scale: float = Field(gt=0)

    @property
    def fed(self) -> float:
        """The budget the network is told at the episode's start."""
        return self.scale * self.budget


def interpolated_scale(points: list[BudgetScale], budget: float) -> float:
    """The scale at `budget`: the fed budget (scale x budget) is linear between listed budgets,
    so it grows with the budget when theirs does; outside them, the nearest listed scale."""
    if budget <= points[0].budget:
        return points[0].scale
    if budget >= points[-1].budget:
        return points[-1].scale
    fed = np.interp(budget, [point.budget for point in points], [point.fed for point in points])
    return float(fed) / budget


class CostGuidance(BaseModel):
    """Guidance on the cost token (docs/decisions/cost-guidance.md): each forward pass also runs
    the windows with `shift` more cost-to-go at every position, and the mean action moves
    `weight` times further from that contrast: a = a(C) + weight x (a(C) - a(C + shift)).

    A policy that reads its cost token only weakly (CarCircle, AntRun at 24,000 CPU steps) is
    pushed along the direction the token already points; weight 0 is the plain policy."""

    model_config = FINITE

    weight: float = Field(ge=0, le=10)
    shift: float = Field(gt=0, le=1_000)
    """Cost units added to the cost-to-go of the contrast pass (the largest validated budget)."""


class CostCriticCard(BaseModel):
    """The card's record of its cost critic (`cost_critic.onnx`, `runtime.cost_critic`), written
    by `cdt critic`: what it was trained on and how well it predicts held-out episodes."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)

    discount: float = Field(gt=0, lt=1)
    """Its target: the discounted cost that follows an action, sum_k discount^k c_{t+k}."""
    dataset: str
    update_steps: PositiveInt
    validation_mse: float = Field(ge=0)
    """Mean squared error on the held-out episodes' transitions."""
    target_variance: float = Field(ge=0)
    """The variance of those transitions' targets (the error of predicting their mean)."""


class GuardFigures(BaseModel):
    """Episodes of one budget and action mode, with or without the budget guard."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    share_over_budget: float
    """Fraction of episodes whose cost exceeded the cost limit in force at their end."""
    cost_mean: float
    normalised_reward: float | None = None
    guarded_steps_mean: float = 0.0


class GuardMeasurement(BaseModel):
    """The budget guard measured from outside: the same seeds guarded and unguarded."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    budget: float
    """The cost limit at the start (`cost_schedule` lists any change)."""
    action_mode: str
    """`sampled` or `mean`."""
    cost_schedule: str = ""
    """`STEP:LIMIT,...` budget changes (`cdt rollout --cost-schedule`); empty: none."""
    cut_floor: float | None = None
    """The cut floor the episodes named at their creation (`cdt rollout --cut-floor`)."""
    episodes: int
    first_seed: int
    guarded: GuardFigures
    unguarded: GuardFigures


class MeasuredCut(BaseModel):
    """What `budget_guard_measured` says of a budget cut at mid-episode: the most episodes over
    the new limit in one action mode, when the episodes were not told of the cut and when they
    named its floor at their creation (None: not measured)."""

    cost_schedule: str
    episodes: int
    unannounced: float
    announced: float | None


class ModelCard(BaseModel):
    """The `model.json` sidecar; required keys per ARTIFACT.md, extra keys allowed."""

    model_config = ConfigDict(
        extra="allow", protected_namespaces=(), frozen=True, allow_inf_nan=False
    )

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(min_length=1, max_length=128)
    task: str
    observation_dim: PositiveInt
    action_dim: PositiveInt
    action_low: list[float]
    action_high: list[float]
    context_len: PositiveInt
    max_episode_len: PositiveInt
    algo: str | None = None
    reward_scale: float = 1.0
    cost_scale: float = 1.0
    budget_scale: float = Field(default=1.0, gt=0)
    """The graph feeds budget_scale x the remaining cost budget (chosen by `cdt select`)."""
    mean_action_budget_scales: list[BudgetScale] | None = Field(default=None, min_length=1)
    """The calibration of `deterministic` episodes when it differs from `budget_scale`, by the
    episode's current cost limit (`interpolated_scale`; one entry: at every budget). Chosen per
    action mode by `cdt select`, per budget by `cdt calibrate`: their cost-to-go is multiplied
    by that scale / budget_scale before the graph."""
    sampled_budget_scales: list[BudgetScale] | None = Field(default=None, min_length=1)
    """The same for sampled episodes (`cdt calibrate --action-mode sampled`; absent or null:
    `budget_scale` at every budget)."""
    deterministic: bool | None = None
    onnx_opset: int | None = None
    git_commit: str | None = None
    created_at: str | None = None
    default_targets: list[CardTarget] | None = None
    cost_curve: list[CostCurvePoint] | None = None
    validated_cost_range: tuple[float, float] | None = None
    validated_action_mode: str | None = None
    """The action mode (`sampled`, `mean`) the cost curve and validated range were measured with."""
    dataset: dict[str, Any] | None = None
    training_config: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    budget_guard: BudgetGuard | None = None
    """The budget guard's thresholds and fallback (absent: `runtime.budget_guard`'s defaults)."""
    cost_guidance: CostGuidance | None = None
    """Guidance on the cost token, chosen by `cdt guidance` on selection seeds (absent: none)."""
    budget_guard_measured: list[GuardMeasurement] | None = None
    """Guarded against unguarded episodes, written by `bench/budget_guard.py --record`."""
    cost_critic: CostCriticCard | None = None
    """The cost critic beside the graph, the budget guard's shield (absent: none)."""

    @property
    def reward_return_range(self) -> tuple[float, float] | None:
        """(min, max) reward return of the training dataset, for normalised scores."""
        data = self.dataset or {}
        low, high = data.get("reward_return_min"), data.get("reward_return_max")
        if not isinstance(low, int | float) or not isinstance(high, int | float):
            return None
        return float(low), float(high)

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        low, high = np.asarray(self.action_low), np.asarray(self.action_high)
        if low.shape != (self.action_dim,) or high.shape != (self.action_dim,):
            raise ValueError("action_low and action_high need action_dim entries")
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
            raise ValueError("action bounds must be finite with action_low <= action_high")
        if self.guard.shield_margin > 0 and self.cost_critic is None:
            raise ValueError("budget_guard.shield_margin needs a cost critic (`cdt critic`)")
        cost_range = self.validated_cost_range
        if cost_range is not None and not cost_range[0] <= cost_range[1]:
            raise ValueError("validated_cost_range must be [low, high] with low <= high")
        for field, points in (
            ("mean_action_budget_scales", self.mean_action_budget_scales),
            ("sampled_budget_scales", self.sampled_budget_scales),
        ):
            for lower, upper in pairwise(points or []):
                if upper.budget <= lower.budget or upper.fed < lower.fed:
                    raise ValueError(
                        f"{field} must list increasing budgets whose fed budget"
                        " (scale x budget) does not fall: a looser budget must never feed less"
                    )
        return self

    @property
    def guard(self) -> BudgetGuard:
        """The budget guard of this model: the card's, or the measured defaults."""
        return self.budget_guard if self.budget_guard is not None else DEFAULT_GUARD

    def budget_scales(self, deterministic: bool) -> list[BudgetScale] | None:
        """The action mode's calibration by budget (None: the graph's `budget_scale`)."""
        return self.mean_action_budget_scales if deterministic else self.sampled_budget_scales

    def cost_input_scale(self, deterministic: bool, budget: float) -> float:
        """What the cost-to-go of an episode in this action mode with cost limit `budget` is
        multiplied by before the graph (1: fed as it is)."""
        points = self.budget_scales(deterministic)
        if points is None:
            return 1.0
        return interpolated_scale(points, budget) / self.budget_scale

    def guard_validated_range(self) -> tuple[float, float] | None:
        """The lowest to the highest steady budget of `budget_guard_measured`, where the guard
        let at most its target share of episodes over in every steady row (None: unmeasured, or
        a row missed)."""
        rows = [row for row in self.budget_guard_measured or [] if not row.cost_schedule]
        if not rows or any(row.guarded.share_over_budget > GUARD_TARGET_SHARE_OVER for row in rows):
            return None
        budgets = [row.budget for row in rows]
        return min(budgets), max(budgets)

    def measured_cut(self, guarded: bool) -> MeasuredCut | None:
        """The cut rows of `budget_guard_measured`, with the guard on or off (None: no cut
        measured without notice)."""
        rows = [row for row in self.budget_guard_measured or [] if row.cost_schedule]
        unannounced = [row for row in rows if row.cut_floor is None]
        if not unannounced:
            return None

        def worst(chosen: list[GuardMeasurement]) -> float:
            figures = [row.guarded if guarded else row.unguarded for row in chosen]
            return max(figure.share_over_budget for figure in figures)

        announced = [row for row in rows if row.cut_floor is not None]
        return MeasuredCut(
            cost_schedule=unannounced[0].cost_schedule,
            episodes=min(row.episodes for row in unannounced),
            unannounced=worst(unannounced),
            announced=worst(announced) if announced else None,
        )

    def cut_warnings(self, guarded: bool) -> list[str]:
        """Warn a controller that cuts an episode's budget without notice where this model was
        measured to miss such cuts (more episodes over than `CUT_TARGET_SHARE_OVER`)."""
        cut = self.measured_cut(guarded)
        if cut is None or cut.unannounced <= CUT_TARGET_SHARE_OVER:
            return []
        told = "" if cut.announced is None else f"; {cut.announced:.0%} when they named the floor"
        return [
            f"{self.name} {self.version} ended over the new limit in {cut.unannounced:.0%} of "
            f"{cut.episodes} episodes measured with a cut they were not told of (step:limit "
            f"{cut.cost_schedule}){told}: an episode that may be cut names its cut_floor when "
            "it is created"
        ]

    def guard_misses(self, target_cost: float) -> list[str]:
        """Warn where the guard was measured from outside at this steady budget to let more
        episodes over than its target (`budget_guard_measured`; the worst action mode)."""
        rows = [
            row
            for row in self.budget_guard_measured or []
            if not row.cost_schedule and row.budget == target_cost
        ]
        worst = max(rows, key=lambda row: row.guarded.share_over_budget, default=None)
        if worst is None or worst.guarded.share_over_budget <= GUARD_TARGET_SHARE_OVER:
            return []
        return [
            f"{self.name} {self.version} with the budget guard ended over a budget of "
            f"{target_cost:g} in {worst.guarded.share_over_budget:.0%} of {worst.episodes} "
            f"episodes measured from outside ({worst.action_mode} actions; the guard's target: "
            f"{GUARD_TARGET_SHARE_OVER:.0%})"
        ]

    def budget_warnings(self, target_cost: float, guarded: bool = False) -> list[str]:
        """Warn when an episode's cost limit lies outside the validated range (for an episode
        with the budget guard on, also outside the range the guard was measured to keep, and
        at a budget where it was measured to miss its target: `guard_misses`)."""
        misses = self.guard_misses(target_cost) if guarded else []
        if self.validated_cost_range is None or _within(target_cost, self.validated_cost_range):
            return misses
        # every step's answer asks: the guard's rows are read only where the model's range misses
        ranges = [self.validated_cost_range]
        guard_range = self.guard_validated_range() if guarded else None
        if guard_range is not None:
            if _within(target_cost, guard_range):
                return []
            ranges.append(guard_range)
        named = " or ".join(f"[{low:g}, {high:g}]" for low, high in ranges)
        outside = (
            f"cost limit {target_cost:g} lies outside the validated range {named} of "
            f"{self.name} {self.version}; the cost is not guaranteed"
        )
        return [outside, *misses]


def _within(value: float, bounds: tuple[float, float]) -> bool:
    low, high = bounds
    return low <= value <= high


def read_card(directory: Path) -> ModelCard:
    """Read and validate `directory/model.json`; raises `CardError`."""
    path = Path(directory) / CARD_FILE
    try:
        return ModelCard.model_validate_json(read_regular(path, CARD_LIMIT))
    except (OSError, ValueError) as error:
        raise CardError(f"{path}: {_describe(error)}") from error


def write_card(directory: Path, card: ModelCard | dict[str, Any]) -> ModelCard:
    """Validate `card` and write it to `directory/model.json` atomically; returns it."""
    try:
        model = card if isinstance(card, ModelCard) else ModelCard.model_validate(card)
    except ValidationError as error:
        raise CardError(f"{Path(directory) / CARD_FILE}: {_describe(error)}") from error
    text = json.dumps(model.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"
    write_atomic(Path(directory) / CARD_FILE, lambda temporary: temporary.write_text(text))
    return model


def update_card(directory: Path, **changes: Any) -> ModelCard:
    """Read the card, apply `changes` (validated again) and write it back."""
    card = read_card(directory)
    return write_card(directory, {**card.model_dump(mode="json"), **changes})
