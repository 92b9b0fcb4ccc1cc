"""Data collection: PPO-Lagrangian, PID multiplier, a rising cost threshold (`cdt collect`)."""
