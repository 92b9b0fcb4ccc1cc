"""The token layout of a CDT window, and selectors that pick the tokens a head reads.

Every step contributes (R_t, C_t, s_t, a_t), step-major: (R_0, C_0, s_0, a_0, R_1, ...). The
newest step may come without its action token: with no cost head, nothing reads it, so the
model leaves it out of every block (`ConstrainedDecisionTransformer.forward`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TOKENS_PER_STEP = 4  # (R_t, C_t, s_t, a_t)
STATE_TOKEN = 2  # index of s_t inside one step's tokens
ACTION_TOKEN = 3  # index of a_t inside one step's tokens


TokenSelector = Callable[[torch.Tensor, int], torch.Tensor]


def select_token_types(types: tuple[int, ...]) -> TokenSelector:
    """A selector keeping the given token types of every step (tokens are step-major; the newest
    step may lack its action token, see `ConstrainedDecisionTransformer.forward`)."""
    first, count = types[0], len(types)
    if types != tuple(range(first, first + count)):
        raise ValueError(f"token types must be consecutive, got {types}")

    def select(x: torch.Tensor, dim: int) -> torch.Tensor:
        shape = x.shape
        steps, newest_tokens = divmod(shape[dim], TOKENS_PER_STEP)
        # [..., steps * 4, ...] -> [..., steps, 4, ...] -> [..., steps * count, ...]
        whole = x.narrow(dim, 0, steps * TOKENS_PER_STEP)
        whole = whole.reshape(*shape[:dim], steps, TOKENS_PER_STEP, *shape[dim + 1 :])
        picked = whole.narrow(dim + 1, first, count).reshape(*shape[:dim], -1, *shape[dim + 1 :])
        if newest_tokens == 0:
            return picked
        if first + count > newest_tokens:
            raise ValueError(f"token types {types} include one the newest step left out")
        newest = x.narrow(dim, steps * TOKENS_PER_STEP + first, count)
        return torch.cat([picked, newest], dim)

    return select


def select_newest_state(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Keep only the newest step's state token: [..., tokens, ...] -> [..., 1, ...]."""
    steps = -(-x.shape[dim] // TOKENS_PER_STEP)  # the newest step may lack its action token
    return x.narrow(dim, (steps - 1) * TOKENS_PER_STEP + STATE_TOKEN, 1)


def reader(newest_only: bool, with_cost: bool) -> TokenSelector:
    """The tokens the heads read: state tokens (+ action tokens for the cost head)."""
    if newest_only:
        return select_newest_state
    return select_token_types((STATE_TOKEN, ACTION_TOKEN) if with_cost else (STATE_TOKEN,))
