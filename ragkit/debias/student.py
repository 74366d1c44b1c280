"""``DistilledReranker``: the one-pass cross-encoder student of Mixture-of-Intervention.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) needs ``M`` generator passes over all ``k`` passages per question;
its utilities on training questions become the targets of a cross-encoder ``f(q, p)`` that scores
each (question, passage) pair once (training: :mod:`ragkit.training.distill`). This module holds
the inference side only, so evaluation, serving and the pipeline load a student without importing
the trainers.

Residual student (:class:`ResidualReranker`)
--------------------------------------------

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

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragkit.debias.calibration import PlattCalibration
from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.debias.long_docs import LongDocs
from ragkit.io import atomic_dir, parse_json
from ragkit.types import Passage, Query, RankedList

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import CrossEncoder

__all__ = ["DistilledReranker", "META_FILE", "PRIORS", "ResidualReranker", "model_card", "normalised_prior",
           "zero_head"]

logger = logging.getLogger(__name__)

META_FILE = "ragkit_distill.json"
_META_FORMAT = "ragkit-distilled-reranker/1"


def _check_folder_files(p: Path) -> dict[str, set[str]]:
    """Refuse a student folder whose files cannot be trusted; return the tensor names of each
    safetensors weight file.

    * a file that is a symbolic link leading out of the folder (ragkit loads nothing from outside
      the folder it was given: a link could swap in any other model);
    * no ``*.safetensors`` weights (a pickled ``.bin`` is never loaded);
    * a weight file that safetensors cannot open (cut short, damaged): its header is read here, so
      the error names the file instead of surfacing as a bare ``SafetensorError``.
    """
    from safetensors import safe_open

    root = p.resolve()
    for f in sorted(p.rglob("*")):
        if f.is_symlink():
            try:
                f.resolve().relative_to(root)
            except ValueError:
                raise ValueError(
                    f"{f} is a symbolic link leading out of the student folder (to {os.path.realpath(f)}); ragkit "
                    "loads nothing from outside the folder it is given: copy the file into the folder instead"
                ) from None
    weights = sorted(p.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{p} holds no model.safetensors weights (ragkit never loads pickled .bin weights); "
                         "retrain with `ragkit distill` or save the model with safe_serialization=True")
    names: dict[str, set[str]] = {}
    for w in weights:
        try:
            with safe_open(str(w), framework="pt") as f:
                names[w.name] = set(f.keys())
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError (an Exception)
            raise ValueError(f"{w} is damaged or cut short ({e}); copy the student folder again or retrain it "
                             "with `ragkit distill`") from None
    return names


def _check_weights_cover_model(p: Path, model: Any, names: dict[str, set[str]]) -> None:
    """Every parameter of the model that ``config.json`` describes must come from the weight files:
    a config edited to one more layer (or a larger size) would otherwise load that layer randomly
    initialised, and the student would rank with it."""
    hf = getattr(model, "model", model)
    prefix = str(getattr(hf, "base_model_prefix", "") or "")

    def norm(k: str) -> str:
        return k[len(prefix) + 1:] if prefix and k.startswith(prefix + ".") else k

    have = {norm(k) for ks in names.values() for k in ks}
    missing = [k for k, _ in hf.named_parameters() if norm(k) not in have]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ValueError(
            f"{p}: config.json does not match the weights: {len(missing)} parameter(s) it describes are not in "
            f"{', '.join(sorted(names))} ({shown}), so they would be random; config.json was edited or belongs to "
            "another model: restore it, or retrain with `ragkit distill`")


class DistilledReranker(CrossEncoderReranker):
    """A cross-encoder student of MoI: one encoder pass per (query, passage) pair.

    Parameters
    ----------
    model
        A sentence-transformers ``CrossEncoder`` with one output (a raw logit per pair).
    metadata
        Training provenance saved beside the weights (base model, loss, label file, ...).
    batch_size
        Pairs per encoder forward in :meth:`score_pairs`.
    show_progress
        Progress bar in ``predict`` (``None``: off).
    max_batch_tokens, forward_cost_tokens, long_docs
        Length buckets and the long-document rule (:class:`CrossEncoderReranker`).

    Examples
    --------
    >>> student = DistilledReranker.load("students/minilm-moi")       # doctest: +SKIP
    >>> student.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris ..."]).top_k(1)  # doctest: +SKIP
    """

    name = "student"

    def __init__(
        self,
        model: CrossEncoder,
        metadata: Mapping[str, Any] | None = None,
        batch_size: int = 64,
        show_progress: bool | None = None,
        max_batch_tokens: int | None = None,
        forward_cost_tokens: int = 128,
        long_docs: LongDocs | None = None,
    ) -> None:
        super().__init__(model, batch_size=batch_size, show_progress=show_progress,
                         max_batch_tokens=max_batch_tokens, forward_cost_tokens=forward_cost_tokens,
                         long_docs=long_docs)
        self.metadata: dict[str, Any] = dict(metadata or {})

    @classmethod
    def from_base(
        cls,
        base_model: str | None = None,
        *,
        device: str = "auto",
        max_length: int = 256,
        seed: int = 0,
        batch_size: int = 64,
    ) -> DistilledReranker:
        """A fresh (untrained head) student from an encoder.

        Parameters
        ----------
        base_model
            ``None`` for the embedded all-MiniLM-L6-v2; any sentence-transformers folder, Hugging
            Face encoder or cross-encoder (path or hub id).
        device
            ``"auto"``, ``"cpu"``, ``"cuda"``, ...
        max_length
            Token limit of a (query, passage) pair; longer pairs are truncated.
        seed
            Seeds the randomly initialised scoring head.
        """
        import torch
        from sentence_transformers import CrossEncoder

        from ragkit.models import resolve_device, resolve_embedder_path

        path = resolve_embedder_path(base_model)
        torch.manual_seed(seed)
        model = CrossEncoder(
            path,
            num_labels=1,
            max_length=max_length,
            device=resolve_device(device),
            activation_fn=torch.nn.Identity(),
        )
        meta = {"base_model": base_model or "all-MiniLM-L6-v2", "base_path": path,
                "max_length": max_length, "seed": seed}
        return cls(model, meta, batch_size=batch_size)

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | os.PathLike[str], *, device: str = "auto", batch_size: int = 64,
        max_length: int | None = None, max_batch_tokens: int | None = None, forward_cost_tokens: int = 128,
        long_docs: LongDocs | None = None, backend: str = "torch",
    ) -> DistilledReranker:
        """A student from a local folder or a Hugging Face Hub id, or any one-output cross-encoder.

        A folder written by :meth:`save_pretrained` (it holds ``ragkit_distill.json``) loads with its
        training metadata (:meth:`load`); so does a hub repository made by :meth:`push_to_hub`.
        Anything else that ``sentence_transformers.CrossEncoder`` loads is wrapped as is.
        ``backend``: ``"torch"``, ``"onnx"``, ``"onnx-int8"`` or ``"openvino"`` (:meth:`with_backend`).
        """
        p = Path(name_or_path)
        if p.is_dir() and (p / META_FILE).exists():
            student = cls.load(p, device=device, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                               forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)
            if max_length is not None:
                student.model.max_length = max_length
            return student.with_backend(backend, source=str(p))
        meta: dict[str, Any] = {"base_model": str(name_or_path)}
        if not p.exists():  # a hub id: its ragkit metadata, when the repository has some
            try:
                from huggingface_hub import hf_hub_download

                raw = json.loads(Path(hf_hub_download(str(name_or_path), META_FILE)).read_text(encoding="utf-8"))
                if raw.get("format") == _META_FORMAT:
                    meta = dict(raw.get("metadata", {}))
            except Exception as e:  # noqa: BLE001 - no metadata file (or offline): a plain cross-encoder
                logger.info("%s has no readable %s (%s); loading it as a plain cross-encoder", name_or_path,
                            META_FILE, type(e).__name__)
        plain = CrossEncoderReranker.from_pretrained(str(name_or_path), device=device, max_length=max_length)
        return cls(plain.model, meta, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                   forward_cost_tokens=forward_cost_tokens, long_docs=long_docs).with_backend(
            backend, source=str(name_or_path))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str = "auto", batch_size: int = 64,
             max_batch_tokens: int | None = None, forward_cost_tokens: int = 128,
             long_docs: LongDocs | None = None, backend: str = "torch") -> DistilledReranker:
        """Load a student saved by :meth:`save` (or by ``ragkit distill``); ``max_batch_tokens`` and
        ``forward_cost_tokens`` set its length buckets, ``long_docs`` its long-document rule and
        ``backend`` its encoder backend (:class:`CrossEncoderReranker`)."""
        import torch
        from sentence_transformers import CrossEncoder

        from ragkit.models import resolve_device

        p = Path(path)
        if not p.is_dir():
            raise FileNotFoundError(f"no such reranker folder: {p}; train one with `ragkit distill`")
        meta_path = p / META_FILE
        if not meta_path.exists():
            raise ValueError(
                f"{p} is not a ragkit distilled reranker (no {META_FILE}); train one with "
                "`ragkit distill --labels FILE --out DIR`, or wrap a plain cross-encoder with "
                "DistilledReranker.from_pretrained(path)"
            )
        try:
            meta = parse_json(meta_path.read_text(encoding="utf-8"), meta_path)
        except json.JSONDecodeError as e:
            raise ValueError(f"{meta_path} is not valid JSON ({e.msg}); the folder is damaged, retrain") from e
        if meta.get("format") != _META_FORMAT:
            raise ValueError(f"{meta_path}: unknown format {meta.get('format')!r}; expected {_META_FORMAT!r}")
        names = _check_folder_files(p)
        model = CrossEncoder(str(p), device=resolve_device(device), activation_fn=torch.nn.Identity(),
                             local_files_only=True)
        _check_weights_cover_model(p, model, names)
        student = _student_class(cls, meta.get("metadata", {}))(
            model, meta.get("metadata", {}), batch_size=batch_size, max_batch_tokens=max_batch_tokens,
            forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)
        student.calibration = PlattCalibration.find(p)
        return student.with_backend(backend, source=str(p))

    def save_pretrained(self, path: str | os.PathLike[str], overwrite: bool = False,
                        card: bool = True) -> Path:
        """Save the student as a Hugging Face cross-encoder folder, atomically.

        The folder holds the weights (safetensors), config and tokenizer, ``ragkit_distill.json``
        (the training metadata) and, with ``card``, a generated model card ``README.md`` (teacher,
        labels, data, training, metrics). ``sentence_transformers.CrossEncoder(path)``,
        :meth:`from_pretrained` and ``ragkit serve --reranker student:PATH`` all load it.
        Replaces only a previous distilled reranker (or, with ``overwrite``, another ragkit artifact
        or a file); never a folder of other files (:func:`ragkit.io.check_writable_dir`).
        """
        out = Path(path)
        with atomic_dir(out, kind="reranker", overwrite=overwrite) as tmp:
            self.model.save(str(tmp), safe_serialization=True)
            meta = {"format": _META_FORMAT, "metadata": self.metadata}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False, default=str),
                                         encoding="utf-8")
            if self.calibration is not None:
                self.calibration.save(tmp)
            if card:
                (tmp / "README.md").write_text(model_card(self.metadata, out.name), encoding="utf-8")
        logger.info("saved distilled reranker to %s", out)
        return out

    def save(self, path: str | os.PathLike[str], overwrite: bool = False) -> Path:
        """:meth:`save_pretrained` (kept for the name ``ragkit distill`` has always used)."""
        return self.save_pretrained(path, overwrite=overwrite)

    def push_to_hub(self, repo_id: str, *, private: bool | None = None, token: str | None = None,
                    commit_message: str = "Upload ragkit distilled reranker") -> str:
        """Upload the :meth:`save_pretrained` folder (weights, metadata, model card) to the Hub.

        Creates ``repo_id`` when missing; returns the URL of the commit. Needs network access and a
        token (``token`` or ``huggingface-cli login``).
        """
        import tempfile

        from huggingface_hub import HfApi
        from huggingface_hub.constants import HF_HUB_OFFLINE

        if HF_HUB_OFFLINE:
            raise RuntimeError("push_to_hub needs the network but HF_HUB_OFFLINE is set; unset it (and log in "
                               "with `huggingface-cli login`) to upload")
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        with tempfile.TemporaryDirectory(prefix="ragkit-push-") as d:
            folder = self.save_pretrained(Path(d) / repo_id.split("/")[-1])
            info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message)
        return str(getattr(info, "commit_url", info))


def _comparison_lines(c: Any) -> list[str]:
    """The card's "Compared with the first stage" section (the held-out check of ``ragkit distill``)."""
    if not isinstance(c, Mapping):
        return ["## Compared with the first stage", "", "Not compared: trained without a held-out check.", ""]
    metrics = [k for k in c.get("student", {}) if k in c.get("first_stage", {})]
    verdict = "refused, saved with --force" if c.get("forced") else ("passed" if c.get("passed") else "-")
    return ["## Compared with the first stage", "",
            f"Compared with **{_fmt(c.get('first_stage_name'))}** (the candidates' given order) on "
            f"{_fmt(c.get('num_queries'))} held-out training questions, relevance from "
            f"{_fmt(c.get('relevance'))}; rule: the student may not fall below it on any metric "
            f"(tolerance {_fmt(c.get('tolerance'))}); verdict: {verdict}.", "",
            "| metric | first stage | student |", "|---|---|---|",
            *[f"| {k} | {_fmt(c['first_stage'][k])} | {_fmt(c['student'][k])} |" for k in metrics], ""]


def _student_class(cls: type[DistilledReranker], metadata: Mapping[str, Any]) -> type[DistilledReranker]:
    """The class a saved student loads as: its metadata's ``student`` recipe (``"residual"``) picks it."""
    if metadata.get("student") == "residual":
        return ResidualReranker
    return cls


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v)) if v else "-"
    return "-" if v is None or v == "" else str(v)


def model_card(metadata: Mapping[str, Any], name: str = "ragkit-student") -> str:
    """A Hugging Face model card (``README.md``) for a distilled reranker from its training metadata.

    States the teacher (Mixture-of-Intervention, Lee et al., NAACL Findings 2025, arXiv 2412.10684,
    with the label generators and sources), the labels and data, the training settings and any
    ``metadata["metrics"]``, and how to load and serve the folder.
    """
    m = dict(metadata)
    base = str(m.get("base_model") or "all-MiniLM-L6-v2")
    front = ["---", "library_name: sentence-transformers", "pipeline_tag: text-ranking", "tags:", "- ragkit",
             "- cross-encoder", "- reranker", "- distillation", "- mixture-of-intervention"]
    if "/" in base and not Path(base).exists():  # a hub id
        front.append(f"base_model: {base}")
    front.append("---")
    rows = [("student recipe", m.get("student") or "cross-encoder"), ("base encoder", base),
            ("loss", m.get("loss")), ("epochs", m.get("epochs")),
            ("batch size", m.get("batch_size")), ("learning rate", m.get("lr")),
            ("label temperature", m.get("temperature")), ("max pair length (tokens)", m.get("max_length")),
            ("seed", m.get("seed")), ("training seconds", m.get("train_seconds")),
            ("ranking loss before -> after", f"{_fmt(m.get('initial_loss'))} -> {_fmt(m.get('final_loss'))}")]
    metrics = m.get("metrics") if isinstance(m.get("metrics"), Mapping) else {}
    metric_lines = (["| metric | value |", "|---|---|", *[f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]]
                    if metrics else ["No held-out metrics were recorded with this model (ragkit's "
                                     "`experiments/distill/distill.py` measures MRR, recall and answer F1)."])
    lines = [
        *front, "", f"# {name}", "",
        "A one-pass cross-encoder reranker distilled from **Mixture-of-Intervention (MoI)** (Lee et al., "
        "\"Inference Scaling for Bridging Retrieval and Augmented Generation\", NAACL Findings 2025, "
        "arXiv 2412.10684) with ragkit. It scores each (question, passage) pair once; higher is better "
        "(a raw logit, no activation).", "",
        "## Teacher and labels", "",
        f"- teacher: MoI utilities computed with the generator(s) {_fmt(m.get('label_generators'))}",
        f"- label sources (MoI design / outcome): {_fmt(m.get('label_sources'))}",
        f"- label file: {_fmt(m.get('labels') or m.get('label_file'))}",
        f"- training questions: {_fmt(m.get('num_queries'))}", "",
        "## Training", "", "| setting | value |", "|---|---|", *[f"| {k} | {_fmt(v)} |" for k, v in rows], "",
        "## Metrics", "", *metric_lines, "", *_comparison_lines(m.get("comparison")),
        "## Use", "", "```python", "from sentence_transformers import CrossEncoder", "",
        f'model = CrossEncoder("{name}")  # this folder or hub id',
        'scores = model.predict([("Who wrote Hamlet?", "Hamlet is a play by Shakespeare.")])', "",
        "from ragkit.debias import DistilledReranker", "",
        f'reranker = DistilledReranker.from_pretrained("{name}")',
        'reranker.rank("Who wrote Hamlet?", ["Hamlet is a play by Shakespeare.", "Paris is in France."])',
        "```", "", "Serve it with Cohere- and TEI-compatible endpoints (`/v1/rerank`, `/rerank`):", "",
        "```bash", f"ragkit serve --reranker student:{name} --port 8080", "```", "",
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- residual student
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

    pointwise = False  # the position prior depends on the passage's place in the list

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
