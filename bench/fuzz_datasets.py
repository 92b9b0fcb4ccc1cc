"""Fuzz the dataset loader and the commands that read datasets with corrupted HDF5 files.

    .venv/bin/python bench/fuzz_datasets.py --seed 0 --cases 300
    .venv/bin/python bench/fuzz_datasets.py --seed 0 --case 17 --keep /tmp/fuzz   # one case

Each case writes a seeded corruption of a small slice of `--source` (its first `--episodes`
episodes) into a temporary folder: truncated or non-HDF5 bytes, missing or extra keys, wrong
dtypes, shapes and ranks, mismatched lengths, NaN/inf, empty arrays, one-step episodes, no or
only terminals, negative costs, huge values, and bad, missing, bytes or str attributes (`env_id`,
`max_episode_steps`, `action_low`/`action_high`, `layout`). Every file goes to `load_dataset`,
`read_task` and the `cdt dataset` subcommands (in a forked child, through `cdt_cli.main`, so a
crash or a hang is caught per case), and, where the loader accepts it, to a one-step
`cdt train` (a subprocess, `--train loaded`; `--train all` sends every file, `none` skips it).

The invariant: the file loads and the command works, or the command stops with exit code 1 or 2
and one line naming the problem. A violation is a traceback, a hang, a crash, a multi-line
error, or a silent wrong result: accepted data that is not finite in float32 (values or episode
returns), an empty dimension, non-JSON figures (NaN/Infinity) from `inspect --json`, an
`expand`/`compact` output that reloads differently, or a non-finite training loss. The summary
counts cases per corruption kind and outcomes per command, and names each violation with its
reproducer. Figures only; writes nothing outside its temporary folder (and `--keep`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo
import cdt_cli
import training.data.cli  # noqa: F401  (loaded once, before the children fork)
from bench.fuzz_cases import Case, Result, violation_lines
from training.data.dataset import (
    FLAG_KEYS,
    FLOAT_KEYS,
    REQUIRED_KEYS,
    DatasetError,
    OfflineDataset,
    load_dataset,
    read_task,
)

CASE_SECONDS = 30.0
"""A case whose child runs longer is a hang (each takes well under a second)."""
TRAIN_SECONDS = 120.0
TRAIN_ARGS = (
    "--update-steps 1 --eval-every 0 --batch-size 4 --embedding-dim 8 --num-layers 1 "
    "--num-heads 1 --seq-len 2 --no-augment --no-tensorboard --num-threads 1"
).split()
DATASET_COMMANDS = ("inspect", "reduce", "filter", "add-outliers", "expand", "compact")
Arrays = dict[str, Any]
Attrs = dict[str, Any]


# ---------------------------------------------------------------- corruptions


def read_slice(source: Path, episodes: int) -> tuple[Arrays, Attrs]:
    """The first `episodes` episodes of `source` as raw arrays, and its raw attributes."""
    with h5py.File(source, "r") as file:
        ends = np.flatnonzero(np.asarray(file["terminals"]) | np.asarray(file["timeouts"]))
        rows = int(ends[min(episodes, len(ends)) - 1]) + 1
        arrays = {key: np.asarray(file[key][:rows]) for key in REQUIRED_KEYS}
        attrs = dict(file.attrs.items())
    return arrays, attrs


def write_file(path: Path, arrays: Arrays, attrs: Attrs) -> None:
    with h5py.File(path, "w") as file:
        for key, array in arrays.items():
            if array is GROUP:
                file.create_group(key)
            else:
                file.create_dataset(key, data=array)
        for key, value in attrs.items():
            file.attrs[key] = value


GROUP = object()  # an `arrays` value written as an HDF5 group


def _key(rng: np.random.Generator, keys: tuple[str, ...] = REQUIRED_KEYS) -> str:
    return str(rng.choice(keys))


def _missing_key(rng, arrays, attrs):
    key = _key(rng)
    del arrays[key]
    return key


def _extra_key(rng, arrays, attrs):
    name = str(rng.choice(["extra", "infos/x", "final_observations", "layout", "costs_2"]))
    length = len(arrays["rewards"])
    arrays[name] = [np.zeros(length), np.array(["s"] * 3, dtype="S1"), GROUP][rng.integers(3)]
    return name


def _wrong_dtype(rng, arrays, attrs):
    key, kind = _key(rng), str(rng.choice(["str", "vlen-str", "int", "complex", "bool", "f16"]))
    array = arrays[key]
    if kind == "str":
        arrays[key] = array.astype("S8")
    elif kind == "vlen-str":
        arrays[key] = np.array([str(v) for v in array.ravel()], dtype=h5py.string_dtype())
    else:
        dtype = {"int": np.int64, "complex": np.complex64, "bool": bool, "f16": np.float16}
        arrays[key] = array.astype(dtype[kind])
    return f"{key} {kind}"


def _wrong_shape(rng, arrays, attrs):
    key, kind = _key(rng), str(rng.choice(["scalar", "extra-axis", "flat", "zero-dim", "wide"]))
    array = arrays[key]
    if kind == "scalar":
        arrays[key] = array.ravel()[0]
    elif kind == "extra-axis":
        arrays[key] = array[..., None, None]
    elif kind == "flat":
        arrays[key] = array.ravel()
    elif kind == "zero-dim":
        arrays[key] = np.zeros((len(array), 0), dtype=array.dtype)
    else:
        arrays[key] = np.stack([array, array], axis=-1)
    return f"{key} {kind}"


def _mismatched_length(rng, arrays, attrs):
    key, change = _key(rng), int(rng.choice([-50, -1, 1, 7]))
    array = arrays[key]
    arrays[key] = array[:change] if change < 0 else np.concatenate([array, array[:change]])
    return f"{key} {change:+d} rows"


def _non_finite(rng, arrays, attrs):
    key, value = _key(rng), float(rng.choice([np.nan, np.inf, -np.inf]))
    array = arrays[key].astype(np.float32) if key in FLAG_KEYS else arrays[key].copy()
    row = int(rng.integers(len(array)))
    array[row] = value
    arrays[key] = array
    return f"{key}[{row}] = {value}"


def _empty(rng, arrays, attrs):
    if rng.random() < 0.5:
        for key in REQUIRED_KEYS:
            arrays[key] = arrays[key][:0]
        return "all keys"
    key = _key(rng)
    arrays[key] = arrays[key][:0]
    return key


def _short_episodes(rng, arrays, attrs):
    flags = arrays["terminals"].copy()
    kind = str(rng.choice(["every-step", "two-in-a-row", "first-row"]))
    if kind == "every-step":
        flags[:] = True
    else:
        row = int(rng.integers(1, len(flags))) if kind == "two-in-a-row" else 0
        flags[row - 1 if kind == "two-in-a-row" else row] = True
        flags[row] = True
    arrays["terminals"] = flags
    return kind


def _no_end(rng, arrays, attrs):
    if rng.random() < 0.5:
        arrays["terminals"] = np.zeros_like(arrays["terminals"])
        arrays["timeouts"] = np.zeros_like(arrays["timeouts"])
        return "no end anywhere"
    cut = int(rng.integers(1, 150))
    for key in REQUIRED_KEYS:
        arrays[key] = arrays[key][:-cut]
    return f"last {cut} rows cut"


def _all_terminals(rng, arrays, attrs):
    arrays["terminals"] = np.ones_like(arrays["terminals"])
    if rng.random() < 0.5:
        arrays["timeouts"] = np.ones_like(arrays["timeouts"])
    return "terminals all true"


def _negative_costs(rng, arrays, attrs):
    costs = arrays["costs"].copy()
    if rng.random() < 0.5:
        costs[int(rng.integers(len(costs)))] = -1.0
        arrays["costs"] = costs
        return "one cost -1"
    arrays["costs"] = -np.abs(costs) - 0.5
    return "all costs negative"


def _huge_values(rng, arrays, attrs):
    key = _key(rng, FLOAT_KEYS)
    array = arrays[key].astype(np.float64 if rng.random() < 0.5 else np.float32)
    value = 1e300 if array.dtype == np.float64 else 3e38
    array[: max(1, len(array) // int(rng.choice([1, 10])))] = value * float(rng.choice([1, -1]))
    arrays[key] = array
    return f"{key} {array.dtype} {value:g}"


BAD_ENV_IDS: list[Any] = [
    "",
    "NoSuchEnv-v0",
    "../../../../tmp/escape",
    "a/b",
    "line\nbreak",
    "x" * 5000,
    7,
    np.float64(np.nan),
    np.array([1, 2]),
    np.bytes_(b"SafetyCarRun-v0"),
    np.bytes_(b"\xff\xfe"),
    "[1, 2]",
    '{"a": 1}',
    np.array([b"SafetyCarRun-v0"]),
]


def _bad_env_id(rng, arrays, attrs):
    if rng.random() < 0.15:
        del attrs["env_id"]
        return "env_id missing"
    value = BAD_ENV_IDS[int(rng.integers(len(BAD_ENV_IDS)))]
    attrs["env_id"] = value
    return f"env_id {value!r:.40}"


def _bytes_attrs(rng, arrays, attrs):
    """Every string attribute as fixed-length bytes, or one as bytes that are not UTF-8."""
    if rng.random() < 0.5:
        for key, value in list(attrs.items()):
            if isinstance(value, str):
                attrs[key] = np.bytes_(value.encode())
        return "all str attrs as bytes"
    key = str(rng.choice(["collector", "schedule", "env_id", "note"]))
    attrs[key] = np.bytes_(b"\xc3(")
    return f"{key} not UTF-8"


BAD_OTHER_ATTRS: list[tuple[str, Any]] = [
    ("max_episode_steps", "two hundred"),
    ("max_episode_steps", -5),
    ("max_episode_steps", 10**12),
    ("max_episode_steps", 200.5),
    ("max_episode_steps", np.array([1, 2])),
    ("action_low", np.array([-1.0, -1.0, -1.0])),
    ("action_low", "low"),
    ("action_low", np.nan),
    ("action_high", np.array([np.inf, 1.0])),
    ("action_high", -2.0),
    ("layout", "compact"),
    ("layout", 3),
    ("processing", "not json ["),
    ("schedule", "{broken json"),
    ("grid_filter", "[1, 2"),
]


def _bad_attrs(rng, arrays, attrs):
    key, value = BAD_OTHER_ATTRS[int(rng.integers(len(BAD_OTHER_ATTRS)))]
    attrs[key] = value
    return f"{key} {value!r:.40}"


ArrayCorruption = Callable[[np.random.Generator, Arrays, Attrs], str]
ARRAY_KINDS: dict[str, ArrayCorruption] = {
    "missing key": _missing_key,
    "extra key": _extra_key,
    "wrong dtype": _wrong_dtype,
    "wrong shape": _wrong_shape,
    "mismatched length": _mismatched_length,
    "NaN/inf": _non_finite,
    "empty arrays": _empty,
    "short episodes": _short_episodes,
    "no end": _no_end,
    "all terminals": _all_terminals,
    "negative costs": _negative_costs,
    "huge values": _huge_values,
    "bad env_id": _bad_env_id,
    "bytes attrs": _bytes_attrs,
    "bad attrs": _bad_attrs,
}
BYTE_KINDS = ("truncated", "not HDF5", "bit flips")
KINDS = (*ARRAY_KINDS, *BYTE_KINDS, "compact layout")


def _corrupt_bytes(rng: np.random.Generator, kind: str, path: Path) -> str:
    data = bytearray(path.read_bytes())
    if kind == "truncated":
        size = int(rng.integers(0, len(data)))
        path.write_bytes(bytes(data[:size]))
        return f"{size} of {len(data)} bytes"
    if kind == "not HDF5":
        choice = int(rng.integers(4))
        texts = [b"", b'{"observations": []}', b"\x89HDF\r\n\x1a\n" + bytes(64), None]
        path.write_bytes(texts[choice] or rng.bytes(int(rng.integers(1, 5000))))
        return ["empty file", "JSON", "HDF5 signature only", "random bytes"][choice]
    flips = int(rng.integers(1, 20))
    for offset in rng.integers(0, len(data), size=flips):
        data[int(offset)] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(data))
    return f"{flips} flipped bits"


def _compact(rng: np.random.Generator, arrays: Arrays, attrs: Attrs) -> str:
    """The compact layout with one of its own corruptions."""
    ends = np.flatnonzero(arrays["terminals"] | arrays["timeouts"])
    finals = arrays.pop("next_observations")[ends]
    attrs["layout"] = "compact"
    kind = int(rng.integers(5))
    if kind == 1:
        finals = finals[:-1]
    elif kind == 2:
        arrays["terminals"] = np.concatenate([arrays["terminals"], [True] * 3])
        finals = np.concatenate([finals, finals[:3]])
    elif kind == 3:
        arrays["observations"] = arrays["observations"][:, 0]
        finals = finals[:, 0]
    elif kind == 4:
        finals = finals.copy()
        finals[0, 0] = np.nan
    arrays["final_observations"] = finals
    return ["valid", "finals one short", "extra ends", "1-D observations", "NaN final"][kind]


def make_case(source: tuple[Arrays, Attrs], seed: int, index: int, path: Path) -> tuple[str, str]:
    """Write case `index` of `seed` to `path`: (corruption kind, variant)."""
    rng = np.random.default_rng([seed, index])
    kind = KINDS[index % len(KINDS)]
    arrays = {key: value.copy() for key, value in source[0].items()}
    attrs = dict(source[1])
    if kind in ARRAY_KINDS:
        variant = ARRAY_KINDS[kind](rng, arrays, attrs)
    elif kind == "compact layout":
        variant = _compact(rng, arrays, attrs)
    else:
        variant = ""
    write_file(path, arrays, attrs)
    if kind in BYTE_KINDS:
        variant = _corrupt_bytes(rng, kind, path)
    return kind, variant


# ---------------------------------------------------------------- checks


def data_problem(dataset: OfflineDataset) -> str | None:
    """What is wrong with data the loader accepted (None: nothing)."""
    if not dataset.episodes:
        return "no episodes"
    if dataset.observation_dim < 1 or dataset.action_dim < 1:
        return f"empty dimension: obs {dataset.observation_dim}, act {dataset.action_dim}"
    for number, episode in enumerate(dataset.episodes):
        if episode.length < 1:
            return f"episode {number} is empty"
        for key, array in episode._asdict().items():
            if array.dtype != bool and not np.all(np.isfinite(array)):
                return f"non-finite {key} in episode {number}"
        if not (episode.terminals[-1] or episode.timeouts[-1]):
            return f"episode {number} does not end in a terminal or timeout"
    returns = np.concatenate([dataset.reward_returns, dataset.cost_returns])
    if not np.all(np.isfinite(returns.astype(np.float32))):
        return "non-finite episode return"
    if np.any(dataset.cost_returns < 0):
        return "negative cost return accepted"
    return None


def _strict_json(text: str) -> None:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in JSON")

    json.loads(text, parse_constant=refuse)


def _same_episodes(first: OfflineDataset, second: OfflineDataset) -> bool:
    if len(first.episodes) != len(second.episodes):
        return False
    return all(
        np.array_equal(a, b)
        for one, two in zip(first.episodes, second.episodes, strict=True)
        for a, b in zip(one, two, strict=True)
    )


def _one_line_refusal(prog: str, code: object, err: str) -> str | None:
    """None when a failed command answered as a user error should, else what was wrong."""
    lines = err.strip().splitlines()
    if code not in (1, 2):
        return f"exit code {code}"
    if "Traceback" in err:
        return "traceback"
    if not lines or not lines[-1].startswith(f"{prog}: "):
        return f"no one-line '{prog}: ...' error"
    return None


def run_command(argv: list[str]) -> tuple[object, str]:
    """`cdt ARGV` in this process: (exit code, stderr); an escaped exception is a traceback."""
    err = io.StringIO()
    code: object = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cdt_cli.main(argv)
        except SystemExit as stop:
            code = stop.code
        except BaseException:
            code = "exception"
            err.write(traceback.format_exc())
    return code, err.getvalue()


def _dataset_command(path: Path, loaded: OfflineDataset | None, name: str, work: Path) -> Result:
    out = work / f"{name}.out"
    argv = ["dataset", name, str(path), "--force"]
    argv += ["--json", str(out)] if name == "inspect" else ["--out", str(out)]
    argv += {"add-outliers": ["--fraction", "0.2"], "reduce": ["--threshold", "10"]}.get(name, [])
    code, err = run_command(argv)
    if code != 0:
        problem = _one_line_refusal(f"cdt dataset {name}", code, err)
        if problem:
            return Result(name, "violation", f"{problem}: {err.strip()[-300:]}")
        return Result(name, "refused", err.strip().splitlines()[-1])
    try:
        if name == "inspect":
            _strict_json(out.read_text())
        elif name in ("expand", "compact") and loaded is not None:
            if not _same_episodes(loaded, load_dataset(out)):
                return Result(name, "violation", "output reloads with other episodes")
    except Exception as error:
        return Result(name, "violation", f"bad output: {type(error).__name__}: {error}")
    return Result(name, "ok", "")


def check_file(path: Path, work: Path) -> list[Result]:
    """The loader, `read_task` and every `cdt dataset` subcommand on one file."""
    results, loaded = [], None
    for name, call in (("load_dataset", load_dataset), ("read_task", read_task)):
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # the loader's warnings
                value = call(path)
        except DatasetError as error:
            text = str(error)
            outcome = "violation" if "\n" in text else "refused"
            results.append(Result(name, outcome, text))
            continue
        except Exception as error:
            detail = f"traceback: {type(error).__name__}: {error}"
            results.append(Result(name, "violation", detail[:300]))
            continue
        if isinstance(value, OfflineDataset):
            loaded, problem = value, data_problem(value)
            results.append(Result(name, "violation" if problem else "ok", problem or ""))
        else:
            results.append(Result(name, "ok", ""))
    results += [_dataset_command(path, loaded, name, work) for name in DATASET_COMMANDS]
    return results


def _child(path: Path, work: Path, sender: Any) -> None:
    sender.send(check_file(path, work))


def check_isolated(path: Path, work: Path, seconds: float = CASE_SECONDS) -> list[Result]:
    """`check_file` in a forked child: a crash or a hang is one violation, not the end."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child, args=(path, work, sender))
    child.start()
    sender.close()
    if receiver.poll(seconds):
        try:
            results: list[Result] = receiver.recv()
        except EOFError:
            results = []
        child.join(seconds)
        if results:
            return results
        return [Result("child", "violation", f"crashed (exit code {child.exitcode})")]
    child.kill()
    child.join()
    return [Result("child", "violation", f"hang: no answer within {seconds:g} s")]


def check_train(path: Path, work: Path) -> Result:
    """A one-step `cdt train` on `path`, as a user runs it."""
    env = {**os.environ, "CDT_LEDGER": "off"}
    runs = work / "runs"
    command = [sys.executable, "-m", "cdt_cli", "train", "--dataset", str(path)]
    command += ["--out-dir", str(runs), *TRAIN_ARGS]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=TRAIN_SECONDS, env=env
        )
    except subprocess.TimeoutExpired:
        return Result("train", "violation", f"hang: no answer within {TRAIN_SECONDS:g} s")
    if done.returncode != 0:
        problem = _one_line_refusal("cdt train", done.returncode, done.stderr)
        if problem:
            return Result("train", "violation", f"{problem}: {done.stderr.strip()[-300:]}")
        return Result("train", "refused", done.stderr.strip().splitlines()[-1])
    for csv in runs.glob("*/train.csv"):
        header, *rows = csv.read_text().splitlines()
        columns = header.split(",")
        for row in rows:
            for column, cell in zip(columns, row.split(","), strict=False):
                if "loss" in column and cell and not math.isfinite(float(cell)):
                    return Result("train", "violation", f"{column} = {cell} in {csv.name}")
    return Result("train", "ok", "")


def run_case(
    source: tuple[Arrays, Attrs], seed: int, index: int, folder: Path, train: str = "none"
) -> Case:
    """Write case `index`, check it, and return what every command did."""
    work = folder / f"case{index}"
    work.mkdir(parents=True, exist_ok=True)
    path = work / "data.hdf5"
    kind, variant = make_case(source, seed, index, path)
    results = check_isolated(path, work)
    loaded = any(r.check == "load_dataset" and r.outcome != "refused" for r in results)
    if train == "all" or (train == "loaded" and loaded):
        results.append(check_train(path, work))
    return Case(index, kind, variant, results)


# ---------------------------------------------------------------- report


def _loader_outcomes(cases: list[Case]) -> Counter[str]:
    return Counter(r.outcome for case in cases for r in case.results if r.check == "load_dataset")


def format_summary(cases: list[Case], seed: int, source: Path, train: str) -> str:
    """Cases per corruption kind, outcomes per command, and every violation with a reproducer."""
    lines = [f"fuzz_datasets: seed {seed}, {len(cases)} cases, source {source}, train {train}", ""]
    lines.append(
        f"{'corruption kind':<20}{'cases':>6}{'loaded':>8}{'refused':>9}{'violations':>12}"
    )
    for kind in KINDS:
        chosen = [case for case in cases if case.kind == kind]
        if chosen:
            loader = _loader_outcomes(chosen)
            bad = sum(any(r.outcome == "violation" for r in case.results) for case in chosen)
            counts = f"{len(chosen):>6}{loader['ok']:>8}{loader['refused']:>9}{bad:>12}"
            lines.append(f"{kind:<20}{counts}")
    outcomes = Counter((r.check, r.outcome) for case in cases for r in case.results)
    lines += ["", f"{'command':<16}{'ok':>6}{'refused':>9}{'violation':>11}"]
    for command in dict.fromkeys(command for command, _ in outcomes):
        ok, refused = outcomes[(command, "ok")], outcomes[(command, "refused")]
        lines.append(f"{command:<16}{ok:>6}{refused:>9}{outcomes[(command, 'violation')]:>11}")
    lines += violation_lines(
        cases,
        lambda case: (
            f"python bench/fuzz_datasets.py --seed {seed} --case {case.index} "
            f"--train {train} --keep /tmp/fuzz-case"
        ),
        width=240,
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of every corruption")
    parser.add_argument("--cases", type=int, default=len(KINDS) * 10, help="cases to run")
    parser.add_argument("--case", type=int, help="run only this case (a reproducer)")
    parser.add_argument("--source", type=Path, default=Path("datasets/SafetyCarRun-v0.hdf5"))
    parser.add_argument("--episodes", type=int, default=3, help="episodes of the source slice")
    parser.add_argument("--train", choices=("loaded", "all", "none"), default="loaded")
    parser.add_argument("--keep", type=Path, help="copy each case's file into this folder")
    args = parser.parse_args(argv)
    os.environ["CDT_LEDGER"] = "off"  # the commands run here must not write reports/ledger.jsonl
    source = read_slice(args.source, args.episodes)
    indices = [args.case] if args.case is not None else list(range(args.cases))
    cases = []
    with tempfile.TemporaryDirectory(prefix="fuzz-datasets-") as folder:
        for index in indices:
            case = run_case(source, args.seed, index, Path(folder), args.train)
            cases.append(case)
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                written = Path(folder) / f"case{index}" / "data.hdf5"
                shutil.copy(written, args.keep / f"case{index}.hdf5")
    print(format_summary(cases, args.seed, args.source, args.train))
    return 1 if any(r.outcome == "violation" for c in cases for r in c.results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
