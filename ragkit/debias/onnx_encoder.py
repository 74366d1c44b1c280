"""Exported-graph backends of the cross-encoder rerankers: ``backend="onnx"``, ``"onnx-int8"``, ``"openvino"``.

A cross-encoder on CPU is compute-bound: merging requests gains nothing once the encoder's
matrix products fill the cores. ONNX Runtime runs the same graph with fused operators, and
dynamic int8 quantisation (weights stored as int8, activations quantised per batch at run time,
``y = s_x s_w (x_q W_q)``; Jacob et al., "Quantization and Training of Neural Networks for
Efficient Integer-Arithmetic-Only Inference", CVPR 2018, arXiv 1712.05877) replaces the float
matrix products by integer ones, which CPUs with VNNI instructions run several times faster.
These are the two CPU speed-ups sentence-transformers documents for its cross-encoders
(``CrossEncoder(..., backend="onnx")`` and ``export_dynamic_quantized_onnx_model``).

sentence-transformers reaches ONNX Runtime through ``optimum-onnx``, whose releases pin
``transformers < 4.58``, while ragkit needs ``transformers >= 5``; this module therefore does the
same two steps itself: the Hugging Face model behind the ``CrossEncoder`` is exported with
``torch.onnx.export`` (dynamic batch and sequence axes), and the int8 variant is made with
``onnxruntime.quantization.quantize_dynamic`` (int8 weights of the ``MatMul`` operators, one
scale per output channel). Per-channel scales keep the ranking closer to torch's than the per-tensor
scales of sentence-transformers' ``avx512_vnni`` preset at the same speed: on a MiniLM-L6 student
trained one epoch (the 100 bundled HotpotQA questions, 10 paragraphs each), the same top-3 in order
on 70% of the questions against 54%, mean Spearman 0.978 against 0.959 (static QDQ quantisation
with MinMax calibration: 21%). The exported files follow sentence-transformers' layout
(``onnx/model.onnx``, ``onnx/model_qint8_per_channel.onnx``) in a cache
folder keyed by a hash of the weights (``$RAGKIT_CACHE/onnx``, default ``~/.cache/ragkit/onnx``):
a model is exported once, and a user's model folder is never written to. A folder that already
holds ``onnx/model.onnx`` (as many hub cross-encoders do) is used as it is.

:class:`OnnxCrossEncoder` answers ``predict(pairs, batch_size=...)`` like a ``CrossEncoder``, so
:class:`~ragkit.debias.cross_encoder.CrossEncoderReranker` (and the student) take it as their
model unchanged. Needs the ``onnx`` extra (``onnx``, ``onnxruntime``).

``backend="openvino"`` (:class:`OpenVinoCrossEncoder`, the ``openvino`` extra: ``openvino``, and
``onnx`` for the export) is the third CPU backend sentence-transformers offers: OpenVINO Runtime
reads the same fp32 ``onnx/model.onnx`` (``Core.read_model``) and compiles it for the CPU with its
own fused kernels, so one exporter and one cache folder serve both engines, and
:class:`ExportedCrossEncoder` holds the tokenise-batch-run loop they share. It is compiled with
``INFERENCE_PRECISION_HINT=f32``: on CPUs with bf16 instructions (AVX512-BF16, AMX) OpenVINO runs
the matrix products in bfloat16 by default, which on all-MiniLM-L6-v2 with an untrained one-logit
head moved the scores by up to 5e-4 (4% of their standard deviation over 20 bundled questions)
where fp32 stays within 1e-7 of torch; the backend keeps torch's scores, and bfloat16 is a
speed/accuracy trade to measure first. ``INFERENCE_NUM_THREADS`` is torch's thread count unless
told, as for ONNX Runtime, and ``PERFORMANCE_HINT=LATENCY`` gives one call (a served micro-batch)
all of them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BACKENDS", "ExportedCrossEncoder", "OnnxCrossEncoder", "OpenVinoCrossEncoder", "check_backend",
           "export_onnx", "to_backend", "weights_hash"]

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino")
"""Encoder backends of the cross-encoder rerankers."""

_FILES = {"onnx": "model.onnx", "onnx-int8": "model_qint8_per_channel.onnx", "openvino": "model.onnx"}
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _need(modules: Sequence[str], what: str, extra: str) -> Any:
    """The last of ``modules`` imported, or an ``ImportError`` naming the missing one and ``ragkit[extra]``
    (``what``: what needs them, with its verb)."""
    import importlib

    try:
        return [importlib.import_module(m) for m in modules][-1]
    except ImportError as e:
        raise ImportError(f"{what} {' and '.join(modules)} ({e.name or modules[-1]} is missing); install "
                          f"{'it' if len(modules) == 1 else 'them'} with `pip install 'ragkit[{extra}]'`, or use "
                          "backend='torch'") from e


def _need_onnx() -> Any:
    return _need(("onnx", "onnxruntime"), "the ONNX backends need", "onnx")


def _need_openvino() -> Any:
    return _need(("openvino",), "backend='openvino' needs", "openvino")


def _need_exporter() -> None:
    """``torch.onnx.export`` writes its graph through the ``onnx`` package (ONNX Runtime is not needed)."""
    _need(("onnx",), "exporting to ONNX needs", "onnx")


def check_backend(backend: str) -> str:
    """``backend`` when it is one of :data:`BACKENDS`, else a ``ValueError`` naming them."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def _cache_root() -> Path:
    return Path(os.environ.get("RAGKIT_CACHE", Path.home() / ".cache" / "ragkit")) / "onnx"


def weights_hash(model: Any) -> str:
    """A hash of the model's weights, names and config (what the exported graph depends on)."""
    h = hashlib.sha256()
    h.update(model.config.to_json_string().encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


class _Logits:
    """``model(**inputs).logits`` as a module of positional tensors (what ``torch.onnx.export`` traces)."""

    @staticmethod
    def wrap(model: Any, names: Sequence[str]) -> Any:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                return self.model(**dict(zip(names, args))).logits

        return Wrapped()


def export_onnx(cross_encoder: Any, folder: str | os.PathLike[str] | None = None, *, int8: bool = True) -> Path:
    """Export a sentence-transformers ``CrossEncoder`` to ONNX (fp32 and, with ``int8``, its int8 variant).

    Only the ``onnx`` package is needed for the fp32 graph; ``int8`` also needs ONNX Runtime.

    Parameters
    ----------
    cross_encoder
        A loaded ``CrossEncoder`` (torch backend).
    folder
        Where to write ``onnx/model.onnx`` (and ``onnx/model_qint8_per_channel.onnx``); ``None``: the cache
        folder of these weights (see the module docstring).
    int8
        Also write the dynamically int8-quantised graph.

    Returns
    -------
    Path
        The folder holding ``onnx/``.
    """
    _need_onnx() if int8 else _need_exporter()
    import torch

    from ragkit.io import atomic_dir

    hf = getattr(cross_encoder, "transformers_model", None) or cross_encoder.model
    out = Path(folder) if folder is not None else _cache_root() / weights_hash(hf)
    fp32 = out / "onnx" / _FILES["onnx"]
    q8 = out / "onnx" / _FILES["onnx-int8"]
    if fp32.exists() and (q8.exists() or not int8):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = cross_encoder.tokenizer
    sample = tok(["a question", "another one"], ["a passage of text", "x"], padding=True, truncation=True,
                 return_tensors="pt")
    names = [n for n in _INPUTS if n in sample]
    was_training = hf.training
    hf.eval()
    try:
        with atomic_dir(out / "onnx", kind="onnx", overwrite=True) as tmp:
            with torch.no_grad():
                torch.onnx.export(
                    _Logits.wrap(hf, names), tuple(sample[n].to(hf.device) for n in names), str(tmp / _FILES["onnx"]),
                    input_names=names, output_names=["logits"], opset_version=17, dynamo=False,
                    dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, "logits": {0: "batch"}},
                )
            if int8:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                quantize_dynamic(str(tmp / _FILES["onnx"]), str(tmp / _FILES["onnx-int8"]),
                                 weight_type=QuantType.QInt8, per_channel=True, reduce_range=False,
                                 op_types_to_quantize=["MatMul"])
    finally:
        hf.train(was_training)
    logger.info("exported %s to %s", type(hf).__name__, out / "onnx")
    return out


class ExportedCrossEncoder:
    """An exported cross-encoder graph with ``CrossEncoder``'s ``predict``; subclasses only run a batch.

    ``predict`` tokenises each batch of pairs, feeds the graph the tokenizer outputs it takes
    (``input_ids``, ``attention_mask``, ``token_type_ids``, as int64) and gathers the first logit
    of each pair; a subclass sets :attr:`input_names` and implements :meth:`_run`.

    Parameters
    ----------
    path
        The ``.onnx`` file the engine loaded.
    tokenizer
        The model's Hugging Face tokenizer.
    max_length
        Most tokens per pair (longer pairs are truncated).
    backend
        The backend's name (reported, not used to load).
    """

    num_labels = 1
    input_names: list[str]

    def __init__(self, path: str | os.PathLike[str], tokenizer: Any, max_length: int, backend: str) -> None:
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.backend = backend

    @staticmethod
    def default_threads(threads: int | None) -> int:
        """``threads``, or torch's ``get_num_threads()`` when ``None`` (so that every backend uses the cores alike)."""
        if threads is None:
            import torch

            threads = torch.get_num_threads()
        return int(threads)

    def _check_inputs(self, names: Sequence[str]) -> None:
        unknown = set(names) - set(_INPUTS)
        if unknown:
            raise ValueError(f"{self.path} takes inputs {sorted(unknown)} that a cross-encoder tokenizer does not "
                             f"give; export it with ragkit.debias.onnx_encoder.export_onnx")
        self.input_names = list(names)

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's ``[batch, labels]`` logits for one tokenised batch."""
        raise NotImplementedError

    def predict(self, pairs: Sequence[tuple[str, str]], batch_size: int = 32, show_progress_bar: bool | None = None,
                convert_to_numpy: bool = True, **_: Any) -> np.ndarray:
        """Raw logits of ``pairs``, ``batch_size`` pairs per run (the ``CrossEncoder.predict`` contract)."""
        del show_progress_bar, convert_to_numpy
        out = np.zeros(len(pairs), dtype=np.float32)
        for s in range(0, len(pairs), batch_size):
            chunk = pairs[s : s + batch_size]
            enc = self.tokenizer([q for q, _ in chunk], [d for _, d in chunk], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="np")
            feed = {n: np.asarray(enc[n], dtype=np.int64) for n in self.input_names}
            out[s : s + len(chunk)] = np.asarray(self._run(feed)).reshape(len(chunk), -1)[:, 0]
        return out

    def save(self, *_: Any, **__: Any) -> None:
        raise RuntimeError(f"the {self.backend} backend cannot be saved as a ragkit student; save the torch model "
                           f"(backend='torch') and load it with backend={self.backend!r} to run it exported")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.backend}, {self.path})"


class OnnxCrossEncoder(ExportedCrossEncoder):
    """An exported cross-encoder run by ONNX Runtime, with ``CrossEncoder``'s ``predict``.

    Parameters
    ----------
    path
        An ``.onnx`` file with inputs among ``input_ids``, ``attention_mask``, ``token_type_ids``
        and a ``[batch, 1]`` output of raw logits.
    tokenizer
        The model's Hugging Face tokenizer.
    max_length
        Most tokens per pair (longer pairs are truncated).
    threads
        ONNX Runtime's intra-op threads (``None``: torch's ``get_num_threads()``, so that both
        backends use the cores alike).
    backend
        ``"onnx"`` or ``"onnx-int8"`` (reported, not used to load).
    """

    def __init__(self, path: str | os.PathLike[str], tokenizer: Any, max_length: int, threads: int | None = None,
                 backend: str = "onnx") -> None:
        ort = _need_onnx()
        super().__init__(path, tokenizer, max_length, backend)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.default_threads(threads)
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        self._check_inputs([i.name for i in self.session.get_inputs()])

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(None, feed)[0]


class OpenVinoCrossEncoder(ExportedCrossEncoder):
    """An exported cross-encoder compiled by OpenVINO for the CPU, with ``CrossEncoder``'s ``predict``.

    Parameters
    ----------
    path
        An ``.onnx`` file with inputs among ``input_ids``, ``attention_mask``, ``token_type_ids``
        and a ``[batch, 1]`` output of raw logits (dynamic batch and sequence axes).
    tokenizer
        The model's Hugging Face tokenizer.
    max_length
        Most tokens per pair (longer pairs are truncated).
    threads
        OpenVINO's ``INFERENCE_NUM_THREADS`` (``None``: torch's ``get_num_threads()``).
    backend
        ``"openvino"`` (reported, not used to load).
    """

    def __init__(self, path: str | os.PathLike[str], tokenizer: Any, max_length: int, threads: int | None = None,
                 backend: str = "openvino") -> None:
        ov = _need_openvino()
        super().__init__(path, tokenizer, max_length, backend)
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(str(self.path)), "CPU", {
            "INFERENCE_NUM_THREADS": self.default_threads(threads),
            "INFERENCE_PRECISION_HINT": "f32",
            "PERFORMANCE_HINT": "LATENCY",
        })
        self._check_inputs([i.get_any_name() for i in self.compiled.inputs])
        self._local = threading.local()  # an infer request serves one thread at a time

    def _run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return np.asarray(request.infer(feed)[self.compiled.output(0)])


def to_backend(cross_encoder: Any, backend: str, source: str | os.PathLike[str] | None = None,
               threads: int | None = None) -> Any:
    """``cross_encoder`` itself for ``"torch"``; else an :class:`ExportedCrossEncoder` of its weights
    (:class:`OnnxCrossEncoder` for ``"onnx"``/``"onnx-int8"``,
    :class:`OpenVinoCrossEncoder` for ``"openvino"``).

    Parameters
    ----------
    cross_encoder
        A loaded ``CrossEncoder`` (torch backend).
    backend
        One of :data:`BACKENDS`.
    source
        The folder the model was loaded from: its own ``onnx/model.onnx`` (or
        ``onnx/model_qint8_per_channel.onnx``) is used when present; otherwise the graph is exported to the
        cache (:func:`export_onnx`). ``"openvino"`` compiles the fp32 ``model.onnx``.
    threads
        The engine's intra-op threads (``None``: torch's ``get_num_threads()``).
    """
    check_backend(backend)
    if backend == "torch":
        return cross_encoder
    engine: Any = OnnxCrossEncoder
    if backend == "openvino":
        _need_openvino()  # before an export that would be of no use
        engine = OpenVinoCrossEncoder
    name = _FILES[backend]
    own = Path(source) / "onnx" / name if source is not None else None
    # the ONNX backends make both graphs at once: quantising costs seconds, and a cache folder is then
    # written once; OpenVINO reads the fp32 graph only, and needs no ONNX Runtime to make it
    path = own if own is not None and own.is_file() else (
        export_onnx(cross_encoder, int8=backend != "openvino") / "onnx" / name)
    max_length = getattr(cross_encoder, "max_seq_length", None) or getattr(cross_encoder, "max_length", None) or 512
    return engine(path, cross_encoder.tokenizer, int(max_length), threads=threads, backend=backend)
