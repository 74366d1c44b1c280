"""ragkit: retrieval-augmented generation that is robust to passage order and query wording."""

from __future__ import annotations

from ragkit.types import Hit, Passage, Query, RankedList

__version__ = "0.1.0"

__all__ = ["Hit", "Passage", "Query", "RankedList", "__version__"]
