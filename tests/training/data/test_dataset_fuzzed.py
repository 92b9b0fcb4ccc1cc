"""The dataset-input defects bench/fuzz_datasets.py found: each file is refused in one line (or
loads), never a traceback or silently wrong data."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import cdt_cli
from tests.training.data.synthetic_dsrl import make_episode, raw_arrays, write_raw
from training.data.dataset import DatasetError, load_dataset, read_task, save_dataset


def _with_attrs(path, **attrs):
    with h5py.File(path, "a") as file:
        for key, value in attrs.items():
            file.attrs[key] = value
    return path


def test_a_flipped_byte_anywhere_in_a_small_file_loads_or_is_refused_in_one_line(tmp_path):
    """Bit flips made h5py raise KeyError or RuntimeError, which escaped as tracebacks. Every
    seventh byte of the whole file (~770 files; the fuzzer, bench/fuzz_datasets.py, flips more)."""
    clean = write_raw(tmp_path / "clean.hdf5", raw_arrays()).read_bytes()
    corrupt = tmp_path / "corrupt.hdf5"
    for offset in range(0, len(clean), 7):
        data = bytearray(clean)
        data[offset] ^= 0xFF
        corrupt.write_bytes(bytes(data))
        for read in (load_dataset, read_task):
            try:
                read(corrupt)
            except DatasetError as error:
                assert "\n" not in str(error)


@pytest.mark.parametrize("key", ["env_id", "note"])
def test_an_attribute_that_is_not_utf8_is_refused_by_name(tmp_path, key):
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), **{key: np.bytes_(b"\xc3(")})
    with pytest.raises(DatasetError, match=f"attribute '{key}' holds bytes that are not UTF-8"):
        load_dataset(path)
    if key == "env_id":
        with pytest.raises(DatasetError, match="not UTF-8"):
            read_task(path)


def test_cdt_dataset_answers_a_non_utf8_attribute_in_one_line(tmp_path, capsys):
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), note=np.bytes_(b"\xff"))
    with pytest.raises(SystemExit) as stopped:
        cdt_cli.main(["dataset", "inspect", str(path)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cdt dataset inspect: attribute 'note'")


def test_an_array_of_bytes_attribute_loads_as_text_and_saves_again(tmp_path):
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), tags=np.array([b"a", b"b"]))
    dataset = load_dataset(path)
    assert dataset.attrs["tags"] == ["a", "b"]
    again = save_dataset(tmp_path / "again.hdf5", dataset.episodes, dataset.attrs)
    assert load_dataset(again).attrs["tags"] == ["a", "b"]


@pytest.mark.parametrize(
    "env_id",
    ["../../../tmp/escape", "", "line\nbreak", "x" * 300, 7, np.array([b"SafetyCarRun-v0"])],
)
def test_an_env_id_that_names_no_env_is_refused(tmp_path, env_id):
    """The task names the run folder: `../../x` made `cdt train` write outside --out-dir."""
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), env_id=env_id)
    with pytest.raises(DatasetError, match="attribute 'env_id' must name an env"):
        load_dataset(path)
    with pytest.raises(DatasetError, match="attribute 'env_id' must name an env"):
        read_task(path)


@pytest.mark.parametrize("env_id", ["SafetyCarRun-v0", "ns/Some_Env:v2-v10", b"SafetyCarRun-v0"])
def test_gymnasium_env_ids_are_accepted(tmp_path, env_id):
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), env_id=env_id)
    expected = env_id.decode() if isinstance(env_id, bytes) else env_id
    assert load_dataset(path).task == read_task(path) == expected


def test_float64_values_beyond_float32_are_refused_not_loaded_as_inf(tmp_path):
    arrays = raw_arrays()
    arrays["observations"] = arrays["observations"].astype(np.float64)
    arrays["observations"][2, 1] = 1e300
    with pytest.raises(DatasetError, match="too large for float32 in 'observations' at row 2"):
        load_dataset(write_raw(tmp_path / "d.hdf5", arrays))


@pytest.mark.parametrize("key", ["rewards", "costs"])
def test_returns_that_overflow_float32_are_refused(tmp_path, key):
    """3e38 per step is finite, but the episode's return was inf and `cdt dataset` crashed."""
    arrays = raw_arrays()
    arrays[key][:] = 3e38
    with pytest.raises(DatasetError, match=f"'{key}' too large: their returns overflow float32"):
        load_dataset(write_raw(tmp_path / "d.hdf5", arrays))


def test_negative_costs_are_refused(tmp_path):
    arrays = raw_arrays()
    arrays["costs"][4] = -1.0
    with pytest.raises(DatasetError, match=r"negative cost in 'costs' at row 4 \(costs must be"):
        load_dataset(write_raw(tmp_path / "d.hdf5", arrays))


def test_a_compact_file_with_more_flags_than_observations_is_refused(tmp_path):
    arrays = raw_arrays()
    arrays["final_observations"] = np.zeros((3, arrays["observations"].shape[1]), np.float32)
    del arrays["next_observations"]
    arrays["terminals"] = np.concatenate([arrays["terminals"], [True]])
    arrays["timeouts"] = np.concatenate([arrays["timeouts"], [False]])
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", arrays), layout="compact")
    with pytest.raises(DatasetError, match="one 'terminals' and 'timeouts' row per observation"):
        load_dataset(path)


def test_compact_refuses_next_observations_it_cannot_keep(tmp_path):
    """They were dropped silently: the compact file reloaded with other next_observations."""
    episode = make_episode([1.0, 2.0, 3.0], [0.0, 0.0, 1.0])
    changed = episode.next_observations.copy()
    changed[1, 0] = 42.0
    episode = episode._replace(next_observations=changed)
    with pytest.raises(DatasetError, match="episode 0 has a next_observation at step 1"):
        save_dataset(tmp_path / "c.hdf5", [episode], {}, compact=True)
    assert not (tmp_path / "c.hdf5").exists()


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"max_episode_steps": "two hundred"}, "'max_episode_steps' must be a whole number"),
        ({"max_episode_steps": 10**12}, "'max_episode_steps' must be a whole number"),
        ({"max_episode_steps": -5}, "'max_episode_steps' must be a whole number"),
        ({"action_low": np.array([-1.0, -1.0, -1.0])}, "'action_low' must be one finite number"),
        ({"action_high": np.nan}, "'action_high' must be one finite number"),
        ({"action_low": "low"}, "'action_low' must be one finite number"),
        ({"action_low": 1.0, "action_high": 1.0}, "'action_low' must lie below 'action_high'"),
    ],
)
def test_attributes_training_reads_are_checked_on_load(tmp_path, attrs, message):
    """`cdt train` read them unchecked: int("two hundred") and a reshape raised tracebacks, a
    NaN bound gave NaN actions, and 10**12 steps asked for a 10**12-row time embedding."""
    path = _with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), **attrs)
    with pytest.raises(DatasetError, match=message):
        load_dataset(path)


def test_valid_training_attributes_load(tmp_path):
    attrs = {"max_episode_steps": 200, "action_low": -1.0, "action_high": np.array([1.0, 2.0])}
    dataset = load_dataset(_with_attrs(write_raw(tmp_path / "d.hdf5", raw_arrays()), **attrs))
    assert dataset.attrs["max_episode_steps"] == 200
    assert dataset.attrs["action_high"] == [1.0, 2.0]


def test_scalar_action_bounds_in_the_file_apply_to_every_action():
    """A scalar `action_high` made `cdt train` fail in a reshape (a traceback)."""
    from training.data.windows import action_bounds

    episodes = [make_episode([1.0, 2.0], [0.0, 0.0])]  # actions 0.5 in both dimensions
    low, high = action_bounds(episodes, {"action_low": -2.0, "action_high": 3.0})
    assert (low, high) == ([-2.0, -2.0], [3.0, 3.0])
    assert action_bounds(episodes, {}) == ([-1.0, -1.0], [1.0, 1.0])


def test_zero_column_actions_are_refused(tmp_path):
    """[N, 0] actions loaded as a dataset with no action to learn."""
    arrays = raw_arrays()
    arrays["actions"] = np.zeros((6, 0), np.float32)
    with pytest.raises(DatasetError, match="need at least one column each"):
        load_dataset(write_raw(tmp_path / "d.hdf5", arrays))
