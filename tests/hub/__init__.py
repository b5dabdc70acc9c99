"""The model library, the hub double, fit, the model commands and the demo build's checkpoints."""
