"""The Constrained Decision Transformer and its ablations, as `nn.Module`s only (no env, no I/O).

Paper: Liu et al., "Constrained Decision Transformer for Offline Safe Reinforcement Learning",
ICML 2023, section 4.3. Every step contributes the tokens (R_t, C_t, s_t, a_t) (DT-Cost and CDT
alike); a causal GPT reads them and the action a_t is predicted from the output at the state token.

All inputs are already normalised by `training.data.windows` (states standardised, actions scaled to
[-1, 1], returns-to-go multiplied by their scale); `training.export.OnnxPolicy` adds the raw-unit
pre- and post-processing around this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.learn.tokens import TOKENS_PER_STEP, TokenSelector, reader

# What a deterministic policy reports as its log-std (ARTIFACT.md: "a constant").
DETERMINISTIC_LOG_STD = -20.0


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild the network; stored in every checkpoint."""

    state_dim: int
    action_dim: int
    seq_len: int
    max_episode_len: int
    embedding_dim: int = 128
    num_layers: int = 3
    num_heads: int = 8
    dropout: float = 0.1
    stochastic: bool = True
    log_std_min: float = -5.0
    log_std_max: float = 2.0
    cost_prediction: bool = True
    cost_to_go_offset: float | None = None
    cost_conditioned: bool = True  # False: the cost-to-go input is ignored (unconstrained DT)
    fused_attention: bool = True
    short_attention: bool = True  # broadcast products for few keys (see CausalSelfAttention)
    skip_unread_outputs: bool = True  # compute only the tokens that are read (exact)
    fast_dropout: bool = True  # dropout masks from 16-bit random numbers (see `dropout`)
    # Return tokens: 0 keeps the plain Linear(1, emb) embedding; n > 0 adds n triangular basis
    # functions over the given ranges of the fed (scaled) values (see `ScalarEmbedding`).
    return_basis: int = 0
    reward_token_range: tuple[float, float] = (0.0, 1.0)
    cost_token_range: tuple[float, float] = (0.0, 1.0)


class PolicyOutput(NamedTuple):
    """Per-position predictions, all in normalised action units."""

    action_mean: torch.Tensor  # [batch_size, seq_len, action_dim], inside [-1, 1]
    action_log_std: torch.Tensor  # [batch_size, seq_len, action_dim]
    cost_logits: torch.Tensor | None  # [batch_size, seq_len], logit of "this step costs"


def dropout(x: torch.Tensor, p: float, fast: bool) -> torch.Tensor:
    """Inverted dropout (training only; callers skip it when p is 0).

    fast: draw the keep-mask from 16-bit uniform integers instead of one bernoulli draw per
    element (p is then rounded to a multiple of 2^-16, e.g. 0.1 becomes 0.100006). On CPU the bits
    come from numpy's PCG64, four masks per 64-bit draw, seeded by one draw from torch's generator
    (so seeding, per-rank streams and checkpointed RNG state work as for torch's own dropout):
    ~8x cheaper than `F.dropout`, ~3x cheaper than torch's `random_`. With the paper's dropout of
    0.1 the masks cost a sixth of a training step otherwise.
    """
    if not fast:
        return F.dropout(x, p, training=True)
    numel = x.numel()
    if x.device.type == "cpu":
        seed = int(torch.randint(0, 2**62, (1,)))
        raw = np.random.PCG64(seed).random_raw((numel + 3) // 4)  # [numel / 4] uint64
        # [numel / 4] uint64 -> [numel] int16, uniform over [-32768, 32767]
        halves = torch.from_numpy(raw.view(np.int16)[:numel]).view(x.shape)
    else:
        bits = torch.empty((numel + 1) // 2, dtype=torch.int32, device=x.device)
        bits.random_(-(2**31), 2**31)
        halves = bits.view(torch.int16)[:numel].view(x.shape)
    keep = halves >= round(p * 65536) - 32768
    return x * (keep.to(x.dtype) * (1.0 / (1.0 - p)))  # one autograd multiply, not two


SHORT_ATTENTION_KEYS = 4
"""Up to this many keys (context 1: the return, cost and state tokens), `short_attention` computes
attention as broadcast products over [batch, queries, keys, emb]; longer sequences use SDPA."""


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention written out by hand (one fused QKV projection).

    `nn.MultiheadAttention` is avoided on purpose: its legacy ONNX export bakes the traced sequence
    length into the graph (pytorch #117209), and its fast path is unavailable in training anyway.
    With `short_attention` and at most SHORT_ATTENTION_KEYS keys, the scores and the weighted sum
    are elementwise products summed over the head's features, on the projection's own [batch,
    tokens, emb] layout: at 3 tokens the SDPA kernel's fixed cost per (batch, head) block and the
    copies around its head-major layout were most of its time (equal to fp32 rounding;
    docs/decisions/training-speed.md).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        embedding_dim, num_heads = config.embedding_dim, config.num_heads
        if embedding_dim % num_heads:
            raise ValueError(f"embedding_dim {embedding_dim} not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.dropout = config.dropout
        self.fused = config.fused_attention
        self.short = config.short_attention
        self.fast_dropout = config.fast_dropout
        self.qkv = nn.Linear(embedding_dim, 3 * embedding_dim)
        self.proj = nn.Linear(embedding_dim, embedding_dim)

    def _project(
        self, queries: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query [batch, q_tokens, emb], key and value [batch, tokens, emb] (views of the
        projection; only the queried tokens get a query)."""
        embedding_dim = queries.shape[-1]
        if queries is keys:
            projected: torch.Tensor = self.qkv(keys)  # [b, t, 3 * emb]
            query, key, value = torch.split(projected, embedding_dim, dim=-1)
            return query, key, value
        sizes = [embedding_dim, 2 * embedding_dim]
        weight_q, weight_kv = torch.split(self.qkv.weight, sizes)
        bias_q, bias_kv = torch.split(self.qkv.bias, sizes)
        key, value = torch.split(F.linear(keys, weight_kv, bias_kv), embedding_dim, dim=-1)
        return F.linear(queries, weight_q, bias_q), key, value

    def _few_keys(
        self, queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """The attention output before `proj`, [batch, q_tokens, emb], by broadcast products."""
        batch_size, q_tokens, embedding_dim = queries.shape
        tokens, heads = keys.shape[1], self.num_heads
        head_dim = embedding_dim // heads
        # fp32 products and sums, as the attention kernels accumulate (no-op without autocast)
        query, key, value = (projected.float() for projected in self._project(queries, keys))
        # [b, q, 1, heads, hd] * [b, 1, t, heads, hd], summed over hd -> [b, q, t, heads]
        products = query.view(batch_size, q_tokens, 1, heads, head_dim) * key.view(
            batch_size, 1, tokens, heads, head_dim
        )
        scores = products.sum(-1) / math.sqrt(head_dim)
        # allowed [b, 1, q, t] -> [b, q, t, 1]; softmax over the keys
        weights = scores.masked_fill(
            ~allowed.permute(0, 2, 3, 1), torch.finfo(scores.dtype).min
        ).softmax(dim=2)
        # [b, q, t, heads, 1] * [b, 1, t, heads, hd], summed over t -> [b, q, heads, hd]
        mixed = (weights.unsqueeze(-1) * value.view(batch_size, 1, tokens, heads, head_dim)).sum(2)
        return mixed.reshape(batch_size, q_tokens, embedding_dim)

    def forward(
        self, queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor
    ) -> torch.Tensor:
        """queries: [batch, q_tokens, emb], keys: [batch, tokens, emb] (the same tensor when every
        token is queried), allowed: [batch, 1, q_tokens, tokens] bool, True = may attend."""
        batch_size, q_tokens, embedding_dim = queries.shape
        head_dim = embedding_dim // self.num_heads
        drop = self.dropout if self.training else 0.0
        if self.short and not drop and keys.shape[1] <= SHORT_ATTENTION_KEYS:
            return self.proj(self._few_keys(queries, keys, allowed))  # type: ignore[no-any-return]
        # 3 x [batch, tokens, emb] -> [batch, heads, tokens, head_dim]
        query, key, value = (
            projected.view(batch_size, projected.shape[1], self.num_heads, head_dim).transpose(1, 2)
            for projected in self._project(queries, keys)
        )
        if self.fused and not (drop and self.fast_dropout):
            out = F.scaled_dot_product_attention(
                query, key, value, attn_mask=allowed, dropout_p=drop
            )
        else:
            # [batch, heads, q_tokens, tokens]
            scores = query @ key.transpose(-2, -1) / math.sqrt(head_dim)
            weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
            if drop:
                weights = dropout(weights, drop, self.fast_dropout)
            out = weights @ value
        # [batch, heads, q_tokens, head_dim] -> [batch, q_tokens, emb]
        out = out.transpose(1, 2).reshape(batch_size, q_tokens, embedding_dim)
        projected: torch.Tensor = self.proj(out)
        return projected


class TransformerBlock(nn.Module):
    """Pre-LayerNorm GPT block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.embedding_dim
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attention = CausalSelfAttention(config)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dropout = config.dropout
        self.fast_dropout = config.fast_dropout

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        # Skips the call (and its RNG work) entirely when there is nothing to drop.
        if not (self.training and self.dropout):
            return x
        return dropout(x, self.dropout, self.fast_dropout)

    def forward(
        self, x: torch.Tensor, allowed: torch.Tensor, select: TokenSelector | None = None
    ) -> torch.Tensor:
        """x: [batch, tokens, emb] -> [batch, tokens, emb].

        With `select` (picks rows along a token dim) only the selected tokens are computed and
        returned. Exact, not approximate: the last block's other outputs are never read, so
        skipping their queries, projection and MLP saves about a fifth of the model's FLOPs.
        """
        normed = self.norm1(x)
        if select is None:
            x = x + self._drop(self.attention(normed, normed, allowed))
        else:
            x = select(x, 1)
            queries = select(normed, 1)
            x = x + self._drop(self.attention(queries, normed, select(allowed, 2)))
        return x + self._drop(self.mlp(self.norm2(x)))


class ScalarEmbedding(nn.Module):
    """A return token's embedding: Linear(1, emb), plus a piecewise-linear code when basis > 0.

    Why: the embeddings are layer-normalised (as in DT and OSRL), and LayerNorm(x * w + b + t) is
    nearly scale-invariant once |x * w| outgrows the bias and timestep terms, so a plain linear
    embedding of a large return-to-go tells the model little more than its sign. Triangular basis
    functions phi_k(x) = relu(1 - |x - c_k| / h) over the range where budgets are served give
    every value its own direction, which LayerNorm keeps (docs/decisions/return-tokens.md).
    """

    centers: torch.Tensor  # [basis]

    def __init__(self, embedding_dim: int, basis: int, value_range: tuple[float, float]) -> None:
        super().__init__()
        self.linear = nn.Linear(1, embedding_dim)
        self.basis = nn.Linear(basis, embedding_dim, bias=False) if basis > 0 else None
        low, high = value_range
        if basis > 0 and not high > low:
            raise ValueError(f"return token range must be increasing, got {value_range}")
        centers = torch.linspace(low, high, max(basis, 2))[: max(basis, 1)]
        self.register_buffer("centers", centers, persistent=False)
        self.width = (high - low) / max(basis - 1, 1)
        # Python floats, not reads of `centers`: a tensor read is a data-dependent op that the
        # ONNX exporter traces and prints as a graph dump.
        self.clamp_range = (float(centers[0]), float(centers[-1]))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # Checkpoints written before this class held a bare Linear here: same tensors, old names.
        for name in ("weight", "bias"):
            if prefix + name in state_dict:
                state_dict[f"{prefix}linear.{name}"] = state_dict.pop(prefix + name)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        """values: [batch, seq_len] -> [batch, seq_len, emb]."""
        embedded: torch.Tensor = self.linear(values.unsqueeze(-1))
        if self.basis is None:
            return embedded
        low, high = self.clamp_range
        clamped = values.clamp(low, high).unsqueeze(-1)  # [batch, seq_len, 1]
        code = F.relu(1.0 - (clamped - self.centers).abs() / self.width)  # [b, seq_len, basis]
        coded: torch.Tensor = self.basis(code)
        return embedded + coded


class GaussianHead(nn.Module):
    """Diagonal Gaussian with a tanh-bounded mean and a state-dependent, bounded log-std.

    Deviation (paper 4.3 leaves the parametrisation open; OSRL's head is unbounded and clamps at
    rollout): the mean is squashed into [-1, 1] so the exported policy's mean always lies inside
    the action bounds, and the log-std is mapped smoothly into [log_std_min, log_std_max] as in
    Online DT.
    The likelihood is that of the plain (unsquashed) Gaussian, matching how the service samples:
    clip(mean + std * z).
    """

    def __init__(self, embedding_dim: int, action_dim: int, log_std_bounds: tuple[float, float]):
        super().__init__()
        self.linear = nn.Linear(embedding_dim, 2 * action_dim)
        self.log_std_min, self.log_std_max = log_std_bounds

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.linear(features).chunk(2, dim=-1)
        half_width = 0.5 * (self.log_std_max - self.log_std_min)
        log_std = self.log_std_min + half_width * (torch.tanh(log_std) + 1.0)
        return torch.tanh(mean), log_std


class DeterministicHead(nn.Module):
    """Mean-squared-error head (the paper's "CDT (deterministic)" and DT-Cost): tanh(linear)."""

    def __init__(self, embedding_dim: int, action_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(embedding_dim, action_dim)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tanh(self.linear(features))
        return mean, torch.full_like(mean, DETERMINISTIC_LOG_STD)


class ConstrainedDecisionTransformer(nn.Module):
    """CDT (paper 4.3): tokens (R_t, C_t, s_t, a_t) + a learned timestep embedding, causal GPT."""

    causal: torch.Tensor  # [tokens, tokens] bool, lower triangle
    diagonal: torch.Tensor  # [tokens, tokens] bool, identity

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.embedding_dim
        self.timestep_embedding = nn.Embedding(config.max_episode_len, dim)
        self.return_embedding = ScalarEmbedding(dim, config.return_basis, config.reward_token_range)
        self.cost_embedding = ScalarEmbedding(dim, config.return_basis, config.cost_token_range)
        self.state_embedding = nn.Linear(config.state_dim, dim)
        self.action_embedding = nn.Linear(config.action_dim, dim)
        self.embedding_norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.output_norm = nn.LayerNorm(dim)
        self.action_head: GaussianHead | DeterministicHead
        if config.stochastic:
            bounds = (config.log_std_min, config.log_std_max)
            self.action_head = GaussianHead(dim, config.action_dim, bounds)
        else:
            self.action_head = DeterministicHead(dim, config.action_dim)
        # OSRL's auxiliary per-step cost classifier, read at the action token.
        self.cost_head = nn.Linear(dim, 1) if config.cost_prediction else None
        tokens = TOKENS_PER_STEP * config.seq_len
        self.register_buffer("causal", torch.ones(tokens, tokens).tril().bool(), persistent=False)
        self.register_buffer("diagonal", torch.eye(tokens).bool(), persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2 / minGPT initialisation, as in the DT and OSRL code.
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def _attention_mask(self, padding_mask: torch.Tensor) -> torch.Tensor:
        """[batch, seq_len] bool (True = pad) -> [batch, 1, tokens, tokens] (True = may attend)."""
        batch_size, seq_len = padding_mask.shape
        tokens = TOKENS_PER_STEP * seq_len
        # [batch, seq_len, 4] -> [batch, tokens], each step's flag repeated for its 4 tokens
        real = (~padding_mask).unsqueeze(-1).expand(batch_size, seq_len, TOKENS_PER_STEP)
        real = real.reshape(batch_size, tokens)
        causal, diagonal = self.causal[:tokens, :tokens], self.diagonal[:tokens, :tokens]
        # A padded query may see itself so that its softmax row is never empty (no NaN); real
        # queries never see padding because padding sits on the left (ARTIFACT.md).
        allowed = causal & (real.unsqueeze(1) | diagonal)  # [batch, tokens, tokens]
        return allowed.unsqueeze(1)

    def forward(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        costs_to_go: torch.Tensor,
        time_steps: torch.Tensor,
        padding_mask: torch.Tensor,
        newest_only: bool = False,
    ) -> PolicyOutput:
        """Predict a_t for every position t of left-padded windows.

        Args:
            states: [batch, seq_len, state_dim], standardised.
            actions: [batch, seq_len, action_dim], in [-1, 1]; a_t is never seen when predicting it.
            returns_to_go: [batch, seq_len], scaled.
            costs_to_go: [batch, seq_len], scaled.
            time_steps: [batch, seq_len] int64 in [0, max_episode_len).
            padding_mask: [batch, seq_len] bool, True = padding.
            newest_only: predict only the newest step (inference): seq_len 1, no cost logits.
        """
        batch_size, seq_len = padding_mask.shape
        with_cost = self.cost_head is not None and not newest_only
        # The newest action token comes last, so no token attends to it, and without the cost
        # head nothing reads it: every block runs without it (exact; a quarter of the tokens at
        # seq_len 1).
        unread_last = self.config.skip_unread_outputs and not with_cost
        hidden = self._embed(states, actions, returns_to_go, costs_to_go, time_steps, unread_last)
        allowed = self._attention_mask(padding_mask)
        if unread_last:
            allowed = allowed[:, :, :-1, :-1]
        for block in self.blocks[:-1]:
            hidden = block(hidden, allowed)
        select = reader(newest_only, with_cost)
        if self.config.skip_unread_outputs:
            hidden = self.blocks[-1](hidden, allowed, select)
        else:  # the whole last block, then pick (same numbers, ~20% more FLOPs; for benchmarks)
            hidden = select(self.blocks[-1](hidden, allowed), 1)
        hidden = self.output_norm(hidden)
        # [batch, steps * read, emb] -> [batch, steps, read, emb]
        hidden = hidden.view(batch_size, 1 if newest_only else seq_len, 2 if with_cost else 1, -1)
        mean, log_std = self.action_head(hidden[:, :, 0])
        cost_logits = None
        if with_cost and self.cost_head is not None:
            cost_logits = self.cost_head(hidden[:, :, 1]).squeeze(-1)
        return PolicyOutput(mean, log_std, cost_logits)

    def _embed(
        self,
        states: torch.Tensor,
        actions: torch.Tensor,
        returns_to_go: torch.Tensor,
        costs_to_go: torch.Tensor,
        time_steps: torch.Tensor,
        without_newest_action: bool = False,
    ) -> torch.Tensor:
        """Token embeddings plus timestep embedding, normalised: [batch, seq_len * 4, emb]
        ([batch, seq_len * 4 - 1, emb] `without_newest_action`)."""
        batch_size, seq_len = time_steps.shape
        if not self.config.cost_conditioned:
            costs_to_go = torch.zeros_like(costs_to_go)  # the token then carries time only
        elif self.config.cost_to_go_offset is not None:
            # OSRL feeds (constant - CTG); an affine reparametrisation of the cost embedding.
            costs_to_go = self.config.cost_to_go_offset - costs_to_go
        time = self.timestep_embedding(time_steps)
        tokens = [
            self.return_embedding(returns_to_go) + time,
            self.cost_embedding(costs_to_go) + time,
            self.state_embedding(states) + time,
            self.action_embedding(actions) + time,
        ]
        # [batch, seq_len, 4, emb] -> [batch, seq_len * 4, emb], (R_0, C_0, s_0, a_0, R_1, ...)
        sequence = torch.stack(tokens, dim=2).reshape(batch_size, TOKENS_PER_STEP * seq_len, -1)
        if without_newest_action:
            sequence = sequence[:, :-1]
        hidden: torch.Tensor = self.embedding_norm(sequence)
        if self.training and self.config.dropout:
            hidden = dropout(hidden, self.config.dropout, self.config.fast_dropout)
        return hidden
