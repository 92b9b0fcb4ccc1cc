"""The PID Lagrange multiplier (Stooke et al., 2020) shared by the collector and the baselines.

`cdt collect`'s PPO-Lagrangian feeds it the mean episode cost of each epoch; BCQ-Lag and
BEAR-Lag feed it a cost critic's estimate (`training/baselines/lagrangian.py`). Pure Python, so
neither side imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PidLagrangian:
    """PID Lagrange multiplier: lambda = max(0, P + I + D) on the episode-cost error.

    Defaults are the paper's k_P, k_I, k_D = 0.1, 0.003, 0.001.
    """

    k_p: float = 0.1
    k_i: float = 0.003
    k_d: float = 0.001
    ema_alpha: float = 0.95
    integral: float = 0.0
    smoothed_error: float = 0.0
    smoothed_cost: float = 0.0
    previous_cost: float = 0.0
    multiplier: float = 0.0

    def update(self, episode_cost: float, threshold: float) -> float:
        """Feed the mean episode cost of the latest epoch; return the new multiplier."""
        error = episode_cost - threshold
        self.integral = max(0.0, self.integral + self.k_i * error)
        # Smoothed P and D terms, as in Stooke et al. (2020), Algorithm 2.
        self.smoothed_error = self.ema_alpha * self.smoothed_error + (1 - self.ema_alpha) * error
        self.smoothed_cost = (
            self.ema_alpha * self.smoothed_cost + (1 - self.ema_alpha) * episode_cost
        )
        derivative = max(0.0, self.smoothed_cost - self.previous_cost)
        self.previous_cost = self.smoothed_cost
        self.multiplier = max(
            0.0, self.k_p * self.smoothed_error + self.integral + self.k_d * derivative
        )
        return self.multiplier
