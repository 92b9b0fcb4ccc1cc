"""The cost critic: a learned check on one action's near-term cost, the budget guard's shield.

The critic Q_c(s, a) predicts the discounted cost that follows taking action `a` in state `s`
(sum_k discount^k c_{t+k} over the logged episodes, `training/cost_critic.py`). Near the end of
a budget the guard asks it about the action the policy chose; when the predicted cost is above
the guard's `shield_risk`, the action is replaced by the nearest of a fixed set of candidates
(fixed offsets around it, a fixed spread over the action box) that the critic calls safe: the
least change, since the critic knows cost, not reward. Where it calls none safe, the action
stays.
The candidates are fixed, not drawn, so the shield consumes no randomness and the service and
the offline loop take the same action. Why: docs/decisions/budget-guard.md (the cost critic).

The graph (`cost_critic.onnx` beside the policy's) takes `observations [N, observation_dim]` and
`actions [N, action_dim]` (float32, raw: the graph normalises) and answers `cost [N]`.
Torch-free: onnxruntime only, imported when a critic is loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

import numpy as np
import numpy.typing as npt

from runtime.budget_guard import GuardAction, GuardDecision
from runtime.context import EpisodeContext, sample_action
from runtime.files import COST_CRITIC_FILE
from runtime.onnx_session import open_session
from runtime.user_errors import UserError, one_line

if TYPE_CHECKING:
    import onnxruntime as ort

INPUT_NAMES = ("observations", "actions")
OUTPUT_NAME = "cost"
OFFSETS_PER_ACTION = 32
"""Candidates near the chosen action: it plus fixed offsets (a quarter of the box's half-width)."""
SPREAD_CANDIDATES = 32
"""Candidates spread over the whole action box."""
_CANDIDATE_SEED = 20230601
"""Fixes the offsets and the spread once, for every model (any seed would do)."""


class CostCriticLoadError(UserError):
    """A cost critic graph that does not honour the contract above: one line, whatever
    onnxruntime's message spans."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


@functools.cache
def _unit_candidates(action_dim: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Unit offsets [OFFSETS_PER_ACTION, A] ~ N(0, 0.25^2), spread [SPREAD_CANDIDATES, A] ~ U."""
    generator = np.random.default_rng(_CANDIDATE_SEED)
    offsets = generator.normal(0.0, 0.25, (OFFSETS_PER_ACTION, action_dim))
    spread = generator.uniform(-1.0, 1.0, (SPREAD_CANDIDATES, action_dim))
    return offsets, spread


def candidates(
    action: npt.NDArray[np.floating], low: npt.NDArray[np.float64], high: npt.NDArray[np.float64]
) -> npt.NDArray[np.float32]:
    """The shield's candidates for `action` [A], first the action itself: [1 + 32 + 32, A]."""
    offsets, spread = _unit_candidates(len(action))
    centre, half_width = (high + low) / 2.0, (high - low) / 2.0
    near = np.clip(action + offsets * half_width, low, high)  # [OFFSETS_PER_ACTION, A]
    everywhere = centre + spread * half_width  # [SPREAD_CANDIDATES, A]
    return np.concatenate([action[None].astype(np.float64), near, everywhere]).astype(np.float32)


@dataclass(frozen=True)
class ShieldResult:
    """What the shield made of one action."""

    action: npt.NDArray[np.floating]
    replaced: bool
    predicted_cost: float
    """The critic's prediction for the action the policy chose."""


@dataclass(frozen=True)
class CostCritic:
    """A loaded cost critic graph."""

    session: ort.InferenceSession
    observation_dim: int
    action_dim: int

    @classmethod
    def load(cls, directory: Path, observation_dim: int, action_dim: int) -> Self:
        """Load and check `directory/cost_critic.onnx`; raises `CostCriticLoadError`."""
        path = Path(directory) / COST_CRITIC_FILE
        session = open_session(path, CostCriticLoadError)
        critic = cls(session, observation_dim, action_dim)
        critic._check_contract(path)
        return critic

    def _check_contract(self, path: Path) -> None:
        inputs = {node.name: node for node in self.session.get_inputs()}
        outputs = [node.name for node in self.session.get_outputs()]
        if set(inputs) != set(INPUT_NAMES) or outputs != [OUTPUT_NAME]:
            raise CostCriticLoadError(
                f"{path}: graph has inputs {sorted(inputs)} and outputs {outputs}, expected "
                f"{list(INPUT_NAMES)} and [{OUTPUT_NAME!r}]"
            )
        for name, dim in (("observations", self.observation_dim), ("actions", self.action_dim)):
            shape = inputs[name].shape  # [N, dim]; symbolic dims are strings
            if len(shape) != 2 or (isinstance(shape[1], int) and shape[1] != dim):
                raise CostCriticLoadError(f"{path}: {name} has shape {shape}, the card says {dim}")
        try:
            cost = self.predict(
                np.zeros((2, self.observation_dim), np.float32),
                np.zeros((2, self.action_dim), np.float32),
            )
        except Exception as error:
            raise CostCriticLoadError(f"{path}: a forward pass failed: {error}") from error
        if cost.shape != (2,) or not np.isfinite(cost).all():
            raise CostCriticLoadError(f"{path}: answers {cost!r} for two zero inputs")

    def predict(
        self, observations: npt.NDArray[np.float32], actions: npt.NDArray[np.float32]
    ) -> npt.NDArray[np.float32]:
        """Predicted discounted cost [N] of `actions` [N, A] in `observations` [N, obs]."""
        feeds = {"observations": observations, "actions": actions}
        (cost,) = self.session.run([OUTPUT_NAME], feeds)
        return np.asarray(cost, dtype=np.float32).reshape(len(observations))

    def shield(
        self,
        observation: npt.NDArray[np.floating],
        action: npt.NDArray[np.floating],
        bounds: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
        risk: float,
    ) -> ShieldResult:
        """`action` if its predicted cost is at most `risk`; else the candidate nearest to it
        whose predicted cost is (the least change that the critic calls safe). Where none is,
        `action` stays: the critic knows the data's actions, and the least costly action of the
        whole box, far from them, was measured to do worse (docs/decisions/budget-guard.md).

        Args:
            observation: the newest observation [observation_dim], as the policy saw it.
            action: the action the policy (and the rest of the guard) chose [action_dim].
            bounds: the card's (low, high) action bounds.
            risk: the predicted discounted cost above which the action is replaced.
        """
        options = candidates(np.asarray(action, dtype=np.float64), *bounds)  # [C, A]
        state = np.asarray(observation, np.float32)[None]  # [1, observation_dim]
        own = float(self.predict(state, options[:1])[0])  # most steps end here: one row, not C
        if not np.isfinite(own) or own <= risk:
            return ShieldResult(np.asarray(action), False, own)
        cost = self.predict(np.repeat(state, len(options), axis=0), options)  # [C]
        safe = np.flatnonzero(cost <= risk)
        if not np.isfinite(cost).all() or len(safe) == 0:
            return ShieldResult(np.asarray(action), False, own)
        width = np.where(bounds[1] > bounds[0], bounds[1] - bounds[0], 1.0)  # a fixed dim: 1
        distance = np.linalg.norm((options[safe] - options[0]) / width, axis=1)
        chosen = options[safe[int(np.argmin(distance))]]
        return ShieldResult(chosen.astype(np.float64), True, own)


def shielded(
    critic: CostCritic | None,
    observation: npt.NDArray[np.floating],
    action: npt.NDArray[np.floating],
    bounds: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    decision: GuardDecision,
) -> tuple[npt.NDArray[np.floating], GuardAction]:
    """The action to take and what the guard did: the shield's answer where `decision` asks for
    it."""
    if decision.shield_risk is None:
        return action, decision.action
    if critic is None:  # a card that sets the shield loads its critic (`ModelCard` checks)
        raise CostCriticLoadError("the budget guard asks for a shield but no cost critic is loaded")
    result = critic.shield(observation, action, bounds, decision.shield_risk)
    return result.action, GuardAction.SHIELD if result.replaced else decision.action


def act_as_decided(
    context: EpisodeContext,
    outputs: tuple[npt.NDArray[np.floating], npt.NDArray[np.floating]],
    bounds: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]],
    deterministic: bool,
    decision: GuardDecision,
    critic: CostCritic | None,
) -> GuardAction:
    """Record the action for the newest step of `context` as the budget guard decided: sampled
    with its noise factor, then the shield where it asks; what the guard did (the service's
    `act` and the offline loop both take their actions here)."""
    mean, log_std = outputs
    sampled = sample_action(
        mean, log_std, context.rng, *bounds, deterministic, noise_scale=decision.noise_scale
    )
    action, acted = shielded(critic, context.states[-1], sampled, bounds, decision)
    context.record_action(action)
    return acted
