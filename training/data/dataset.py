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


def _check_arrays(arrays: dict[str, np.ndarray]) -> None:
    _check_shapes(arrays)
    for key in FLOAT_KEYS:
        if not np.issubdtype(arrays[key].dtype, np.floating):
            raise DatasetError(f"wrong dtype: {key!r} is {arrays[key].dtype}, expected float")
        if not np.all(np.isfinite(arrays[key])):
            bad = int(np.argwhere(~np.isfinite(arrays[key]))[0][0])
            raise DatasetError(f"non-finite value (NaN or inf) in {key!r} at row {bad}")
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


def _decode_attr(value: Any) -> Any:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()  # plain Python, so the attrs can be written back as JSON
    return value


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
            attrs = {key: _decode_attr(value) for key, value in file.attrs.items()}
            if attrs.get("layout") == COMPACT_LAYOUT:
                arrays["next_observations"] = _next_observations(arrays, file)
    except OSError as error:
        raise DatasetError(f"not a readable HDF5 file: {path} ({error})") from error
    return OfflineDataset(episodes=split_episodes(arrays), attrs=attrs)


def _next_observations(arrays: dict[str, np.ndarray], file: h5py.File) -> np.ndarray:
    """A compact file's `next_observations`: the next row's observation within an episode, the
    stored final one at each episode's end."""
    if FINAL_OBSERVATIONS not in file or "observations" not in arrays:
        raise DatasetError(f"a compact file needs {FINAL_OBSERVATIONS!r} and 'observations'")
    observations, finals = arrays["observations"], np.asarray(file[FINAL_OBSERVATIONS])
    ends = np.flatnonzero(
        np.asarray(arrays.get("terminals", [])).astype(bool)
        | np.asarray(arrays.get("timeouts", [])).astype(bool)
    )
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
            return str(_decode_attr(file.attrs.get("env_id", "unknown")))
    except OSError as error:
        raise DatasetError(f"not a readable HDF5 file: {path} ({error})") from error


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
