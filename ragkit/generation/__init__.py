"""ragkit.generation."""
