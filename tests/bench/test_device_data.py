"""Packing a dataset for the GPU machine's upload and restoring it there."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from bench.device_data import pack, unpack
from tests.training.cdt_synthetic import write_dataset
from training.data.dataset import load_dataset


def test_pack_drops_next_observations_and_unpack_restores_a_loadable_file(tmp_path: Path) -> None:
    original = write_dataset(tmp_path / "SafetyBallRun-v0.hdf5")
    pack([original], tmp_path / "packed")
    with h5py.File(tmp_path / "packed" / original.name, "r") as packed:
        assert "next_observations" not in packed
        assert packed.attrs["env_id"] == "SafetyBallRun-v0"

    unpack(tmp_path / "packed", tmp_path / "restored")
    restored = load_dataset(tmp_path / "restored" / original.name)
    expected = load_dataset(original)
    assert restored.attrs == expected.attrs
    assert len(restored.episodes) == len(expected.episodes)
    for got, want in zip(restored.episodes, expected.episodes, strict=True):
        for key in ("observations", "actions", "rewards", "costs", "terminals", "timeouts"):
            np.testing.assert_array_equal(getattr(got, key), getattr(want, key))
        # Within an episode the next observation is the following one; the last repeats itself.
        np.testing.assert_array_equal(got.next_observations[:-1], want.next_observations[:-1])
        np.testing.assert_array_equal(got.next_observations[-1], got.observations[-1])


def test_unpack_keeps_a_file_already_there(tmp_path: Path) -> None:
    original = write_dataset(tmp_path / "data" / "SafetyBallRun-v0.hdf5")
    pack([original], tmp_path / "packed")
    before = original.read_bytes()
    unpack(tmp_path / "packed", tmp_path / "data")
    assert original.read_bytes() == before
