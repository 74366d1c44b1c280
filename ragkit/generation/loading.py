"""One entry point for "a generator from a name": local weights or an OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

from ragkit.generation.remote import RemoteGenerator, is_server_url

__all__ = ["load_generator"]


def load_generator(model: str | None = None, **kwargs: Any) -> Any:
    """A :class:`~ragkit.generation.RemoteGenerator` for ``http(s)://`` URLs, else a local ``Generator``.

    Parameters
    ----------
    model
        ``None`` (the embedded SmolLM2-135M-Instruct), a hub id, a folder or a ``.gguf`` file
        (local :class:`~ragkit.generation.Generator`), or a server URL such as
        ``http://HOST:PORT/v1`` (vLLM, SGLang, llama.cpp server, TGI).
    **kwargs
        Passed on to the chosen class. Arguments that only the other class takes are dropped
        when they have their default meaning: ``device``/``dtype`` for a server; ``tokenizer``,
        ``api_key``, ``concurrency``, ... for local weights (a non-``None`` value is an error).

    Examples
    --------
    >>> load_generator("http://127.0.0.1:8000/v1", tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> load_generator(None, device="cpu")                                                            # doctest: +SKIP
    """
    remote_only = ("tokenizer", "concurrency", "prompt_format", "api_key", "timeout", "max_retries", "backoff",
                   "served_model", "deadline", "max_retry_after", "max_response_bytes")
    local_only = ("device", "dtype")
    if is_server_url(model):
        for k in local_only:
            kwargs.pop(k, None)  # the server decides where and in which precision it runs
        served = kwargs.pop("served_model", None)
        return RemoteGenerator(str(model), model=served, **kwargs)
    bad = [k for k in remote_only if kwargs.get(k) is not None]
    if bad:
        raise ValueError(f"{', '.join(bad)} only apply to a server URL (http://HOST:PORT/v1); model={model!r} is local")
    for k in remote_only:
        kwargs.pop(k, None)
    from ragkit.generation.generator import Generator

    return Generator(model, **kwargs)
