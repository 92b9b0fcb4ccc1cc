"""Behaviour cloning: BC-All, BC-Safe, BC-Risky, BC-Frontier, BC-Boundary and MT-BC.

The variants differ only in their data (`data.selection_mask`); each regresses a deterministic
tanh actor onto the dataset's actions with the mean squared error, as OSRL's BC does.

MT-BC is conditioned on the cost: its actor sees the state and the normalised cost-to-go.
Deviation from OSRL (`osrl/algorithms/bc.py`, commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6),
which appends the episode's constant cost return and at test time the constant threshold: a
context-length-1 policy only sees the newest step's remaining budget C_t (docs/ARTIFACT.md), so
MT-BC learns from the per-step cost-to-go, which equals the episode cost return at t = 0.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from training.baselines.data import TransitionBatch
from training.baselines.networks import DeterministicActor
from training.baselines.trainer import TrainingContext, adam, step


class BCHead(nn.Module):
    """Exported BC policy: tanh actor on the state (and for MT-BC the cost condition)."""

    def __init__(self, actor: DeterministicActor, conditioned: bool) -> None:
        super().__init__()
        self.actor = actor
        self.conditioned = conditioned

    def forward(self, states: torch.Tensor, condition: torch.Tensor) -> tuple[torch.Tensor, None]:
        if self.conditioned:
            states = torch.cat([states, condition.unsqueeze(-1)], -1)  # [B, obs_dim + 1]
        return self.actor(states), None


class BCLearner(nn.Module):
    """Mean-squared-error behaviour cloning of a deterministic actor."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = context.config
        self.conditioned = config.algo == "mt-bc"
        in_dim = context.data.state_dim + int(self.conditioned)
        self.head = BCHead(
            DeterministicActor(in_dim, context.data.action_dim, config.actor_hidden),
            self.conditioned,
        )
        self.to(config.device)
        self.optimiser = adam(self.head, config.resolved_actor_lr)

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """One MSE step on the batch's actions."""
        predicted, _ = self.head(batch.states, batch.costs_to_go)
        loss = F.mse_loss(predicted, batch.actions)
        return {"actor_loss": step(self.optimiser, loss)}

    def policy_head(self) -> nn.Module:
        return self.head
