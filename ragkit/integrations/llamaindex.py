"""A LlamaIndex node postprocessor for any ragkit reranker (optional extra ``llamaindex``).

>>> from ragkit.integrations.llamaindex import RagkitNodePostprocessor     # doctest: +SKIP
>>> post = RagkitNodePostprocessor(reranker=get_reranker("student:DIR"), top_n=3)  # doctest: +SKIP
>>> index.as_query_engine(node_postprocessors=[post])                       # doctest: +SKIP

The nodes' retriever scores (``NodeWithScore.score``) are the reranker's prior; the output nodes
carry the reranker's score, best first or in the chosen ``placement``.
"""

from __future__ import annotations

from typing import Any

from ragkit.integrations._common import DocumentReranker, require

require("llama_index.core", "ragkit.integrations.llamaindex", "llamaindex", "llama-index-core")
from llama_index.core.bridge.pydantic import Field, PrivateAttr  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle  # noqa: E402

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
        :class:`ragkit.integrations._common.DocumentReranker`).
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
        placement = DocumentReranker(reranker, top_n, placement, profile).placement  # checks the options
        super().__init__(top_n=top_n, placement=placement, use_retriever_scores=use_retriever_scores, **kwargs)
        self._reranker = reranker
        self._profile = profile

    @classmethod
    def class_name(cls) -> str:
        return "RagkitNodePostprocessor"

    def _core(self) -> DocumentReranker:
        return DocumentReranker(self._reranker, self.top_n, self.placement, self._profile)

    def _inputs(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None
                ) -> tuple[str, list[str], None, list[float | None] | None]:
        if query_bundle is None or not query_bundle.query_str.strip():
            raise ValueError("RagkitNodePostprocessor needs the query: call postprocess_nodes(nodes, query_str=...) "
                             "or use it inside a query engine")
        return (query_bundle.query_str, [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes], None,
                [n.score for n in nodes] if self.use_retriever_scores else None)

    def _postprocess_nodes(self, nodes: list[NodeWithScore],
                           query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        nodes = list(nodes)
        if not nodes:
            return []
        picked = self._core().rerank(*self._inputs(nodes, query_bundle))
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in picked]

    async def _apostprocess_nodes(self, nodes: list[NodeWithScore],
                                  query_bundle: QueryBundle | None = None) -> list[NodeWithScore]:
        nodes = list(nodes)
        if not nodes:
            return []
        picked = await self._core().arerank(*self._inputs(nodes, query_bundle))
        return [NodeWithScore(node=nodes[i].node, score=s) for i, s in picked]
