"""Evaluation in the simulator: checkpoint scores and `cdt select`, `cdt evaluate`, `cdt calibrate`
and the sweeps (`cdt report`, which also trains, is an orchestrator: training/report/)."""
