"""Offline datasets in the DSRL HDF5 layout: validate, load, split into episodes, save.

A file holds flat per-transition arrays (`observations`, `next_observations`, `actions`, `rewards`,
`costs`, `terminals`, `timeouts`) and attributes naming the env and how the data was made. A file
written by DSRL loads unchanged.

The compact layout (attribute `layout = "compact"`) leaves out `next_observations`, which within
an episode repeat the next row's `observations`, and keeps only each episode's last one
(`final_observations`, [episodes, obs_dim]): about 40 % smaller, and loading rebuilds the DSRL
arrays exactly (`cdt dataset expand` writes them back out).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from runtime.files import write_atomic
from runtime.user_errors import UserError

if TYPE_CHECKING:
    import h5py

FLOAT_KEYS = ("observations", "next_observations", "actions", "rewards", "costs")
COMPACT_LAYOUT = "compact"
FINAL_OBSERVATIONS = "final_observations"  # compact layout: each episode's last next_observation
FLAG_KEYS = ("terminals", "timeouts")
REQUIRED_KEYS = FLOAT_KEYS + FLAG_KEYS
VECTOR_KEYS = ("rewards", "costs", "terminals", "timeouts")  # [transitions], one value per step

FLOAT32_MAX = float(np.finfo(np.float32).max)
ENV_ID = re.compile(r"(?:[\w:-]+/)?[\w:.-]{1,200}")
"""Gymnasium's env id grammar (`[namespace/]name[-vN]`): a task name is also a run folder's name,
so it may hold no `..` path, control character or other separator."""
MAX_EPISODE_STEPS = 1_000_000
"""The largest `max_episode_steps` attribute: the model learns one time-step embedding per step."""
READ_ERRORS = (OSError, KeyError, RuntimeError, TypeError, ValueError)
"""What h5py raises for a corrupt file (bit flips: KeyError and RuntimeError, not only OSError)."""

logger = logging.getLogger(__name__)


class DatasetError(UserError, ValueError):
    """A dataset file that cannot be used; the message is one line naming the problem."""


class Episode(NamedTuple):
    """One trajectory; every array has the episode's length on axis 0."""

    observations: np.ndarray  # [T, obs_dim]
    next_observations: np.ndarray  # [T, obs_dim]
    actions: np.ndarray  # [T, act_dim]
    rewards: np.ndarray  # [T]
    costs: np.ndarray  # [T]
    terminals: np.ndarray  # [T] bool
    timeouts: np.ndarray  # [T] bool

    @property
    def length(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def reward_return(self) -> float:
        return float(self.rewards.sum())

    @property
    def cost_return(self) -> float:
        return float(self.costs.sum())


@dataclass(frozen=True)
class OfflineDataset:
    """A loaded dataset: its episodes plus the file's attributes."""

    episodes: list[Episode]
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def observation_dim(self) -> int:
        return int(self.episodes[0].observations.shape[1])

    @property
    def action_dim(self) -> int:
        return int(self.episodes[0].actions.shape[1])

    @property
    def transitions(self) -> int:
        return sum(episode.length for episode in self.episodes)

    @property
    def reward_returns(self) -> np.ndarray:
        return np.array([episode.reward_return for episode in self.episodes], dtype=np.float64)

    @property
    def cost_returns(self) -> np.ndarray:
        return np.array([episode.cost_return for episode in self.episodes], dtype=np.float64)

    @property
    def task(self) -> str:
        return str(self.attrs.get("env_id", "unknown"))


def _squeeze_columns(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Accept `[N, 1]` rewards, costs and flags as `[N]`, as DSRL's `get_dataset` does."""
    return {
        key: array[:, 0]
        if key in VECTOR_KEYS and array.ndim == 2 and array.shape[1] == 1
        else array
        for key, array in arrays.items()
    }


def _check_shapes(arrays: dict[str, np.ndarray]) -> None:
    for key in REQUIRED_KEYS:
        if key not in arrays:
            raise DatasetError(
                f"missing key {key!r} (a DSRL file needs {', '.join(REQUIRED_KEYS)})"
            )
        if arrays[key].ndim == 0:
            raise DatasetError(f"{key!r} is a scalar, expected one row per transition")
    length = arrays["rewards"].shape[0]
    for key in REQUIRED_KEYS:
        if arrays[key].shape[0] != length:
            raise DatasetError(
                f"ragged lengths: {key!r} has {arrays[key].shape[0]} rows, 'rewards' has {length}"
            )
    if length == 0:
        raise DatasetError("the file holds no transitions")
    for key in VECTOR_KEYS:
        if arrays[key].ndim != 1:
            raise DatasetError(f"{key!r} must be 1-D [transitions], got {arrays[key].shape}")
    if arrays["observations"].ndim != 2 or arrays["actions"].ndim != 2:
        raise DatasetError("'observations' and 'actions' must be 2-D [transitions, dim]")
    if arrays["observations"].shape != arrays["next_observations"].shape:
        raise DatasetError("'observations' and 'next_observations' differ in shape")


def _first_row(mask: np.ndarray) -> int | None:
    """The row (index along the first axis) of `mask`'s first True, None when it has none."""
    hits = np.argwhere(mask)
    return int(hits[0][0]) if len(hits) else None


def _check_arrays(arrays: dict[str, np.ndarray]) -> None:
    _check_shapes(arrays)
    for key in FLOAT_KEYS:
        if not np.issubdtype(arrays[key].dtype, np.floating):
            raise DatasetError(f"wrong dtype: {key!r} is {arrays[key].dtype}, expected float")
        if (bad := _first_row(~np.isfinite(arrays[key]))) is not None:
            raise DatasetError(f"non-finite value (NaN or inf) in {key!r} at row {bad}")
        if (bad := _first_row(np.abs(arrays[key]) > FLOAT32_MAX)) is not None:  # held as float32
            raise DatasetError(f"value too large for float32 in {key!r} at row {bad}")
    if (bad := _first_row(arrays["costs"] < 0)) is not None:
        raise DatasetError(f"negative cost in 'costs' at row {bad} (costs must be >= 0)")
    for key in ("rewards", "costs"):  # returns and returns-to-go are summed into float32
        if np.abs(arrays[key]).sum(dtype=np.float64) > FLOAT32_MAX:
            raise DatasetError(f"{key!r} too large: their returns overflow float32")
    if 0 in arrays["observations"].shape[1:] or 0 in arrays["actions"].shape[1:]:
        raise DatasetError("'observations' and 'actions' need at least one column each")
    for key in FLAG_KEYS:
        dtype = arrays[key].dtype
        if not (dtype == np.bool_ or np.issubdtype(dtype, np.number)):
            raise DatasetError(f"wrong dtype: {key!r} is {dtype}, expected bool")
        if dtype != np.bool_ and not np.all(
            (arrays[key] == 0) | (arrays[key] == 1)
        ):  # NaN fails both
            raise DatasetError(f"{key!r} holds values other than 0 and 1")
    ends = arrays["terminals"].astype(bool) | arrays["timeouts"].astype(bool)
    if not ends.any():
        raise DatasetError("no episode end: neither 'terminals' nor 'timeouts' is ever true")


def split_episodes(arrays: dict[str, np.ndarray]) -> list[Episode]:
    """Cut flat DSRL arrays into episodes at every terminal or timeout.

    Transitions after the last episode end (an unfinished episode) are dropped, as DSRL does.
    """
    arrays = _squeeze_columns(arrays)
    _check_arrays(arrays)
    ends = arrays["terminals"].astype(bool) | arrays["timeouts"].astype(bool)
    end_rows = np.flatnonzero(ends)
    unfinished = arrays["rewards"].shape[0] - int(end_rows[-1]) - 1
    if unfinished:
        logger.warning("dropped %d transitions after the last episode end", unfinished)
    starts = np.concatenate([[0], end_rows[:-1] + 1])
    episodes = []
    for start, end in zip(starts, end_rows + 1, strict=True):
        episodes.append(
            Episode(
                observations=arrays["observations"][start:end].astype(np.float32),
                next_observations=arrays["next_observations"][start:end].astype(np.float32),
                actions=arrays["actions"][start:end].astype(np.float32),
                rewards=arrays["rewards"][start:end].astype(np.float32),
                costs=arrays["costs"][start:end].astype(np.float32),
                terminals=arrays["terminals"][start:end].astype(bool),
                timeouts=arrays["timeouts"][start:end].astype(bool),
            )
        )
    return episodes


def _decode_attr(value: Any, key: str = "") -> Any:
    """An attribute as plain Python (so the attrs can be written back as JSON): bytes as UTF-8
    text, JSON text as its value, numpy values and arrays (of bytes too) as numbers and lists."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.ndarray | list):
        return [_decode_attr(item, key) for item in value]
    if isinstance(value, bytes | str):
        try:  # h5py hands text that is not UTF-8 over as str with surrogate escapes
            value = value.decode() if isinstance(value, bytes) else value
            value.encode()
        except UnicodeError:
            raise DatasetError(f"attribute {key!r} holds bytes that are not UTF-8 text") from None
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, np.generic):
        return _decode_attr(value.item(), key)
    if not isinstance(value, str | int | float | bool):  # an empty (null) attribute, a reference
        raise DatasetError(f"attribute {key!r} is a {type(value).__name__}, not text or numbers")
    return value


def _check_task(attrs: dict[str, Any]) -> None:
    """`env_id` names a gymnasium env, and so a run folder (see ENV_ID)."""
    if "env_id" not in attrs:
        return
    task = attrs["env_id"]
    if not isinstance(task, str) or not ENV_ID.fullmatch(task):
        raise DatasetError(
            f"attribute 'env_id' must name an env such as SafetyCarRun-v0, got {task!r:.80}"
        )


def _check_attrs(attrs: dict[str, Any], action_dim: int) -> None:
    """The attributes training reads: `env_id`, `max_episode_steps`, `action_low`/`_high`."""
    _check_task(attrs)
    steps = attrs.get("max_episode_steps", 1)
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_EPISODE_STEPS:
        raise DatasetError(
            f"attribute 'max_episode_steps' must be a whole number in [1, {MAX_EPISODE_STEPS:,}],"
            f" got {steps!r:.80}"
        )
    bounds = {}
    for key in ("action_low", "action_high"):
        if key not in attrs:
            continue
        try:
            value = np.asarray(attrs[key], dtype=np.float64)
        except (TypeError, ValueError):
            value = np.array([np.nan])
        if value.size not in (1, action_dim) or value.ndim > 1 or not np.isfinite(value).all():
            raise DatasetError(
                f"attribute {key!r} must be one finite number or {action_dim} (one per action),"
                f" got {attrs[key]!r:.80}"
            )
        bounds[key] = value
    if len(bounds) == 2 and not np.all(bounds["action_low"] < bounds["action_high"]):
        raise DatasetError("attribute 'action_low' must lie below 'action_high'")


def load_dataset(path: str | Path) -> OfflineDataset:
    """Load and validate a DSRL-layout HDF5 file.

    Raises:
        DatasetError: the file is missing, unreadable or malformed (one-line message).
    """
    import h5py  # here, not at the top: a command's --help needs no h5py (nor the [train] extra)

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    try:
        with h5py.File(path, "r") as file:
            for key in REQUIRED_KEYS:
                if key in file and not isinstance(file[key], h5py.Dataset):
                    raise DatasetError(f"{key!r} is an HDF5 group, expected a dataset: {path}")
            arrays = {key: np.asarray(file[key]) for key in REQUIRED_KEYS if key in file}
            attrs = {key: _decode_attr(value, key) for key, value in file.attrs.items()}
            if attrs.get("layout") == COMPACT_LAYOUT:
                arrays["next_observations"] = _next_observations(arrays, file)
    except DatasetError:
        raise
    except READ_ERRORS as error:
        raise DatasetError(f"not a readable HDF5 file: {path} ({error})") from error
    episodes = split_episodes(arrays)
    _check_attrs(attrs, int(episodes[0].actions.shape[1]))
    return OfflineDataset(episodes=episodes, attrs=attrs)


def _next_observations(arrays: dict[str, np.ndarray], file: h5py.File) -> np.ndarray:
    """A compact file's `next_observations`: the next row's observation within an episode, the
    stored final one at each episode's end."""
    if FINAL_OBSERVATIONS not in file or "observations" not in arrays:
        raise DatasetError(f"a compact file needs {FINAL_OBSERVATIONS!r} and 'observations'")
    observations, finals = arrays["observations"], np.asarray(file[FINAL_OBSERVATIONS])
    flags = [np.asarray(arrays.get(key, [])) for key in FLAG_KEYS]
    if observations.ndim == 0 or any(flag.shape[:1] != observations.shape[:1] for flag in flags):
        raise DatasetError(
            "a compact file needs one 'terminals' and 'timeouts' row per observation"
        )
    ends = np.flatnonzero(flags[0].astype(bool) | flags[1].astype(bool))
    if finals.shape != (len(ends), *observations.shape[1:]):
        raise DatasetError(f"{FINAL_OBSERVATIONS!r} needs one row per episode end")
    next_observations = np.empty_like(observations)
    next_observations[:-1] = observations[1:]
    next_observations[ends] = finals
    return next_observations


def read_task(path: str | Path) -> str:
    """The env id a dataset file names (its `env_id` attribute, "unknown" without one), read
    without loading its arrays.

    Raises:
        DatasetError: the file is missing or not readable HDF5.
    """
    import h5py  # here, not at the top: a command's --help needs no h5py (nor the [train] extra)

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    try:
        with h5py.File(path, "r") as file:
            attrs = (
                {"env_id": _decode_attr(file.attrs["env_id"], "env_id")}
                if ("env_id" in file.attrs)
                else {}
            )
    except DatasetError:
        raise
    except READ_ERRORS as error:
        raise DatasetError(f"not a readable HDF5 file: {path} ({error})") from error
    _check_task(attrs)
    return str(attrs.get("env_id", "unknown"))


def concatenate_episodes(episodes: Sequence[Episode]) -> dict[str, np.ndarray]:
    """Flatten episodes back into DSRL arrays (float32 data, bool flags)."""
    if not episodes:
        raise DatasetError("cannot write a dataset with no episodes")
    return {
        key: np.concatenate([getattr(episode, key) for episode in episodes]).astype(
            bool if key in FLAG_KEYS else np.float32
        )
        for key in REQUIRED_KEYS
    }


def _check_compactable(episodes: Sequence[Episode]) -> None:
    """The compact layout keeps only each episode's last next_observation: refuse episodes whose
    other ones are not the next row's observations (they would be lost)."""
    for number, episode in enumerate(episodes):
        differs = np.flatnonzero(
            np.any(episode.next_observations[:-1] != episode.observations[1:], axis=1)
        )
        if differs.size:
            raise DatasetError(
                f"episode {number} has a next_observation at step {int(differs[0])} that is not "
                "the next step's observation, which the compact layout cannot keep: "
                "write the full layout (cdt dataset expand)"
            )


def save_dataset(
    path: str | Path, episodes: Sequence[Episode], attrs: dict[str, Any], compact: bool = False
) -> Path:
    """Write episodes as a compressed DSRL HDF5 file, atomically (temp file, then rename);
    `compact` writes the compact layout (module docstring). The bytes depend only on the
    episodes and attributes, so the same data always gives the same file."""
    import h5py  # here, not at the top: a command's --help needs no h5py (nor the [train] extra)

    arrays = concatenate_episodes(episodes)
    attrs = {key: value for key, value in attrs.items() if key != "layout"}
    if compact:
        _check_compactable(episodes)
        finals = np.stack([episode.next_observations[-1] for episode in episodes])
        arrays = {key: value for key, value in arrays.items() if key != "next_observations"}
        arrays[FINAL_OBSERVATIONS] = finals.astype(np.float32)
        attrs["layout"] = COMPACT_LAYOUT

    def write(temporary: Path) -> None:
        with h5py.File(temporary, "w") as file:
            for key, array in arrays.items():
                file.create_dataset(
                    key,
                    data=array,
                    compression="gzip",
                    compression_opts=9,
                    shuffle=True,
                    track_times=False,  # no timestamps: the same data gives the same bytes
                )
            for key, value in attrs.items():
                file.attrs[key] = (
                    value if isinstance(value, str | int | float) else json.dumps(value)
                )

    return write_atomic(Path(path), write)
