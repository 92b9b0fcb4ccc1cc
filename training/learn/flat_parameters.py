"""A module's parameters as views of one flat buffer, and their gradients as views of another.

Why: on a CPU, gradient clipping and the weight average (and AdamW, before it ran fused there)
run one small op per parameter tensor. At the `cpu-budget` size (~116k parameters in ~40
tensors) that was a tenth of a training step on a 2-core Zen 4 (docs/decisions/training-speed.md).
With every parameter a view of one buffer, each is a handful of ops on one tensor. The
arithmetic is the same: AdamW and the average are elementwise, the clipping norm is one norm.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class FlatParameters:
    """Rebinds `module`'s parameters as views of `values` (and, with gradients, each `.grad` as
    a view of `values.grad`), in `module.parameters()` order.

    The module keeps its own Parameter objects, so everything that holds them keeps working;
    backward accumulates into the gradient views in place. Never set the gradients to None
    (`zero_grad(set_to_none=False)`): a new `.grad` tensor would no longer be a view.
    """

    def __init__(self, module: nn.Module, gradients: bool = True) -> None:
        parameters = list(module.parameters())
        self.sizes = [p.numel() for p in parameters]
        with torch.no_grad():
            self.values = nn.Parameter(torch.cat([p.reshape(-1) for p in parameters]))
        grad = torch.zeros_like(self.values) if gradients else None
        self.values.grad = grad
        offset = 0
        for parameter, size in zip(parameters, self.sizes, strict=True):
            parameter.data = self.values.data[offset : offset + size].view_as(parameter)
            if grad is not None:
                parameter.grad = grad[offset : offset + size].view_as(parameter)
            offset += size

    @torch.no_grad()
    def follow(self, source: FlatParameters, decay: float, averaged_before: int) -> None:
        """One step of an exponential moving average of `source` (AveragedModel with
        `get_ema_multi_avg_fn(decay)`: a copy at the first update, then a lerp)."""
        if averaged_before == 0:
            self.values.copy_(source.values)
        else:
            self.values.lerp_(source.values, 1.0 - decay)


def flat_optimizer_state(saved: dict[str, Any], flat: FlatParameters) -> dict[str, Any]:
    """An optimizer state dict saved with one entry per parameter tensor, as the one-tensor
    state dict of `flat` (a run checkpointed before flat parameters resumes with them).

    A state dict that already holds one parameter is returned as it is.
    """
    groups = saved["param_groups"]
    indices = [index for group in groups for index in group["params"]]
    if len(indices) == 1:
        return saved
    if len(groups) != 1 or len(indices) != len(flat.sizes):
        raise ValueError(
            f"the checkpoint's optimizer holds {len(indices)} parameters in {len(groups)} "
            f"groups; this model has {len(flat.sizes)} in one"
        )
    per_tensor = [saved["state"][index] for index in indices]
    state: dict[str, Any] = {}
    for key, first in per_tensor[0].items():
        if key == "step":  # a scalar, the same for every tensor; a copy, not shared with them
            state[key] = first.clone()
        else:
            state[key] = torch.cat([entry[key].reshape(-1) for entry in per_tensor])
    return {"state": {0: state}, "param_groups": [{**groups[0], "params": [0]}]}
