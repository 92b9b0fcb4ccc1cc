"""The ONNX policy that training's evaluation and the service both run (docs/ARTIFACT.md).

A policy is checked against the artifact contract when it is loaded (input and output names,
dtypes and dims, one forward pass on an empty window), so a broken file is refused at load time
and never reaches an episode. Torch-free: onnxruntime only.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from runtime.card import CardError, ModelCard
from runtime.card import read_card as read_model_card
from runtime.context import WINDOW_NAMES
from runtime.cost_critic import CostCritic, CostCriticLoadError
from runtime.files import CARD_FILE, COST_CRITIC_FILE, ONNX_FILE, read_regular
from runtime.onnx_session import open_session
from runtime.user_errors import UserError, one_line

OUTPUT_NAMES = ("action_mean", "action_log_std")
INPUT_TYPES = {
    "states": "tensor(float)",
    "actions": "tensor(float)",
    "returns_to_go": "tensor(float)",
    "costs_to_go": "tensor(float)",
    "time_steps": "tensor(int64)",
    "padding_mask": "tensor(bool)",
}
OUTPUT_TYPES = dict.fromkeys(OUTPUT_NAMES, "tensor(float)")
assert tuple(INPUT_TYPES) == WINDOW_NAMES, "the contract's input order is runtime.context's"


class PolicyLoadError(UserError):
    """A model directory that does not honour docs/ARTIFACT.md: one line (the reload's reason,
    a command's error), whatever onnxruntime's message spans."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def read_card(directory: Path) -> ModelCard:
    """Read and validate `directory/model.json`; a bad card is a refused policy."""
    try:
        return read_model_card(directory)
    except CardError as error:
        raise PolicyLoadError(str(error)) from error


def fingerprint(directory: Path) -> str:
    """sha256 over the card and the graphs, to notice files changed without a version bump;
    raises `OSError` for a file that is not a regular one (a FIFO, a device: `read_regular`)."""
    digest = hashlib.sha256()
    for name in (CARD_FILE, ONNX_FILE, COST_CRITIC_FILE):
        if name != COST_CRITIC_FILE or os.path.lexists(directory / name):
            digest.update(read_regular(directory / name))
    return digest.hexdigest()


@dataclass(frozen=True)
class Policy:
    """One loaded model version: its card, an onnxruntime session, and its cost critic when the
    card names one."""

    card: ModelCard
    session: ort.InferenceSession
    directory: Path
    fingerprint: str
    cost_critic: CostCritic | None = None

    @classmethod
    def load(cls, directory: Path, *, intra_op_threads: int = 1, inter_op_threads: int = 1) -> Self:
        """Load and check `directory/model.onnx` + `model.json`; raises `PolicyLoadError`."""
        directory = Path(directory)
        card = read_card(directory)
        session = open_session(
            directory / ONNX_FILE,
            PolicyLoadError,
            intra_op_threads=intra_op_threads,
            inter_op_threads=inter_op_threads,
        )
        try:
            critic = None
            if card.cost_critic is not None:
                critic = CostCritic.load(directory, card.observation_dim, card.action_dim)
            policy = cls(card, session, directory, fingerprint(directory), critic)
            policy.check_contract()
        except CostCriticLoadError as error:
            raise PolicyLoadError(str(error)) from error
        except PolicyLoadError:
            raise
        except Exception as error:  # onnxruntime's own types, from the first forward pass
            raise PolicyLoadError(f"{directory / ONNX_FILE}: {error}") from error
        return policy

    @functools.cached_property
    def action_bounds(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The card's (low, high) action bounds as float64 arrays (made once, used every step)."""
        return np.asarray(self.card.action_low), np.asarray(self.card.action_high)

    def check_contract(self) -> None:
        """Check names, dtypes and dims against the card, then run one empty window."""
        card = self.card
        inputs = {node.name: node for node in self.session.get_inputs()}
        outputs = {node.name: node for node in self.session.get_outputs()}
        for expected, found in ((INPUT_TYPES, inputs), (OUTPUT_TYPES, outputs)):
            if set(found) != set(expected):
                raise PolicyLoadError(f"graph has {sorted(found)}, expected {sorted(expected)}")
            for name, dtype in expected.items():
                if found[name].type != dtype:
                    raise PolicyLoadError(f"{name} is {found[name].type}, expected {dtype}")
        dims = {"states": [card.context_len, card.observation_dim]}
        dims["actions"] = [card.context_len, card.action_dim]
        for name, expected_dims in dims.items():
            shape = inputs[name].shape  # [B, K, dim]; symbolic dims are strings
            fixed = [(d, e) for d, e in zip(shape[1:], expected_dims, strict=False)]
            if len(shape) != 3 or any(isinstance(d, int) and d != e for d, e in fixed):
                raise PolicyLoadError(f"{name} has shape {shape}, the card says {expected_dims}")
        mean, log_std = self.predict(self.empty_windows())
        if mean.shape != (1, card.action_dim) or log_std.shape != (1, card.action_dim):
            raise PolicyLoadError(f"outputs have shapes {mean.shape}, {log_std.shape}")
        if not (np.isfinite(mean).all() and np.isfinite(log_std).all()):
            answered = f"{mean.tolist()}, {log_std.tolist()}"
            raise PolicyLoadError(f"outputs {answered} for an empty window: not finite")

    def empty_windows(self) -> dict[str, npt.NDArray[Any]]:
        """A batch of one all-padding window but the newest position (zeros)."""
        card = self.card
        k = card.context_len
        mask = np.ones((1, k), dtype=np.bool_)
        mask[0, -1] = False
        return {
            "states": np.zeros((1, k, card.observation_dim), np.float32),
            "actions": np.zeros((1, k, card.action_dim), np.float32),
            "returns_to_go": np.zeros((1, k), np.float32),
            "costs_to_go": np.zeros((1, k), np.float32),
            "time_steps": np.zeros((1, k), np.int64),
            "padding_mask": mask,
        }

    def predict(
        self,
        windows: Mapping[str, npt.NDArray[Any]],
        guidance_weights: Sequence[float | None] | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One forward pass on a batch of windows.

        Args:
            windows: the six ONNX inputs with a batch axis (`stack_windows`).
            guidance_weights: per row, the weight of the card's cost guidance (None: the card's
                own; the budget guard sets one while it holds an episode for a cut). Without
                guidance on the card there is nothing to weigh.

        Returns:
            `action_mean` and `action_log_std`, each [B, action_dim].
        """
        guidance = self.card.cost_guidance
        if guidance is not None:
            rows = len(windows["costs_to_go"])
            weights = _row_weights(guidance.weight, guidance_weights, rows)
            if weights.any():
                return self._guided(windows, weights, guidance.shift)
        mean, log_std = self.session.run(list(OUTPUT_NAMES), dict(windows))
        return np.asarray(mean, dtype=np.float32), np.asarray(log_std, dtype=np.float32)

    def _guided(
        self,
        windows: Mapping[str, npt.NDArray[Any]],
        weights: npt.NDArray[np.float32],
        shift: float,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """The card's cost guidance: the windows and their contrast (`shift` more cost-to-go at
        every real position) in one batched pass, each row's mean pushed away from the
        contrast's by its weight."""
        batch = len(windows["costs_to_go"])
        real = ~windows["padding_mask"]  # padding keeps its zeros, as the graph expects
        contrast = windows["costs_to_go"] + np.float32(shift) * real
        doubled = {name: np.concatenate([value, value]) for name, value in windows.items()}
        doubled["costs_to_go"] = np.concatenate([windows["costs_to_go"], contrast])
        mean, log_std = self.session.run(list(OUTPUT_NAMES), doubled)
        own, away = mean[:batch], mean[batch:]
        low, high = self.action_bounds
        guided = np.clip(own + weights[:, None] * (own - away), low, high)
        return guided.astype(np.float32), np.asarray(log_std[:batch], dtype=np.float32)


def _row_weights(
    card_weight: float, weights: Sequence[float | None] | None, rows: int
) -> npt.NDArray[np.float32]:
    """The guidance weight of each of `rows` rows: the card's where none is given."""
    if weights is None:
        return np.full(rows, card_weight, dtype=np.float32)
    if len(weights) != rows:
        raise ValueError(f"{len(weights)} guidance weights for {rows} windows")
    return np.array([card_weight if w is None else w for w in weights], dtype=np.float32)
