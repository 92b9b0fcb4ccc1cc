"""Episodes -> fixed-K training windows. Padding, returns-to-go and normalisation live here only.

Windows are left-padded, exactly as the service builds them (docs/ARTIFACT.md): the newest step
sits at position K-1 and padding, if the episode has fewer than K steps so far, at the start.

Speed: every episode (and every relabelled copy) is written once into flat tensors, each preceded
by K-1 padding rows. A window ending at step t of an episode is then the K consecutive rows ending
at that step's row, so a whole batch is one gather with a [batch, K] row index, with no Python loop
per sample (OSRL pads every sample in a DataLoader worker).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from runtime.evaluation_protocol import REPORTED_BUDGETS
from training.data.augmentation import Relabel, relabel_to_go
from training.data.dataset import Episode, OfflineDataset
from training.data.frontiers import derive_default_targets
from training.provenance import git_commit

logger = logging.getLogger(__name__)


class Batch(NamedTuple):
    """A batch of left-padded windows, normalised for the model."""

    states: torch.Tensor  # [batch, seq_len, state_dim], standardised
    actions: torch.Tensor  # [batch, seq_len, action_dim], scaled to [-1, 1]
    returns_to_go: torch.Tensor  # [batch, seq_len], times reward_scale
    costs_to_go: torch.Tensor  # [batch, seq_len], times cost_scale
    time_steps: torch.Tensor  # [batch, seq_len] int64, clamped to max_episode_len - 1
    padding_mask: torch.Tensor  # [batch, seq_len] bool, True = padding
    costs: torch.Tensor  # [batch, seq_len], raw per-step cost (target of the cost head)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(tensor.to(device, non_blocking=True) for tensor in self))


@dataclass(frozen=True)
class NormalisationStats:
    """Everything that maps raw env quantities to model inputs; exported into the ONNX graph."""

    state_mean: list[float]
    state_std: list[float]
    action_low: list[float]
    action_high: list[float]
    reward_scale: float
    cost_scale: float
    max_episode_len: int

    def to_dict(self) -> dict[str, Any]:
        return {field: getattr(self, field) for field in self.__dataclass_fields__}

    def normalise_states(self, states: np.ndarray) -> np.ndarray:
        normalised: np.ndarray = (states - np.asarray(self.state_mean)) / np.asarray(self.state_std)
        return normalised

    def scale_actions(self, actions: np.ndarray) -> np.ndarray:
        """Env units -> [-1, 1]."""
        low, high = np.asarray(self.action_low), np.asarray(self.action_high)
        scaled: np.ndarray = (actions - (high + low) / 2) / ((high - low) / 2)
        return scaled


def to_go(values: np.ndarray) -> np.ndarray:
    """Undiscounted return-to-go: out[t] = sum(values[t:])."""
    return np.cumsum(values[::-1], dtype=np.float64)[::-1].astype(np.float32)


def action_bounds(episodes: Sequence[Episode], attrs: dict[str, Any]) -> tuple[list[float], ...]:
    """Action bounds from the dataset's `action_low`/`action_high` attributes, else [-1, 1].

    Bullet-Safety-Gym tasks all use [-1, 1]; data outside the bounds widens them so that scaled
    actions stay within [-1, 1].
    """
    dim = episodes[0].actions.shape[1]
    # scalars or lists in the file -> [action_dim] (load_dataset checks they are one of the two)
    low = np.broadcast_to(np.asarray(attrs.get("action_low", -1.0), dtype=np.float64), (dim,))
    high = np.broadcast_to(np.asarray(attrs.get("action_high", 1.0), dtype=np.float64), (dim,))
    all_actions = np.concatenate([episode.actions for episode in episodes])
    low = np.minimum(low, all_actions.min(axis=0))
    high = np.maximum(high, all_actions.max(axis=0))
    return low.tolist(), high.tolist()


def compute_stats(
    episodes: Sequence[Episode],
    attrs: dict[str, Any],
    reward_scale: float,
    cost_scale: float,
) -> NormalisationStats:
    """State mean/std over all transitions, action bounds and the longest episode."""
    states = np.concatenate([episode.observations for episode in episodes]).astype(np.float64)
    low, high = action_bounds(episodes, attrs)
    max_len = max(int(attrs.get("max_episode_steps", 0)), *(ep.length for ep in episodes))
    return NormalisationStats(
        state_mean=states.mean(axis=0).tolist(),
        # Deviation: OSRL leaves states raw; DT (Chen et al. 2021) and CORL standardise them.
        state_std=(states.std(axis=0) + 1e-6).tolist(),
        action_low=low,
        action_high=high,
        reward_scale=reward_scale,
        cost_scale=cost_scale,
        max_episode_len=max_len,
    )


class TrajectoryBuffer(NamedTuple):
    """All training episodes in flat, left-padded tensors (see the module docstring)."""

    states: torch.Tensor  # [rows, state_dim], standardised
    actions: torch.Tensor  # [rows, action_dim], in [-1, 1]
    returns_to_go: torch.Tensor  # [rows], scaled
    costs_to_go: torch.Tensor  # [rows], scaled
    time_steps: torch.Tensor  # [rows] int64
    is_padding: torch.Tensor  # [rows] bool
    costs: torch.Tensor  # [rows]
    first_row: torch.Tensor  # [episodes] int64, row of each episode's step 0
    lengths: torch.Tensor  # [episodes] int64
    cost_returns: torch.Tensor  # [episodes] float64, raw (relabelled for augmented copies)

    def rows_to(self, device: torch.device) -> TrajectoryBuffer:
        """The per-row tensors on `device` (batches are then gathered there); the per-episode
        ones stay on the CPU, where the sampler draws its indices from its seeded generator."""
        return self._replace(
            **{
                name: tensor.to(device)
                for name, tensor in self._asdict().items()
                if name not in PER_EPISODE_FIELDS
            }
        )


PER_EPISODE_FIELDS = ("first_row", "lengths", "cost_returns")


def _episode_block(
    episode: Episode, stats: NormalisationStats, seq_len: int, relabel: Relabel | None
) -> dict[str, np.ndarray]:
    reward_to_go, cost_to_go = to_go(episode.rewards), to_go(episode.costs)
    if relabel is not None:
        # Algorithm 1: element-wise shift so the copy starts at the (infeasible) targets.
        reward_to_go = relabel_to_go(reward_to_go, relabel.reward_return)
        cost_to_go = relabel_to_go(cost_to_go, relabel.cost_return)
    pad = seq_len - 1
    block = {
        "states": stats.normalise_states(episode.observations),
        "actions": stats.scale_actions(episode.actions),
        "returns_to_go": reward_to_go * stats.reward_scale,
        "costs_to_go": cost_to_go * stats.cost_scale,
        "time_steps": np.minimum(np.arange(episode.length), stats.max_episode_len - 1),
        "is_padding": np.zeros(episode.length, dtype=bool),
        "costs": episode.costs,
    }
    # prepend K-1 padding rows (zeros, flagged True in is_padding; the mask hides them)
    return {
        key: np.concatenate(
            [np.full((pad, *value.shape[1:]), key == "is_padding", dtype=value.dtype), value]
        )
        for key, value in block.items()
    }


def dataset_summary(
    path: Path, dataset: OfflineDataset, budgets: Sequence[float] = REPORTED_BUDGETS
) -> dict[str, Any]:
    """What checkpoints and model cards record about the training data: return ranges, and the
    default (reward, cost) targets at `budgets` that selection and the card share."""
    rewards, costs = dataset.reward_returns, dataset.cost_returns
    return {
        "path": str(path),
        "task": dataset.task,
        "episodes": len(dataset.episodes),
        "transitions": dataset.transitions,
        "reward_return_min": float(rewards.min()),
        "reward_return_max": float(rewards.max()),
        "cost_return_min": float(costs.min()),
        "cost_return_max": float(costs.max()),
        "default_targets": derive_default_targets(costs, rewards, tuple(budgets)),
        "git_commit": git_commit(),
    }


def build_buffer(
    episodes: Sequence[Episode],
    stats: NormalisationStats,
    seq_len: int,
    relabels: Sequence[Relabel] = (),
) -> TrajectoryBuffer:
    """Write the episodes, then one relabelled copy per `Relabel`, into one flat buffer."""
    sources: list[tuple[Episode, Relabel | None]] = [(episode, None) for episode in episodes]
    sources += [(episodes[relabel.source], relabel) for relabel in relabels]
    blocks = [_episode_block(episode, stats, seq_len, relabel) for episode, relabel in sources]
    lengths = np.array([episode.length for episode, _ in sources], dtype=np.int64)
    block_sizes = lengths + seq_len - 1
    first_row = np.cumsum(block_sizes) - lengths  # step 0 follows each block's padding
    cost_returns = [
        relabel.cost_return if relabel else episode.cost_return for episode, relabel in sources
    ]
    flat = {key: np.concatenate([block[key] for block in blocks]) for key in blocks[0]}
    return TrajectoryBuffer(
        states=torch.as_tensor(flat["states"], dtype=torch.float32),
        actions=torch.as_tensor(flat["actions"], dtype=torch.float32),
        returns_to_go=torch.as_tensor(flat["returns_to_go"], dtype=torch.float32),
        costs_to_go=torch.as_tensor(flat["costs_to_go"], dtype=torch.float32),
        time_steps=torch.as_tensor(flat["time_steps"], dtype=torch.int64),
        is_padding=torch.as_tensor(flat["is_padding"], dtype=torch.bool),
        costs=torch.as_tensor(flat["costs"], dtype=torch.float32),
        first_row=torch.as_tensor(first_row),
        lengths=torch.as_tensor(lengths),
        cost_returns=torch.as_tensor(np.asarray(cost_returns, dtype=np.float64)),
    )


def cost_sampling_weights(
    cost_returns: torch.Tensor, ceiling: float | None, min_weight: float = 0.0
) -> torch.Tensor:
    """Linear cost-weighted sampling: weight max(ceiling - C, floor), uniform if all are 0.

    `ceiling` None is the largest cost return plus 10 % of the cost range: every episode and
    relabelled copy keeps a positive weight, the cheapest ones the largest. `min_weight` is the
    floor as a share of the largest weight: with the authors' ceiling of 70, a floor of 0.1 keeps
    costlier episodes in the draw at a tenth of the safest one's weight instead of zero.
    """
    if ceiling is None:
        high, low = float(cost_returns.max()), float(cost_returns.min())
        ceiling = high + 0.1 * (high - low)
    weights = (ceiling - cost_returns).clamp(min=0.0)
    weights = weights.clamp(min=min_weight * float(weights.max()))
    if float(weights.sum()) <= 0.0:
        return torch.ones_like(cost_returns)
    return weights


COST_TO_GO_EDGES = (0.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0, math.inf)
"""Bins of the cost-to-go histogram a run prints (raw cost units)."""


def window_coverage(
    buffer: TrajectoryBuffer,
    weights: torch.Tensor | None,
    recorded_episodes: int,
    cost_scale: float,
) -> dict[str, Any]:
    """What the sampler trains on, exactly (no draws): the share of windows taken from relabelled
    copies and the histogram of the newest position's cost-to-go (raw units).

    An episode is drawn with probability w_e / sum(w), then its newest step uniformly, so step t
    of episode e is the newest position with probability w_e / (sum(w) * length_e).
    """
    lengths = buffer.lengths.cpu().double()
    episode_weights = torch.ones_like(lengths) if weights is None else weights.cpu().double()
    probability = episode_weights / episode_weights.sum()
    relabelled_share = float(probability[recorded_episodes:].sum())
    episode_of_row = torch.repeat_interleave(torch.arange(len(lengths)), buffer.lengths.cpu())
    step_of_row = torch.arange(len(episode_of_row)) - torch.repeat_interleave(
        torch.cumsum(buffer.lengths.cpu(), 0) - buffer.lengths.cpu(), buffer.lengths.cpu()
    )
    rows = buffer.first_row.cpu()[episode_of_row] + step_of_row  # every real row, once
    row_probability = (probability / lengths)[episode_of_row].numpy()
    cost_to_go = buffer.costs_to_go.cpu()[rows].double().numpy() / cost_scale
    shares, _ = np.histogram(cost_to_go, bins=COST_TO_GO_EDGES, weights=row_probability)
    return {
        "relabelled_window_share": relabelled_share,
        "cost_to_go_edges": list(COST_TO_GO_EDGES),
        "cost_to_go_share": [float(share) for share in shares],
    }


def describe_coverage(coverage: dict[str, Any]) -> str:
    """A one-line summary of `window_coverage` for the run's log."""
    edges, shares = coverage["cost_to_go_edges"], coverage["cost_to_go_share"]
    bins = ", ".join(
        f"{low:g}-{high:g}: {share:.1%}"
        for low, high, share in zip(edges[:-1], edges[1:], shares, strict=True)
    )
    return (
        f"windows from relabelled copies: {coverage['relabelled_window_share']:.1%}; "
        f"newest cost-to-go: {bins}"
    )


class WindowSampler:
    """Draws batches of windows: an episode (uniform or weighted), then its newest step uniformly.

    Deviation: OSRL draws a window *start* and pads on the right; drawing the window's *end* and
    padding on the left gives every step the same chance to be the newest one, which is the
    position the policy is queried at in deployment.
    """

    def __init__(
        self,
        buffer: TrajectoryBuffer,
        seq_len: int,
        batch_size: int,
        seed: int,
        episode_weights: torch.Tensor | None = None,
    ) -> None:
        self.buffer = buffer
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.episode_weights = None if episode_weights is None else episode_weights.double()
        self.generator = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len - 1, -1, -1)  # [seq_len], K-1 ... 0

    def draw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([batch] episode index, [batch] newest step) of the next batch."""
        count = len(self.buffer.lengths)
        if self.episode_weights is None:
            episode = torch.randint(count, (self.batch_size,), generator=self.generator)
        else:
            episode = torch.multinomial(
                self.episode_weights, self.batch_size, replacement=True, generator=self.generator
            )
        uniform = torch.rand(self.batch_size, generator=self.generator, dtype=torch.float64)
        newest = (uniform * self.buffer.lengths[episode]).long()  # [batch], step index
        return episode, newest

    def sample(self) -> Batch:
        episode, newest = self.draw()
        last_row = self.buffer.first_row[episode] + newest
        rows = last_row.unsqueeze(1) - self.offsets  # [batch, seq_len], oldest ... newest
        return self.gather(rows)

    def gather(self, rows: torch.Tensor) -> Batch:
        """Windows from a [batch, seq_len] row index, on the device of the buffer's rows."""
        buffer = self.buffer
        rows = rows.to(buffer.states.device, non_blocking=True)
        return Batch(
            states=buffer.states[rows],
            actions=buffer.actions[rows],
            returns_to_go=buffer.returns_to_go[rows],
            costs_to_go=buffer.costs_to_go[rows],
            time_steps=buffer.time_steps[rows],
            padding_mask=buffer.is_padding[rows],
            costs=buffer.costs[rows],
        )
