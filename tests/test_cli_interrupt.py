"""Ctrl-C in any `cdt` command: one line and exit code 130, never a KeyboardInterrupt traceback;
a command that answers it itself (`cdt train`, `pipeline`, `report`) keeps its own line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import cdt_cli


def _fake(monkeypatch: pytest.MonkeyPatch, name: str, main: Any) -> None:
    """`cdt NAME` runs `main` (a test double in place of the command's module)."""
    module = type(sys)("fake_command")
    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_command", module)
    monkeypatch.setitem(cdt_cli.SUBCOMMANDS, name, ("fake_command", "a test double"))


def _interrupted(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(argv)
    assert exit_info.value.code == 130
    return capsys.readouterr().err


def _ctrl_c(*args: Any, **kwargs: Any) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("fake", "interrupted; nothing was written"),
        ("collect", "interrupted; the epochs collected so far are kept in its run folder: run"),
        ("calibrate", "interrupted; the rows measured so far are kept in the card: run the same"),
        ("serve", "stopped"),
    ],
)
def test_ctrl_c_is_one_line_saying_what_the_command_leaves(
    name: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake(monkeypatch, name, _ctrl_c)
    err = _interrupted([name], capsys)
    assert err.startswith(f"cdt {name}: {said}") and err.count("\n") == 1


def test_a_command_that_answers_ctrl_c_itself_keeps_its_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def own(argv: list[str]) -> None:
        print("interrupted at step 7; continue with: cdt train --resume last.pt", file=sys.stderr)
        raise SystemExit(130)

    _fake(monkeypatch, "fake", own)
    err = _interrupted(["fake"], capsys)
    assert err == "interrupted at step 7; continue with: cdt train --resume last.pt\n"


def test_ctrl_c_in_cdt_export_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from training import export as export_module

    checkpoint = tmp_path / "last.pt"
    checkpoint.write_bytes(b"a checkpoint")  # never read: the export stops first
    monkeypatch.setattr(export_module, "export_checkpoint", _ctrl_c)
    err = _interrupted(["export", str(checkpoint), "--out", str(tmp_path / "model")], capsys)
    assert err == "cdt export: interrupted; nothing was written\n"
    assert not (tmp_path / "model").exists()


def test_ctrl_c_in_cdt_evaluate_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.service.toy_policy import write_test_policy
    from training.evaluation import evaluate as evaluate_module

    model = write_test_policy(tmp_path / "model", observation_dim=7, action_dim=2)
    monkeypatch.setattr(evaluate_module, "evaluate_policy_dir", _ctrl_c)
    err = _interrupted(["evaluate", str(model), "--out", str(tmp_path / "out")], capsys)
    assert err == "cdt evaluate: interrupted; nothing was written\n"
    assert not (tmp_path / "out").exists()
