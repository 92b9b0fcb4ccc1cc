"""The model folder fuzzer (bench/fuzz_models.py): a handful of cases keep the invariants, cases
are seeded, and what it counts as a violation."""

from __future__ import annotations

import filecmp
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import bench.fuzz_models as fuzz

MODELS = Path(__file__).resolve().parents[2] / "models"
PATHS = (MODELS / "cdt-carrun-cpu", MODELS / "cdt-carcircle", MODELS / "cdt-dronecircle")


def test_a_handful_of_cases_keep_the_invariants(tmp_path: Path) -> None:
    chosen = ("card NaN/Infinity", "onnx truncated", "critic other model", "card symlink")
    indices = [fuzz.KINDS.index(kind) for kind in chosen]
    started = time.monotonic()
    cases = [fuzz.run_case(0, index, tmp_path, PATHS) for index in indices]
    assert time.monotonic() - started < 60
    assert [case.kind for case in cases] == list(chosen)
    violations = [(c.kind, r) for c in cases for r in c.results if r.outcome == "violation"]
    assert not violations, violations
    for case in cases:
        checks = {result.check for result in case.results}
        assert {"reload", "GET /v1/models", "readyz", "read_card", "Policy.load"} <= checks
        assert case.variant
    critic = {r.check: r for r in cases[2].results}
    assert critic["reload"].outcome == critic["CostCritic.load"].outcome == "refused"
    summary = fuzz.format_summary(cases, 0, PATHS[0])
    assert "critic other model" in summary and "violations: 0" in summary


def test_cases_are_seeded(tmp_path: Path) -> None:
    index = fuzz.KINDS.index("card huge/negative")
    folders = []
    for name in ("a", "b"):
        models = tmp_path / name
        models.mkdir()
        kind, folder = fuzz.prepare(index, models, PATHS[0], PATHS[1])
        variant = fuzz.corrupt(3, index, kind, folder, PATHS[2])
        folders.append((variant, folder))
    assert folders[0][0] == folders[1][0]
    assert filecmp.cmp(folders[0][1] / "model.json", folders[1][1] / "model.json", shallow=False)
    shutil.rmtree(tmp_path)


def test_a_500_a_non_finite_body_and_an_action_out_of_bounds_are_violations() -> None:
    def response(status: int, text: str) -> SimpleNamespace:
        return SimpleNamespace(status_code=status, text=text)

    assert fuzz._answer("x", response(500, '{"code": "model_error"}'))[0].outcome == "violation"
    assert fuzz._answer("x", response(200, '{"a": NaN}'))[0].outcome == "violation"
    assert fuzz._answer("x", response(422, '{"code": "x"}'))[0].outcome == "refused"
    assert fuzz._answer("x", response(200, '{"a": 1}'))[0].outcome == "ok"
    assert fuzz._action_problem([0.5, 2.0], [-1.0, -1.0], [1.0, 1.0])
    assert fuzz._action_problem([float("nan"), 0.0], [-1.0, -1.0], [1.0, 1.0])
    assert fuzz._action_problem([0.0], [-1.0, -1.0], [1.0, 1.0])
    assert fuzz._action_problem([1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]) is None


def test_a_hang_is_a_violation_of_the_check_running(tmp_path: Path, monkeypatch) -> None:
    def hang(index, seed, work, paths, sender) -> None:
        sender.send(("start", "Policy.load"))
        time.sleep(30)

    monkeypatch.setattr(fuzz, "_case_child", hang)
    case = fuzz.run_case(0, 0, tmp_path, PATHS, seconds=1.0)
    (result,) = case.results
    assert (result.check, result.outcome) == ("Policy.load", "violation")
    assert "hang" in result.detail
