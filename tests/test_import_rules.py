"""Which package may import which: read from the source (AST), so a wrong-way import fails here.

- training/ never imports service/ or clients/; runtime/ imports none of training/, service/,
  clients/ or torch; service/ and clients/ import neither training/ nor torch (docs: STYLE.md).
- Inside training/ imports run one way: collect, data -> learn -> export -> evaluation ->
  orchestrators (`pipeline`, `report/`, `train_cli`); baselines sit beside evaluation, on data
  and export. `MAY_IMPORT` is the rule; a new top-level module must be placed in `LAYERS`.
- The training loop imports without onnxruntime, and the `[train]` extra installs every
  third-party package that training/ and runtime/ import.

Imports inside functions count too (the AST walk sees every `import` statement).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIRST_PARTY = {"training", "runtime", "service", "clients", "tests", "bench", "cdt_cli"}

LAYERS = {
    "provenance": "common",
    "pid_lagrangian": "common",
    "ledger": "common",
    "heap": "common",  # where freed memory goes; any training process may set it
    "checkpoint": "common",  # checkpoint files: atomic writes, weights-only loading
    "interrupt": "common",  # Ctrl-C and SIGTERM as a stop at the next step, for every trainer
    "run_lock": "common",  # one process at a time per run folder (collect, train, pipeline)
    "tyro_cli": "common",  # tyro parsing with one-line mistakes, for every tyro command
    "data": "data",
    "collect": "collect",
    "learn": "learn",
    "export": "export",
    "export_cli": "export",  # `cdt export`'s arguments, parsed before the exporter loads torch
    "card_update": "export",  # writes measured results into the exported model card
    "guard_cli": "export",  # writes the budget guard into the exported model card
    "cost_critic": "export",  # the cost critic: fit on the dataset, exported beside a model
    "critic_cli": "export",  # `cdt critic`: writes the critic and its record into a model
    "baselines": "baselines",
    "evaluation": "evaluation",
    "pipeline": "orchestration",
    "pipeline_stages": "orchestration",
    "report": "orchestration",
    "train_cli": "orchestration",
}
"""Layer of each package or module directly under training/."""

MAY_IMPORT = {
    "common": {"common"},
    "data": {"common", "data"},
    "collect": {"common", "data", "collect"},
    "learn": {"common", "data", "learn"},
    "export": {"common", "data", "learn", "export"},
    "baselines": {"common", "data", "export", "baselines"},
    "evaluation": {"common", "data", "learn", "export", "evaluation"},
    "orchestration": set(LAYERS.values()),
}
"""Which layers a layer's modules may import from training/."""


def module_files(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of a first-party package."""
    root = REPO / package
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imports_of(module: str, path: Path) -> Iterator[str]:
    """Every module an `import` or `from ... import` anywhere in the file names (for `from a
    import b`, both `a` and `a.b`, since b may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def imports_from(package: str, forbidden: set[str]) -> list[str]:
    """'module -> import' for every import of a `forbidden` top-level package in `package`."""
    return [
        f"{module} -> {name}"
        for module, path in module_files(package).items()
        for name in imports_of(module, path)
        if name.split(".")[0] in forbidden
    ]


def layer(module: str) -> str:
    """The layer of a training module (`training` itself is common ground)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "common"
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: place training/{parts[1]} in LAYERS")
    return LAYERS[parts[1]]


def test_training_never_imports_the_service_or_the_clients() -> None:
    assert imports_from("training", {"service", "clients"}) == []


def test_runtime_imports_no_training_service_clients_or_torch() -> None:
    assert imports_from("runtime", {"training", "service", "clients", "torch"}) == []


@pytest.mark.parametrize("package", ["service", "clients"])
def test_service_and_clients_import_neither_training_nor_torch(package: str) -> None:
    assert imports_from(package, {"training", "torch"}) == []


def layer_violations(modules: dict[str, Path]) -> list[str]:
    """'module (layer) -> import (layer)' for every import of training/ against MAY_IMPORT."""
    return [
        f"{module} ({layer(module)}) -> {name} ({layer(name)})"
        for module, path in modules.items()
        for name in imports_of(module, path)
        if name.split(".")[0] == "training"
        and name in modules
        and layer(name) not in MAY_IMPORT[layer(module)]
    ]


def test_training_imports_run_one_way_through_its_layers() -> None:
    assert layer_violations(module_files("training")) == []


def test_every_top_level_part_of_training_has_a_layer() -> None:
    parts = {path.stem for path in (REPO / "training").glob("*.py")} - {"__init__"}
    parts |= {path.parent.name for path in (REPO / "training").glob("*/__init__.py")}
    assert parts <= set(LAYERS), parts - set(LAYERS)


def test_the_layer_rule_keeps_learn_and_data_low() -> None:
    assert not MAY_IMPORT["learn"] & {"export", "evaluation", "baselines", "orchestration"}
    assert not MAY_IMPORT["data"] & {"learn", "collect", "export", "evaluation", "baselines"}
    below_the_top = set().union(
        *(MAY_IMPORT[name] for name in MAY_IMPORT if name != "orchestration")
    )
    assert "orchestration" not in below_the_top


def test_the_layer_rule_refuses_the_old_wrong_way_imports(tmp_path: Path) -> None:
    # learn/train.py evaluating checkpoints itself, and baselines borrowing the collector's PID
    learn = tmp_path / "train.py"
    learn.write_text("from training.evaluation.checkpoint_scores import evaluate_selection\n")
    baselines = tmp_path / "lagrangian.py"
    baselines.write_text("from training.collect import ppo_lagrangian\n")
    modules = {
        "training.learn.train": learn,
        "training.baselines.lagrangian": baselines,
        "training.evaluation.checkpoint_scores": tmp_path / "unused.py",
        "training.collect.ppo_lagrangian": tmp_path / "unused.py",
    }
    (tmp_path / "unused.py").write_text("")
    assert layer_violations(modules) == [
        "training.learn.train (learn) -> training.evaluation.checkpoint_scores (evaluation)",
        "training.baselines.lagrangian (baselines) -> training.collect.ppo_lagrangian (collect)",
    ]


MAX_LINES = 450
"""Hard cap on a module's length under training/ (STYLE.md aims for 400)."""


def test_no_training_module_passes_the_hard_cap() -> None:
    long = {
        str(path.relative_to(REPO)): count
        for path in module_files("training").values()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_training_loop_data_and_collection_import_without_onnxruntime() -> None:
    # One interpreter for the three (each start imports torch): a module that needs onnxruntime
    # fails the import, and the traceback names it.
    modules = "training.learn.train, training.data.cli, training.collect.collection"
    blocked = f"import sys; sys.modules['onnxruntime'] = None; import {modules}"
    result = subprocess.run(
        [sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


def _requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0]
    for separator in "<>=!~[ ":
        name = name.split(separator)[0]
    return name.lower().replace("_", "-")


def test_train_extra_installs_what_training_and_runtime_import() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    installed = {_requirement_name(r) for r in [*project["dependencies"], *extras["train"]]}
    if "cdt-safe-rl" in installed:  # `cdt-safe-rl[sim]`: the extra pulls in another extra
        installed |= {_requirement_name(r) for r in extras["sim"]}
    distributions = packages_distributions()
    third_party = {
        name.split(".")[0]
        for package in ("training", "runtime")
        for module, path in module_files(package).items()
        for name in imports_of(module, path)
        if name and name.split(".")[0] not in FIRST_PARTY | set(sys.stdlib_module_names)
    }
    missing = {
        top: distributions.get(top)
        for top in sorted(third_party)
        if not {_requirement_name(d) for d in distributions.get(top, [])} & installed
    }
    assert missing == {}
