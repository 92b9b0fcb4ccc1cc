"""Offline datasets: the DSRL layout, frontiers, grid filter, relabelling, training windows."""
