"""CDT learning: config and presets, the model, losses, the training loop and its checkpoints."""
