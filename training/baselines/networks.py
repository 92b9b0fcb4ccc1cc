"""Networks of the baselines: MLP actors, Q ensembles, the conditional VAE and MMD.

All actions are in network units, [-1, 1]; the exported graph maps them to env units.
Shapes follow OSRL's `osrl/common/net.py` (liuzuxin/OSRL at commit
039f775653dcaeeb1a1658a5d040cce468f4ffa6), written here from the papers' definitions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
DETERMINISTIC_LOG_STD = -5.0
"""The log-std in env units that deterministic policies export (docs/ARTIFACT.md)."""


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    activation: type[nn.ReLU] = nn.ReLU,
) -> nn.Sequential:
    """Linear layers with `activation` between them and none after the last.

    The activation works in place: a linear layer's backward needs its input, never its
    output, so overwriting the output saves one large buffer per layer.
    """
    sizes = [in_dim, *hidden, out_dim]
    layers: list[nn.Module] = []
    for index, (size_in, size_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(size_in, size_out))
        if index < len(sizes) - 2:
            layers.append(activation(inplace=True))
    return nn.Sequential(*layers)


class DeterministicActor(nn.Module):
    """a = tanh(MLP(s)); the behaviour-cloning policy (OSRL's MLPActor)."""

    def __init__(self, in_dim: int, action_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp(in_dim, hidden, action_dim)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(inputs))


class SquashedGaussianActor(nn.Module):
    """a = tanh(u), u ~ N(mu(s), sigma(s)); BEAR, CPQ and COptiDICE's policy."""

    def __init__(self, state_dim: int, action_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.body = mlp(state_dim, hidden[:-1], hidden[-1])
        self.mean = nn.Linear(hidden[-1], action_dim)
        self.log_std = nn.Linear(hidden[-1], action_dim)

    def gaussian(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh mean and log-std at `states` [B, obs_dim], both [B, act_dim]."""
        features = F.relu(self.body(states), inplace=True)
        log_std = self.log_std(features).clamp(LOG_STD_MIN, LOG_STD_MAX)
        mean: torch.Tensor = self.mean(features)
        return mean, log_std

    def sample(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised (action [B, act_dim], pre-tanh value [B, act_dim])."""
        mean, log_std = self.gaussian(states)
        pre_tanh = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(pre_tanh), pre_tanh

    def log_prob(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a|s) [B] up to the tanh Jacobian, which does not depend on the parameters."""
        mean, log_std = self.gaussian(states)
        pre_tanh = torch.atanh(actions.clamp(-0.9999, 0.9999))
        standardised = (pre_tanh - mean) / log_std.exp()
        density = -0.5 * standardised.pow(2) - log_std - 0.5 * math.log(2.0 * math.pi)
        return density.sum(-1)

    def mean_and_log_std(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic action tanh(mu) and its log-std by the delta method, both [B, act_dim].

        tanh is linearised at mu (d tanh / du = 1 - tanh^2), so the exported Gaussian that the
        service samples approximates the squashed one near its mode.
        """
        pre_tanh_mean, log_std = self.gaussian(states)
        mean = torch.tanh(pre_tanh_mean)
        return mean, log_std + torch.log(1.0 - mean.pow(2) + 1e-6)


class PerturbationActor(nn.Module):
    """BCQ's xi(s, a): a + phi * tanh(MLP(s, a)), clipped to [-1, 1] (Fujimoto et al., 2019)."""

    def __init__(
        self, state_dim: int, action_dim: int, hidden: Sequence[int], perturbation: float
    ) -> None:
        super().__init__()
        self.net = mlp(state_dim + action_dim, hidden, action_dim)
        self.perturbation = perturbation

    def forward(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        delta = self.perturbation * torch.tanh(self.net(torch.cat([states, actions], -1)))
        return (actions + delta).clamp(-1.0, 1.0)


class QEnsemble(nn.Module):
    """`num_critics` independent Q(s, a) networks (for COptiDICE's nu/chi: V(s), action_dim 0)."""

    def __init__(
        self, state_dim: int, action_dim: int, hidden: Sequence[int], num_critics: int
    ) -> None:
        super().__init__()
        self.nets = nn.ModuleList(
            mlp(state_dim + action_dim, hidden, 1) for _ in range(num_critics)
        )

    def forward(self, states: torch.Tensor, actions: torch.Tensor | None = None) -> torch.Tensor:
        """Values [num_critics, B]."""
        inputs = states if actions is None else torch.cat([states, actions], -1)
        return torch.stack([net(inputs).squeeze(-1) for net in self.nets])  # [num_critics, B]

    def loss(
        self, states: torch.Tensor, actions: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        """Sum over the ensemble of the mean squared error to `target` [B]."""
        errors: torch.Tensor = self(states, actions) - target  # [num_critics, B]
        return errors.pow(2).mean(-1).sum()


def mixed_target(values: torch.Tensor, mix: float) -> torch.Tensor:
    """BCQ's clipped double-Q target mix * min + (1 - mix) * max over the ensemble axis 0."""
    return mix * values.min(0).values + (1.0 - mix) * values.max(0).values


class ConditionalVAE(nn.Module):
    """Generative model of the behaviour policy's actions, p(a | s) (BCQ, BEAR, CPQ)."""

    def __init__(self, state_dim: int, action_dim: int, hidden: int) -> None:
        super().__init__()
        self.latent_dim = 2 * action_dim
        self.encoder = mlp(state_dim + action_dim, [hidden], hidden)
        self.latent_mean = nn.Linear(hidden, self.latent_dim)
        self.latent_log_std = nn.Linear(hidden, self.latent_dim)
        self.decoder = mlp(state_dim + self.latent_dim, [hidden, hidden], action_dim)

    def encode(
        self, states: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean and std, both [B, latent_dim]."""
        features = F.relu(self.encoder(torch.cat([states, actions], -1)), inplace=True)
        return self.latent_mean(features), self.latent_log_std(features).clamp(-4.0, 15.0).exp()

    def decode_raw(self, states: torch.Tensor, latent: torch.Tensor | None = None) -> torch.Tensor:
        """Pre-tanh decoded actions [B, act_dim]; latent defaults to clip(N(0, I), +-0.5)."""
        if latent is None:
            shape = (states.shape[0], self.latent_dim)
            latent = torch.randn(shape, device=states.device).clamp(-0.5, 0.5)
        raw: torch.Tensor = self.decoder(torch.cat([states, latent], -1))
        return raw

    def decode(self, states: torch.Tensor, latent: torch.Tensor | None = None) -> torch.Tensor:
        """Decoded actions in [-1, 1], [B, act_dim]."""
        return torch.tanh(self.decode_raw(states, latent))

    def kl(self, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """KL(N(mean, std) || N(0, I)) averaged over the latent axis, [B]."""
        return -0.5 * (1.0 + torch.log(std.pow(2)) - mean.pow(2) - std.pow(2)).mean(-1)

    def loss(self, states: torch.Tensor, actions: torch.Tensor, kl_weight: float) -> torch.Tensor:
        """Reconstruction MSE plus `kl_weight` times the KL to the prior."""
        mean, std = self.encode(states, actions)
        latent = mean + std * torch.randn_like(std)
        reconstruction = F.mse_loss(self.decode(states, latent), actions)
        return reconstruction + kl_weight * self.kl(mean, std).mean()


def gaussian_mmd(first: torch.Tensor, second: torch.Tensor, sigma: float) -> torch.Tensor:
    """MMD with a Gaussian kernel between sample sets [B, N, d] and [B, M, d]; returns [B]."""

    def kernel(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        difference = left.unsqueeze(2) - right.unsqueeze(1)  # [B, N, M, d]
        return torch.exp(-difference.pow(2).sum(-1) / (2.0 * sigma)).mean((1, 2))  # [B]

    squared = kernel(first, first) + kernel(second, second) - 2.0 * kernel(first, second)
    return (squared + 1e-6).sqrt()


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging: target <- tau * source + (1 - tau) * target."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), source.parameters(), strict=True):
            target_param.lerp_(param, tau)


class SquashedGaussianHead(nn.Module):
    """Exported policy of BEAR, CPQ and COptiDICE: the actor's mode and delta-method log-std."""

    def __init__(self, actor: SquashedGaussianActor) -> None:
        super().__init__()
        self.actor = actor

    def forward(
        self, states: torch.Tensor, condition: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor.mean_and_log_std(states)
