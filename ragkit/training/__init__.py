"""ragkit.training."""
