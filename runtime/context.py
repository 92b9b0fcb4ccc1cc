"""Per-episode context window and budgets (paper Algorithm 2), in pure numpy.

Shared by the service and the offline evaluator, so what is measured is what is served. No FastAPI
and no onnxruntime here. The window is kept left-padded at a fixed length K: the newest step is at
position K - 1 and padding sits at the start, as `docs/ARTIFACT.md` requires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

WINDOW_NAMES = ("states", "actions", "returns_to_go", "costs_to_go", "time_steps", "padding_mask")


class _StateToCome(np.random.SeedSequence):
    """Seeds a bit generator whose state is set right after: zeros, without the hashing of
    `SeedSequence.generate_state` (two thirds of `restore_rng`'s time)."""

    def generate_state(
        self, n_words: int, dtype: npt.DTypeLike = np.uint32
    ) -> npt.NDArray[np.uint32 | np.uint64]:
        """`n_words` zeros; `restore_rng` overwrites the state they seed."""
        return np.zeros(n_words, dtype)


_STATE_TO_COME = _StateToCome(0)


def make_rng(seed: int | None) -> np.random.Generator:
    """The per-episode generator of ARTIFACT.md: `Generator(PCG64(seed))`."""
    return np.random.Generator(np.random.PCG64(seed))


def restore_rng(state: Mapping[str, Any]) -> np.random.Generator:
    """A generator continuing from a saved `bit_generator.state` (10x faster than deepcopy)."""
    bit_generator = np.random.PCG64(_STATE_TO_COME)
    bit_generator.state = cast(Any, state)  # numpy types the setter as PCG64's TypedDict
    return np.random.Generator(bit_generator)


@dataclass
class EpisodeContext:
    """The last K steps of one episode plus its reward and cost budgets.

    Arrays have a fixed length K; the first `K - length` positions are padding (zeros).
    `returns_to_go[-1]` and `costs_to_go[-1]` are the budgets left at the newest step.
    """

    states: npt.NDArray[np.float32]  # [K, observation_dim]
    actions: FloatArray  # [K, action_dim] float64 (exact actions for retries), newest is 0
    returns_to_go: FloatArray  # [K]
    costs_to_go: FloatArray  # [K], >= 0
    time_steps: npt.NDArray[np.int64]  # [K]
    length: int
    """Number of real (non-padding) positions, 1..K."""
    target_reward: float
    """Current reward target for the whole episode."""
    target_cost: float
    """Current cost limit for the whole episode."""
    total_reward: float = 0.0
    total_cost: float = 0.0
    rng: np.random.Generator = field(default_factory=lambda: make_rng(None))

    @classmethod
    def start(
        cls,
        observation: Sequence[float] | npt.NDArray[np.floating[Any]],
        target_reward: float,
        target_cost: float,
        *,
        context_len: int,
        action_dim: int,
        seed: int | None = None,
    ) -> Self:
        """Open an episode: `R_0 = target_reward`, `C_0 = target_cost`, first observation at t=0."""
        if target_cost < 0:
            raise ValueError(f"target_cost must be >= 0, got {target_cost}")
        target_cost = float(target_cost) + 0.0  # -0.0 -> 0.0
        state = np.asarray(observation, dtype=np.float32)
        if state.ndim != 1:
            raise ValueError(f"observation must be 1-D, got shape {state.shape}")
        context = cls(
            states=np.zeros((context_len, state.shape[0]), dtype=np.float32),
            actions=np.zeros((context_len, action_dim), dtype=np.float64),
            returns_to_go=np.zeros(context_len, dtype=np.float64),
            costs_to_go=np.zeros(context_len, dtype=np.float64),
            time_steps=np.zeros(context_len, dtype=np.int64),
            length=1,
            target_reward=float(target_reward),
            target_cost=target_cost,
            rng=make_rng(seed),
        )
        context.states[-1] = state
        context.returns_to_go[-1] = target_reward
        context.costs_to_go[-1] = target_cost
        return context

    @property
    def context_len(self) -> int:
        """K, the fixed window length."""
        return int(self.states.shape[0])

    @property
    def step(self) -> int:
        """Episode step index of the newest observation."""
        return int(self.time_steps[-1])

    @property
    def remaining_reward(self) -> float:
        """Reward-to-go at the newest step."""
        return float(self.returns_to_go[-1])

    @property
    def remaining_cost(self) -> float:
        """Cost-to-go at the newest step, never below zero."""
        return float(self.costs_to_go[-1])

    @property
    def budget_exhausted(self) -> bool:
        """True once no cost budget is left."""
        return self.remaining_cost <= 0.0

    @property
    def last_action(self) -> FloatArray:
        """The action recorded for the newest step (zeros until `record_action`)."""
        newest: FloatArray = self.actions[-1].copy()
        return newest

    def record_action(self, action: Sequence[float] | npt.NDArray[np.floating[Any]]) -> None:
        """Record the action taken at the newest step."""
        self.actions[-1] = np.asarray(action, dtype=np.float64)

    def advance(
        self,
        reward: float,
        cost: float,
        observation: Sequence[float] | npt.NDArray[np.floating[Any]],
    ) -> None:
        """Append the env's answer to the newest action (paper Algorithm 2).

        `R_{t+1} = R_t - r_t` and `C_{t+1} = max(C_t - c_t, 0)`: an exhausted budget means
        "no more cost", never an out-of-distribution negative cost-to-go.
        """
        state = np.asarray(observation, dtype=np.float32)
        if state.shape != self.states.shape[1:]:
            raise ValueError(f"observation must have shape {self.states.shape[1:]}")
        next_return = self.remaining_reward - reward
        next_cost = max(self.remaining_cost - cost, 0.0)
        next_step = self.step + 1
        for window in (self.states, self.actions, self.returns_to_go, self.costs_to_go):
            window[:-1] = window[1:]  # shift left by one step, the oldest falls out
        self.time_steps[:-1] = self.time_steps[1:]
        self.states[-1] = state
        self.actions[-1] = 0.0
        self.returns_to_go[-1] = next_return
        self.costs_to_go[-1] = next_cost
        self.time_steps[-1] = next_step
        self.length = min(self.length + 1, self.context_len)
        self.total_reward += float(reward)
        self.total_cost += float(cost)

    def set_budget(
        self,
        *,
        cost_limit: float | None = None,
        remaining_cost: float | None = None,
        target_reward: float | None = None,
        remaining_reward: float | None = None,
    ) -> None:
        """Change the budgets mid-episode (zero-shot threshold change).

        `cost_limit` is a new episode total (cost already spent is subtracted, clamped at 0);
        `remaining_cost` sets what is left directly; likewise `target_reward` / `remaining_reward`.
        The whole window is shifted by the same delta so the history stays consistent with the
        newest budget (cost-to-go clamped at 0), and padding stays 0.
        """
        if cost_limit is not None and remaining_cost is not None:
            raise ValueError("give either cost_limit or remaining_cost, not both")
        if target_reward is not None and remaining_reward is not None:
            raise ValueError("give either target_reward or remaining_reward, not both")
        if min(cost_limit or 0.0, remaining_cost or 0.0) < 0:
            raise ValueError("cost budgets must be >= 0")
        real = ~self.padding_mask()  # [K]
        if cost_limit is not None:
            self._shift_costs(max(cost_limit - self.total_cost, 0.0), real)
            self.target_cost = float(cost_limit) + 0.0  # -0.0 -> 0.0
        elif remaining_cost is not None:
            self._shift_costs(float(remaining_cost), real)
            self.target_cost = self.total_cost + float(remaining_cost)
        if target_reward is not None:
            self._shift_returns(target_reward - self.total_reward, real)
            self.target_reward = float(target_reward)
        elif remaining_reward is not None:
            self._shift_returns(float(remaining_reward), real)
            self.target_reward = self.total_reward + float(remaining_reward)

    def _shift_returns(self, new_return: float, real: npt.NDArray[np.bool_]) -> None:
        """Shift the real reward-to-go entries so the newest equals `new_return`."""
        self.returns_to_go[real] += new_return - self.remaining_reward
        self.returns_to_go[-1] = new_return

    def _shift_costs(self, new_cost: float, real: npt.NDArray[np.bool_]) -> None:
        """Shift the real cost-to-go entries so the newest equals `new_cost`, clamping at 0."""
        delta = new_cost - self.remaining_cost
        self.costs_to_go[real] = np.maximum(self.costs_to_go[real] + delta, 0.0)
        self.costs_to_go[-1] = new_cost + 0.0  # -0.0 -> 0.0

    def padding_mask(self) -> npt.NDArray[np.bool_]:
        """[K] bool, True = padding (the first K - length positions)."""
        return np.arange(self.context_len) < self.context_len - self.length

    def window(
        self, cost_input_scale: float = 1.0, *, cost_left: float | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """The ONNX inputs for this episode without the batch axis, dtypes as in ARTIFACT.md;
        the cost-to-go multiplied by `cost_input_scale` (the card's, for this action mode).

        `cost_left` tells the model another budget left than the episode's (the budget guard):
        the whole cost-to-go is shifted so that its newest entry is `cost_left` (older entries
        clamped at 0), the window a `set_budget(remaining_cost=cost_left)` would leave.
        """
        costs = self.costs_to_go  # [K]
        if cost_left is not None:
            costs = np.maximum(costs + (cost_left - self.remaining_cost), 0.0)  # [K]
        return {
            "states": self.states,  # [K, observation_dim]
            "actions": self.actions.astype(np.float32),  # [K, action_dim]
            "returns_to_go": self.returns_to_go.astype(np.float32),  # [K]
            "costs_to_go": (costs * cost_input_scale).astype(np.float32),  # [K]
            "time_steps": self.time_steps,  # [K]
            "padding_mask": self.padding_mask(),  # [K]
        }

    def copy(self) -> EpisodeContext:
        """A deep copy (arrays and generator state), for all-or-nothing updates."""
        return EpisodeContext(  # spelled out: dataclasses.replace costs as much as the copies
            states=self.states.copy(),
            actions=self.actions.copy(),
            returns_to_go=self.returns_to_go.copy(),
            costs_to_go=self.costs_to_go.copy(),
            time_steps=self.time_steps.copy(),
            length=self.length,
            target_reward=self.target_reward,
            target_cost=self.target_cost,
            total_reward=self.total_reward,
            total_cost=self.total_cost,
            rng=restore_rng(self.rng.bit_generator.state),
        )


def stack_windows(
    contexts: Sequence[EpisodeContext], cost_input_scales: Sequence[float] | None = None
) -> dict[str, npt.NDArray[Any]]:
    """Batch the windows of several episodes (same K and dims) for one forward pass, each
    episode's cost-to-go multiplied by its entry of `cost_input_scales` (default 1).

    Returns:
        The six ONNX inputs, each with a leading batch axis: `states [B, K, observation_dim]`,
        `actions [B, K, action_dim]`, `returns_to_go`, `costs_to_go`, `time_steps` and
        `padding_mask` `[B, K]`.
    """
    scales = [1.0] * len(contexts) if cost_input_scales is None else cost_input_scales
    return batch_windows(
        [context.window(scale) for context, scale in zip(contexts, scales, strict=True)]
    )


def batch_windows(windows: Sequence[Mapping[str, npt.NDArray[Any]]]) -> dict[str, npt.NDArray[Any]]:
    """Stack per-episode windows (no batch axis) into the six batched ONNX inputs."""
    if len(windows) == 1:  # a batch axis is all one window needs
        return {name: windows[0][name][None] for name in WINDOW_NAMES}
    return {name: np.stack([window[name] for window in windows]) for name in WINDOW_NAMES}


def sample_action(
    mean: npt.NDArray[np.floating[Any]],
    log_std: npt.NDArray[np.floating[Any]],
    rng: np.random.Generator,
    low: npt.NDArray[np.floating[Any]] | Sequence[float],
    high: npt.NDArray[np.floating[Any]] | Sequence[float],
    deterministic: bool,
    *,
    noise_scale: float = 1.0,
) -> FloatArray:
    """`clip(mean + noise_scale * exp(log_std) * z, low, high)` with `z ~ N(0, I)` from `rng`.

    Args:
        mean: [action_dim] (or [B, action_dim]) mean action in env units.
        log_std: same shape as `mean`.
        rng: the episode's generator; not consumed when `deterministic`.
        low: lower action bounds, [action_dim].
        high: upper action bounds, [action_dim].
        deterministic: use the mean instead of sampling.
        noise_scale: the budget guard's factor on the noise (`runtime.budget_guard`); z is
            drawn even at 0, so a guarded episode's later draws are the unguarded episode's.

    Returns:
        float64 actions with the shape of `mean`, inside `[low, high]`.
    """
    action = np.asarray(mean, dtype=np.float64)
    if not deterministic:
        noise = rng.standard_normal(action.shape)
        if noise_scale != 1.0:
            noise = noise * noise_scale
        action = action + np.exp(np.asarray(log_std, dtype=np.float64)) * noise
    # minimum/maximum: np.clip's dispatch costs more than the arithmetic on a few values
    return np.minimum(np.maximum(action, low), high).astype(np.float64, copy=False)
