"""ragkit.eval."""
