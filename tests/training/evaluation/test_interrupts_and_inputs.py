"""The evaluation commands' inputs and interruptions: seeds past a split, a card's task that no
simulator knows, and SIGTERM while worker processes run (nothing left running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cdt_cli
from runtime.evaluation_protocol import SeedRangeError, split_problems, split_seeds
from runtime.user_errors import UserError
from tests.service.toy_policy import write_test_policy
from training.evaluation import evaluate as evaluate_module

REPO = Path(__file__).resolve().parents[3]
SMALLEST_MODEL = REPO / "models" / "bc-safe-ballrun"  # 280 KB, one-step context, 100 steps


@pytest.fixture
def toy_model(tmp_path: Path) -> Path:
    """An exported policy whose card names SafetyToyRun-v0, a task no simulator has."""
    return write_test_policy(tmp_path / "model", observation_dim=7, action_dim=2)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_split_seeds_past_a_split_name_the_option_and_the_largest_allowed() -> None:
    with pytest.raises(SeedRangeError, match=r"--seeds 100000000: 1 to 500 \(the test split"):
        split_seeds("test", 20, 100_000_000)
    assert issubclass(SeedRangeError, UserError) and issubclass(SeedRangeError, ValueError)
    assert split_problems("test", 10_001, 3, ("--episodes", "--eval-seeds")) == [
        "--episodes 10001: 1 to 10,000 episodes per seed"
    ]
    # selection groups past 100 would reach the validation seeds (6,000,000 on)
    assert split_problems("selection", 1, 101)[0].startswith("--seeds 101: 1 to 100")
    assert split_seeds("selection", 1, 100)[-1] == (5_990_000,)


@pytest.mark.parametrize("command", ["evaluate", "sweeps"])
def test_seeds_past_the_test_split_are_one_line_before_any_episode(
    command: str,
    toy_model: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_episodes(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an episode ran")

    monkeypatch.setattr(evaluate_module, "run_parallel", no_episodes)
    monkeypatch.setattr("training.evaluation.sweeps.run_parallel", no_episodes)
    argv = [command, str(toy_model), "--seeds", "100000000", "--out", str(toy_model.parent / "o")]
    err = _one_line(capsys, argv)
    assert err.startswith(f"cdt {command}: --seeds 100000000: 1 to 500 (the test split owns")
    assert not (toy_model.parent / "o").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--episodes", "1", "--seeds", "1", "--workers", "1"],
        ["evaluate", "--episodes", "1", "--seeds", "2", "--workers", "2"],
        ["calibrate", "--episodes", "1"],
        ["guidance", "--episodes", "1"],
        ["cut-ready", "--episodes", "1"],
        ["sweeps", "--episodes", "1", "--seeds", "1"],
    ],
    ids=lambda argv: " ".join(argv[:1] + argv[-2:]),
)
def test_a_card_task_no_simulator_knows_is_one_line_in_every_command(
    argv: list[str], toy_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = (toy_model / "model.json").read_text()
    err = _one_line(capsys, [argv[0], str(toy_model), *argv[1:]])
    assert err.startswith(f"cdt {argv[0]}: no simulator task 'SafetyToyRun-v0'")
    assert "Known tasks: SafetyAntCircle-v0" in err
    assert (toy_model / "model.json").read_text() == card  # nothing written
    assert sorted(path.name for path in toy_model.iterdir()) == ["model.json", "model.onnx"]


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _stat(int(entry.name))[1] == pid:
            found.append(int(entry.name))
    return found


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) of a process; ("gone", 0) once it is gone. A zombie (state Z) has
    ended: only its parent's wait is missing (a container's PID 1 may never wait)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "gone", 0
    return fields[0], int(fields[1])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.skipif(not (SMALLEST_MODEL / "model.onnx").is_file(), reason="no shipped model")
def test_sigterm_ends_the_evaluation_workers_too(tmp_path: Path) -> None:
    """SIGTERM to `cdt evaluate --workers 2` (a scheduler, `docker stop`) ends its workers and
    answers one line with exit code 130, as Ctrl-C does; it orphaned them before."""
    argv = [sys.executable, "-m", "cdt_cli", "evaluate", str(SMALLEST_MODEL), "--episodes", "30"]
    argv += ["--seeds", "2", "--workers", "2", "--out", str(tmp_path / "out")]
    env = os.environ | {"CDT_LEDGER": "off"}
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while len(_children(process.pid)) < 3 and time.monotonic() < deadline:  # tracker + 2
            time.sleep(0.05)
        children = _children(process.pid)
        assert len(children) >= 3, "the workers never started"
        time.sleep(0.5)  # the workers are in their episodes (30 each: seconds of work)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err.decode()
    assert err.decode().splitlines()[-1] == "cdt evaluate: interrupted; nothing was written"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [pid for pid in children if _stat(pid)[0] not in ("gone", "Z")]
        if not alive:
            break
        time.sleep(0.1)
    assert alive == [], [Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in alive]
    assert not (tmp_path / "out").exists()
