"""The CDT paper's baselines, trained on our datasets and exported under docs/ARTIFACT.md.

Every algorithm is a stateless policy (context length 1) trained on single transitions:

- behaviour cloning on a subset of the trajectories (``bc-all``, ``bc-safe``, ``bc-risky``,
  ``bc-frontier``, ``bc-boundary``) and cost-conditioned behaviour cloning (``mt-bc``);
- Lagrangian offline RL with a PID multiplier (``bcq-lag``, ``bear-lag``);
- ``cpq`` (constraints-penalised Q-learning) and ``coptidice`` (stationary distribution
  correction);
- the unconstrained ``bcq`` and ``bear`` for the epsilon-reducible study.

Layout: ``config.py`` (``BaselineConfig``), ``data.py`` (trajectory selection, transitions),
``networks.py`` (MLPs, VAE, Q ensembles), ``lagrangian.py`` (PID multiplier on a critic's cost
estimate), ``critics.py`` (reward/cost critics shared by BCQ and BEAR), ``trainer.py`` (the
shared loop), one module per algorithm family (``bc``, ``bcq``, ``bear``, ``cpq``,
``coptidice``), ``registry.py`` (name -> trainer), ``export.py`` (ONNX graph and model card)
and ``cli.py``.
"""

from __future__ import annotations

from typing import Literal, get_args

BcAlgorithm = Literal[
    "bc-all",
    "bc-safe",
    "bc-risky",
    "bc-frontier",
    "bc-boundary",
    "mt-bc",
]
"""Behaviour-cloning variants (`training/baselines/bc.py`)."""

Algorithm = Literal[BcAlgorithm, "bcq-lag", "bear-lag", "cpq", "coptidice", "bcq", "bear"]
"""Every baseline name `cdt train --algo NAME` accepts here, in the paper's table order: the one
list (`BaselineConfig.algo`, the registry, `cdt train`'s routing and `cdt report` read it)."""

BC_ALGORITHMS: tuple[str, ...] = get_args(BcAlgorithm)
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)

DETERMINISTIC_ALGORITHMS: tuple[str, ...] = (*BC_ALGORITHMS, "bcq-lag", "bcq")
"""Baselines whose exported log-std is the constant -5 (a deterministic policy)."""

NAMES_IN_PAPER: dict[str, str] = {
    "bc-all": "BC-All",
    "bc-safe": "BC-Safe",
    "bc-risky": "BC-Risky",
    "bc-frontier": "BC-Frontier",
    "bc-boundary": "BC-Boundary",
    "mt-bc": "MT-BC",
    "bcq-lag": "BCQ-Lag",
    "bear-lag": "BEAR-Lag",
    "cpq": "CPQ",
    "coptidice": "COptiDICE",
    "bcq": "BCQ",
    "bear": "BEAR",
}
"""How the paper's tables name each baseline."""
