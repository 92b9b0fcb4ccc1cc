"""`BaselineConfig`: every setting of one baseline training run.

Defaults follow OSRL's per-algorithm configs (liuzuxin/OSRL, `examples/configs/*_configs.py` at
commit 08df54dc09b42387cc32827989187b2f62f9d64d): 256x256 actors and critics, a 400-unit VAE,
batch 512, gamma 0.99, tau 0.005, reward scale 0.1 and the PID gains 0.1, 0.003, 0.001.
Learning rates that differ between algorithms are `None` here and resolved by a property.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from training.baselines import Algorithm

# OSRL's actor learning rates: 1e-4 for CPQ and COptiDICE, 1e-3 for the others.
_SLOW_ACTOR = ("cpq", "coptidice")


@dataclass(frozen=True)
class BaselineConfig:
    """Settings of one baseline run: data, optimisation, networks and algorithm constants."""

    algo: Algorithm = "bc-safe"
    """which baseline to train."""
    dataset: Path = Path("datasets/SafetyCarRun-v0.hdf5")
    """DSRL-layout HDF5 dataset."""
    out: Path | None = None
    """export directory (default models/<algo>-<task>-s<seed>)."""
    cost_limit: float = 10.0
    """cost threshold kappa (episode cost return)."""
    steps: Annotated[int, tyro.conf.arg(aliases=("--update-steps",))] = 100_000
    """gradient steps (`--update-steps` too, as for CDT)."""
    seed: int = 0
    """seed of torch and the batch sampler."""
    batch_size: int = 512
    """transitions per gradient step."""
    device: str = "cpu"
    """torch device; CUDA is opt-in ("cuda")."""
    threads: int | None = None
    """torch CPU threads (default: torch's choice; 1 is fastest on a busy machine)."""
    actor_hidden: tuple[int, ...] = (256, 256)
    """actor hidden layer sizes."""
    critic_hidden: tuple[int, ...] = (256, 256)
    """critic (and COptiDICE nu/chi network) hidden layer sizes."""
    vae_hidden: int = 400
    """VAE hidden width (BCQ, BEAR, CPQ)."""
    num_critics: int = 2
    """Q networks per ensemble (targets take their min, or the lambda-mix for BCQ and BEAR)."""
    actor_lr: float | None = None
    """actor learning rate (default 1e-4 for cpq and coptidice, else 1e-3)."""
    critic_lr: float | None = None
    """critic learning rate (default 1e-4 for coptidice, else 1e-3)."""
    vae_lr: float = 1e-3
    """VAE learning rate."""
    scalar_lr: float | None = None
    """learning rate of BEAR's MMD weight, CPQ's alpha, COptiDICE's lambda and tau (default 1e-4
    for coptidice, else 1e-3)."""
    gamma: float = 0.99
    """discount of the critics."""
    tau: float = 0.005
    """soft target-update rate."""
    reward_scale: float = 0.1
    """rewards are multiplied by this before the critics see them."""
    cost_scale: float = 1.0
    """costs are multiplied by this before the critics see them (and the threshold too)."""
    episode_len: int | None = None
    """max episode length (default: the longest episode in the dataset)."""
    action_low: tuple[float, ...] | None = None
    """action lower bounds (default: dataset attrs, then the env's action space)."""
    action_high: tuple[float, ...] | None = None
    """action upper bounds (default: dataset attrs, then the env's action space)."""
    k_p: float = 0.1
    """PID multiplier: proportional gain (BCQ-Lag, BEAR-Lag)."""
    k_i: float = 0.003
    """PID multiplier: integral gain."""
    k_d: float = 0.001
    """PID multiplier: derivative gain."""
    sample_action_num: int = 10
    """candidate next actions per state in the BCQ/BEAR/CPQ targets."""
    target_mix: float = 0.75
    """BCQ/BEAR target: mix * min(Q) + (1 - mix) * max(Q) over the ensemble."""
    vae_kl_weight: float = 0.5
    """weight of the VAE's KL term."""
    perturbation: float = 0.05
    """BCQ: largest perturbation of a VAE action, as a fraction of the action range."""
    mmd_sigma: float = 50.0
    """BEAR: Gaussian-kernel width of the MMD support constraint."""
    mmd_threshold: float = 0.05
    """BEAR: target MMD (the Lagrange weight rises while MMD exceeds it)."""
    mmd_samples: int = 10
    """BEAR: samples per state for the MMD estimate."""
    cpq_alpha_max: float = 1.0
    """CPQ: upper clip of the OOD-cost weight alpha."""
    cpq_threshold_scale: float = 1.5
    """CPQ: the OOD cost target is this times the per-step threshold."""
    dice_alpha: float = 0.5
    """COptiDICE: weight of the f-divergence regulariser."""
    dice_cost_epsilon: float = 0.01
    """COptiDICE: KL budget of the cost upper bound (0 uses the plain estimate)."""
    log_every: int = 1000
    """log the running losses every this many steps."""
    checkpoint_every: int = 1000
    """write the whole training state to `progress.pt` in the output folder every this many
    steps, so the same command run again resumes (0: only when stopped by Ctrl-C or SIGTERM)."""

    @property
    def resolved_actor_lr(self) -> float:
        if self.actor_lr is not None:
            return self.actor_lr
        return 1e-4 if self.algo in _SLOW_ACTOR else 1e-3

    @property
    def resolved_critic_lr(self) -> float:
        if self.critic_lr is not None:
            return self.critic_lr
        return 1e-4 if self.algo == "coptidice" else 1e-3

    @property
    def resolved_scalar_lr(self) -> float:
        if self.scalar_lr is not None:
            return self.scalar_lr
        return 1e-4 if self.algo == "coptidice" else 1e-3

    @property
    def constrained(self) -> bool:
        """False for the unconstrained `bcq` and `bear` of the epsilon-reducible study."""
        return self.algo not in ("bcq", "bear")

    def output_dir(self, task: str) -> Path:
        """Where the export goes: `out`, or models/<algo>-<task>-s<seed>."""
        return self.out or Path("models") / f"{self.algo}-{task}-s{self.seed}"
