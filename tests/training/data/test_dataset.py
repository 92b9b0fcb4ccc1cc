"""Loading, splitting, returns, saving and every bad-file case of the DSRL HDF5 loader."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from tests.training.data.synthetic_dsrl import ACT_DIM, OBS_DIM, make_episode, raw_arrays, write_raw
from training.data.dataset import (
    REQUIRED_KEYS,
    DatasetError,
    Episode,
    load_dataset,
    save_dataset,
    split_episodes,
)


def test_load_splits_at_terminals_and_timeouts_and_sums_returns(tmp_path):
    dataset = load_dataset(write_raw(tmp_path / "d.hdf5", raw_arrays()))
    assert [episode.length for episode in dataset.episodes] == [3, 3]
    np.testing.assert_array_equal(dataset.reward_returns, [6.0, 15.0])
    np.testing.assert_array_equal(dataset.cost_returns, [1.0, 3.0])
    assert dataset.transitions == 6
    assert (dataset.observation_dim, dataset.action_dim) == (OBS_DIM, ACT_DIM)
    assert dataset.episodes[1].observations[0, 0] == 9.0  # row 3 starts episode 2
    assert dataset.task == "unknown"


def test_split_drops_an_unfinished_last_episode():
    arrays = raw_arrays()
    arrays["timeouts"][-1] = False
    episodes = split_episodes(arrays)
    assert [episode.length for episode in episodes] == [3]


def test_split_accepts_dsrl_column_vectors():
    arrays = raw_arrays()
    arrays["rewards"] = arrays["rewards"][:, None]  # [N, 1], as some DSRL files store them
    arrays["terminals"] = arrays["terminals"].astype(np.float32)[:, None]
    episodes = split_episodes(arrays)
    assert episodes[0].rewards.shape == (3,)
    assert [episode.reward_return for episode in episodes] == [6.0, 15.0]


def test_save_then_load_round_trips_episodes_and_attrs(tmp_path):
    episodes = [make_episode([1.0, 2.0], [0.0, 1.0]), make_episode([3.0], [2.0], timeout=False)]
    attrs = {"env_id": "SafetyCarRun-v0", "seed": 3, "schedule": {"eps_1": 10.0}, "tags": [1, 2]}
    path = save_dataset(tmp_path / "sub" / "d.hdf5", episodes, attrs)
    loaded = load_dataset(path)
    assert loaded.attrs == attrs
    assert loaded.task == "SafetyCarRun-v0"
    for original, restored in zip(episodes, loaded.episodes, strict=True):
        for key in Episode._fields:
            np.testing.assert_array_equal(getattr(original, key), getattr(restored, key))
    assert loaded.episodes[1].terminals.tolist() == [True]
    assert [p.name for p in path.parent.iterdir()] == ["d.hdf5"]  # no temp file left


def test_compact_layout_rebuilds_next_observations_exactly_and_writes_the_same_bytes(tmp_path):
    episodes = [
        make_episode([1.0, 2.0, 0.5], [0.0, 1.0, 0.0]),
        make_episode([3.0], [2.0], timeout=False),
        make_episode([0.0, 1.0], [1.0, 1.0]),
    ]
    attrs = {"env_id": "SafetyCarRun-v0"}
    compact = save_dataset(tmp_path / "compact.hdf5", episodes, attrs, compact=True)
    with h5py.File(compact) as file:
        assert "next_observations" not in file
        assert file["final_observations"].shape == (3, OBS_DIM)
    loaded = load_dataset(compact)
    assert loaded.attrs["layout"] == "compact"
    for original, restored in zip(episodes, loaded.episodes, strict=True):
        np.testing.assert_array_equal(original.next_observations, restored.next_observations)
    full = save_dataset(tmp_path / "full.hdf5", loaded.episodes, loaded.attrs)
    again = save_dataset(tmp_path / "again.hdf5", episodes, attrs)
    assert full.read_bytes() == again.read_bytes()  # `cdt dataset expand` is deterministic
    assert "layout" not in load_dataset(full).attrs


def test_attrs_stored_as_numpy_arrays_load_as_lists_and_save_again(tmp_path):
    path = write_raw(tmp_path / "d.hdf5", raw_arrays())
    with h5py.File(path, "a") as file:
        file.attrs["limits"] = np.array([1.0, 2.0])
    dataset = load_dataset(path)
    assert dataset.attrs["limits"] == [1.0, 2.0]
    again = load_dataset(save_dataset(tmp_path / "again.hdf5", dataset.episodes, dataset.attrs))
    assert again.attrs["limits"] == [1.0, 2.0]


def test_save_failure_leaves_no_file_behind(tmp_path):
    episodes = [make_episode([1.0], [0.0])]
    with pytest.raises(TypeError):
        save_dataset(tmp_path / "d.hdf5", episodes, {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_no_episodes(tmp_path):
    with pytest.raises(DatasetError, match="no episodes"):
        save_dataset(tmp_path / "d.hdf5", [], {})


def _without(key: str) -> dict[str, np.ndarray]:
    arrays = raw_arrays()
    del arrays[key]
    return arrays


def _with(**replacements: np.ndarray) -> dict[str, np.ndarray]:
    return {**raw_arrays(), **replacements}


def _bad_value_at(key: str, row: int, value: float) -> dict[str, np.ndarray]:
    arrays = raw_arrays()
    arrays[key][row] = value
    return arrays


NO_END = np.zeros(6, dtype=bool)
BAD_FILES = {
    "missing key": (lambda: _without("costs"), "missing key 'costs'"),
    "ragged lengths": (
        lambda: _with(actions=np.zeros((5, ACT_DIM), np.float32)),
        "ragged lengths: 'actions' has 5 rows, 'rewards' has 6",
    ),
    "NaN": (
        lambda: _bad_value_at("rewards", 4, np.nan),
        r"non-finite value \(NaN or inf\) in 'rewards' at row 4",
    ),
    "inf": (
        lambda: _bad_value_at("observations", 1, np.inf),
        "non-finite value .* in 'observations' at row 1",
    ),
    "wrong dtype": (
        lambda: _with(rewards=np.arange(6, dtype=np.int64)),
        "wrong dtype: 'rewards' is int64, expected float",
    ),
    "wrong flag dtype": (
        lambda: _with(timeouts=np.array([b"x"] * 6)),
        "wrong dtype: 'timeouts'",
    ),
    "flag not 0 or 1": (
        lambda: _with(terminals=np.full(6, 2.0, np.float32)),
        "'terminals' holds values other than 0 and 1",
    ),
    "no episode end": (lambda: _with(terminals=NO_END, timeouts=NO_END), "no episode end"),
    "scalar": (lambda: _with(costs=np.float32(1.0)), "'costs' is a scalar"),
    "2-D rewards": (lambda: _with(rewards=np.ones((6, 2), np.float32)), "'rewards' must be 1-D"),
    "1-D observations": (lambda: _with(observations=np.ones(6, np.float32)), "must be 2-D"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_load_refuses_bad_files_with_one_line(tmp_path, case):
    make_arrays, message = BAD_FILES[case]
    path = write_raw(tmp_path / "bad.hdf5", make_arrays())
    with pytest.raises(DatasetError, match=message) as error:
        load_dataset(path)
    assert "\n" not in str(error.value)


def test_load_refuses_a_missing_path_a_non_hdf5_file_and_a_group(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "absent.hdf5")
    text = tmp_path / "notes.hdf5"
    text.write_text(json.dumps({"not": "hdf5"}))
    with pytest.raises(DatasetError, match="not a readable HDF5 file"):
        load_dataset(text)
    path = write_raw(tmp_path / "group.hdf5", _without("costs"))
    with h5py.File(path, "a") as file:
        file.create_group("costs")
    with pytest.raises(DatasetError, match="'costs' is an HDF5 group"):
        load_dataset(path)


def test_required_keys_are_the_dsrl_layout():
    assert set(REQUIRED_KEYS) == {
        "observations",
        "next_observations",
        "actions",
        "rewards",
        "costs",
        "terminals",
        "timeouts",
    }
