"""``DistilledReranker``: the one-pass cross-encoder student of Mixture-of-Intervention.

MoI (Lee et al., "Inference Scaling for Bridging Retrieval and Augmented Generation", NAACL
Findings 2025, arXiv 2412.10684) needs ``M`` generator passes over all ``k`` passages per question;
its utilities on training questions become the targets of a cross-encoder ``f(q, p)`` that scores
each (question, passage) pair once (training: :mod:`ragkit.training.distill`). This module holds
the inference side only, so evaluation, serving and the pipeline load a student without importing
the trainers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragkit.debias.cross_encoder import CrossEncoderReranker
from ragkit.debias.long_docs import LongDocs
from ragkit.io import atomic_dir, parse_json

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import CrossEncoder

__all__ = ["DistilledReranker", "META_FILE", "model_card"]

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
        long_docs: LongDocs | None = None,
    ) -> DistilledReranker:
        """A student from a local folder or a Hugging Face Hub id, or any one-output cross-encoder.

        A folder written by :meth:`save_pretrained` (it holds ``ragkit_distill.json``) loads with its
        training metadata (:meth:`load`); so does a hub repository made by :meth:`push_to_hub`.
        Anything else that ``sentence_transformers.CrossEncoder`` loads is wrapped as is.
        """
        p = Path(name_or_path)
        if p.is_dir() and (p / META_FILE).exists():
            student = cls.load(p, device=device, batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                               forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)
            if max_length is not None:
                student.model.max_length = max_length
            return student
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
                   forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, device: str = "auto", batch_size: int = 64,
             max_batch_tokens: int | None = None, forward_cost_tokens: int = 128,
             long_docs: LongDocs | None = None) -> DistilledReranker:
        """Load a student saved by :meth:`save` (or by ``ragkit distill``); ``max_batch_tokens`` and
        ``forward_cost_tokens`` set its length buckets and ``long_docs`` its long-document rule
        (:class:`CrossEncoderReranker`)."""
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
        return cls(model, meta.get("metadata", {}), batch_size=batch_size, max_batch_tokens=max_batch_tokens,
                   forward_cost_tokens=forward_cost_tokens, long_docs=long_docs)

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
    rows = [("base encoder", base), ("loss", m.get("loss")), ("epochs", m.get("epochs")),
            ("batch size", m.get("batch_size")), ("learning rate", m.get("lr")),
            ("label temperature", m.get("temperature")), ("max pair length (tokens)", m.get("max_length")),
            ("seed", m.get("seed")), ("training seconds", m.get("train_seconds")),
            ("ranking loss before -> after", f"{_fmt(m.get('initial_loss'))} -> {_fmt(m.get('final_loss'))}")]
    metrics = m.get("metrics") if isinstance(m.get("metrics"), Mapping) else {}
    metric_lines = (["| metric | value |", "|---|---|", *[f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]]
                    if metrics else ["No held-out metrics were recorded with this model (ragkit's "
                                     "`benchmarks/distill.py` measures MRR, recall and answer F1)."])
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
        "## Metrics", "", *metric_lines, "",
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
