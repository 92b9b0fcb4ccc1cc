"""The model repository (`models/*/`): every served policy by name, old versions kept for pinning.

The policies themselves (`runtime.policy.Policy`) are what training's evaluation runs too; the
only contract with training is `docs/ARTIFACT.md`.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from runtime.card import ModelCard
from runtime.files import CARD_FILE
from runtime.policy import Policy, PolicyLoadError, fingerprint, read_card
from service.errors import EpisodeGoneError, ModelNotFoundError, VersionElsewhereError
from service.schemas import (
    ModelPublic,
    ModelRef,
    ReloadFailure,
    ReloadResult,
    TargetPair,
)

logger = logging.getLogger(__name__)


def policy_ref(policy: Policy) -> ModelRef:
    """(name, version) of a policy, as the API names it."""
    return ModelRef(name=policy.card.name, version=policy.card.version)


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


def model_folders(models_dir: Path) -> list[Path]:
    """The folders of `models_dir` holding a `model.json` entry, by name: a broken one too (a
    dangling or looping link, a folder in its place), to be refused while the old version serves
    on; a folder whose card is gone is a removed model. (An export stages its files two levels
    down, `runtime.files.staged_files`: never seen here; nor are hidden folders.)"""
    try:
        entries = sorted(models_dir.iterdir())
    except OSError:  # a missing or unreadable repository serves nothing
        return []
    return [
        path
        for path in entries
        if not path.name.startswith(".") and path.is_dir() and os.path.lexists(path / CARD_FILE)
    ]


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
        self._ever_loaded: set[tuple[str, str]] = set()
        """Every (name, version) this replica has served: one it dropped is gone for good."""
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
        """The version an episode started with.

        Raises `EpisodeGoneError` (410) for a version this replica dropped, and
        `VersionElsewhereError` (503, retryable) for one it never loaded: the episode started on
        another replica of a newer or older release, as while a deploy rolls out."""
        try:
            return self._versions[(name, version)]
        except KeyError:
            if (name, version) in self._ever_loaded:
                detail = f"model {name} version {version} is no longer served on this replica"
                raise EpisodeGoneError(detail) from None
            detail = (
                f"model {name} version {version} is not loaded on this replica; another replica "
                "serves it (a deploy rolling out?): retry"
            )
            raise VersionElsewhereError(detail) from None

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
            directories = model_folders(self.models_dir)
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
                    result.removed.append(policy_ref(old))
            versions = dict(self._versions)
            versions.update({(p.card.name, p.card.version): p for p in current.values()})
            self._versions = self._trim(versions, current)
            self._ever_loaded |= set(versions)
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
                result.unchanged.append(policy_ref(loaded))
                return loaded
            policy = Policy.load(
                directory, intra_op_threads=self._threads[0], inter_op_threads=self._threads[1]
            )
        except (PolicyLoadError, OSError) as error:
            result.failed.append(ReloadFailure(path=str(directory), error=str(error)))
            return None
        result.loaded.append(policy_ref(policy))
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
