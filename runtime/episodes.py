"""The one episode loop (paper Algorithm 2) that every evaluation runs.

Checkpoint selection during training, `cdt evaluate`, the sweeps and `cdt report` all call
`run_episodes`; only the forward pass differs (torch during training, onnxruntime for an exported
policy). The bookkeeping is `EpisodeContext`'s, the same object the service keeps per episode, and
actions come from `sample_action`, the service's own. Episodes step in lockstep and share one
batched forward pass per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from runtime.budget_guard import (
    DEFAULT_GUARD,
    UNGUARDED,
    BudgetGuard,
    GuardDecision,
    GuardTally,
)
from runtime.context import EpisodeContext, batch_windows
from runtime.cost_critic import CostCritic, act_as_decided

Windows = dict[str, npt.NDArray[Any]]
GuidanceWeights = Sequence[float | None]
Predict = Callable[[Windows, GuidanceWeights], tuple[npt.NDArray[Any], npt.NDArray[Any]]]
"""Batched windows (the six ONNX inputs) and each row's cost guidance weight (None: the card's;
`Policy.predict`) -> (action_mean, action_log_std), both [B, action_dim]."""
CostInputScale = Callable[[bool, float], float]
"""(deterministic, the episode's cost limit) -> what its cost-to-go is multiplied by."""


@dataclass(frozen=True)
class EpisodePolicy:
    """A forward pass plus what the loop needs to know about it (all of it on the model card)."""

    predict: Predict
    context_len: int
    action_dim: int
    action_low: Sequence[float]
    action_high: Sequence[float]
    cost_input_scale: CostInputScale = field(default=lambda deterministic, budget: 1.0)
    """What the cost-to-go of an episode in this action mode with this cost limit is multiplied
    by before `predict` (`ModelCard.cost_input_scale`; default: fed as it is)."""
    budget_guard: BudgetGuard = DEFAULT_GUARD
    """The guard's thresholds (`ModelCard.guard`); used by episodes whose spec asks for it."""
    max_episode_len: int = 0
    """The card's; the guard's steps left are counted from it (0: unknown, none left)."""
    cost_critic: CostCritic | None = None
    """The card's cost critic, the guard's shield (`runtime.cost_critic`); None: none."""


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: its seed, budgets, action mode and optional budget changes."""

    seed: int
    target_reward: float
    target_cost: float
    deterministic: bool = False
    """Act with the Gaussian's mean instead of a sample."""
    cost_schedule: tuple[tuple[int, float], ...] = ()
    """(step, new episode cost limit): applied before the action of that step is chosen, as a
    `PATCH .../budget` that reaches the service before that step's request."""
    budget_guard: bool = False
    """Run the budget guard, as the service does by default (`runtime.budget_guard`); off here
    by default, so calibration and selection measure the model itself."""
    cut_floor: float | None = None
    """The lowest budget this episode may be cut to, for the guard to keep ready (None: the
    card's `budget_guard.cut_floor`), as an episode's creation may name it."""


@dataclass(frozen=True)
class EpisodeResult:
    """One finished episode."""

    spec: EpisodeSpec
    reward: float
    cost: float
    length: int
    step_costs: list[float] = field(default_factory=list)
    """Per-step costs, when asked for (budget-change plots)."""
    step_rewards: list[float] = field(default_factory=list)
    """Per-step rewards, when asked for (what each part of an episode earned)."""
    guard: GuardTally = field(default_factory=GuardTally)
    """Steps the budget guard acted on, by action (all 0 when the spec did not ask for it)."""


def _start(policy: EpisodePolicy, spec: EpisodeSpec, observation: Any) -> EpisodeContext:
    return EpisodeContext.start(
        observation,
        spec.target_reward,
        spec.target_cost,
        context_len=policy.context_len,
        action_dim=policy.action_dim,
        seed=spec.seed,
    )


def decide(policy: EpisodePolicy, spec: EpisodeSpec, context: EpisodeContext) -> GuardDecision:
    """The budget guard's decision for the newest step of an episode (the service's rule)."""
    if not spec.budget_guard:
        return UNGUARDED
    return policy.budget_guard.decide_newest(
        context, policy.max_episode_len, spec.deterministic, spec.cut_floor
    )


def _window(
    policy: EpisodePolicy, spec: EpisodeSpec, context: EpisodeContext, decision: GuardDecision
) -> Mapping[str, npt.NDArray[Any]]:
    scale = policy.cost_input_scale(spec.deterministic, context.target_cost)
    return context.window(scale, cost_left=decision.cost_left_fed)


@dataclass
class _Running:
    """One episode in progress."""

    spec: EpisodeSpec
    env: Any
    context: EpisodeContext
    schedule: dict[int, float]
    length: int = 0
    step_costs: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    tally: GuardTally = field(default_factory=GuardTally)

    def result(self) -> EpisodeResult:
        context = self.context
        return EpisodeResult(
            self.spec, context.total_reward, context.total_cost, self.length, self.step_costs,
            self.step_rewards, self.tally,
        )  # fmt: skip


def run_episodes(
    policy: EpisodePolicy,
    task: str,
    specs: Sequence[EpisodeSpec],
    *,
    record_steps: bool = False,
    env_factory: Callable[[str], Any] | None = None,
    on_episode_end: Callable[[], object] | None = None,
) -> list[EpisodeResult]:
    """Run one episode per spec, all stepping together; results come back in the specs' order.

    Args:
        env_factory: builds one env per episode (default: the Bullet-Safety-Gym wrapper).
        on_episode_end: called as each episode ends (a progress bar's update, say).
    """
    from runtime.sim import make_env, seed_simulator

    if not specs:
        return []
    # Bullet-Safety-Gym draws placement noise from the global RNGs, not from reset(seed=...).
    seed_simulator(specs[0].seed)
    envs = [(env_factory or make_env)(task) for _ in specs]  # all made before any reset
    episodes = [
        _Running(
            spec, env, _start(policy, spec, env.reset(seed=spec.seed)[0]), dict(spec.cost_schedule)
        )
        for env, spec in zip(envs, specs, strict=True)
    ]
    active = episodes
    while active:
        ended = _step_together(policy, active, record_steps)
        active = [episode for episode, done in zip(active, ended, strict=True) if not done]
        for _ in range(sum(ended)):
            if on_episode_end is not None:
                on_episode_end()
    for episode in episodes:
        episode.env.close()
    return [episode.result() for episode in episodes]


def _step_together(policy: EpisodePolicy, active: list[_Running], record_steps: bool) -> list[bool]:
    """One step of every active episode with one batched forward pass; which ones ended."""
    for episode in active:
        if episode.length in episode.schedule:
            episode.context.set_budget(cost_limit=episode.schedule[episode.length])
    decisions = [decide(policy, episode.spec, episode.context) for episode in active]
    windows = [
        _window(policy, episode.spec, episode.context, decision)
        for episode, decision in zip(active, decisions, strict=True)
    ]
    weights = [decision.guidance_weight for decision in decisions]
    mean, log_std = policy.predict(batch_windows(windows), weights)
    return [
        _act(policy, episode, (mean[row], log_std[row]), decision, record_steps)
        for row, (episode, decision) in enumerate(zip(active, decisions, strict=True))
    ]


def _act(
    policy: EpisodePolicy,
    episode: _Running,
    outputs: tuple[npt.NDArray[Any], npt.NDArray[Any]],
    decision: GuardDecision,
    record_steps: bool,
) -> bool:
    """Take the episode's action as the guard decided and step its env; whether it ended."""
    context = episode.context
    bounds = np.asarray(policy.action_low), np.asarray(policy.action_high)
    deterministic = episode.spec.deterministic
    acted = act_as_decided(context, outputs, bounds, deterministic, decision, policy.cost_critic)
    episode.tally = episode.tally.add(acted)
    taken = context.last_action.astype(np.float32)
    observation, reward, terminated, truncated, info = episode.env.step(taken)
    cost = float(info.get("cost", 0.0))
    context.advance(float(reward), cost, observation)
    episode.length += 1
    if record_steps:
        episode.step_costs.append(cost)
        episode.step_rewards.append(float(reward))
    return bool(terminated or truncated)
