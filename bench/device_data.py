"""Shrink datasets for the lent GPU machine's 64 MiB upload, and restore them there.

`pack` drops `next_observations` (about 40 % of a file; CDT training never reads it) and
recompresses; `unpack` writes the file back in the DSRL layout, with `next_observations` rebuilt
from the following observation of the same episode (an episode's last one repeats its own). Do not
train the Q-learning baselines, which read it, on an unpacked file.

    python bench/device_data.py pack datasets/SafetyAntRun-v0.hdf5 ... --out .device-data
    python bench/device_data.py unpack .device-data --out datasets      # on the GPU machine
"""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

DROPPED = "next_observations"


def _copy(source: h5py.File, target: h5py.File, arrays: dict[str, np.ndarray]) -> None:
    for key, value in source.attrs.items():
        target.attrs[key] = value
    for key, array in arrays.items():
        target.create_dataset(key, data=array, compression="gzip", compression_opts=9, shuffle=True)


def pack(paths: list[Path], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        with h5py.File(path, "r") as source, h5py.File(out / path.name, "w") as target:
            _copy(source, target, {key: source[key][()] for key in source if key != DROPPED})
        print(f"{path} -> {out / path.name}: {(out / path.name).stat().st_size / 2**20:.1f} MiB")


def _next_observations(observations: np.ndarray, episode_ends: np.ndarray) -> np.ndarray:
    following = np.concatenate([observations[1:], observations[-1:]])
    following[episode_ends] = observations[episode_ends]
    return following


def unpack(folder: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.glob("*.hdf5")):
        if (out / path.name).exists():
            print(f"{out / path.name} exists: kept")
            continue
        with h5py.File(path, "r") as source, h5py.File(out / path.name, "w") as target:
            arrays = {key: source[key][()] for key in source}
            ends = np.asarray(arrays["terminals"], bool) | np.asarray(arrays["timeouts"], bool)
            arrays[DROPPED] = _next_observations(arrays["observations"], ends)
            _copy(source, target, arrays)
        print(f"{path} -> {out / path.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="drop next_observations into a folder")
    packing.add_argument("datasets", nargs="+", type=Path)
    packing.add_argument("--out", type=Path, required=True)
    unpacking = commands.add_parser("unpack", help="restore the DSRL layout")
    unpacking.add_argument("folder", type=Path)
    unpacking.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "pack":
        pack(args.datasets, args.out)
    else:
        unpack(args.folder, args.out)


if __name__ == "__main__":
    main()
