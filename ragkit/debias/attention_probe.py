"""``moi_attn``: a one-pass reranker that reads the generator's attention, fitted to leave-one-out.

MoI's leave-one-out (Lee et al., NAACL Findings 2025, arXiv 2412.10684) costs ``k + 1`` generator
sequences per question. AT2 (Cohen-Wang et al., "Learning to Attribute with Attention", arXiv
2504.13752) shows that a linear probe over per-head attention weights, fitted to ablation
(leave-one-out) effects, recovers them from one forward pass; ICR (Chen et al., ICLR 2025, arXiv
2410.02642) reads passage relevance from the attention the query pays to each passage. This
reranker combines them:

* one forward of the generator over all candidates in ICR's layout (instruction, passages, then
  ``Query:`` and the question; :mod:`ragkit.debias.icr`: the passages are prefilled once and the
  question row runs with eager attention);
* features: for each layer ``l`` and head ``h``, the attention mass from the question tokens ``Q``
  to passage ``i``'s tokens ``T_i``,

      x_i[l·H + h] = Σ_{t ∈ T_i} mean_{j ∈ Q} A_{l,h}[j, t]     (shape: n_passages × layers·heads);

  with ``calibrated`` probes the same mass under the content-free query ``"N/A"`` is subtracted
  (ICR's calibration; its row shares the forward);
* score: ``s_i = Σ_f w_f x_i[f] / σ_f``, a ridge probe fitted on training questions to their
  leave-one-out utilities ``u`` (per query z-scored, or centred): with per-query centred features
  ``x̃`` scaled by their standard deviations ``σ``, ``w = argmin Σ_q ‖X̃_q w − ỹ_q‖² + λ n ‖w‖²``
  (closed form, ``n`` the number of passages). Per-query centring makes the probe blind to what
  is common to all passages of a question, which does not change a ranking.

A probe is a small JSON file (weights, scales, the generator's fingerprint and the feature layout;
never a pickle) checked against the generator it runs on. The default location of a generator's
probe is ``ragkit/data/probes/<fingerprint>.json``; :func:`fit_attention_probe` (or ``ragkit
distill probe``) fits one from MoI label records. Fidelity to exact leave-one-out:
:func:`spearman_fidelity` and :func:`top_k_agreement`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.debias.icr import ICRReranker
from ragkit.generation.base import GeneratorLike, metered
from ragkit.io import append_jsonl, atomic_write_text, read_appended_jsonl
from ragkit.reranking import Reranker
from ragkit.types import Passage, Query, RankedList, RankInfo

__all__ = ["PROBE_FORMAT", "PROBE_DIR", "AttentionProbe", "AttentionProbeReranker", "attention_features",
           "attention_feature_table", "default_probe_path", "fit_attention_probe", "model_fingerprint",
           "spearman_fidelity", "top_k_agreement"]

logger = logging.getLogger(__name__)

PROBE_FORMAT = "ragkit-attention-probe/1"
PROBE_DIR = Path(__file__).resolve().parent.parent / "data" / "probes"
"""Where committed probes live, one ``<model-fingerprint>.json`` per generator."""
FEATURES_FORMAT = "ragkit-attention-features/1"
"""The format tag of a feature cache's rows (:func:`attention_feature_table`)."""
FEATURE_LAYOUT = ("x[l*heads + h] = sum over the passage's prompt tokens of the mean over the question tokens of "
                  "layer l head h's attention weight (ICR layout); calibrated: minus the same for the query 'N/A'")


def model_fingerprint(generator: Any) -> str:
    """``<name>-<12 hex>``: the generator's file name and a hash of its architecture and vocabulary.

    The hash covers the config fields that fix the attention features' meaning (model type,
    layers, heads, key/value heads, hidden size, vocabulary size) and the tokenizer's vocabulary
    size, so a probe never runs on another model by accident, wherever the file lies.
    """
    model = getattr(generator, "model", None)
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise ValueError(f"{type(generator).__name__} has no local model config; moi_attn needs a local Hugging Face "
                         "model (use a local --model, not a server URL)")
    keys = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
            "intermediate_size", "vocab_size")
    arch = {k: getattr(cfg, k, None) for k in keys}
    tok = getattr(generator, "tokenizer", None)
    arch["tokenizer_size"] = len(tok) if tok is not None else None
    digest = hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:12]
    raw = str(getattr(generator, "name", "") or getattr(cfg, "_name_or_path", "") or "model")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(raw.rstrip("/")).name).strip("-.").lower() or "model"
    return f"{name[:60]}-{digest}"


def default_probe_path(generator: Any) -> Path:
    """``<dir>/<model_fingerprint(generator)>.json``, ``<dir>`` = ``$RAGKIT_PROBE_DIR`` when set, else
    ``ragkit/data/probes`` (the committed probes)."""
    return Path(os.environ.get("RAGKIT_PROBE_DIR") or PROBE_DIR) / f"{model_fingerprint(generator)}.json"


def _zscore(u: Sequence[float]) -> np.ndarray:
    a = np.asarray(u, dtype=np.float64)
    sd = float(a.std())
    return np.zeros_like(a) if sd < 1e-12 else (a - a.mean()) / sd


@dataclass
class AttentionProbe:
    """A linear probe over per-head attention features (module docstring): ``s = (x / scale) · weights``."""

    weights: np.ndarray
    scale: np.ndarray
    layers: int
    heads: int
    model_fingerprint: str = ""
    calibrated: bool = True
    ridge: float = 1.0
    target: str = "zscore"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights, dtype=np.float64).reshape(-1)
        self.scale = np.asarray(self.scale, dtype=np.float64).reshape(-1)
        n = self.layers * self.heads
        if self.weights.shape != (n,) or self.scale.shape != (n,):
            raise ValueError(f"probe has {self.weights.size} weights and {self.scale.size} scales for "
                             f"{self.layers} layers x {self.heads} heads = {n} features")
        if not (np.all(np.isfinite(self.weights)) and np.all(self.scale > 0)):
            raise ValueError("probe weights must be finite and scales positive; refit it with fit_attention_probe")

    def score(self, features: np.ndarray) -> np.ndarray:
        """Scores of one question's passages from their ``(n_passages, layers*heads)`` features."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.weights.size:
            raise ValueError(f"features of shape {x.shape}; this probe reads (n_passages, {self.weights.size})")
        return (x / self.scale) @ self.weights

    @classmethod
    def fit(cls, features: Sequence[np.ndarray], utilities: Sequence[Sequence[float]], *, layers: int, heads: int,
            ridge: float = 1.0, target: str = "zscore", **kw: Any) -> AttentionProbe:
        """Ridge fit of per-query centred, globally scaled features to per-query normalised utilities.

        ``target``: ``"zscore"`` (each question weighs the same) or ``"center"`` (``u − mean(u)``,
        the utilities' own scale). ``ridge`` is ``λ`` of the module docstring.
        """
        if target not in ("zscore", "center"):
            raise ValueError(f"target must be 'zscore' or 'center', got {target!r}")
        if ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {ridge}")
        if len(features) != len(utilities) or not features:
            raise ValueError(f"{len(features)} feature matrices but {len(utilities)} utility lists; need >= 1 of each")
        xs, ys = [], []
        for x, u in zip(features, utilities):
            x = np.asarray(x, dtype=np.float64)
            if x.shape != (len(u), layers * heads):
                raise ValueError(f"features of shape {x.shape} for {len(u)} utilities; expected "
                                 f"({len(u)}, {layers * heads})")
            xs.append(x - x.mean(0, keepdims=True))
            ua = np.asarray(u, dtype=np.float64)
            ys.append(_zscore(ua) if target == "zscore" else ua - ua.mean())
        X, y = np.concatenate(xs), np.concatenate(ys)
        scale = X.std(0)
        scale = np.where(scale > 1e-12, scale, 1.0)
        Xs = X / scale
        w = np.linalg.solve(Xs.T @ Xs + ridge * len(y) * np.eye(Xs.shape[1]), Xs.T @ y)
        return cls(w, scale, layers, heads, ridge=ridge, target=target, **kw)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {"format": PROBE_FORMAT, "model_fingerprint": self.model_fingerprint, "layers": self.layers,
                "heads": self.heads, "calibrated": self.calibrated, "feature_layout": FEATURE_LAYOUT,
                "ridge": self.ridge, "target": self.target, "scale": self.scale.tolist(),
                "weights": self.weights.tolist(), "metadata": self.metadata}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the probe as JSON, atomically."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AttentionProbe:
        """Read a probe written by :meth:`save`; a clear error for a missing or damaged file."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no attention probe at {p}; fit one with `ragkit distill probe --labels "
                                    "LABELS.jsonl --model MODEL` or ragkit.debias.attention_probe.fit_attention_probe")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not valid JSON ({e.msg}); refit the probe") from None
        if not isinstance(d, dict) or d.get("format") != PROBE_FORMAT:
            raise ValueError(f"{p} is not a ragkit attention probe (format {PROBE_FORMAT!r})")
        try:
            return cls(np.asarray(d["weights"]), np.asarray(d["scale"]), int(d["layers"]), int(d["heads"]),
                       model_fingerprint=str(d.get("model_fingerprint", "")),
                       calibrated=bool(d.get("calibrated", True)), ridge=float(d.get("ridge", 1.0)),
                       target=str(d.get("target", "zscore")), metadata=dict(d.get("metadata") or {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{p}: probe field missing or malformed ({e}); refit the probe") from None


def attention_features(icr: ICRReranker, question: str, passages: Sequence[Passage], calibrated: bool = True
                       ) -> np.ndarray:
    """``(n_passages, layers*heads)`` attention-mass features of one question (module docstring)."""
    p_ids, q_ids, n_ids, spans = icr.encode(question, passages)
    a = icr.token_attention(p_ids, [q_ids, n_ids] if calibrated else [q_ids], per_head=True)  # (rows, L, H, n_p)
    c = a[0] - a[1] if calibrated else a[0]
    layers, heads = c.shape[0], c.shape[1]
    flat = c.reshape(layers * heads, -1)
    out = np.zeros((len(passages), layers * heads))
    for i, toks in enumerate(spans):
        if len(toks):
            out[i] = flat[:, np.asarray(toks, dtype=np.int64)].sum(1)
    return out


class AttentionProbeReranker(Reranker):
    """``moi_attn``: rank by a leave-one-out-fitted probe over per-head attention (module docstring).

    Parameters
    ----------
    generator
        A local :class:`ragkit.generation.Generator` (attention weights need the model itself).
    probe
        An :class:`AttentionProbe` or the path of its JSON file; ``None``: the committed probe of
        this generator, :func:`default_probe_path`.
    """

    name = "moi_attn"

    def __init__(self, generator: GeneratorLike, probe: AttentionProbe | str | os.PathLike[str] | None = None) -> None:
        self.icr = ICRReranker(generator)
        self.generator = generator
        fp = model_fingerprint(generator)
        if probe is None:
            path = default_probe_path(generator)
            if not path.is_file():
                raise FileNotFoundError(
                    f"no attention probe for this generator (fingerprint {fp}) at {path}; fit one with `ragkit "
                    "distill probe --labels LABELS.jsonl --model MODEL` (labels from `ragkit distill labels`), or "
                    "ragkit.debias.attention_probe.fit_attention_probe, and pass it with probe=PATH / --probe PATH")
            probe = path
        self.probe = probe if isinstance(probe, AttentionProbe) else AttentionProbe.load(probe)
        if self.probe.model_fingerprint and self.probe.model_fingerprint != fp:
            raise ValueError(f"the attention probe was fitted for {self.probe.model_fingerprint}, not this generator "
                             f"({fp}); fit one for it with `ragkit distill probe`")
        cfg = generator.model.config
        shape = (getattr(cfg, "num_hidden_layers", None), getattr(cfg, "num_attention_heads", None))
        if shape != (self.probe.layers, self.probe.heads):
            raise ValueError(f"the probe reads {self.probe.layers} layers x {self.probe.heads} heads; the generator "
                             f"has {shape[0]} x {shape[1]}; fit a probe for it with `ragkit distill probe`")

    def features(self, question: str, passages: Sequence[Passage]) -> np.ndarray:
        """``(n_passages, layers*heads)`` features of one question."""
        return attention_features(self.icr, question, passages, self.probe.calibrated)

    def _rank_many(self, queries: list[Query], passages: list[list[Passage]],
                   scores: list[list[float] | None]) -> list[RankedList]:
        del scores  # the probe reads attention alone; ties keep the retriever order
        rows = 2 if self.probe.calibrated else 1
        out = []
        for q, ps in zip(queries, passages):
            with metered() as cost:
                s = self.probe.score(self.features(q.text, ps))
            out.append(RankedList.from_scores(ps, s.tolist(), q, info=RankInfo(
                generator_calls=rows, forward_passes=cost.forward_passes, tokens_prefilled=cost.tokens_prefilled)))
        return out


def _feature_key(fingerprint: str, calibrated: bool, question: str, passages: Sequence[Passage]) -> str:
    """A hash of everything one question's features depend on: model, calibration, question, passages."""
    blob = json.dumps([FEATURES_FORMAT, fingerprint, bool(calibrated), question,
                       [[p.id, p.title, p.text] for p in passages]], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def attention_feature_table(generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                            *, calibrated: bool = True, cache: str | os.PathLike[str] | None = None,
                            show_progress: bool | None = None) -> list[np.ndarray]:
    """The :func:`attention_features` of many questions, one generator forward each.

    Parameters
    ----------
    generator
        A local generator (the attention weights need the model itself).
    questions, passages
        The questions and each one's candidate passages.
    calibrated
        Subtract the content-free query's attention (ICR's calibration).
    cache
        A JSONL file that makes a long run resumable: each question's features are appended (and
        fsynced) as soon as they are computed, keyed by a hash of the model's fingerprint, the
        calibration, the question and its passages; a later call reads back every question it
        finds there and computes only the others. Fitting a probe on a few hundred questions is
        hours of CPU, and an interrupted run should not pay them again. JSON floats round-trip
        exactly, so features read back equal the computed ones. A torn last line (a killed write)
        is dropped and that question computed again. ``None``: nothing is stored.
    show_progress
        Show a progress bar (``None``: ragkit's default).
    """
    from ragkit.io import progress

    if len(questions) != len(passages):
        raise ValueError(f"{len(questions)} questions but {len(passages)} passage lists")
    icr = ICRReranker(generator)
    fp = model_fingerprint(generator)
    keys = [_feature_key(fp, calibrated, q, ps) for q, ps in zip(questions, passages)]
    stored: dict[str, np.ndarray] = {}
    if cache is not None:
        for row in read_appended_jsonl(cache):
            if isinstance(row, dict) and row.get("format") == FEATURES_FORMAT and "key" in row:
                stored[str(row["key"])] = np.asarray(row["features"], dtype=np.float64)
        if stored:
            logger.info("%s: %d of %d questions' attention features read back", cache,
                        sum(k in stored for k in keys), len(keys))
    out: list[np.ndarray] = []
    for key, q, ps in progress(list(zip(keys, questions, passages)), show=show_progress, desc="attention features"):
        x = stored.get(key)
        if x is None or x.ndim != 2 or x.shape[0] != len(ps):  # not stored (or a damaged row): compute
            x = attention_features(icr, q, ps, calibrated)
            if cache is not None:
                append_jsonl(cache, [{"format": FEATURES_FORMAT, "key": key, "features": x.tolist()}])
            stored[key] = x
        out.append(x)
    return out


def fit_attention_probe(generator: GeneratorLike, questions: Sequence[str], passages: Sequence[Sequence[Passage]],
                        utilities: Sequence[Sequence[float]], *, ridge: float = 1.0, target: str = "zscore",
                        calibrated: bool = True, out: str | os.PathLike[str] | None = None,
                        show_progress: bool | None = None, metadata: dict[str, Any] | None = None,
                        cache: str | os.PathLike[str] | None = None) -> AttentionProbe:
    """Fit a ``moi_attn`` probe on training questions and their leave-one-out utilities.

    ``utilities[q][i]`` is passage ``i``'s MoI utility for question ``q`` (label records of
    ``ragkit distill labels``: ``lab.u``). One generator forward per question. ``out``: where to
    save the JSON (``None``: not saved; the default location is :func:`default_probe_path`).
    ``cache``: a JSONL file of computed features that makes the fit resumable
    (:func:`attention_feature_table`). The probe's ``metadata["train_fidelity"]`` holds its
    Spearman and top-3 agreement on the questions it was fitted on.
    """
    cfg = generator.model.config
    layers, heads = int(cfg.num_hidden_layers), int(cfg.num_attention_heads)
    feats = attention_feature_table(generator, questions, passages, calibrated=calibrated, cache=cache,
                                    show_progress=show_progress)
    probe = AttentionProbe.fit(feats, utilities, layers=layers, heads=heads, ridge=ridge, target=target,
                               model_fingerprint=model_fingerprint(generator), calibrated=calibrated,
                               metadata=dict(metadata or {}))
    pred = [probe.score(x) for x in feats]
    probe.metadata.update({"num_queries": len(feats), "train_fidelity": {
        "spearman": spearman_fidelity(pred, utilities), "top3_agreement": top_k_agreement(pred, utilities, 3)}})
    if out is not None:
        probe.save(out)
    return probe


def spearman_fidelity(predicted: Sequence[Sequence[float]], exact: Sequence[Sequence[float]]) -> float:
    """Mean over questions of the Spearman correlation between predicted and exact leave-one-out scores.

    Questions where either side is constant (no defined correlation) are left out; NaN when none is left.
    """
    from scipy.stats import spearmanr

    vals = []
    for p, e in zip(predicted, exact):
        p, e = np.asarray(p, dtype=float), np.asarray(e, dtype=float)
        if len(p) != len(e):
            raise ValueError(f"{len(p)} predicted but {len(e)} exact scores for one question")
        if len(p) < 2 or np.ptp(p) == 0 or np.ptp(e) == 0:
            continue
        vals.append(float(spearmanr(p, e).statistic))
    return float(np.mean(vals)) if vals else float("nan")


def top_k_agreement(predicted: Sequence[Sequence[float]], exact: Sequence[Sequence[float]], k: int = 3) -> float:
    """Mean over questions of ``|top_k(predicted) ∩ top_k(exact)| / min(k, n)`` (ties: given order)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    vals = []
    for p, e in zip(predicted, exact):
        n = min(k, len(p))
        top_p = set(sorted(range(len(p)), key=lambda i: (-float(p[i]), i))[:n])
        top_e = set(sorted(range(len(e)), key=lambda i: (-float(e[i]), i))[:n])
        vals.append(len(top_p & top_e) / n)
    return float(np.mean(vals)) if vals else float("nan")
