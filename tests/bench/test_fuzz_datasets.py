"""The dataset fuzzer (bench/fuzz_datasets.py): one case of every corruption kind, and the
violations it must catch."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import bench.fuzz_datasets as fuzz

SOURCE = Path(__file__).resolve().parents[2] / "datasets" / "SafetyCarRun-v0.hdf5"


@pytest.fixture(scope="module")
def source() -> tuple[dict, dict]:
    return fuzz.read_slice(SOURCE, episodes=2)


def test_one_case_of_every_kind_keeps_the_invariant(source, tmp_path: Path) -> None:
    cases = [fuzz.run_case(source, 0, index, tmp_path) for index in range(len(fuzz.KINDS))]
    assert [case.kind for case in cases] == list(fuzz.KINDS)
    violations = [(c.kind, c.variant, r) for c in cases for r in c.results if r.outcome != "ok"]
    assert not [v for v in violations if v[2].outcome == "violation"], violations
    by_kind = {case.kind: case for case in cases}
    for kind in ("missing key", "not HDF5", "NaN/inf", "negative costs"):
        loader = by_kind[kind].results[0]
        assert (loader.check, loader.outcome) == ("load_dataset", "refused"), loader
    assert {r.check for r in by_kind["extra key"].results} == {
        "load_dataset",
        "read_task",
        *fuzz.DATASET_COMMANDS,
    }


def test_cases_are_seeded(source, tmp_path: Path) -> None:
    first = fuzz.make_case(source, 3, 7, tmp_path / "a.hdf5")
    again = fuzz.make_case(source, 3, 7, tmp_path / "b.hdf5")
    assert first == again
    assert (tmp_path / "a.hdf5").read_bytes() == (tmp_path / "b.hdf5").read_bytes()


def test_a_traceback_or_a_multi_line_error_is_a_violation() -> None:
    assert fuzz._one_line_refusal("cdt x", 2, "cdt x: no such file: a.hdf5\n") is None
    assert fuzz._one_line_refusal("cdt x", 2, "Traceback (most recent...)\nKeyError\n")
    assert fuzz._one_line_refusal("cdt x", "exception", "boom\n")
    assert fuzz._one_line_refusal("cdt x", 2, "cdt x: first\nsecond\n")


def _hang(path: Path, work: Path) -> list:
    time.sleep(30)
    return []


def _crash(path: Path, work: Path) -> list:
    os._exit(9)


def test_a_hang_and_a_crash_are_violations(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fuzz, "check_file", _hang)
    (hang,) = fuzz.check_isolated(tmp_path / "x.hdf5", tmp_path, seconds=0.5)
    assert hang.outcome == "violation" and hang.detail.startswith("hang")
    monkeypatch.setattr(fuzz, "check_file", _crash)
    (crash,) = fuzz.check_isolated(tmp_path / "x.hdf5", tmp_path, seconds=10)
    assert crash.outcome == "violation" and crash.detail.startswith("crashed")


def test_the_summary_counts_kinds_and_names_a_reproducer() -> None:
    bad = fuzz.Result("inspect", "violation", "traceback: KeyError")
    cases = [
        fuzz.Case(0, "missing key", "costs", [fuzz.Result("load_dataset", "refused", "x")]),
        fuzz.Case(1, "extra key", "extra", [fuzz.Result("load_dataset", "ok", ""), bad]),
    ]
    text = fuzz.format_summary(cases, 5, SOURCE, "none")
    assert "violations: 1" in text
    assert "case 1 [extra key: extra] inspect: traceback: KeyError" in text
    assert "--seed 5 --case 1 --train none" in text


def test_main_runs_a_few_cases(capsys) -> None:
    code = fuzz.main(["--cases", "3", "--train", "none", "--source", str(SOURCE)])
    out = capsys.readouterr().out
    assert code == 0 and "3 cases" in out and "violations: 0" in out
