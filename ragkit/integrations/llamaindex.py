"""A LlamaIndex node postprocessor for any ragkit reranker (optional extra ``llamaindex``).

>>> from ragkit.integrations.llamaindex import RagkitNodePostprocessor     # doctest: +SKIP
>>> post = RagkitNodePostprocessor(reranker=get_reranker("student:DIR"), top_n=3)  # doctest: +SKIP
>>> index.as_query_engine(node_postprocessors=[post])                       # doctest: +SKIP

The nodes' retriever scores (``NodeWithScore.score``) are the reranker's prior; the output nodes
carry the reranker's score, best first or in the chosen ``placement``.
"""

from __future__ import annotations

from typing import Any

from ragkit.integrations._common import arerank_documents, check_options, rerank_documents

try:
    from llama_index.core.bridge.pydantic import Field, PrivateAttr
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "ragkit.integrations.llamaindex needs llama-index-core; install it with "
        "`pip install 'ragkit[llamaindex]'` or `pip install llama-index-core`"
    ) from e

__all__ = ["RagkitNodePostprocessor"]


class RagkitNodePostprocessor(BaseNodePostprocessor):
    """Rerank LlamaIndex nodes with a ragkit reranker (MoI, the distilled student, a cross-encoder).

    Parameters
    ----------
    reranker
        Any ragkit reranker (``rank(query, passages, scores)``).
    top_n
        Keep the ``top_n`` best nodes (``None``: all).
    placement
        ``"none"`` (best first), ``"reverse"``, ``"both_ends"`` or ``"bias_aware"`` (see
        :func:`ragkit.integrations._common.rerank_documents`).
    profile
        Position profile for ``bias_aware``.
    use_retriever_scores
        Pass the incoming node scores to the reranker as its prior (when every node has one).
    """

    top_n: int | None = Field(default=None, description="keep the top_n best nodes (None: all)")
    placement: str = Field(default="none", description="none, reverse, both_ends or bias_aware")
    use_retriever_scores: bool = Field(default=True, description="pass node scores to the reranker as its prior")
    _reranker: Any = PrivateAttr()
    _profile: Any = PrivateAttr(default=None)

    def __init__(self, reranker: Any, top_n: int | None = None, placement: str = "none", profile: Any = None,
                 use_retriever_scores: bool = True, **kwargs: Any) -> None:
        placement = check_options(reranker, top_n, placement)
        super().__init__(top_n=top_n, placement=placement, use_retriever_scores=use_retriever_scores, **kwargs)
        self._reranker = reranker
        self._profile = profile

    @classmethod
    def class_name(cls) -> str:
        return "RagkitNodePostprocessor"

    def _args(self, nodes: list[NodeWithScore]) -> dict[str, Any]:
        return {"scores": [n.score for n in nodes] if self.use_retriever_scores else None,
                "top_n": self.top_n, "placement": self.placement, "profile": self._profile}

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None or not query_bundle.query_str.strip():
            raise ValueError("RagkitNodePostprocessor needs the query: call postprocess_nodes(nodes, query_str=...) "
                             "or use it inside a query engine")
        return query_bundle.query_str

    @staticmethod
    def _texts(nodes: list[NodeWithScore]) -> list[str]:
        return [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        nodes = list(nodes)
        if not nodes:
            return []
        picked = rerank_documents(self._reranker, self._query(query_bundle), self._texts(nodes), **self._args(nodes))
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in picked]

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        nodes = list(nodes)
        if not nodes:
            return []
        picked = await arerank_documents(self._reranker, self._query(query_bundle), self._texts(nodes),
                                         **self._args(nodes))
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in picked]
