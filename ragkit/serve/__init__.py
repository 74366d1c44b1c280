"""``ragkit serve``: any ragkit reranker behind Cohere- and TEI-compatible HTTP endpoints.

>>> from ragkit.serve import ServeSettings, create_app, run        # doctest: +SKIP
>>> app = create_app(reranker, ServeSettings(max_batch_size=16))   # doctest: +SKIP
>>> run(app, host="127.0.0.1", port=8080)                          # doctest: +SKIP

Needs the ``serve`` extra (``starlette``, ``uvicorn``, ``prometheus-client``).
"""

from __future__ import annotations

from typing import Any

from ragkit.serve.app import RequestError, create_app
from ragkit.serve.batcher import MicroBatcher, QueueFullError
from ragkit.serve.scoring import PairBatchScorer
from ragkit.serve.settings import ServeSettings

__all__ = ["MicroBatcher", "PairBatchScorer", "QueueFullError", "RequestError", "ServeSettings", "create_app", "run"]


def run(app: Any, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info") -> None:
    """Serve ``app`` with uvicorn until interrupted (one process: the model is loaded once)."""
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("ragkit serve needs uvicorn; install it with `pip install 'ragkit[serve]'`") from e
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
