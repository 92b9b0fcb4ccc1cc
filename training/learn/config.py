"""Training configuration: one frozen dataclass, two named presets, and the command-line parser.

`cdt train --dataset FILE --preset cpu|paper [--field value ...]`: the preset picks the defaults,
any flag overrides them. Boolean fields take `--name` / `--no-name` (e.g. `--no-augment`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from runtime.evaluation_protocol import REPORTED_BUDGETS, SelectionRule
from training.tyro_cli import parse

PresetName = Literal["cpu", "paper", "cpu-budget"]


@dataclass(frozen=True)
class TrainConfig:
    """Train CDT (or DT-Cost, or unconstrained DT) on an offline dataset in the DSRL HDF5 layout."""

    dataset: Path = Path("datasets/SafetyCarRun-v0.hdf5")
    """HDF5 dataset (DSRL layout); its `env_id` attribute names the env used for evaluation."""
    preset: PresetName = "cpu"
    """Named defaults: `cpu-budget` (the recipe that teaches the cost token on a CPU, for every
    task), `cpu` (the earlier small recipe) or `paper` (the paper's table)."""
    algo: Literal["cdt", "dt-cost", "dt"] = "cdt"
    """`cdt`; `dt-cost`: plain DT with a cost token (MSE head, no augmentation, no extras); `dt`:
    unconstrained DT, i.e. DT-Cost with its cost-to-go input held at zero, so the policy cannot
    see the cost budget (the epsilon-reducible study). The paper's baselines train through the
    same command with their own options: `--algo bc-all|bc-safe|bc-risky|bc-frontier|bc-boundary|
    mt-bc|bcq-lag|bear-lag|cpq|coptidice|bcq|bear` (see `cdt train --algo bc-safe --help`)."""
    out_dir: Path = Path("runs")
    """Parent folder of run directories."""
    run_name: str | None = None
    """Run directory name under out_dir; None derives `<algo>-<task>-seed<seed>`."""
    seed: int = 0
    """Seed for weights, augmentation, batch sampling and dropout."""
    resume: Path | None = None
    """Checkpoint to continue from; every setting except update_steps comes from its run."""

    # model (paper section 4.3 and appendix table)
    seq_len: int = 10
    """Context length K (steps per window)."""
    embedding_dim: int = 64
    """Transformer width (paper: 128)."""
    num_layers: int = 2
    """Transformer blocks (paper: 3)."""
    num_heads: int = 4
    """Attention heads (paper: 8)."""
    dropout: float = 0.0
    """Dropout on embeddings, attention weights and residual branches."""
    deterministic: bool = False
    """Mean-squared-error head instead of the Gaussian one (the paper's "CDT (deterministic)")."""
    entropy: bool = True
    """Entropy regularisation of the Gaussian head (`--no-entropy` is the paper's ablation)."""
    entropy_weight: float = 0.1
    """Fixed entropy weight lambda, or the initial temperature when it is learned."""
    learn_temperature: bool = True
    """Learn lambda against a target entropy of -|A| (OSRL) instead of keeping it fixed."""
    log_std_min: float = -5.0
    """Lower bound of the Gaussian head's log-std (normalised action units)."""
    log_std_max: float = 2.0
    """Upper bound of the Gaussian head's log-std (normalised action units)."""
    cost_prediction_weight: float = 0.0
    """Weight of the auxiliary per-step cost classifier (OSRL uses 0.02); 0 removes the head."""
    cost_transform: bool = False
    """Feed (cost_constant * cost_scale - CTG) instead of CTG (OSRL's `cost_transform`)."""
    return_basis: int = 0
    """Triangular basis functions added to each return token's linear embedding (0: linear
    only, as DT and OSRL). A layer-normalised linear embedding of a scalar keeps little more than
    its sign; the basis keeps its magnitude (docs/decisions/return-tokens.md)."""

    # data
    reward_scale: float = 0.1
    """Multiplier applied to reward returns-to-go before they enter the model (OSRL)."""
    cost_scale: float = 1.0
    """Multiplier applied to cost returns-to-go before they enter the model (OSRL)."""
    scale_tokens_by_data: bool = False
    """Instead of reward_scale / cost_scale, divide reward-to-go by the data's largest |reward
    return| and cost-to-go by the served cost cap, so both tokens lie near [0, 1] on every task."""
    cost_weighted_sampling: bool = True
    """Sample episodes with weight max(sampling_cost_ceiling - cost return, 0): a linear tilt
    towards safe data (OSRL's `cost_sample`, whose constant zeroes costlier episodes)."""
    sampling_cost_ceiling: float | None = None
    """None: the largest cost return in the training data, relabelled targets included, plus 10 %
    of the cost range, so every episode and relabelled copy is drawn. A constant below the data's
    costs (OSRL: 70) never trains the cost-to-go values above it: with 50, 63 % of CarRun's
    episodes and 72 % of its relabelled copies had zero weight and budgets over 50 went unseen."""
    sampling_min_weight: float = 0.0
    """Floor of an episode's sampling weight, as a share of the largest weight: > 0 keeps every
    episode (and relabelled copy) in the draw however costly, with a sampling ceiling below the
    data's costs."""
    cost_constant: float = 50.0
    """The constant of cost_transform, in raw cost units (OSRL: 50)."""

    # return relabelling augmentation (paper Algorithm 1 and appendix "noisy datasets")
    augment: bool = True
    """Append relabelled copies of frontier trajectories with infeasible targets (Algorithm 1)."""
    augment_fraction: float = 0.2
    """Relabelled trajectories to add, as a fraction of the dataset's episodes (OSRL: 0.2)."""
    augment_min_gap: float = 1.0
    """Sampled target rewards lie at least this far above the reward frontier (raw units)."""
    augment_cost_cap_factor: float | None = None
    """Relabelled target costs are drawn up to this multiple of the largest eval budget (1.5:
    up to 60 for budgets 10-40), where budgets are served; None: the data's whole cost range
    (Algorithm 1 as printed), which on CarCircle put 4 in 5 copies above any served budget."""
    augment_max_reward: float | None = None
    """Highest target reward; None uses the dataset's best reward return plus 10% of its range."""
    association: Literal["best", "sampled"] = "sampled"
    """`best`: the highest-reward trajectory under the target cost; `sampled`: p ~ 1/(d + beta)."""
    association_beta: float = 1.0
    """beta of the sampling-based association, in raw return units."""
    association_max_reward_drop: float = 0.2
    """Sampled associations stay within this fraction of the reward range below the best one."""
    outlier_filter: bool = False
    """Keep trajectories in sparse cells of the return grid out of the frontier and relabelling."""
    outlier_grid: tuple[int, int] = (10, 50)
    """(cost bins, reward bins) of the outlier filter's grid."""
    outlier_min_count: int = 2
    """Cells holding this many trajectories or fewer count as outliers."""

    # optimisation
    batch_size: int = 256
    """Windows per gradient step (per process under DDP)."""
    update_steps: int = 5_000
    """Gradient steps in total."""
    learning_rate: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    warmup_steps: int = 500
    """Linear learning-rate warm-up steps, then the schedule."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or a cosine decay to min_lr_fraction x learning_rate at the end."""
    min_lr_fraction: float = 0.1
    """Where the cosine schedule ends, as a fraction of learning_rate."""
    weight_averaging: float = 0.0
    """Decay of an exponential moving average of the weights that checkpoints, evaluation and
    export use (0: the raw weights). 0.999 averages over about the last thousand steps."""
    clip_grad: float = 0.25
    """Gradient-norm clip."""

    # evaluation, logging, checkpoints
    eval_every: int = 1_000
    """Evaluate in the simulator every this many steps (and at the end); 0 disables."""
    eval_episodes: int = 20
    """Episodes per budget and action mode that best.pt is chosen on, on selection seeds that
    the reported evaluation never uses (runtime.evaluation_protocol)."""
    eval_budgets: tuple[float, ...] = REPORTED_BUDGETS
    """Cost budgets of selection, each with the data's default target reward (PF + 10 % of the
    reward range), as the model card will list them and the reported evaluation uses them."""
    eval_action_modes: Literal["both", "sampled", "mean"] = "both"
    """Action modes a checkpoint must be safe in: served episodes may ask for either."""
    selection_cost_margin: float = SelectionRule.cost_margin
    """best.pt must keep mean cost <= margin x budget at every budget and mode (held-out seeds
    scatter around the selection mean)."""
    selection_max_share_over: float = SelectionRule.max_share_over
    """best.pt may let at most this share of episodes exceed their budget."""
    selection_min_budget_use: float = SelectionRule.min_budget_use
    """best.pt's mean cost must reach this share of every budget above the tightest."""
    fail_fast_step: int = 0
    """At this step (0: never) probe whether actions respond to the return tokens and whether
    the cost of a few mean-action episodes follows the budget; stop the run with a message if not
    (`training/learn/probe.py`)."""
    fail_fast_min_effect: float = 0.005
    """The probe's least mean |action change| (normalised actions) when the cost-to-go of every
    position in a recorded window is raised by the largest eval budget: a dead token. Runs that
    went on to follow the budget on CarCircle moved by 0.012-0.027 (docs/training.md, "fail
    fast"), so the probe only catches a token that does nothing; the cost check does the rest."""
    log_every: int = 50
    """Write training scalars every this many steps."""
    checkpoint_every: int = 1_000
    """Write `last.pt` every this many steps (and at the end); `best.pt` follows evaluation."""
    keep_checkpoints: bool = False
    """Also keep `step_<N>.pt` at every checkpoint, to choose best.pt afterwards with
    `cdt select` (training where no simulator runs, e.g. on a GPU machine with --eval-every 0)."""
    tensorboard: bool = True
    """Also write TensorBoard scalars next to the CSV files."""

    # speed
    device: str = "cpu"
    """`cpu`, `cuda` or `cuda:N`; under torchrun each process takes cuda:LOCAL_RANK."""
    bf16: bool = False
    """bfloat16 autocast. Opt-in, because it pays only for wide enough matrices on hardware with
    bf16 units: on 2-core CPUs with AMX or AVX-512 BF16 the paper architecture (3 x 128 x 8,
    batch 256) trains 1.6-2x faster (loss within 0.33 % of fp32 over 30 steps), while the `cpu`
    preset's 2 x 64 x 4 model runs 2-3x slower. On an H200 it pays at batch 2048 (1.3x), not 256."""
    compile: bool = False
    """torch.compile the model (optional; pays off only on long runs; CUDA only: on a CPU its
    generated code crashed a `cpu-budget` training, docs/decisions/training-speed.md)."""
    num_threads: int | None = 1
    """torch intra-op threads on CPU; None leaves torch's default (one per core).

    1 by default: on a 2-core machine shared with other jobs, 2 threads ran 2-3x *slower* than 1
    (OpenMP threads wait on a descheduled sibling); on an idle machine 2 threads are faster.
    """
    fused_attention: bool = True
    """Use scaled_dot_product_attention instead of the written-out softmax attention."""
    short_attention: bool = True
    """With at most 4 keys (context 1), attention as broadcast products on the projection's
    layout instead of either kernel (equal to fp32 rounding; faster at 3 tokens on a CPU)."""
    skip_unread_outputs: bool = True
    """Compute only what is read (exact): the last block's read tokens (about a fifth fewer
    FLOPs), and, without the cost head, no block sees the newest action token (a quarter of
    the tokens at seq_len 1)."""
    fast_dropout: bool = True
    """Dropout masks from 16-bit random numbers (p rounded to 2^-16; ~2.5x cheaper on CPU)."""
    flat_parameters: bool = True
    """On a CPU (one process, uncompiled): every parameter a view of one buffer, so that AdamW,
    gradient clipping and the weight average each run a few ops, not one per tensor (exact)."""

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.batch_size < 1 or self.update_steps < 0:
            raise ValueError("seq_len and batch_size must be >= 1, update_steps >= 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must lie in [0, 1)")
        if any(budget <= 0 for budget in self.eval_budgets):
            raise ValueError("eval budgets must be > 0 (normalised cost divides by them)")
        if self.log_std_min >= self.log_std_max:
            raise ValueError("log_std_min must be below log_std_max")
        if self.return_basis < 0 or self.return_basis == 1:
            raise ValueError("return_basis must be 0 or at least 2")
        if not 0.0 <= self.sampling_min_weight <= 1.0:
            raise ValueError("sampling_min_weight must lie in [0, 1]")
        if not 0.0 <= self.weight_averaging < 1.0:
            raise ValueError("weight_averaging must lie in [0, 1)")
        if self.augment_cost_cap_factor is not None and self.augment_cost_cap_factor <= 0:
            raise ValueError("augment_cost_cap_factor must be > 0")

    @property
    def is_dt_cost(self) -> bool:
        """DT-Cost or unconstrained DT: the plain DT recipe, none of CDT's additions."""
        return self.algo in ("dt-cost", "dt")

    @property
    def cost_conditioned(self) -> bool:
        """Does the policy read the cost-to-go? Not for unconstrained DT."""
        return self.algo != "dt"

    @property
    def stochastic(self) -> bool:
        """Gaussian head? DT-Cost and the deterministic ablation use the MSE head."""
        return not (self.deterministic or self.is_dt_cost)

    @property
    def uses_augmentation(self) -> bool:
        return self.augment and not self.is_dt_cost

    @property
    def uses_cost_sampling(self) -> bool:
        return self.cost_weighted_sampling and not self.is_dt_cost

    @property
    def effective_cost_prediction_weight(self) -> float:
        return 0.0 if self.is_dt_cost else self.cost_prediction_weight

    @property
    def cost_to_go_offset(self) -> float | None:
        """What the model subtracts scaled CTG from, or None (see cost_transform)."""
        if not self.cost_transform or self.is_dt_cost:
            return None
        return self.cost_constant * self.cost_scale

    @property
    def selection_action_modes(self) -> tuple[bool, ...]:
        """The `deterministic` flags selection runs; a deterministic head has only the mean."""
        if not self.stochastic or self.eval_action_modes == "mean":
            return (True,)
        return {"both": (False, True), "sampled": (False,)}[self.eval_action_modes]

    def run_dir(self, task: str) -> Path:
        """Where this run writes: the resumed checkpoint's folder, else out_dir / run_name (by
        default `<algo>-<task>-seed<seed>`)."""
        if self.resume is not None:
            return self.resume.parent
        return self.out_dir / (self.run_name or f"{self.algo}-{task}-seed{self.seed}")

    @property
    def served_cost_cap(self) -> float:
        """The largest cost a relabelled target may ask for: the factor x the largest budget."""
        return (self.augment_cost_cap_factor or 1.5) * max(self.eval_budgets)

    def token_scales(self, reward_returns: np.ndarray) -> tuple[float, float]:
        """(reward_scale, cost_scale) the model's inputs are multiplied by."""
        if not self.scale_tokens_by_data:
            return self.reward_scale, self.cost_scale
        largest = float(np.abs(reward_returns).max()) or 1.0
        return 1.0 / largest, 1.0 / self.served_cost_cap

    def token_ranges(
        self, reward_returns: np.ndarray, reward_scale: float, cost_scale: float
    ) -> tuple[tuple[float, float], tuple[float, float]]:
        """Ranges of the fed reward and cost tokens that the return basis covers: rewards from
        min(0, worst) to 1.2 x the best return, costs from 0 to the served cost cap."""
        low = min(0.0, float(reward_returns.min())) * reward_scale
        high = 1.2 * float(reward_returns.max()) * reward_scale
        cost_high = self.served_cost_cap * cost_scale
        offset = self.cost_to_go_offset
        cost_range = (0.0, cost_high) if offset is None else (offset - cost_high, offset)
        return (low, max(high, low + 1e-3)), cost_range

    def target_entropy(self, action_dim: int) -> float:
        """SAC/OSRL target entropy -|A|."""
        return -float(action_dim)

    def recipe(self) -> str:
        """The preset and every flag that changes what it learns, as `cdt train` takes them
        (e.g. `cpu-budget --no-augment`): the ledger's recipe, so an ablation is told apart
        from its preset. Bookkeeping, evaluation, selection and speed settings are left out."""
        base = PRESETS[self.preset]
        flags: list[str] = [self.preset]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in _NOT_RECIPE or value == getattr(base, field.name):
                continue
            name = field.name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(f"--{name}" if value else f"--no-{name}")
            elif isinstance(value, tuple):
                flags.append(f"--{name} {' '.join(map(str, value))}")
            else:
                flags.append(f"--{name} {value}")
        return " ".join(flags)

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-safe dict (paths as strings, tuples as lists)."""
        values: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self), default=str))
        return values

    @classmethod
    def from_json_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Inverse of to_json_dict; unknown keys are refused."""
        values = dict(values)
        for key in ("dataset", "out_dir", "resume"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        values["betas"] = tuple(values["betas"])
        values["outlier_grid"] = tuple(values["outlier_grid"])
        values["eval_budgets"] = tuple(values["eval_budgets"])
        return cls(**values)


_NOT_RECIPE = frozenset(
    {
        *("dataset", "preset", "algo", "out_dir", "run_name", "seed", "resume", "update_steps"),
        *("eval_every", "eval_episodes", "eval_budgets", "eval_action_modes"),
        *("selection_cost_margin", "selection_max_share_over", "selection_min_budget_use"),
        *("fail_fast_step", "fail_fast_min_effect", "log_every", "checkpoint_every"),
        *("keep_checkpoints", "tensorboard", "device", "compile", "num_threads"),
        *("fused_attention", "short_attention", "skip_unread_outputs", "fast_dropout"),
        "flat_parameters",
    }
)
"""Settings that do not change what a run learns (the ledger has its own columns for the
algorithm, seed and steps); every other field is part of `TrainConfig.recipe`."""


# Defaults of the dataclass are the `cpu` preset: a smaller transformer (2 x 64 x 4) that reached
# normalised cost <= 1 at kappa = 10 with normalised reward ~0.72-0.76 on our CarRun data within
# 2,000-5,000 steps (about 8 steps/s on one loaded core). The `paper` preset is the paper's table
# (3 x 128 x 8, dropout 0.1, batch 2048, 100k steps) plus the extras of the authors' code
# (OSRL examples/configs/cdt_configs.py): cost head 0.02 and CTG fed as (50 - CTG).
PRESETS: dict[str, TrainConfig] = {
    "cpu": TrainConfig(),
    "paper": TrainConfig(
        preset="paper",
        embedding_dim=128,
        num_layers=3,
        num_heads=8,
        dropout=0.1,
        batch_size=2048,
        update_steps=100_000,
        cost_prediction_weight=0.02,
        cost_transform=True,
        eval_every=2_500,
        checkpoint_every=2_500,
        num_threads=None,
    ),
    # The recipe for every task on a 2-core CPU (docs/training.md, "the cpu-budget recipe"):
    # return tokens that keep their magnitude, relabelled targets where budgets are served, a
    # safe-leaning draw that zeroes nothing, a decaying learning rate, averaged weights, and a
    # probe that stops a run whose actions ignore the budget.
    "cpu-budget": TrainConfig(
        preset="cpu-budget",
        seq_len=1,
        return_basis=16,
        scale_tokens_by_data=True,
        augment_fraction=1.0,
        augment_cost_cap_factor=1.5,
        sampling_cost_ceiling=70.0,
        sampling_min_weight=0.1,
        association_max_reward_drop=0.1,
        learning_rate=3e-4,
        lr_schedule="cosine",
        weight_averaging=0.999,
        update_steps=24_000,
        fail_fast_step=2_000,
        eval_every=4_000,
        checkpoint_every=4_000,
    ),
}


def _preset_from_argv(argv: list[str]) -> str:
    preset = "cpu"
    for index, arg in enumerate(argv):
        if arg == "--preset" and index + 1 < len(argv):
            preset = argv[index + 1]
        elif arg.startswith("--preset="):
            preset = arg.split("=", 1)[1]
    return preset


class ConfigError(ValueError):
    """A `cdt train` setting that cannot work (a missing file, say): one line for the user."""


def _given(args: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(f"{flag}=") for arg in args)


def parse_config(argv: list[str] | None) -> TrainConfig:
    """Parse `cdt train` arguments: the preset's values are the defaults of every flag. A resumed
    run is its own settings (the JSON beside every checkpoint); `--update-steps N` changes its end.
    """
    args = [] if argv is None else list(argv)
    defaults = PRESETS.get(_preset_from_argv(args), PRESETS["cpu"])
    config = parse(TrainConfig, args, "cdt train", default=defaults)
    if config.resume is not None:
        stored = config.resume.with_suffix(".json")
        if not config.resume.is_file() or not stored.is_file():
            raise ConfigError(f"--resume {config.resume}: no such checkpoint (with its .json)")
        try:
            run = TrainConfig.from_json_dict(json.loads(stored.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as error:
            reason = f"{stored} holds no training settings ({type(error).__name__}: {error})"
            raise ConfigError(f"--resume {config.resume}: {reason}") from None
        steps = config.update_steps if _given(args, "--update-steps") else run.update_steps
        config = dataclasses.replace(run, update_steps=steps, resume=config.resume)
    elif not config.dataset.is_file():
        raise ConfigError(f"--dataset {config.dataset}: no such file")
    return config
