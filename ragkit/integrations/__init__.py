"""Adapters that put any ragkit reranker into other RAG frameworks.

- :mod:`ragkit.integrations.langchain`: ``as_compressor`` (a ``BaseDocumentCompressor``) and
  ``as_retriever`` (extra ``langchain``).
- :mod:`ragkit.integrations.llamaindex`: ``RagkitNodePostprocessor`` (extra ``llamaindex``).
- :mod:`ragkit.integrations.haystack`: ``RagkitRanker``, a Haystack 2 component (extra ``haystack``).

Each adapter passes the framework's retriever scores to the reranker as its prior and can lay the
kept documents out best first or in a bias-aware prompt order (``placement``). The frameworks are
imported only when an adapter module is imported.
"""

from __future__ import annotations
