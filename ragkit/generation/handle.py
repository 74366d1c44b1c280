"""The ground floor of :mod:`ragkit.generation`: the model handle and the forward primitives.

:class:`ModelHandle` is everything the scoring and decoding code needs of a loaded causal LM:
the model and tokenizer, the pad and EOS ids, the names under which the model's ``forward`` takes
its key/value cache and its "logits for the last positions only" argument, the batch size, the
context window and the token counters. :mod:`ragkit.generation.scoring` and
:mod:`ragkit.generation.decoding` take a handle (never the :class:`~ragkit.generation.Generator`
facade), so the package's imports run one way: handle -> decoding -> scoring -> generator.

Every forward goes through :func:`forward_output` (most callers through :func:`forward_logits`, its
logits and cache), which passes the cache and logits-to-keep arguments under the model's own names
and counts the forward on the handle's counters and on the caller's
:func:`~ragkit.generation.base.metered` meters.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ragkit.generation.base import charge

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["ModelHandle", "chunks", "keep_argument", "cache_argument", "forward_output", "forward_logits", "cache_ok",
           "handle_of", "layout", "positions", "crop"]


def _forward_parameters(model: Any) -> frozenset[str]:
    """Parameter names of ``model.forward`` (empty when its signature cannot be read)."""
    try:
        return frozenset(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
        return frozenset()


def keep_argument(model: Any) -> str | None:
    """The name of the model forward's "compute logits only for the last positions" argument."""
    params = _forward_parameters(model)
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None)


def cache_argument(model: Any) -> str:
    """The name under which the model's forward takes the KV cache.

    transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns on every call
    and is removed in 5.40); older releases and custom models take ``past_key_values``.
    """
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


@dataclass(eq=False)
class ModelHandle:
    """A loaded causal LM as the scoring and decoding primitives use it.

    Attributes
    ----------
    model, tokenizer
        The Hugging Face model and its tokenizer (a tokenizer without a pad token gets its EOS).
    batch_size
        Sequences per forward pass.
    decode_batch_size
        Rows per greedy decoding step, several prefill batches stacked (``None``: ``batch_size``).
    max_length
        Context window in tokens.
    show_progress
        Progress bars (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).
    pad_id, eos_ids
        Padding token and every token that ends generation (tokenizer and generation config).
    keep_arg, cache_arg
        The names of the forward's logits-to-keep argument (``None``: not supported) and its cache.
    counters
        Running totals: ``prefill_tokens``, ``decode_tokens``, ``forwards``.
    """

    model: Any
    tokenizer: Any
    batch_size: int
    max_length: int
    show_progress: bool | None
    pad_id: int
    eos_ids: tuple[int, ...]
    keep_arg: str | None
    cache_arg: str
    counters: dict[str, int] = field(default_factory=lambda: {"prefill_tokens": 0, "decode_tokens": 0, "forwards": 0})
    decode_batch_size: int | None = None

    @classmethod
    def wrap(cls, model: Any, tokenizer: Any, *, batch_size: int, max_length: int,
             show_progress: bool | None = None, decode_batch_size: int | None = None) -> ModelHandle:
        """A handle for ``model`` and ``tokenizer`` (sets the tokenizer's pad token to EOS when it has none)."""
        if tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise ValueError("the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token")
            tokenizer.pad_token = tokenizer.eos_token
        eos: set[int] = set()
        for src in (tokenizer.eos_token_id, getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
            if isinstance(src, int):
                eos.add(src)
            elif isinstance(src, (list, tuple)):
                eos.update(int(e) for e in src)
        return cls(model=model, tokenizer=tokenizer, batch_size=int(batch_size), max_length=int(max_length),
                   show_progress=show_progress, pad_id=int(tokenizer.pad_token_id), eos_ids=tuple(sorted(eos)),
                   keep_arg=keep_argument(model), cache_arg=cache_argument(model), decode_batch_size=decode_batch_size)

    @property
    def device(self) -> str:
        """The device of the model's parameters, e.g. ``"cpu"`` or ``"cuda:0"``."""
        return str(next(self.model.parameters()).device)


def chunks(n: int, size: int) -> Iterator[range]:
    """``range`` blocks of at most ``size`` covering ``0..n-1``."""
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def handle_of(generator: Any, what: str) -> ModelHandle:
    """The :class:`ModelHandle` of a local :class:`~ragkit.generation.Generator` (``what``: the caller, for the error).

    Raises
    ------
    ValueError
        ``generator`` holds no local model (e.g. a server-backed generator).
    """
    h = getattr(generator, "handle", None)
    if not isinstance(h, ModelHandle):
        raise ValueError(f"{what} runs the model itself and needs a local ragkit.generation.Generator; "
                         f"{type(generator).__name__} has none (use a local --model, not a server URL)")
    return h


def forward_output(
    h: ModelHandle,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    past: Any = None,
    keep: int = 1,
    *,
    output_attentions: bool = False,
    prefill: bool | None = None,
) -> Any:
    """The model's own output for one forward, counted: the primitive under :func:`forward_logits`.

    The model's ``forward`` is called with the cache ``past`` (``use_cache`` when there is one) and,
    when the model has the argument, logits for the last ``keep`` input positions only
    (``output_attentions``: the attention weights too, for callers that read them). ``attention_mask``
    covers the cache and the new tokens. The counters ``h.counters`` (``prefill_tokens``: non-padding
    new tokens of a prefill; ``decode_tokens``; ``forwards``) and the open
    :func:`~ragkit.generation.base.metered` meters are updated. ``prefill`` says which of the two the
    new tokens are: ``None`` (decoding and scoring) takes a forward of more than one new position for a
    prefill and a one-position forward for a decoding step; ``True`` counts a prefill at any width
    (e.g. a one-token query row run over a cached prompt).
    """
    width = input_ids.shape[1]
    keep = max(1, min(int(keep), width))
    kw: dict[str, Any] = {}
    if h.keep_arg is not None:
        kw[h.keep_arg] = keep
    kw[h.cache_arg] = past
    if output_attentions:
        kw["output_attentions"] = True
    out = h.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=past is not None, **kw)
    new = int(attention_mask[:, -width:].sum())
    is_prefill = width > 1 if prefill is None else bool(prefill)
    h.counters["forwards"] += 1
    h.counters["prefill_tokens" if is_prefill else "decode_tokens"] += new
    charge(1, new if is_prefill else 0, 0 if is_prefill else new)
    return out


def forward_logits(h: ModelHandle, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                   past: Any = None, keep: int = 1, *, prefill: bool | None = None) -> tuple[torch.Tensor, Any]:
    """Float logits ``(B, keep, V)`` of the last ``keep`` input positions, and the cache.

    The model's own ``forward`` is called (so any post-head transform of the architecture is
    applied) through :func:`forward_output`, which counts it.
    """
    keep = max(1, min(int(keep), input_ids.shape[1]))
    out = forward_output(h, input_ids, attention_mask, position_ids, past=past, keep=keep, prefill=prefill)
    return out.logits[:, -keep:].float(), out.get(h.cache_arg)  # the output field has the argument's name


def cache_ok(h: ModelHandle) -> bool:
    """Prefix reuse needs a decoder whose layers all use plain full attention (no sliding window)."""
    cfg = h.model.config
    text_cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    if getattr(text_cfg, "sliding_window", None) and getattr(text_cfg, "use_sliding_window", True):
        layer_types = getattr(text_cfg, "layer_types", None)
        if layer_types is None or any(t != "full_attention" for t in layer_types):
            return False
    return True


def layout(h: ModelHandle, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``[pad.. prompt][answer ..pad]`` rows (ids and mask, on the model's device): every prompt
    ends in the same column."""
    import torch

    wp = max(len(p) for p in prompts)
    wa = max((len(a) for a in answers), default=0)
    ids = torch.full((len(prompts), wp + wa), h.pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), wp + wa), dtype=torch.long)
    for r, (p, a) in enumerate(zip(prompts, answers)):
        ids[r, wp - len(p):wp] = torch.tensor(list(p), dtype=torch.long)
        mask[r, wp - len(p):wp] = 1
        if a:
            ids[r, wp:wp + len(a)] = torch.tensor(list(a), dtype=torch.long)
            mask[r, wp:wp + len(a)] = 1
    dev = h.device
    return ids.to(dev), mask.to(dev)


def positions(mask: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids of left-padded rows (``offsets``: positions already in a cache, per row)."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return pos if offsets is None else pos + offsets[:, None]


def crop(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions of a cache (a negative ``crop`` works across versions)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
