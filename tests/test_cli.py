"""The `cdt` dispatcher: help, unknown commands, and lazy imports."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import cdt_cli
from training.export import main as export_main


def test_cli_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    cdt_cli.main(["--help"])
    out = capsys.readouterr().out
    for name in cdt_cli.SUBCOMMANDS:
        assert name in out


def test_cli_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(["frobnicate"])
    assert exit_info.value.code == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_cli_version_answers(capsys: pytest.CaptureFixture[str]) -> None:
    cdt_cli.main(["--version"])
    assert capsys.readouterr().out.startswith("cdt ")


def test_cli_export_of_a_missing_checkpoint_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        export_main([str(tmp_path / "missing.pt"), "--out", str(tmp_path / "model")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "model").exists()
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_text("not a checkpoint")
    with pytest.raises(SystemExit) as exit_info:
        export_main([str(corrupt), "--out", str(tmp_path / "model")])
    assert exit_info.value.code == 2
    assert "not a readable checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(cdt_cli.SUBCOMMANDS))
def test_cli_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: a subprocess per command re-imported torch, 4 s each on a 2-core Zen 3
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main([command, "--help"])
    assert exit_info.value.code in (0, None)
    assert "usage" in capsys.readouterr().out.lower()


def test_cli_serve_does_not_import_torch() -> None:
    code = (
        "import sys, cdt_cli, importlib; importlib.import_module('service.cli'); "
        "importlib.import_module('clients.rollout'); "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@pytest.mark.parametrize(
    "module",
    ["training.evaluation.evaluate", "training.evaluation.calibrate", "training.train_cli"],
)
def test_cli_commands_that_need_no_torch_or_h5py_import_neither(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "sys.exit(1 if {'torch', 'h5py'} & set(sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def test_cli_train_routes_baselines_to_their_trainer() -> None:
    assert cdt_cli._baseline_algo(["--dataset", "x.hdf5", "--algo", "bc-safe"])
    assert cdt_cli._baseline_algo(["--algo=bcq-lag"])
    assert not cdt_cli._baseline_algo(["--algo", "cdt"])
    assert not cdt_cli._baseline_algo([])


def test_cli_train_help_names_the_baselines() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cdt_cli", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "bc-safe" in result.stdout and "coptidice" in result.stdout


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("training.evaluation.sweeps", ["{tmp}/nope"], "cdt sweeps: {tmp}/nope has no model.json"),
        ("training.collect.cli", ["--task", "SafetyNope-v0"], "cdt collect: no simulator task"),
        ("training.pipeline", ["--task", "SafetyNope-v0"], "cdt pipeline: no simulator task"),
        (
            "training.report.cli",
            ["--datasets", "{tmp}/a.hdf5", "--include-existing", "X={tmp}/m", "--out", "{tmp}"],
            "cdt report: no dataset {tmp}/a.hdf5; {tmp}/m has no model.json",
        ),
    ],
)
def test_cli_input_that_is_not_there_stops_the_command_before_any_work(
    tmp_path: Path, module: str, argv: list[str], message: str
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main([arg.format(tmp=tmp_path) for arg in argv])
    assert str(exit_info.value.code).startswith(message.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started
