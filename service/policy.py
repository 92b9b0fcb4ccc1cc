"""onnxruntime policies, their model cards, and the model repository (`models/*/`).

The only contract with training is `docs/ARTIFACT.md`: `model.onnx` plus the `model.json` card.
A policy is checked against that contract when it is loaded (input and output names, dtypes and
dims, one forward pass on an empty window), so a broken file is refused at load time and never
reaches an episode.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from runtime.card import CARD_FILE, CardError, ModelCard
from runtime.card import read_card as read_model_card
from service.errors import EpisodeGoneError, ModelNotFoundError
from service.schemas import (
    ModelPublic,
    ModelRef,
    ReloadFailure,
    ReloadResult,
    TargetPair,
)

logger = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
INPUT_TYPES = {
    "states": "tensor(float)",
    "actions": "tensor(float)",
    "returns_to_go": "tensor(float)",
    "costs_to_go": "tensor(float)",
    "time_steps": "tensor(int64)",
    "padding_mask": "tensor(bool)",
}
OUTPUT_TYPES = {"action_mean": "tensor(float)", "action_log_std": "tensor(float)"}


class PolicyLoadError(Exception):
    """A model directory that does not honour docs/ARTIFACT.md."""


def public_card(card: ModelCard) -> ModelPublic:
    """The card as `GET /v1/models` shows it."""
    return ModelPublic(
        name=card.name,
        version=card.version,
        task=card.task,
        algo=card.algo,
        observation_dim=card.observation_dim,
        action_dim=card.action_dim,
        action_low=card.action_low,
        action_high=card.action_high,
        context_len=card.context_len,
        max_episode_len=card.max_episode_len,
        validated_cost_range=card.validated_cost_range,
        default_targets=[
            TargetPair(reward=target.reward, cost=target.cost)
            for target in card.default_targets or []
        ],
        reward_return_range=card.reward_return_range,
    )


def describe_refused(failures: list[ReloadFailure]) -> str:
    """One line naming the refused model folders."""
    return f"{len(failures)} model folder(s) refused: {', '.join(f.path for f in failures)}"


def read_card(directory: Path) -> ModelCard:
    """Read and validate `directory/model.json`; a bad card is a refused policy."""
    try:
        return read_model_card(directory)
    except CardError as error:
        raise PolicyLoadError(str(error)) from error


def fingerprint(directory: Path) -> str:
    """sha256 over the card and the graph, to notice files changed without a version bump."""
    digest = hashlib.sha256()
    for name in (CARD_FILE, ONNX_FILE):
        digest.update((directory / name).read_bytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Policy:
    """One loaded model version: its card and an onnxruntime session."""

    card: ModelCard
    session: ort.InferenceSession
    directory: Path
    fingerprint: str

    @classmethod
    def load(cls, directory: Path, *, intra_op_threads: int = 1, inter_op_threads: int = 1) -> Self:
        """Load and check `directory/model.onnx` + `model.json`; raises `PolicyLoadError`."""
        directory = Path(directory)
        card = read_card(directory)
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(
                str(directory / ONNX_FILE), options, providers=["CPUExecutionProvider"]
            )
            policy = cls(card, session, directory, fingerprint(directory))
            policy.check_contract()
        except PolicyLoadError:
            raise
        except Exception as error:  # onnxruntime raises its own types, all mean "broken file"
            raise PolicyLoadError(f"{directory / ONNX_FILE}: {error}") from error
        return policy

    @functools.cached_property
    def action_bounds(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The card's (low, high) action bounds as float64 arrays (made once, used every step)."""
        return np.asarray(self.card.action_low), np.asarray(self.card.action_high)

    @property
    def ref(self) -> ModelRef:
        """(name, version) of this policy."""
        return ModelRef(name=self.card.name, version=self.card.version)

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
        self, windows: Mapping[str, npt.NDArray[Any]]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One forward pass on a batch of windows.

        Args:
            windows: the six ONNX inputs with a batch axis (`stack_windows`).

        Returns:
            `action_mean` and `action_log_std`, each [B, action_dim].
        """
        mean, log_std = self.session.run(["action_mean", "action_log_std"], dict(windows))
        return np.asarray(mean, dtype=np.float32), np.asarray(log_std, dtype=np.float32)


class ModelRepository:
    """All policies under `models_dir`, served by card `name`, with versions kept for pinning."""

    def __init__(
        self,
        models_dir: Path,
        *,
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        keep_versions: int = 3,
    ) -> None:
        self.models_dir = Path(models_dir)
        self._threads = (intra_op_threads, inter_op_threads)
        self._keep_versions = keep_versions
        self._current: dict[str, Policy] = {}
        self._versions: dict[tuple[str, str], Policy] = {}
        self._refused: list[ReloadFailure] = []
        self._reload_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._current)

    @property
    def refused(self) -> list[ReloadFailure]:
        """The folders the last reload refused, relative to `models_dir`: `/readyz` shows them
        without a token, so the repository's location stays out."""
        prefix = f"{self.models_dir}{os.sep}"
        return [
            ReloadFailure(path=f.path.removeprefix(prefix), error=f.error.replace(prefix, ""))
            for f in self._refused
        ]

    def policies(self) -> list[Policy]:
        """The current version of every served model, by name."""
        return [self._current[name] for name in sorted(self._current)]

    def current(self, name: str) -> Policy:
        """The version new episodes of `name` start with."""
        try:
            return self._current[name]
        except KeyError:
            raise ModelNotFoundError(f"no model named {name!r} is served", "model") from None

    def pinned(self, name: str, version: str) -> Policy:
        """The version an episode started with."""
        try:
            return self._versions[(name, version)]
        except KeyError:
            detail = f"model {name} version {version} is no longer served on this replica"
            raise EpisodeGoneError(detail) from None

    def serves(self, name: str, version: str, fingerprint: str) -> bool:
        """Is this exact model file (name, version and content) still loaded?"""
        policy = self._versions.get((name, version))
        return policy is not None and policy.fingerprint == fingerprint

    def reload(self) -> ReloadResult:
        """Rescan `models_dir`; broken files are refused and the old version keeps serving."""
        with self._reload_lock:
            result = ReloadResult(loaded=[], unchanged=[], removed=[], failed=[])
            current: dict[str, Policy] = {}
            seen: dict[str, Path] = {}
            directories = [path.parent for path in sorted(self.models_dir.glob(f"*/{CARD_FILE}"))]
            for directory in directories:
                policy = self._load_one(directory, seen, result)
                if policy is not None:
                    current[policy.card.name] = policy
            for name, old in self._current.items():
                if name in current:
                    continue
                if name in seen or old.directory in directories:
                    current[name] = old  # its new files were refused: the old version serves on
                else:
                    result.removed.append(old.ref)
            versions = dict(self._versions)
            versions.update({(p.card.name, p.card.version): p for p in current.values()})
            self._versions = self._trim(versions, current)
            self._current = current
            self._refused = list(result.failed)
            for failure in result.failed:
                logger.error("model refused: %s: %s", failure.path, failure.error)
            return result

    def _load_one(
        self, directory: Path, seen: dict[str, Path], result: ReloadResult
    ) -> Policy | None:
        """Load one directory unless its version is already loaded; record the outcome."""
        try:
            card = read_card(directory)
            if card.name in seen:
                other = seen[card.name]
                raise PolicyLoadError(f"duplicate model name {card.name!r} (also in {other})")
            seen[card.name] = directory
            loaded = self._versions.get((card.name, card.version))
            if loaded is not None:
                if loaded.fingerprint != fingerprint(directory):
                    raise PolicyLoadError(f"files changed without a version bump ({card.version})")
                result.unchanged.append(loaded.ref)
                return loaded
            policy = Policy.load(
                directory, intra_op_threads=self._threads[0], inter_op_threads=self._threads[1]
            )
        except (PolicyLoadError, OSError) as error:
            result.failed.append(ReloadFailure(path=str(directory), error=str(error)))
            return None
        result.loaded.append(policy.ref)
        logger.info("loaded model %s version %s from %s", card.name, card.version, directory)
        return policy

    def _trim(
        self, versions: dict[tuple[str, str], Policy], current: dict[str, Policy]
    ) -> dict[tuple[str, str], Policy]:
        """Keep the newest `keep_versions` loaded versions per name, current ones always."""
        kept: dict[tuple[str, str], Policy] = {}
        per_name: dict[str, int] = {}
        for key in reversed(list(versions)):  # newest first: dicts keep insertion order
            name = key[0]
            is_current = name in current and current[name].card.version == key[1]
            if is_current or per_name.get(name, 0) < self._keep_versions:
                kept[key] = versions[key]
                per_name[name] = per_name.get(name, 0) + 1
        return dict(reversed(list(kept.items())))
