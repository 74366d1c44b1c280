"""``ResidualReranker``: a cross-encoder student that starts exactly where its retriever stands.

A student trained from a fresh scoring head must first learn everything the first stage already
knows; on a few hundred questions it ends below the retriever it replaces. The residual student
keeps the retriever's order as a prior and learns only a correction:

    s(q, p_i) = w · z_i + f(q, p_i),    z = (r − mean(r)) / std(r)   (per query; 0 when std = 0)

with ``r`` the first stage's evidence for the passages of one query and ``f`` a cross-encoder
whose scoring head (the final linear layer) is initialised at zero, so that ``f ≡ 0`` and the
student ranks exactly like the retriever before any training step; gradients reach the head at
once (``∂s/∂W = h``, the encoder's pooled state) and the encoder from the second step on.

``r`` (``prior``, saved with the student):

* ``"rank"`` (default): ``r_i = −i``, the passage's position in the given (retriever) order. It
  needs no score, is the same at training time (label files keep the retriever order, not its
  scores) and at serving time (documents arrive in retriever order), and is immune to the scale
  of BM25 versus cosine scores.
* ``"score"``: the retriever scores passed to :meth:`rank_many` (z-scored per query), falling
  back to ``"rank"`` when a call has none.

Training: :func:`ragkit.training.distill.train_residual_student`. Saved folders are ordinary
distilled-reranker folders (``ragkit_distill.json`` names ``student: residual``), so
:meth:`DistilledReranker.load`, ``student:PATH`` and ``ragkit serve`` load them as residual
students; ``sentence_transformers.CrossEncoder(path)`` loads the correction ``f`` alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ragkit.debias.student import DistilledReranker
from ragkit.types import Passage, Query, RankedList

__all__ = ["PRIORS", "ResidualReranker", "normalised_prior", "zero_head"]

logger = logging.getLogger(__name__)

PRIORS = ("rank", "score")


def normalised_prior(n: int, scores: Sequence[float] | None = None) -> np.ndarray:
    """Per-query z-scored retriever evidence ``z``: of ``scores`` when given, else of ``−position``.

    ``z = (r − mean(r)) / std(r)`` (population std); all zeros when every ``r`` is equal. The
    z-score is strictly increasing in ``r``, so ``argsort(−z)`` is the retriever order.
    """
    r = -np.arange(n, dtype=np.float64) if scores is None else np.asarray(scores, dtype=np.float64)
    if r.shape != (n,):
        raise ValueError(f"{n} passages but {r.size} retriever scores")
    sd = float(r.std())
    return np.zeros(n) if sd < 1e-12 else (r - r.mean()) / sd


def zero_head(model: Any) -> str:
    """Zero the scoring head (the last ``Linear`` with one output) of a one-output cross-encoder.

    Returns the head's module name. Raises ``ValueError`` when the model has no such layer.
    """
    import torch

    heads = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not heads:
        raise ValueError(f"{type(model).__name__} has no one-output linear scoring head to initialise at zero; "
                         "start the residual student from an encoder or a one-output cross-encoder")
    name, head = heads[-1]
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    return name


class ResidualReranker(DistilledReranker):
    """``s = w · z(retriever) + f(q, p)``: a residual cross-encoder student (module docstring).

    Parameters
    ----------
    model, metadata, batch_size, show_progress, max_batch_tokens, forward_cost_tokens, long_docs
        As :class:`DistilledReranker`; ``metadata["prior"]`` (``"rank"`` or ``"score"``) and
        ``metadata["prior_weight"]`` (``w``, default 1.0) set the prior.
    """

    name = "residual"

    def __init__(self, model: Any, metadata: Any = None, **kwargs: Any) -> None:
        super().__init__(model, metadata, **kwargs)
        self.metadata.setdefault("student", "residual")
        self.metadata.setdefault("prior", "rank")
        self.metadata.setdefault("prior_weight", 1.0)
        if self.metadata["prior"] not in PRIORS:
            raise ValueError(f"unknown residual prior {self.metadata['prior']!r}; choose one of {PRIORS}")

    @property
    def prior_weight(self) -> float:
        return float(self.metadata["prior_weight"])

    @classmethod
    def from_base(cls, base_model: str | None = None, *, device: str = "auto", max_length: int = 256,
                  seed: int = 0, batch_size: int = 64, prior: str = "rank",
                  prior_weight: float = 1.0) -> ResidualReranker:
        """A fresh residual student: the encoder with a zero scoring head (ranks like the retriever).

        ``prior`` and ``prior_weight`` are ``r`` and ``w`` of the module docstring.
        """
        if prior not in PRIORS:
            raise ValueError(f"unknown residual prior {prior!r}; choose one of {PRIORS}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        base = DistilledReranker.from_base(base_model, device=device, max_length=max_length, seed=seed,
                                           batch_size=batch_size)
        head = zero_head(base.model)
        meta = {**base.metadata, "student": "residual", "prior": prior, "prior_weight": float(prior_weight),
                "zero_head": head}
        return cls(base.model, meta, batch_size=batch_size)

    def prior(self, n: int, scores: Sequence[float] | None) -> np.ndarray:
        """``w · z`` for one query's ``n`` passages (``scores`` are used only with ``prior="score"``)."""
        use = scores if self.metadata["prior"] == "score" else None
        return self.prior_weight * normalised_prior(n, use)

    def _rank_many(
        self,
        queries: list[Query],
        passages: list[list[Passage]],
        scores: list[list[float] | None],
    ) -> list[RankedList]:
        corrected = super()._rank_many(queries, passages, scores)  # f(q, p), sorted; one encoder pass per pair
        out = []
        for q, ps, s, rl in zip(queries, passages, scores, corrected):
            where = {id(p): i for i, p in enumerate(ps)}
            f = np.zeros(len(ps))
            for h in rl:
                f[where[id(h.passage)]] = h.score
            for i, p in enumerate(ps):  # the same Passage object twice: one hit, one score
                f[i] = f[where[id(p)]]
            out.append(RankedList.from_scores(ps, (self.prior(len(ps), s) + f).tolist(), q, info=rl.info))
        return out
