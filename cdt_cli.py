"""The `cdt` command: one entry point, one subcommand per job.

Subcommands are imported lazily so that `cdt serve` and `cdt rollout` work in an install without
torch (the `[serve]` and `[client]` extras); a command whose extra is missing says which to
install. Every command reports a user's mistake as one line with exit code 2
(`runtime.user_errors`); a traceback means a bug of ours. Ctrl-C (and SIGTERM where a command
turns it into one) is one line and exit code 130: the command's own, where it says how to
continue (`cdt train`, `cdt pipeline`, `cdt report`), else what the command leaves behind.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import version

from runtime.user_errors import install_hint, missing_extra, stop, user_error_types

# subcommand -> (module with `main(argv)`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "collect": ("training.collect.cli", "collect an offline dataset with PPO-Lagrangian (PID)"),
    "dataset": ("training.data.cli", "inspect, reduce or add outliers to a dataset"),
    "train": ("training.train_cli", "train CDT or a baseline on a dataset"),
    "select": (
        "training.evaluation.select_cli",
        "choose best.pt among a run's kept checkpoints (simulator)",
    ),
    "export": ("training.export_cli", "export a checkpoint to models/NAME/ (ONNX + model card)"),
    "calibrate": (
        "training.evaluation.calibrate",
        "calibrate an exported policy's mean action per budget (simulator)",
    ),
    "guidance": (
        "training.evaluation.guidance",
        "choose an exported policy's cost-token guidance (simulator)",
    ),
    "guard": ("training.guard_cli", "show or set a model card's own budget guard"),
    "critic": ("training.critic_cli", "train a model's cost critic, the budget guard's shield"),
    "shield": (
        "training.evaluation.shield",
        "choose the budget guard's shield on the selection seeds",
    ),
    "cut-ready": (
        "training.evaluation.cut_ready",
        "choose whether the budget guard keeps episodes ready for a budget cut",
    ),
    "evaluate": ("training.evaluation.evaluate", "evaluate an exported policy in the simulator"),
    "sweeps": (
        "training.evaluation.sweeps",
        "zero-shot / conflicting-target sweeps and the budget change",
    ),
    "card-update": ("training.card_update", "re-derive a model card's default targets"),
    "report": (
        "training.report.cli",
        "run the algorithm x task grid and write paper-style tables",
    ),
    "pipeline": (
        "training.pipeline",
        "collect, train, select, export and evaluate one task (resumable)",
    ),
    "serve": ("service.cli", "serve the model repository over REST and websocket"),
    "rollout": ("clients.rollout", "drive a simulator through a running service"),
}


def _usage() -> str:
    lines = ["usage: cdt <command> [options]", "", "commands:"]
    lines += [f"  {name:<12} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run `cdt <command> --help` for the options of one command; `cdt --version`."]
    return "\n".join(lines)


def _is_baseline(args: list[str]) -> bool:
    """`_baseline_algo`, False where this install has no training/ (`cdt train` says so)."""
    try:
        return _baseline_algo(args)
    except ModuleNotFoundError:
        return False


def _baseline_algo(args: list[str]) -> bool:
    """True when `cdt train --algo NAME` names one of the paper's baselines (not CDT/DT)."""
    # Deferred on purpose: the serving image ships no training/ (and `cdt serve` never asks).
    from training.baselines import ALGORITHMS

    for index, arg in enumerate(args):
        if arg == "--algo" and index + 1 < len(args):
            return args[index + 1] in ALGORITHMS
        if arg.startswith("--algo="):
            return arg.split("=", 1)[1] in ALGORITHMS
    return False


# Errors of library modules that mean the user's input is wrong (every other one is a UserError),
# by name: looked up only once their module is loaded, so that naming them here imports nothing
# (torch, onnxruntime) a command does not need.
USER_ERROR_TYPES = (
    "runtime.policy.PolicyLoadError",
    "training.checkpoint.CheckpointError",
    "training.learn.config.ConfigError",
)
OUR_PACKAGES = ("training", "runtime", "service", "clients")


INTERRUPTED_EXIT = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""
NOTHING_WRITTEN = "interrupted; nothing was written"
KEPT_WHEN_INTERRUPTED = {
    "collect": "the epochs collected so far are kept in its run folder",
    "calibrate": "the rows measured so far are kept in the card",
    "select": "the checkpoints scored so far are kept in the run's selection.json",
}
"""Commands whose finished work outlives an interruption (the same command run again goes on
from it), with what they keep; every other command writes its results only once it is done."""


def interrupted_message(name: str) -> str:
    """The line `cdt NAME` answers Ctrl-C with, where the command has none of its own."""
    if name in KEPT_WHEN_INTERRUPTED:
        return f"interrupted; {KEPT_WHEN_INTERRUPTED[name]}: run the same command again to go on"
    if name == "serve":
        return "stopped"
    if name in {"train", "pipeline", "report"}:  # they keep their checkpoints and say so
        return "interrupted"
    return NOTHING_WRITTEN


def _run(name: str, module_name: str, args: list[str]) -> None:
    """Import the command's module and run it: a user's mistake or a missing extra is one line
    and exit code 2 (`runtime.user_errors`), an interruption one line and exit code 130;
    anything else is our bug and keeps its traceback."""
    prog = f"cdt {name}"
    try:
        importlib.import_module(module_name).main(args)
    except KeyboardInterrupt:  # a command that answers it itself exits 130 instead
        sys.stderr.write(f"{prog}: {interrupted_message(name)}\n")
        raise SystemExit(INTERRUPTED_EXIT) from None
    except ModuleNotFoundError as error:
        extra, package = missing_extra(error), (error.name or "").split(".")[0]
        if extra is not None:
            stop(prog, install_hint(error.name or package, extra))
        if package in OUR_PACKAGES:
            stop(prog, f"this install has no {package}/ package (the serving image ships none)")
        raise
    except Exception as error:
        if isinstance(error, user_error_types(*USER_ERROR_TYPES)):
            stop(prog, error)
        raise


def main(argv: list[str] | None = None) -> None:
    """Dispatch `cdt <command> ...` to the command's module."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())  # noqa: T201
        return
    if args[0] == "--version":
        print(f"cdt {version('cdt-safe-rl')}")  # noqa: T201
        return
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"cdt: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2)
    module_name, _ = SUBCOMMANDS[name]
    if name == "train" and _is_baseline(rest):
        module_name = "training.baselines.cli"
    _run(name, module_name, rest)


if __name__ == "__main__":
    main()
