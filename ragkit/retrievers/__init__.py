"""ragkit.retrievers."""
