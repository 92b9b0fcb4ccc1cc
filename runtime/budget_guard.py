"""The budget guard: every episode keeps its cost budget, not only the average.

A CDT conditioned on a cost budget keeps it on average; single episodes still overshoot (15-45 %
of sampled episodes, issue 28), and calibration cannot move that tail. The guard acts on what is
known at every step: the cost budget left, the steps left and the action mode. The pace is the
budget left per step left, in units of the largest cost one step can add: at a pace of 1 or
more the episode cannot go over any more, and the guard stands aside. Below that:

- through the first `cut_ready_until` of the episode, a budget above `cut_floor` counts as
  `cut_floor` (all that follows acts on that), so a cut to it finds it unspent (for the card's
  floor, limits from `cut_ready_from` to `cut_ready_to`); a card's
  `cut_ready_guidance` sets the cost guidance's weight while so held, `cut_ready_release`
  lets the rest of the budget in over a share of the episode instead of at once, and
  `cut_ready_tells_floor` false tells the model its own budget while the fallback (at
  `cut_ready_margin`) keeps the floor;
- the model is told `hidden_reserve` less budget than is left (and, with `early_scale` below 1,
  only a share of it early in the episode), so its own plan ends with something in reserve;
- `less_noise`: a sampled episode's noise shrinks with the pace, from `full_noise_pace` down
  to `mean_action_pace`;
- `mean_action`: at or below `mean_action_pace`, the Gaussian's mean, no noise;
- `fallback`: at or below `fallback_margin` of budget left (at most `fallback_share` of the cost
  limit), the card's fallback, by default the CDT itself told no cost is left (cost-to-go 0 in
  its window), with the mean action;
- `shield`: at or below `shield_margin` of budget left, a card with a cost critic
  (`runtime.cost_critic`) has it check the action chosen above, and replaces an action whose
  predicted cost is above `shield_risk` (at most `shield_risk_share` of the budget left) by the
  nearest fixed candidate it predicts at most that for (none such: the action stays).

It is a pure function of those, so it follows a budget changed mid-episode at once and needs no
state beyond its counts. The service (`service.inference.PendingAction`) and the offline episode
loop (`runtime.episodes`) both call `BudgetGuard.decide` and apply the decision with
`EpisodeContext.window`'s `cost_left` and `sample_action`'s `noise_scale`: what is measured
offline is what is served. The figures that chose the defaults: docs/decisions/budget-guard.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from runtime.context import EpisodeContext


GUARD_TARGET_SHARE_OVER = 0.05
"""The budget guard's target: at most one episode in twenty over budget (issue 28)."""
CUT_TARGET_SHARE_OVER = 0.10
"""Episodes over the smaller budget after a cut from a larger one at mid-episode that the guard
aims at (issue 28)."""


class GuardAction(StrEnum):
    """What the guard did to one step's action (`none`: it did not act)."""

    NONE = "none"
    LESS_NOISE = "less_noise"
    MEAN_ACTION = "mean_action"
    FALLBACK = "fallback"
    SHIELD = "shield"


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
    cost_left_fed: float | None = None
    """The cost budget left the model is told (0: the `zero_cost_to_go` fallback); None: the
    episode's own."""
    shield_risk: float | None = None
    """Ask the card's cost critic about the chosen action and replace it when its predicted cost
    is above this (`runtime.cost_critic`); None: no shield this step."""
    guidance_weight: float | None = None
    """The weight of the card's cost guidance for this step's forward pass (None: the card's)."""


@dataclass(frozen=True)
class CutReadiness:
    """What a guard that keeps an episode ready for a budget cut needs to know about it."""

    cost_spent: float = 0.0
    floor: float | None = None
    """The episode's own cut floor (None: the card's `cut_floor`)."""


UNGUARDED = GuardDecision(GuardAction.NONE)
"""The decision of a step the guard leaves alone (and of every step of an unguarded episode)."""


class BudgetGuard(BaseModel):
    """When the guard acts (the card's `budget_guard`; every field has a measured default,
    docs/decisions/budget-guard.md).

    The fallback's thresholds are in units of cost budget left; the noise's in budget left per
    step left (`pace`, in units of `max_step_cost`): at a pace of 1 or more the episode cannot
    go over any more, however it acts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fallback: Literal["zero_cost_to_go"] = "zero_cost_to_go"
    """What runs once the budget is nearly spent: the CDT fed cost-to-go 0, mean action."""
    fallback_margin: float = Field(default=8.0, ge=0)
    """Budget left at or below which the fallback acts: the cost of the costly streak already
    under way when it takes over (costs come in runs of steps, not one at a time)."""
    fallback_cost_rate: float = Field(default=0.0, ge=0)
    """Cost per step left that the fallback itself may still spend; added to the margin."""
    fallback_share: float = Field(default=0.0, ge=0)
    """The margin is at most this share of the episode's cost limit (0: `fallback_margin`
    alone): a limit below the margin would otherwise run in the fallback from its first step."""
    max_step_cost: float = Field(default=1.0, ge=0)
    """The largest cost one step can add (Bullet-Safety-Gym: 1). With at least this much budget
    left per step left, the episode cannot go over, and the guard leaves it alone (0: unknown;
    the guard then never stands aside and never adds noise back)."""
    mean_action_pace: float = Field(default=1.0, ge=0)
    """Pace at or below which sampled episodes act with the mean action."""
    full_noise_pace: float = Field(default=1.0, ge=0)
    """Pace at or above which sampled episodes keep their full sampling noise; between the two
    paces the noise shrinks linearly."""

    hidden_reserve: float = Field(default=2.0, ge=0)
    """Budget kept from the model while the episode could still go over (pace below 1): it is
    told this much less than is left, so its own plan ends with this much in reserve."""
    early_scale: float = Field(default=1.0, gt=0, le=1)
    """Pacing: at the episode's start the model is told this share of the budget left, rising
    linearly to all of it at the episode's end, so it keeps budget for a later cut."""
    cut_floor: float = Field(default=0.0, ge=0)
    """The lowest budget a controller may cut an episode to (0: none); an episode may name its
    own (`cut_floor` at its creation)."""
    cut_ready_from: float = Field(default=0.0, ge=0)
    """The card's `cut_floor` holds only episodes whose cost limit is at least this (0: every
    one above the floor): a model that spends little of a small budget early keeps a cut
    without being held. An episode's own floor holds whatever its limit."""
    cut_ready_to: float = Field(default=0.0, ge=0)
    """The largest limit the card's `cut_floor` holds (0: no bound): where a model earns much
    more with a large budget by spending it early, holding it gives that up for a cut that
    such an episode can still announce."""
    cut_ready_until: float = Field(default=0.5, ge=0, le=1)
    """Share of the episode through which the guard treats a budget above the cut floor as the
    floor (the budget told, the noise, the fallback and the shield all act on it), so a cut to
    the floor in that time finds it unspent; the rest of the budget is free after."""
    cut_ready_release: float = Field(default=0.0, ge=0, le=1)
    """Share of the episode after `cut_ready_until` through which the held budget rises
    linearly from the floor to the episode's own (0: all of it at once), so the model is not
    told a much larger budget from one step to the next."""
    cut_ready_guidance: float | None = Field(default=None, ge=0, le=10)
    """The weight of the card's cost guidance while an episode is held for a cut (None: the
    card's own). The guidance makes a model told a small budget timid; held, the floor, the
    fallback and the shield keep the budget, and a lower weight earns more of it."""
    cut_ready_tells_floor: bool = True
    """While an episode is held for a cut, the model is told what is left of the floor (False:
    of its own budget, less `hidden_reserve`, while the noise, the fallback and the shield
    still act on the floor's): a model that earns much less told a small budget, but spends
    little by mid-episode, keeps the cut through the fallback alone."""
    cut_ready_margin: float | None = Field(default=None, ge=0)
    """The fallback's margin while an episode is held for a cut (None: the card's own): the
    fallback then takes over once the cost spent comes within this of the floor."""
    shield_margin: float = Field(default=0.0, ge=0)
    """Budget left at or below which the card's cost critic checks every action while the
    episode could still go over (0: no shield; a card needs a cost critic to set it)."""
    shield_risk: float = Field(default=2.0, ge=0)
    """The critic's predicted discounted cost above which the shield replaces an action."""
    shield_risk_share: float = Field(default=0.0, ge=0)
    """The shield's risk is at most this share of the budget left (0: `shield_risk` alone): at
    the end of a small budget, an action the critic predicts to cost `shield_risk` is more than
    is left."""

    @model_validator(mode="after")
    def _check_ranges(self) -> Self:
        if self.full_noise_pace < self.mean_action_pace:
            raise ValueError("full_noise_pace must be at least mean_action_pace")
        if 0 < self.cut_ready_to < self.cut_ready_from:
            raise ValueError("cut_ready_to must be 0 (no bound) or at least cut_ready_from")
        return self

    def reserve(self, steps_left: int, limit: float) -> float:
        """The budget left at or below which the fallback takes over, in an episode whose cost
        limit (the budget the guard acts on plus the cost spent) is `limit`."""
        margin = self.fallback_margin
        if self.fallback_share > 0:
            margin = min(margin, self.fallback_share * limit)
        return margin + self.fallback_cost_rate * max(steps_left, 0)

    def pace(self, remaining_cost: float, steps_left: int) -> float:
        """Budget left per step left, in units of `max_step_cost` (inf when unbounded)."""
        most = self.max_step_cost * steps_left
        return remaining_cost / most if most > 0 else float("inf")

    def told(self, remaining_cost: float, steps_left: int, episode_len: int) -> float | None:
        """The budget left the model is told (None: all of it, as it is)."""
        if self.hidden_reserve == 0 and self.early_scale == 1:
            return None
        scale = self.early_scale + (1.0 - self.early_scale) * _done(steps_left, episode_len)
        return max(remaining_cost * scale - self.hidden_reserve, 0.0)

    def holds_limit(self, limit: float) -> bool:
        """Whether the card's `cut_floor` holds an episode whose cost limit is `limit`."""
        below_cap = self.cut_ready_to == 0 or limit <= self.cut_ready_to
        return self.cut_ready_from <= limit and below_cap

    def guarded_budget(
        self, remaining_cost: float, steps_left: int, episode_len: int, cut: CutReadiness
    ) -> float:
        """The budget left the guard acts on: what is left of the cut floor while the episode is
        kept ready for a cut to it (rising to the episode's own while released), else the
        episode's own."""
        limit, floor = remaining_cost + cut.cost_spent, cut.floor
        if floor is None:  # the card's, for limits from `cut_ready_from` to `cut_ready_to`
            floor = self.cut_floor if self.holds_limit(limit) else 0.0
        done = _done(steps_left, episode_len)
        if floor == 0 or done >= self.cut_ready_until + self.cut_ready_release:
            return remaining_cost
        if done > self.cut_ready_until:  # releasing: the floor rises to the episode's limit
            share = (done - self.cut_ready_until) / self.cut_ready_release
            floor += max(limit - floor, 0.0) * share
        return min(remaining_cost, max(floor - cut.cost_spent, 0.0))

    def decide(
        self,
        remaining_cost: float,
        steps_left: int,
        deterministic: bool,
        episode_len: int = 0,
        cut: CutReadiness | None = None,
    ) -> GuardDecision:
        """The decision for a step with `remaining_cost` budget and `steps_left` steps to go.

        Args:
            remaining_cost: the episode's cost-to-go now (after the last step's cost, and after
                any budget change).
            steps_left: `max_episode_len` minus the step index of the newest observation.
            deterministic: the episode acts with the mean action anyway.
            episode_len: the card's `max_episode_len` (pacing; 0: the episode's end).
            cut: the episode's cost so far and its own cut floor (`cut_floor`).
        """
        cut = cut or CutReadiness()
        budget = self.guarded_budget(remaining_cost, steps_left, episode_len, cut)
        pace = self.pace(budget, steps_left)
        if self.max_step_cost > 0 and pace >= 1.0:
            return UNGUARDED  # even a costly step each step to the end stays within budget
        limit, held = budget + cut.cost_spent, budget < remaining_cost
        margin = self.cut_ready_margin if held else None
        decision = self._throttle(
            budget, steps_left, deterministic, (episode_len, pace, limit), margin
        )
        if held:
            decision = self._held(decision, budget, remaining_cost, steps_left, episode_len)
        if 0 < self.shield_margin and budget <= self.shield_margin:
            return replace(decision, shield_risk=self.risk(budget))
        return decision

    def _held(
        self,
        decision: GuardDecision,
        budget: float,
        remaining_cost: float,
        steps_left: int,
        episode_len: int,
    ) -> GuardDecision:
        """`decision` for a step held for a cut to `budget` left of the floor: the model told
        that (or its own budget, where the card says so), with the card's guidance weight."""
        if decision.action is not GuardAction.FALLBACK and not self.cut_ready_tells_floor:
            told = self.told(remaining_cost, steps_left, episode_len)
            decision = replace(decision, cost_left_fed=told)
        elif decision.cost_left_fed is None:
            decision = replace(decision, cost_left_fed=budget)
        if self.cut_ready_guidance is not None:
            decision = replace(decision, guidance_weight=self.cut_ready_guidance)
        return decision

    def risk(self, budget: float) -> float:
        """The shield's risk with `budget` left."""
        if self.shield_risk_share == 0:
            return self.shield_risk
        return min(self.shield_risk, self.shield_risk_share * budget)

    def decide_newest(
        self, context: EpisodeContext, episode_len: int, deterministic: bool, floor: float | None
    ) -> GuardDecision:
        """The decision for the newest step of `context` (the service and the offline loop both
        ask this): its budget left, its steps left to `episode_len`, its cost spent and the cut
        floor its creation named (None: the card's)."""
        cut = CutReadiness(context.total_cost, floor)
        steps_left = episode_len - context.step
        return self.decide(context.remaining_cost, steps_left, deterministic, episode_len, cut)

    def _throttle(
        self,
        remaining_cost: float,
        steps_left: int,
        deterministic: bool,
        step: tuple[int, float, float],
        margin: float | None = None,
    ) -> GuardDecision:
        """The noise, told budget and fallback of a step that could still go over (`step`: the
        episode's length, its pace and its cost limit; `margin`: the fallback's, None: the
        card's)."""
        episode_len, pace, limit = step
        reserve = self.reserve(steps_left, limit) if margin is None else margin
        if remaining_cost <= reserve:
            return GuardDecision(GuardAction.FALLBACK, noise_scale=0.0, cost_left_fed=0.0)
        told = self.told(remaining_cost, steps_left, episode_len)
        if deterministic or pace >= self.full_noise_pace:
            return UNGUARDED if told is None else GuardDecision(GuardAction.NONE, 1.0, told)
        if pace <= self.mean_action_pace:
            return GuardDecision(GuardAction.MEAN_ACTION, noise_scale=0.0, cost_left_fed=told)
        span = self.full_noise_pace - self.mean_action_pace
        noise_scale = (pace - self.mean_action_pace) / span
        return GuardDecision(GuardAction.LESS_NOISE, noise_scale, told)


DEFAULT_GUARD = BudgetGuard()


def _done(steps_left: int, episode_len: int) -> float:
    """Share of the episode gone (1 when its length is unknown)."""
    return min(max(1.0 - steps_left / episode_len, 0.0), 1.0) if episode_len > 0 else 1.0


@dataclass(frozen=True)
class GuardTally:
    """How many steps of one episode each guard action chose (the episode summary's counts)."""

    less_noise: int = 0
    mean_action: int = 0
    fallback: int = 0
    shield: int = 0

    @property
    def guarded_steps(self) -> int:
        """Steps whose action the guard changed."""
        return self.less_noise + self.mean_action + self.fallback + self.shield

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
