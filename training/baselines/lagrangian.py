"""The PID Lagrange multiplier of BCQ-Lag and BEAR-Lag, driven by a cost critic's estimate.

The CDT paper's appendix gives the baselines a PID multiplier with k_P, k_I, k_D = 0.1, 0.003,
0.001 (Stooke et al., 2020); the controller is the collector's `PidLagrangian`
(`training/pid_lagrangian.py`). Its setpoint is the episode cost limit spread evenly over the
episode and discounted, as OSRL's BCQ-L does
(`qc_thres` in `osrl/algorithms/bcql.py` at commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6):
kappa * (1 - gamma^T) / ((1 - gamma) * T).
"""

from __future__ import annotations

from training.pid_lagrangian import PidLagrangian


def per_step_threshold(cost_limit: float, gamma: float, episode_len: int) -> float:
    """The discounted cost of an episode that spends `cost_limit` evenly over `episode_len`."""
    if gamma >= 1.0:
        return cost_limit
    return cost_limit * (1.0 - gamma**episode_len) / ((1.0 - gamma) * episode_len)


class CostMultiplier:
    """lambda = PID(estimated cost - threshold), updated once per gradient step."""

    def __init__(
        self,
        threshold: float,
        k_p: float = 0.1,
        k_i: float = 0.003,
        k_d: float = 0.001,
    ) -> None:
        self.threshold = threshold
        self.pid = PidLagrangian(k_p=k_p, k_i=k_i, k_d=k_d)

    @property
    def value(self) -> float:
        return self.pid.multiplier

    def update(self, estimated_cost: float) -> float:
        """Feed the batch-mean cost estimate Q_c(s, pi(s)); return the new multiplier."""
        return self.pid.update(estimated_cost, self.threshold)
