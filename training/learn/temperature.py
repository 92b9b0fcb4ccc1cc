"""The entropy temperature of the stochastic policy's loss, learned towards a target entropy
(OSRL's CDT, as in SAC). Not part of the policy network: only training tunes it."""

from __future__ import annotations

import math

import torch
from torch import nn


class EntropyTemperature(nn.Module):
    """Learned entropy weight exp(log_temperature), tuned towards a target entropy (OSRL, SAC).

    Kept outside the policy so DistributedDataParallel never sees a parameter the forward pass
    does not use; it has its own optimiser.
    """

    def __init__(self, initial: float, target_entropy: float) -> None:
        super().__init__()
        self.log_temperature = nn.Parameter(torch.tensor(math.log(initial)))
        self.target_entropy = target_entropy

    def forward(self) -> torch.Tensor:
        return self.log_temperature.exp()

    @torch.no_grad()
    def set_gradient(self, entropy: torch.Tensor) -> None:
        """The gradient of the temperature loss exp(log_t) * (entropy - target), which raises the
        temperature while the policy entropy is below the target and lowers it above. Written
        out, it is the number autograd gives, without a backward pass (a tenth of a CPU step)."""
        gradient = self.log_temperature.exp() * (entropy.detach() - self.target_entropy)
        self.log_temperature.grad = gradient.reshape(self.log_temperature.shape)
