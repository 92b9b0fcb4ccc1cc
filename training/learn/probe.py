"""Does a policy listen to its return tokens? A probe on recorded windows, cheap enough to log.

Along real (not relabelled) episodes, the cost-to-go of every position in a window is raised by a
budget's worth, or the reward-to-go lowered, and the mean action compared with the original. A
policy that ignores the cost token barely moves: on CarCircle the earlier small recipe moved its
mean action by 0.025 (|action| ~0.64) for +60 cost-to-go, while `cdt-carrun-cpu`, which keeps
its budgets, moved by 0.147 (|action| ~0.28).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from training.data.windows import Batch, TrajectoryBuffer
from training.learn.model import ConstrainedDecisionTransformer


class BudgetIgnored(RuntimeError):
    """A run stopped early because its actions do not follow the budget."""

    def __init__(self, step: int, reason: str) -> None:
        super().__init__(
            f"stopped at step {step}: the policy does not follow the cost budget ({reason}); "
            "more steps of this recipe will not fix it (docs/training.md, 'fail fast')"
        )
        self.step = step


class TokenSensitivity(NamedTuple):
    """Mean |change| of the mean action (normalised units) under each shift, and mean |action|."""

    cost_effect: float
    reward_effect: float
    action_size: float

    def describe(self) -> str:
        return (
            f"token probe: cost-to-go shift moves the mean action by {self.cost_effect:.3f}, "
            f"reward-to-go shift by {self.reward_effect:.3f} (mean |action| {self.action_size:.3f})"
        )


def probe_rows(
    buffer: TrajectoryBuffer, recorded_episodes: int, seq_len: int, count: int, seed: int
) -> torch.Tensor:
    """[count, seq_len] row indices of windows ending at random steps of recorded episodes."""
    generator = torch.Generator().manual_seed(seed)
    episode = torch.randint(recorded_episodes, (count,), generator=generator)
    uniform = torch.rand(count, generator=generator, dtype=torch.float64)
    newest = (uniform * buffer.lengths[episode]).long()
    last_row = buffer.first_row[episode] + newest  # [count]
    return last_row.unsqueeze(1) - torch.arange(seq_len - 1, -1, -1)  # oldest ... newest


def _mean_action(model: ConstrainedDecisionTransformer, batch: Batch) -> torch.Tensor:
    output = model(
        batch.states,
        batch.actions,
        batch.returns_to_go,
        batch.costs_to_go,
        batch.time_steps,
        batch.padding_mask,
        newest_only=True,
    )
    newest: torch.Tensor = output.action_mean[:, -1].float()  # [count, action_dim]
    return newest


@torch.no_grad()
def token_sensitivity(
    model: ConstrainedDecisionTransformer,
    batch: Batch,
    cost_shift: float,
    reward_shift: float,
) -> TokenSensitivity:
    """Probe `model` on `batch` (windows of recorded episodes, in model units).

    Args:
        cost_shift: added to every position's cost-to-go (scaled units).
        reward_shift: added to every position's reward-to-go (scaled units; negative lowers it).
    """
    was_training = model.training
    model.eval()
    try:
        original = _mean_action(model, batch)
        real = ~batch.padding_mask  # padding keeps its zeros
        more_cost = batch._replace(costs_to_go=batch.costs_to_go + cost_shift * real)
        less_reward = batch._replace(returns_to_go=batch.returns_to_go + reward_shift * real)
        cost_effect = (_mean_action(model, more_cost) - original).abs().mean()
        reward_effect = (_mean_action(model, less_reward) - original).abs().mean()
    finally:
        model.train(was_training)
    return TokenSensitivity(float(cost_effect), float(reward_effect), float(original.abs().mean()))
