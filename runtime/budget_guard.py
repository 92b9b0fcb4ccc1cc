"""The budget guard: every episode keeps its cost budget, not only the average.

A CDT conditioned on a cost budget keeps it on average; single episodes still overshoot (20-40 %
of sampled episodes at a budget of 10, issue 28), and calibration cannot move that tail. The guard
acts on what is known at every step, the cost budget left and the steps left, and makes the
policy more conservative as the budget runs out:

1. `less_noise`: the sampling noise shrinks linearly with the budget left (sampled episodes);
2. `mean_action`: the Gaussian's mean, no noise (sampled episodes);
3. `fallback`: the card's fallback, by default the CDT itself conditioned on no cost left
   (cost-to-go 0 in its window) with the mean action, once the budget left is within
   `fallback_margin` of the costly steps it may still have to absorb.

It is a pure function of (budget left, steps left, action mode), so it follows a budget changed
mid-episode at once and needs no state of its own beyond its counts. The service
(`service.inference.PendingAction`) and the offline episode loop (`runtime.episodes`) both call
`BudgetGuard.decide` and apply the decision with `guarded_window` and `sample_action`'s
`noise_scale`: what is measured offline is what is served. The thresholds and the figures that
chose them: docs/decisions/budget-guard.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field


class GuardAction(StrEnum):
    """What the guard did to one step's action (`none`: it did not act)."""

    NONE = "none"
    LESS_NOISE = "less_noise"
    MEAN_ACTION = "mean_action"
    FALLBACK = "fallback"


GUARD_ACTIONS = tuple(GuardAction)
"""Every action in a fixed order; a record stores an action as its index here."""
ACTED = GUARD_ACTIONS[1:]
"""The actions that count as guarded steps."""


@dataclass(frozen=True)
class GuardDecision:
    """How one step's action is chosen."""

    action: GuardAction
    noise_scale: float = 1.0
    """Multiplies the sampling noise (1: as the model says; 0: the mean action)."""
    no_cost_left: bool = False
    """Feed the window as if no cost budget were left (the `zero_cost_to_go` fallback)."""


UNGUARDED = GuardDecision(GuardAction.NONE)
"""The decision of a step the guard leaves alone (and of every step of an unguarded episode)."""


class BudgetGuard(BaseModel):
    """When the guard acts, in units of cost budget left (the card's `budget_guard`; every field
    has a measured default, docs/decisions/budget-guard.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fallback: Literal["zero_cost_to_go"] = "zero_cost_to_go"
    """What runs once the budget is nearly spent: the CDT fed cost-to-go 0, mean action."""
    fallback_margin: float = Field(default=3.0, ge=0)
    """Budget left at or below which the fallback acts: the cost of the costly streak already
    under way when it takes over (costs come in runs of steps, not one at a time)."""
    fallback_cost_rate: float = Field(default=0.0, ge=0)
    """Cost per step left that the fallback itself may still spend; added to the margin."""
    mean_margin: float = Field(default=2.0, ge=0)
    """Budget above the fallback's reserve at or below which sampled episodes act with the mean."""
    noise_margin: float = Field(default=4.0, ge=0)
    """Budget above the mean action's at which the sampling noise starts to shrink."""

    def reserve(self, steps_left: int) -> float:
        """The budget left at or below which the fallback takes over."""
        return self.fallback_margin + self.fallback_cost_rate * max(steps_left, 0)

    def decide(self, remaining_cost: float, steps_left: int, deterministic: bool) -> GuardDecision:
        """The decision for a step with `remaining_cost` budget and `steps_left` steps to go.

        Args:
            remaining_cost: the episode's cost-to-go now (after the last step's cost, and after
                any budget change).
            steps_left: `max_episode_len` minus the step index of the newest observation.
            deterministic: the episode acts with the mean action anyway.
        """
        headroom = remaining_cost - self.reserve(steps_left)
        if headroom <= 0.0:
            return GuardDecision(GuardAction.FALLBACK, noise_scale=0.0, no_cost_left=True)
        if deterministic or headroom >= self.mean_margin + self.noise_margin:
            return UNGUARDED
        if headroom <= self.mean_margin:
            return GuardDecision(GuardAction.MEAN_ACTION, noise_scale=0.0)
        noise_scale = (headroom - self.mean_margin) / self.noise_margin
        return GuardDecision(GuardAction.LESS_NOISE, noise_scale=noise_scale)


DEFAULT_GUARD = BudgetGuard()


def guarded_window(
    window: dict[str, npt.NDArray[Any]], decision: GuardDecision
) -> dict[str, npt.NDArray[Any]]:
    """`window` (one episode's six inputs, no batch axis) as the decision feeds it.

    The fallback shifts the cost-to-go so that its newest entry is 0 and each older one is the
    cost spent since (clamped at 0): exactly the window a `PATCH .../budget` with
    `remaining_cost: 0` would leave, so the model sees a consistent exhausted budget.
    """
    if not decision.no_cost_left:
        return window
    costs = window["costs_to_go"]  # [K]
    shifted = np.maximum(costs - costs[-1], 0.0).astype(costs.dtype)  # [K], newest 0
    return {**window, "costs_to_go": shifted}


@dataclass(frozen=True)
class GuardTally:
    """How many steps of one episode each guard action chose (the episode summary's counts)."""

    less_noise: int = 0
    mean_action: int = 0
    fallback: int = 0

    @property
    def guarded_steps(self) -> int:
        """Steps whose action the guard changed."""
        return self.less_noise + self.mean_action + self.fallback

    def counts(self) -> dict[str, int]:
        """Steps by action, for every action that counts as guarded."""
        return {action.value: getattr(self, action.value) for action in ACTED}

    def add(self, action: GuardAction) -> GuardTally:
        """The tally with one more step of `action` (unchanged for `none`)."""
        if action is GuardAction.NONE:
            return self
        counts = self.counts()
        counts[action.value] += 1
        return GuardTally(**counts)
