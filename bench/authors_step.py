"""Seconds per CDT training step, the authors' implementation next to ours, same run, same CPU.

    python bench/authors_step.py --osrl PATH/TO/OSRL
    python bench/authors_step.py --osrl PATH/TO/OSRL --steps 2 --rounds 1   # smoke check
    python bench/authors_step.py --osrl PATH/TO/OSRL --recipe cpu-budget --threads 1
    python bench/authors_step.py --osrl PATH/TO/OSRL --recipe cpu-budget --threads 1 --compile

--osrl names a clone of https://github.com/liuzuxin/OSRL (commit 03a4586); nothing of it is
copied into this repository, the bench imports it from there. Both sides train on the same
synthetic CarRun-shaped data (bench/train_throughput.py's `synthetic_dataset`), in fp32, with the
same torch thread count, in interleaved rounds; the best round per side is kept (the machine may
be shared). The goal (issue "every paper task on two CPU cores"): ours at least 3x faster at
batch 256.

Authors' side, as their examples/train/train_cdt.py runs it on a CPU: the CDT model, CDTTrainer
and SequenceDataset built from the OfflineCarRun-v0 entry of examples/configs/cdt_configs.py
(3 layers x 128 embedding x 8 heads, seq_len 10, dropouts 0.1, stochastic head, episode_len 200,
loss_cost_weight 0.02, 20 % return-relabelling augmentation, cost-weighted sampling) over a
DSRL-layout dict of the synthetic file, and a DataLoader over it. A timed step is one iteration of
their training loop without its logging and evaluation: next(iterator), every tensor `.to(device)`,
then `trainer.train_one_step(...)`. Where this differs from their script:
- DataLoader num_workers=0 (their config: 8): two cores, and the step already runs one torch
  thread on each, so sample assembly happens in the loop, inside the timed step;
- pin_memory=False (theirs: True): there is no GPU to pin host memory for;
- batch size --batch-size (their config: 2048);
- the trainer's logger records the last stored values instead of WandbLogger (whose store() also
  just appends them), so the loss can be checked; the env is None (only evaluation uses it).

Our side: `make_state` with every option in SPEED_OPTIONS on and TrainConfig as
bench/train_throughput.py's main() builds it (3 x 128 x 8, K = 10, dropout 0.1), plus the
authors' cost-prediction loss (weight 0.02), one `step` each. The authors' step also computes a
state-prediction head whose loss weight is 0; ours does not. The parameter counts are printed as
a check.

--recipe cpu-budget times the recipe every shipped model since 2026-11-27 was trained with
instead: ours is the `cpu-budget` preset as `cdt train` runs it (2 x 64 x 4, context 1, no
dropout, its return features, cosine schedule and weight averaging), theirs the same config with
the model's size, context, dropouts and cost-prediction weight set to the preset's
(authors_at_cpu_budget()); everything else stays theirs. The floor is then not printed: at this size
the step is not its matrix products.

Modules OSRL imports that are not installed get minimal stand-ins, in sys.modules only while
OSRL's modules are imported (the report says which). None of them runs inside a timed step:
- fsrl.utils (DummyLogger, WandbLogger): cdt.py builds a DummyLogger as a default argument and
  names WandbLogger in type hints; the trainer here is given the recorder above;
- scipy.optimize.minimize: osrl/common/dataset.py imports it for pf_sample=True, which the CarRun
  config leaves off; the stand-in raises if called;
- oapackage (ParetoDoubleLong): the Pareto front of the episodes' (-cost, reward) returns, which
  SequenceDataset's augmentation fits at construction; a numpy stand-in computes the same set.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere in the repo

if TYPE_CHECKING:
    import torch

    from training.learn.config import TrainConfig

TASK = "OfflineCarRun-v0"  # the per-task config class the synthetic data is shaped like
MAX_ACTION = 1.0  # CarRun's action bound; CDT stores it for rollouts only
CDT_FILE = Path("osrl/algorithms/cdt.py")
RECIPES = ("paper", "cpu-budget")
CONFIG_FILE = Path("examples/configs/cdt_configs.py")


class LastValues:
    """Stands in for the trainer's logger: store() keeps the latest value of each name."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def store(self, tab: str | None = None, **values: float) -> None:
        self.values.update(values)


class _NoOpLogger:
    """fsrl.utils' loggers as far as importing cdt.py needs them: every method does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class _ParetoSet:
    """oapackage.ParetoDoubleLong as OSRL's augmentation uses it: the points no other point
    dominates, every objective maximised."""

    def __init__(self) -> None:
        self.points: list[tuple[float, ...]] = []
        self.indices: list[int] = []

    def addvalue(self, point: tuple[float, ...], index: int) -> None:
        self.points.append(tuple(point))
        self.indices.append(index)

    def show(self, verbose: int = 1) -> None:
        pass

    def allindices(self) -> list[int]:
        points = np.asarray(self.points, dtype=np.float64)
        # [i, j]: point j dominates point i
        at_least = np.all(points[None, :] >= points[:, None], axis=-1)
        better = np.any(points[None, :] > points[:, None], axis=-1)
        dominated = np.any(at_least & better, axis=1).tolist()
        return [index for index, lost in zip(self.indices, dominated, strict=True) if not lost]


def _unavailable_minimize(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError("scipy is not installed (OSRL needs it only for pf_sample=True)")


STAND_INS: dict[str, dict[str, Any]] = {
    "fsrl.utils": {"DummyLogger": _NoOpLogger, "WandbLogger": _NoOpLogger},
    "scipy.optimize": {"minimize": _unavailable_minimize},
    "oapackage": {"ParetoDoubleLong": _ParetoSet, "doubleVector": tuple},
}


def _module(name: str, **attributes: Any) -> ModuleType:
    # a real spec, so importlib.util.find_spec on the name still works
    module = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(name, None))
    module.__dict__.update(attributes)
    return module


@contextmanager
def stand_ins() -> Iterator[list[str]]:
    """Stand-ins in sys.modules for the missing modules OSRL imports, only inside the block.

    OSRL binds what it uses from them when its modules are imported, so they are taken out again
    afterwards: nothing on our side (torch included) can mistake them for the real packages.
    """
    missing: list[str] = []
    added: list[str] = []
    for name, attributes in STAND_INS.items():
        try:
            importlib.import_module(name)
        except ImportError:
            parent, _, child = name.rpartition(".")
            module = sys.modules[name] = _module(name, **attributes)
            added.append(name)
            if parent and parent not in sys.modules:
                sys.modules[parent] = _module(parent, **{child: module})
                added.append(parent)
            missing.append(name)
    try:
        yield missing
    finally:
        for name in added:
            del sys.modules[name]


def load_file(name: str, path: Path) -> ModuleType:
    """Import one file without its package's __init__ (their `examples` package is not ours)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def authors_at_cpu_budget() -> dict[str, float]:
    """The authors' config fields that --recipe cpu-budget sets, each to the `cpu-budget`
    preset's value: model size, context, dropouts and the cost head's weight."""
    from training.learn.config import PRESETS

    preset = PRESETS["cpu-budget"]
    dropouts = ("attention_dropout", "residual_dropout", "embedding_dropout")
    return {
        "embedding_dim": preset.embedding_dim,
        "num_layers": preset.num_layers,
        "num_heads": preset.num_heads,
        "seq_len": preset.seq_len,
        **dict.fromkeys(dropouts, preset.dropout),
        "loss_cost_weight": preset.cost_prediction_weight,
    }


def authors_config(osrl: Path, recipe: str) -> SimpleNamespace:
    """Their CarRun config, as train_cdt.py turns it into `args` (command-line overrides only
    for --recipe cpu-budget: authors_at_cpu_budget())."""
    configs = load_file("osrl_cdt_configs", osrl / CONFIG_FILE)
    args = SimpleNamespace(**asdict(configs.CDT_DEFAULT_CONFIG[TASK]()))
    if recipe == "cpu-budget":
        vars(args).update(authors_at_cpu_budget())
    return args


def dsrl_dict(dataset: Path) -> dict[str, np.ndarray]:
    """The flat arrays DSRL's env.get_dataset() returns, read from our HDF5 file."""
    from training.data.dataset import concatenate_episodes, load_dataset

    return concatenate_episodes(load_dataset(dataset).episodes)


@dataclass
class Side:
    name: str
    step: Callable[[], None]
    parameters: int  # a check that both sides train the same architecture
    wall: float = np.inf  # best seconds per step over the rounds
    cpu: float = np.inf


def authors_side(
    osrl: Path, data: dict[str, np.ndarray], batch_size: int, recipe: str
) -> tuple[Side, LastValues, SimpleNamespace]:
    """Their model, trainer, dataset and loader, built as train_cdt.py builds them."""
    from osrl.algorithms.cdt import CDT, CDTTrainer  # imported by main(), with the stand-ins
    from osrl.common.dataset import SequenceDataset
    from osrl.common.exp_util import seed_all
    from torch.utils.data import DataLoader

    args = authors_config(osrl, recipe)
    args.device = "cpu"
    seed_all(args.seed)
    action_dim = data["actions"].shape[1]
    model = CDT(
        state_dim=data["observations"].shape[1],
        action_dim=action_dim,
        max_action=MAX_ACTION,
        embedding_dim=args.embedding_dim,
        seq_len=args.seq_len,
        episode_len=args.episode_len,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        attention_dropout=args.attention_dropout,
        residual_dropout=args.residual_dropout,
        embedding_dropout=args.embedding_dropout,
        time_emb=args.time_emb,
        use_rew=args.use_rew,
        use_cost=args.use_cost,
        cost_transform=args.cost_transform,
        add_cost_feat=args.add_cost_feat,
        mul_cost_feat=args.mul_cost_feat,
        cat_cost_feat=args.cat_cost_feat,
        action_head_layers=args.action_head_layers,
        cost_prefix=args.cost_prefix,
        stochastic=args.stochastic,
        init_temperature=args.init_temperature,
        target_entropy=-action_dim,
    ).to(args.device)
    recorder = LastValues()
    trainer = CDTTrainer(
        model,
        None,  # the env: only evaluate() uses it
        logger=recorder,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=args.betas,
        clip_grad=args.clip_grad,
        lr_warmup_steps=args.lr_warmup_steps,
        reward_scale=args.reward_scale,
        cost_scale=args.cost_scale,
        loss_cost_weight=args.loss_cost_weight,
        loss_state_weight=args.loss_state_weight,
        cost_reverse=args.cost_reverse,
        no_entropy=args.no_entropy,
        device=args.device,
    )

    def cost_transform(x: float) -> float:  # their `ct` lambda
        return 70 - x if args.linear else 1 / (x + 10)

    dataset = SequenceDataset(
        data,
        seq_len=args.seq_len,
        reward_scale=args.reward_scale,
        cost_scale=args.cost_scale,
        deg=args.deg,
        pf_sample=args.pf_sample,
        max_rew_decrease=args.max_rew_decrease,
        beta=args.beta,
        augment_percent=args.augment_percent,
        cost_reverse=args.cost_reverse,
        max_reward=args.max_reward,
        min_reward=args.min_reward,
        pf_only=args.pf_only,
        rmin=args.rmin,
        cost_bins=args.cost_bins,
        npb=args.npb,
        cost_sample=args.cost_sample,
        cost_transform=cost_transform,
        start_sampling=args.start_sampling,
        prob=args.prob,
        random_aug=args.random_aug,
        aug_rmin=args.aug_rmin,
        aug_rmax=args.aug_rmax,
        aug_cmin=args.aug_cmin,
        aug_cmax=args.aug_cmax,
        cgap=args.cgap,
        rstd=args.rstd,
        cstd=args.cstd,
    )
    # num_workers=0: two cores, both busy with the step's torch threads (module docstring)
    loader = DataLoader(dataset, batch_size=batch_size, pin_memory=False, num_workers=0)
    batches: Iterator[list[torch.Tensor]] = iter(loader)

    def step() -> None:  # the body of their training loop up to the logging
        batch = next(batches)
        states, actions, returns, costs_return, time_steps, mask, episode_cost, costs = [
            b.to(args.device) for b in batch
        ]
        trainer.train_one_step(
            states, actions, returns, costs_return, time_steps, mask, episode_cost, costs
        )

    parameters = sum(p.numel() for p in model.parameters())
    return Side("authors (OSRL 03a4586)", step, parameters), recorder, args


def our_config(dataset: Path, out_dir: Path, threads: int, recipe: str) -> TrainConfig:
    """TrainConfig as bench/train_throughput.py's main() builds it, at the paper's dropout, with
    the authors' cost-prediction loss (weight 0.02) on, so that both sides train the same heads;
    or the `cpu-budget` preset as `cdt train` runs it."""
    from bench.train_throughput import bench_config

    config = bench_config(recipe, dataset, out_dir, threads)
    if recipe == "cpu-budget":
        return config
    return dataclasses.replace(config, cost_prediction_weight=0.02)


def our_side(
    config: TrainConfig, batch_size: int, compiled: bool = False
) -> tuple[Side, list[torch.Tensor]]:
    """Our step with every speed option on; `compiled`: also `torch.compile` (`cdt train
    --compile`), its compilation done here, before any timing."""
    from bench.train_throughput import SPEED_OPTIONS, make_state, step

    options = dict.fromkeys(SPEED_OPTIONS, True) | {"compile": compiled}
    state = make_state(config, options, batch_size)
    last_loss: list[torch.Tensor] = []  # read after timing: no extra sync inside the step

    def run() -> None:
        last_loss[:] = [step(state).loss.detach()]

    for _ in range(3 if compiled else 0):
        run()
    parameters = sum(p.numel() for p in state.model.parameters())
    name = "ours + torch.compile" if compiled else "ours (all speed options on)"
    return Side(name, run, parameters), last_loss


def measure(sides: list[Side], steps: int, rounds: int, threads: int) -> None:
    """Best (wall, CPU) seconds per step of each side over interleaved rounds, after warm-up."""
    import torch

    for side in sides:  # warm-up: allocator, lazy initialisation
        side.step()
    for round_index in range(rounds):
        # alternate the order so that neither side always runs right after the other
        for side in sides if round_index % 2 == 0 else sides[::-1]:
            torch.set_num_threads(threads)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                side.step()
            side.wall = min(side.wall, (time.perf_counter() - wall) / steps)
            side.cpu = min(side.cpu, (time.process_time() - cpu) / steps)


MATRIX_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm")


def matrix_product_floor(side: Side, threads: int, repeats: int = 5) -> tuple[float, float]:
    """(GFLOP, seconds) of one step's matrix products, each timed alone at its own shapes.

    A step can be no faster than its matrix products run by themselves on this CPU: the floor
    under every speed-up that keeps the architecture and fp32.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        side.step()
    calls = [e for e in prof.events() if e.name in MATRIX_PRODUCTS]
    torch.set_num_threads(threads)
    seconds, flops = 0.0, 0.0
    for event in calls:
        shapes = [shape for shape in event.input_shapes if shape]
        operands = [torch.randn(shape) for shape in shapes]
        product = getattr(torch, event.name.split("::")[1])
        best = np.inf
        for _ in range(repeats):
            start = time.perf_counter()
            product(*operands)
            best = min(best, time.perf_counter() - start)
        seconds += best
        flops += event.flops
    return flops / 1e9, seconds


def check_osrl(osrl: Path | None) -> Path:
    """The clone's root, or a one-line error and exit status 2."""
    if osrl is None or not (osrl / CDT_FILE).is_file() or not (osrl / CONFIG_FILE).is_file():
        print(
            f"authors_step: --osrl must name a clone of https://github.com/liuzuxin/OSRL "
            f"(with {CDT_FILE} and {CONFIG_FILE}); got {osrl}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return osrl.resolve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--osrl", type=Path, help="a clone of github.com/liuzuxin/OSRL")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best kept")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--recipe", choices=RECIPES, default="paper",
        help="paper: their CarRun config, 3 x 128 x 8, K = 10; cpu-budget: our preset, both sides "
        "at its size (2 x 64 x 4, context 1)",
    )  # fmt: skip
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time ours with torch.compile (cdt train --compile)",
    )
    args = parser.parse_args()
    osrl = check_osrl(args.osrl)

    import torch

    from bench.train_throughput import synthetic_dataset

    sys.path.insert(0, str(osrl))
    with stand_ins() as missing:  # the cdt module pulls in every algorithm and osrl.common
        importlib.import_module("osrl.algorithms.cdt")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="cdt-authors-") as workdir:
        dataset = synthetic_dataset(Path(workdir) / "synthetic.hdf5")
        data = dsrl_dict(dataset)
        theirs, recorder, config = authors_side(osrl, data, args.batch_size, args.recipe)
        config_ours = our_config(dataset, Path(workdir), args.threads, args.recipe)
        ours, our_loss = our_side(config_ours, args.batch_size)
        extra = [our_side(config_ours, args.batch_size, compiled=True)[0]] if args.compile else []
        measure([theirs, ours, *extra], args.steps, args.rounds, args.threads)
        floor = matrix_product_floor(ours, args.threads) if args.recipe == "paper" else None

    from training.ledger import cpu_name

    print(f"CPU: {cpu_name()}")
    print(
        f"torch {torch.__version__}, fp32, {args.threads} threads, batch {args.batch_size}, "
        f"best of {args.rounds} interleaved rounds of {args.steps} steps after 1 warm-up step"
    )
    print(f"stand-ins for missing modules: {', '.join(missing) or 'none'}")
    changed = ", ".join(authors_at_cpu_budget()) if args.recipe == "cpu-budget" else "none"
    print(f"recipe {args.recipe}; authors' config fields set to the preset's: {changed}")
    print(
        f"authors' config ({TASK}): {config.num_layers} layers x {config.embedding_dim} x "
        f"{config.num_heads} heads, seq_len {config.seq_len}, episode_len {config.episode_len}, "
        f"stochastic {config.stochastic}; DataLoader num_workers 0"
    )
    print(f"{'side':<30} {'s/step':>8} {'CPU s/step':>11} {'parameters':>11}")
    for side in (theirs, ours, *extra):
        print(f"{side.name:<30} {side.wall:>8.3f} {side.cpu:>11.3f} {side.parameters:>11,}")
    for side in (ours, *extra):
        print(
            f"authors / {side.name}: {theirs.wall / side.wall:.2f}x wall, "
            f"{theirs.cpu / side.cpu:.2f}x CPU"
        )
    if floor is not None:
        gflop, seconds = floor
        print(
            f"floor: our step's matrix products alone ({gflop:.1f} GFLOP, each timed by itself at "
            f"its shapes) take {seconds:.3f} s, {gflop / seconds:.0f} GFLOP/s: no fp32 step of "
            f"this architecture runs faster here than {theirs.wall / seconds:.2f}x the authors'"
        )
    loss = recorder.values.get("all_loss", np.nan)
    verdict = "finite" if np.isfinite(loss) else "NOT finite"
    if config.seq_len == 1 and not np.isfinite(loss):
        # their state-prediction loss is the mean of an empty slice at seq_len 1, and weight 0
        # times NaN is NaN; the step's arithmetic is the same as with a finite loss
        verdict += ": their state-prediction loss is empty at seq_len 1"
    print(f"sanity: authors' last loss {loss:.4f} ({verdict}), ours {float(our_loss[0]):.4f}")


if __name__ == "__main__":
    main()
