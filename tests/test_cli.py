"""The `cdt` dispatcher: help, unknown commands, and lazy imports."""

import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cdt_cli
from training.export_cli import main as export_main


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


LIGHT_COMMANDS = (
    "service.cli",
    "clients.rollout",
    "training.evaluation.evaluate",
    "training.evaluation.calibrate",
    "training.train_cli",
)
IMPORT_EACH = """
import importlib, json, sys
import cdt_cli
for module in {modules!r}:
    importlib.import_module(module)
    print(json.dumps([module, sorted({{"torch", "h5py"}} & set(sys.modules))]))
"""


def test_cli_commands_that_need_no_torch_or_h5py_import_neither() -> None:
    """`cdt serve` and `cdt rollout` (the serving side must not need torch), and the parsers of
    evaluate, calibrate and train. One process for all: the first module that loads one is
    named."""
    code = IMPORT_EACH.format(modules=LIGHT_COMMANDS)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = [json.loads(line) for line in result.stdout.splitlines()]
    assert [module for module, _ in loaded] == list(LIGHT_COMMANDS)
    assert next(((module, heavy) for module, heavy in loaded if heavy), None) is None


def test_cli_train_routes_baselines_to_their_trainer() -> None:
    assert cdt_cli._baseline_algo(["--dataset", "x.hdf5", "--algo", "bc-safe"])
    assert cdt_cli._baseline_algo(["--algo=bcq-lag"])
    assert not cdt_cli._baseline_algo(["--algo", "cdt"])
    assert not cdt_cli._baseline_algo([])


def test_cli_train_help_names_the_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cdt_cli.main(["train", "--help"])
    out = capsys.readouterr().out
    assert "bc-safe" in out and "coptidice" in out


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
    tmp_path: Path, module: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main([arg.format(tmp=tmp_path) for arg in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A tmp folder of good and broken inputs: a model, a corrupt card, a corrupt graph, a run
    with a corrupt checkpoint, a dataset, and a plain file to put outputs under."""
    from tests.service.toy_policy import write_test_policy
    from tests.training.cdt_synthetic import write_dataset

    model = write_test_policy(tmp_path / "model", observation_dim=7, action_dim=2)
    card = model / "model.json"
    card.write_text(card.read_text().replace("SafetyToyRun-v0", "SafetyBallRun-v0"))
    for broken, name, junk in (
        ("bad-card", "model.json", "{not json"),
        ("bad-onnx", "model.onnx", "junk"),
    ):
        shutil.copytree(model, tmp_path / broken)
        (tmp_path / broken / name).write_text(junk)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "step_0000001.pt").write_text("not a checkpoint")
    write_dataset(tmp_path / "data.hdf5")
    (tmp_path / "file.txt").write_text("a file, not a folder")
    return tmp_path


USER_ERRORS = [
    (["evaluate", "{tmp}/bad-card"], "not a valid model card"),
    (["evaluate", "{tmp}/bad-onnx"], "model.onnx"),
    (["calibrate", "{tmp}/bad-card"], "not a valid model card"),
    (["calibrate", "{tmp}/bad-onnx"], "model.onnx"),
    (["sweeps", "{tmp}/bad-card"], "not a valid model card"),
    (["sweeps", "{tmp}/bad-onnx"], "model.onnx"),
    (["card-update", "{tmp}/bad-card", "--dataset", "{tmp}/data.hdf5"], "not a valid model card"),
    (["card-update", "{tmp}/nope", "--dataset", "{tmp}/data.hdf5"], "No such file"),
    (["card-update", "{tmp}/model", "--dataset", "{tmp}/nope.hdf5"], "no such file"),
    (["card-update", "{tmp}/model", "--dataset", "{tmp}/file.txt"], "not a readable HDF5"),
    (
        ["card-update", "{tmp}/model", "--dataset", "{tmp}/data.hdf5", "--thresholds", "-1"],
        "must be",
    ),
    (["evaluate", "{tmp}/model", "--task", "Nope-v0"], "no simulator task 'Nope-v0'"),
    (["evaluate", "{tmp}/model", "--task", "SafetyCarRun-v0"], "pass --force"),
    (["evaluate", "{tmp}/model", "--out", "{tmp}/file.txt/out"], "is a file, not a folder"),
    (["evaluate", "/nope"], "/nope has no model.json"),
    (["evaluate", "{tmp}/model", "--target-reward", "-1e9", "--target-cost", "nan"], "finite"),
    (["sweeps", "{tmp}/model", "--costs", "5,x"], "expected numbers"),
    (["sweeps", "{tmp}/model", "--change-step", "500"], "past the episode's end"),
    (["select", "/nope"], "/nope is not a folder"),
    (["select", "{tmp}/run"], "not a readable checkpoint"),
    (["select", "{tmp}/run", "--max-share-over", "2"], "must lie in [0, 1]"),
    (["calibrate", "{tmp}/model", "--budgets", "-5"], "must be a positive number, got -5"),
    (["calibrate", "{tmp}/model", "--max-share-over", "2"], "must lie in [0, 1], got 2"),
    (["report", "--algorithms", "foo", "--datasets", "{tmp}/data.hdf5"], "no algorithm 'foo'"),
    (["report", "--seeds", "0", "--datasets", "{tmp}/data.hdf5"], "--seeds must be at least 1"),
    (["report", "--datasets", "{tmp}/data.hdf5", "--out", "{tmp}/file.txt"], "is a file"),
    (["collect", "--num-envs", "0", "--out", "{tmp}/c.hdf5"], "--num-envs must be at least 1"),
    (["collect", "--gamma", "nan", "--out", "{tmp}/c.hdf5"], "--gamma must lie in (0, 1]"),
    (["collect", "--steps-per-epoch", "-1", "--out", "{tmp}/c.hdf5"], "--steps-per-epoch"),
    (["collect", "--task", "Nope-v0", "--out", "{tmp}/c.hdf5"], "no simulator task"),
    (["collect", "--out", "{tmp}/data.hdf5"], "exists already"),
    (["collect", "--out", "{tmp}/file.txt/c.hdf5"], "is a file, not a folder"),
    (
        [
            "dataset",
            "add-outliers",
            "{tmp}/data.hdf5",
            "--out",
            "{tmp}/o.hdf5",
            "--fraction",
            "0.1",
            "--reward-scale",
            "nan",
        ],
        "must be a finite number, got nan",
    ),
    (["dataset", "reduce", "{tmp}/data.hdf5", "--out", "{tmp}/data.hdf5"], "is the input file"),
    (["dataset", "filter", "{tmp}/data.hdf5", "--out", "{tmp}/file.txt"], "exists already"),
    (["dataset", "inspect", "{tmp}/data.hdf5", "--json", "{tmp}/file.txt/s.json"], "is a file"),
    (["train", "--dataset", "{tmp}/data.hdf5", "--update-steps", "0"], "--update-steps must be"),
    (["train", "--dataset", "{tmp}/data.hdf5", "--learning-rate", "nan"], "must be finite"),
    (["train", "--dataset", "{tmp}/data.hdf5", "--eval-every", "-1"], "--eval-every must be"),
    (["train", "--dataset", "{tmp}/data.hdf5", "--num-threads", "0"], "--num-threads must be"),
    (["export", "{tmp}/nope.pt", "--out", "{tmp}/m"], "no such checkpoint"),
    (["export", "{tmp}/run/step_0000001.pt", "--out", "{tmp}/model"], "pass --force"),
    (["pipeline", "--update-steps", "0"], "--update-steps must be at least 1, got 0"),
    (["pipeline", "--dataset", "{tmp}/file.txt"], "not a readable HDF5 file"),
    (["pipeline", "--tsk", "X"], "Unrecognized options: --tsk, X (perhaps you meant --task"),
    (["train", "--preset", "nope"], "invalid choice 'nope' for argument '--preset'"),
    (["train", "--algo", "bc-safe", "--batch-size", "x"], "Error parsing --batch-size"),
    (["export"], "Missing from cdt export: PATH, --out PATH"),
    (["collect", "--task"], "Missing value for argument '--task'"),
    (["report", "--bogus"], "Unrecognized options: --bogus"),
    (["rollout", "--model", "toy", "--seed", "-1"], "must be at least 0, got -1"),
    (["rollout", "--model", "toy", "--json", "{tmp}/file.txt/r.json"], "--json"),
    (["rollout", "--model", "toy", "--json", "{tmp}/file.txt"], "exists already"),
]


def _files(root: Path) -> dict[str, int]:
    return {str(path): path.stat().st_mtime_ns for path in sorted(root.rglob("*"))}


@pytest.mark.parametrize(("argv", "message"), USER_ERRORS, ids=lambda value: str(value)[:60])
def test_cli_user_errors_are_one_line_exit_2_and_write_nothing(
    inputs: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(inputs)  # any default output (runs/, models/, reports/) lands here
    before = _files(inputs)
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main([arg.format(tmp=inputs) for arg in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith(f"cdt {argv[0]}") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err
    assert _files(inputs) == before  # nothing written, nothing half-written


def test_cli_sweeps_without_matplotlib_says_so_before_any_episode(
    inputs: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(inputs)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after the README's main install
    before = _files(inputs)
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(["sweeps", str(inputs / "model")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("cdt sweeps: needs matplotlib, from the [train]")
    assert _files(inputs) == before


BLOCKED = ("torch", "h5py", "tyro", "onnx", "onnxscript", "matplotlib", "tensorboard")
HELP_WITHOUT_TRAIN_EXTRA = """
import contextlib, io, json, sys, traceback
sys.modules.update(dict.fromkeys({blocked}))
import cdt_cli
answers = {{}}
for command in cdt_cli.SUBCOMMANDS:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cdt_cli.main([command, "--help"])
            code = 0
        except SystemExit as stopped:
            code = stopped.code
        except BaseException:
            traceback.print_exc()
            code = "traceback"
    answers[command] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(answers))
"""


def test_cli_every_help_answers_without_the_train_extra() -> None:
    """After the README's main install (no torch, h5py, tyro, onnx, matplotlib): help text, or
    one line naming the extra to install; never a traceback."""
    code = HELP_WITHOUT_TRAIN_EXTRA.format(blocked=BLOCKED)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    answers = json.loads(result.stdout)
    assert set(answers) == set(cdt_cli.SUBCOMMANDS)
    for command, (exit_code, out, err) in answers.items():
        assert "Traceback" not in out + err, (command, err)
        if exit_code in (0, None):
            assert "usage" in out.lower(), command
        else:
            assert exit_code == 2 and err.count("\n") == 1, (command, err)
            assert err.startswith(f"cdt {command}: needs ") and "pip install -e '.[train]'" in err
    # their parsers need none of the [train] extra (tyro's commands do)
    for served in ("serve", "rollout", "evaluate", "calibrate", "dataset", "select", "sweeps"):
        assert answers[served][0] in (0, None), served


HEAVY = ("torch", "onnx", "h5py", "matplotlib", "pybullet", "gymnasium")
PARSE_ONLY = """
import contextlib, io, json, sys
import cdt_cli
loaded = {{}}
for argv in {argvs}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cdt_cli.main(argv)
        except SystemExit:
            pass
    loaded[" ".join(argv)] = sorted(set({heavy}) & set(sys.modules))
print(json.dumps(loaded))
"""


def test_cli_help_and_a_bad_option_import_no_heavy_module() -> None:
    """`--help` and a mistake answer in well under a second (issue 31): torch, onnx, h5py,
    matplotlib and the simulator load only once a command runs. One process for every command:
    the first that loads one is named."""
    argvs = [[name, flag] for name in cdt_cli.SUBCOMMANDS for flag in ("--help", "--no-such-flag")]
    argvs.append(["train", "--algo", "bc-safe", "--help"])
    code = PARSE_ONLY.format(argvs=argvs, heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = json.loads(result.stdout)
    assert len(loaded) == len(argvs)
    assert next(((argv, modules) for argv, modules in loaded.items() if modules), None) is None


def test_cli_a_missing_extra_is_named_and_our_own_bugs_keep_their_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(argv: list[str]) -> None:
        raise ModuleNotFoundError("No module named 'httpx'", name="httpx")

    def buggy(argv: list[str]) -> None:
        raise KeyError("ours")

    fake = type(sys)("fake_command")
    monkeypatch.setitem(sys.modules, "fake_command", fake)
    monkeypatch.setitem(cdt_cli.SUBCOMMANDS, "fake", ("fake_command", "a test double"))
    fake.main = missing  # type: ignore[attr-defined]
    with pytest.raises(SystemExit) as exit_info:
        cdt_cli.main(["fake"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "cdt fake: needs httpx, from the [client] extra: pip install -e '.[client]'\n"
    )
    fake.main = buggy  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        cdt_cli.main(["fake"])
