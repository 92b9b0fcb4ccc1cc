"""The `cdt` command: one entry point, one subcommand per job.

Subcommands are imported lazily so that `cdt serve` and `cdt rollout` work in an install without
torch (the `[serve]` and `[client]` extras).
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv)`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "collect": ("training.collect.cli", "collect an offline dataset with PPO-Lagrangian (PID)"),
    "dataset": ("training.data.cli", "inspect, reduce or add outliers to a dataset"),
    "train": ("training.learn.cli", "train CDT or a baseline on a dataset"),
    "select": (
        "training.evaluation.select",
        "choose best.pt among a run's kept checkpoints (simulator)",
    ),
    "export": ("training.export", "export a checkpoint to models/NAME/ (ONNX + model card)"),
    "calibrate": (
        "training.evaluation.calibrate",
        "calibrate an exported policy's mean action per budget (simulator)",
    ),
    "evaluate": ("training.evaluation.evaluate", "evaluate an exported policy in the simulator"),
    "sweeps": (
        "training.evaluation.sweeps",
        "zero-shot / conflicting-target sweeps and the budget change",
    ),
    "card-update": ("training.card_update", "re-derive a model card's default targets"),
    "report": (
        "training.evaluation.report",
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


def _baseline_algo(args: list[str]) -> bool:
    """True when `cdt train --algo NAME` names one of the paper's baselines (not CDT/DT)."""
    from training.baselines import ALGORITHMS

    for index, arg in enumerate(args):
        if arg == "--algo" and index + 1 < len(args):
            return args[index + 1] in ALGORITHMS
        if arg.startswith("--algo="):
            return arg.split("=", 1)[1] in ALGORITHMS
    return False


def main(argv: list[str] | None = None) -> None:
    """Dispatch `cdt <command> ...` to the command's module."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())  # noqa: T201
        return
    if args[0] == "--version":
        from importlib.metadata import version

        print(f"cdt {version('cdt-safe-rl')}")  # noqa: T201
        return
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"cdt: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)  # noqa: T201
        raise SystemExit(2)
    module_name, _ = SUBCOMMANDS[name]
    if name == "train" and _baseline_algo(rest):
        module_name = "training.baselines.cli"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        extra = "serve" if module_name.startswith("service") else "client"
        if module_name.startswith("training"):
            extra = "train"
        print(  # noqa: T201
            f"cdt {name}: missing dependency {error.name!r}; install with "
            f"pip install -e '.[{extra}]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from error
    module.main(rest)


if __name__ == "__main__":
    main()
