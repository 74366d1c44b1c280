"""ragkit.debias."""
