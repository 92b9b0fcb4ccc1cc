"""Evaluation in the simulator: checkpoint selection, `cdt evaluate`, sweeps, `cdt report`."""
