"""``RemoteGenerator``: the generator contract over an OpenAI-compatible completions server.

vLLM, SGLang, llama.cpp's server (``llama-cpp-python[server]``) and TGI speak the OpenAI
``/v1/completions`` protocol. Generation is a plain completion request. Answer scoring follows
lm-evaluation-harness (Gao et al., "A framework for few-shot language model evaluation", Zenodo
10.5281/zenodo.10256836): the server is sent ``prompt + answer`` with ``echo=true``,
``logprobs=1`` and ``max_tokens=1`` and returns the log-probability of every prompt token; the
answer's log-likelihood is the sum over the continuation tokens,

    log p(y | x) = Σ_{t=1..T} log p(y_t | x, y_<t),

read from ``token_logprobs`` at the answer positions (the one generated token is ignored).
The answer's tokens are found as the in-process :class:`~ragkit.generation.Generator` finds them:
``prompt + answer`` is tokenised as one text and the tokens whose character span reaches past
the prompt are the answer's. With ``prompt_format="tokens"`` the token ids are tokenised here
and sent as the prompt (vLLM, SGLang), so the server reads exactly the tokens the local
generator would; with ``"text"`` the server tokenises and the answer tokens are located by the
returned ``text_offset`` (llama.cpp's server takes text prompts only). ``"auto"`` tries token
ids and falls back to text when the server refuses them.

Servers whose echoed log-probs are misaligned are detected: a correct echo with ``max_tokens=1``
ends with the generated token's entry; llama-cpp-python's server (0.3.x) drops that entry and
reports each prompt token's log-prob under the distribution that *follows* it
(abetlen/llama-cpp-python#1983). With ``score_mode="auto"`` (default) such a server is scored by
*forced decoding* instead: the prompt is completed under a GBNF grammar that admits only the
answer text (``grammar``, llama.cpp's constrained decoding) and the log-probs of the generated
tokens, which that server computes from the raw logits, are the answer's. The tokens are then
the server's greedy spelling of the answer, usually the canonical tokenisation.

Prompts are built locally with the same templates and passage fitting as the local generator
(a tokenizer is needed: the served model's, from the hub, a folder or the served ``.gguf``).

Nothing the server sends is trusted unchecked, and no server can hold a call: every call has a
total ``deadline`` (retries, ``Retry-After`` waits, which are capped at ``max_retry_after``, and a
response trickled a byte at a time included), a response body is read up to
``max_response_bytes`` after decompression (a gzip bomb stops there), log-probs must be finite
and not positive, a completion's text must be a string no longer than its token budget allows,
and a transient failure (connection error, 408, 429, 5xx) never changes how later calls are sent.
Credentials in the URL are masked wherever it is shown (:func:`ragkit.io.redact_url`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.generation.base import CandidateFn, OrderingRun, ScoreResult
from ragkit.generation.fitting import answer_text, encode_answers, encode_prompts, fit_passages
from ragkit.generation.layout import ordering_inputs, per_query, run_orderings_by_parts
from ragkit.generation.prompts import PromptTemplate, get_template
from ragkit.io import progress, redact_url
from ragkit.text import extract_answer
from ragkit.types import Passage, as_passages

__all__ = ["RemoteGenerator", "RemoteServerError", "is_server_url"]

logger = logging.getLogger(__name__)

_PROMPT_FORMATS = ("auto", "tokens", "text")
_SCORE_MODES = ("auto", "echo", "forced")


class _RedactURLs(logging.Filter):
    """Masks URL credentials in the records of the ``httpx`` logger (it logs every request's URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = tuple(redact_url(str(a)) if isinstance(a, str) or hasattr(a, "netloc") else a
                                for a in record.args) if isinstance(record.args, tuple) else record.args
        return True


logging.getLogger("httpx").addFilter(_RedactURLs())


def is_server_url(model: str | None) -> bool:
    """Whether ``model`` names a server (``http://`` or ``https://``) rather than local weights."""
    return isinstance(model, str) and model.lower().startswith(("http://", "https://"))


class RemoteServerError(RuntimeError):
    """The completions server answered with an error or without what was asked for.

    ``status`` is the HTTP status of the failed answer (``None``: no answer, or a bad one);
    ``transient`` says whether the failure may pass on its own (connection error, deadline,
    408, 429, 5xx), in which case it says nothing about what the server supports.
    """

    def __init__(self, message: str, status: int | None = None, transient: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient


_MAX_CHARS_PER_TOKEN = 64
"""Most characters one generated token may decode to (a completion longer than ``max_tokens`` times
this, plus a little, is not an answer to the request)."""


class RemoteGenerator:
    """A generator backed by an OpenAI-compatible completions server.

    Same public methods as :class:`ragkit.generation.Generator` (it satisfies
    :class:`ragkit.generation.GeneratorLike`), so MoI, the sweep and ``ragkit eval`` run on it
    unchanged; there are no local weights (``model`` is ``None``), so training needs the local
    generator.

    Parameters
    ----------
    base_url
        ``http://HOST:PORT/v1`` (``/v1`` is appended when missing).
    model
        The served model's name (default: the first id in ``GET /v1/models``).
    tokenizer
        A Hugging Face tokenizer, or a hub id / folder / ``.gguf`` file to load one from
        (default: the served model id, when it is one of those).
    template, passage_max_tokens
        As in :class:`~ragkit.generation.Generator`.
    max_length
        The server's context window in tokens (default: ``max_model_len`` from ``/v1/models``
        when the server reports it, else 2048).
    batch_size
        Prompts per HTTP request (servers that take one prompt per request, such as
        llama.cpp's, are detected and sent one each).
    concurrency
        Requests in flight at once.
    prompt_format
        ``"auto"``, ``"tokens"`` or ``"text"`` (see the module docstring).
    score_mode
        ``"auto"`` (echo, forced decoding when the server's echo is misaligned), ``"echo"``
        (an error on such servers) or ``"forced"`` (see the module docstring).
    api_key
        Sent as ``Authorization: Bearer``.
    timeout
        Seconds per network read (httpx's timeout).
    max_retries, backoff
        Transient failures (connection errors, 408/429/5xx) are retried ``max_retries`` times,
        waiting ``backoff * 2**attempt`` seconds (or the server's ``Retry-After``, at most
        ``max_retry_after``).
    deadline
        Seconds one HTTP call may take in all: its tries, the waits between them and the reading
        of a slow response (a server that trickles bytes is cut off here, which a per-read timeout
        cannot do).
    max_retry_after
        The longest ``Retry-After`` honoured, in seconds (longer ones are cut to it).
    max_response_bytes
        Most bytes of one response body after decompression.
    show_progress
        Progress bars (``None``: on unless ``RAGKIT_NO_PROGRESS`` is set).

    Examples
    --------
    >>> gen = RemoteGenerator("http://127.0.0.1:8000/v1",
    ...                       tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct")  # doctest: +SKIP
    >>> prompt = gen.build_prompt("Who wrote Hamlet?", ["Hamlet is by Shakespeare."])  # doctest: +SKIP
    >>> gen.score([prompt], ["Shakespeare"]).sum                                       # doctest: +SKIP
    """

    answer_reserve: int = 32

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        tokenizer: Any = None,
        template: str | PromptTemplate = "auto",
        batch_size: int = 16,
        max_length: int | None = None,
        passage_max_tokens: int | None = None,
        concurrency: int = 4,
        prompt_format: str = "auto",
        score_mode: str = "auto",
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        show_progress: bool | None = None,
        deadline: float = 600.0,
        max_retry_after: float = 30.0,
        max_response_bytes: int = 64 * 2**20,
    ) -> None:
        try:
            import httpx
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("RemoteGenerator needs httpx; install it with `pip install 'ragkit[remote]'`") from e
        if not is_server_url(base_url):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if prompt_format not in _PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {_PROMPT_FORMATS}, got {prompt_format!r}")
        if score_mode not in _SCORE_MODES:
            raise ValueError(f"score_mode must be one of {_SCORE_MODES}, got {score_mode!r}")
        for name, v in (("batch_size", batch_size), ("concurrency", concurrency)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if max_retries < 0 or not (math.isfinite(backoff) and backoff >= 0):
            raise ValueError("max_retries and backoff must be finite and >= 0")
        for name, v in (("timeout", timeout), ("deadline", deadline), ("max_retry_after", max_retry_after)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0) or (name != "max_retry_after"
                                                                                    and v == 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {v!r}")
        if max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes must be >= 1024, got {max_response_bytes}")
        if passage_max_tokens is not None and passage_max_tokens < 1:
            raise ValueError(f"passage_max_tokens must be >= 1 or None, got {passage_max_tokens}")
        try:
            parsed = httpx.URL(base_url)
        except (httpx.InvalidURL, ValueError) as e:
            raise ValueError(f"base_url {redact_url(base_url)!r} is not a valid URL ({e})") from None
        # credentials travel as an Authorization header and the query as parameters, never in the URL
        # that httpx logs; the URL shown in messages has them masked
        auth = httpx.BasicAuth(parsed.username, parsed.password) if parsed.username or parsed.password else None
        path = parsed.path.rstrip("/")
        path = path if path.endswith("/v1") else path + "/v1"
        url = str(parsed.copy_with(username=None, password=None, query=None, fragment=None, path=path))
        self.base_url = redact_url(str(parsed.copy_with(path=path, query=None, fragment=None)))
        # only encodings decompressed here under the size bound are asked for
        headers = {"Accept-Encoding": "gzip, deflate"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout, auth=auth,
                                    params=parsed.params)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.deadline = float(deadline)
        self.max_retry_after = float(max_retry_after)
        self.max_response_bytes = int(max_response_bytes)
        self._closing = threading.Event()
        self.batch_size = int(batch_size)
        self.concurrency = int(concurrency)
        self.prompt_format = prompt_format
        self.score_mode = score_mode
        self.show_progress = show_progress
        self.passage_max_tokens = passage_max_tokens
        self._lock = threading.Lock()
        self._per_request = self.batch_size
        self._lists_ok = False
        self._probed = False
        info = self._models() if model is None or max_length is None else {}
        if model is None:
            ids = [m.get("id") for m in info.get("data", []) if isinstance(m, dict) and m.get("id")]
            if not ids:
                raise RemoteServerError(f"{self.base_url}/models lists no model; pass model=NAME")
            model = str(ids[0])
        self.name = str(model)
        self.model = None  # no local weights
        self.tokenizer = self._load_tokenizer(tokenizer if tokenizer is not None else self.name)
        if max_length is None:
            lens = [m.get("max_model_len") for m in info.get("data", []) if isinstance(m, dict)
                    and m.get("id") == self.name and isinstance(m.get("max_model_len"), int)]
            max_length = lens[0] if lens else 2048
            if not lens:
                logger.info("%s does not report its context window; assuming %d tokens (pass max_length)",
                            self.base_url, max_length)
        if max_length < self.answer_reserve + 8:
            raise ValueError(f"max_length={max_length} is too small; use at least {self.answer_reserve + 8}")
        self.max_length = int(max_length)
        self.template = get_template(template, self.tokenizer)

    # ------------------------------------------------------------------ setup helpers
    def __repr__(self) -> str:
        return (f"RemoteGenerator(base_url={self.base_url!r}, name={self.name!r}, template={self.template.name!r}, "
                f"max_length={self.max_length})")

    @property
    def device(self) -> str:
        """``"remote"``: the model runs on the server."""
        return "remote"

    def close(self) -> None:
        """Close the HTTP connection pool; a call waiting to retry gives up at once."""
        self._closing.set()
        self._client.close()

    def _models(self) -> dict[str, Any]:
        return self._request("GET", "/models")

    @staticmethod
    def _load_tokenizer(spec: Any) -> Any:
        if not isinstance(spec, (str, Path)):
            return spec
        from transformers import AutoTokenizer

        s = str(spec)
        try:
            if s.endswith(".gguf") and Path(s).is_file():
                p = Path(s)
                return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
            return AutoTokenizer.from_pretrained(s)
        except Exception as e:  # noqa: BLE001 - any loading failure gets the same advice
            raise ValueError(
                f"cannot load a tokenizer from {s!r} ({type(e).__name__}: {e}); pass tokenizer=... (the served "
                "model's hub id, a local folder or its .gguf file): prompts are built and answers located locally"
            ) from e

    # ------------------------------------------------------------------ HTTP
    def _read(self, r: Any, end: float, where: str) -> bytes:
        """The body of the streamed response ``r``, decompressed, within the deadline and the size bound."""
        enc = r.headers.get("content-encoding", "identity").strip().lower()
        if enc in ("gzip", "x-gzip", "deflate"):
            d: Any = zlib.decompressobj(47 if enc != "deflate" else 15)  # 47: gzip or zlib header
        elif enc in ("", "identity"):
            d = None
        else:
            raise RemoteServerError(f"{where} answered with Content-Encoding {enc!r}, which ragkit does not "
                                    "decode (it asks for gzip or deflate)")
        limit = self.max_response_bytes
        out = bytearray()
        for chunk in r.iter_raw():
            while chunk:
                if d is None:
                    part, chunk = chunk, b""
                else:  # never more than the room left: a small bomb cannot inflate past the bound
                    try:
                        part = d.decompress(chunk, limit + 1 - len(out))
                    except zlib.error as e:
                        raise RemoteServerError(f"{where} sent a {enc} body that does not decompress ({e})") from None
                    chunk = d.unconsumed_tail
                out += part
                if len(out) > limit:
                    raise RemoteServerError(f"{where} sent a response of more than {limit} bytes "
                                            "(max_response_bytes); it is not an answer to the request")
                if d is not None and not part:
                    break
            if time.monotonic() > end:
                raise RemoteServerError(f"{where} was still sending its response after {self.deadline:g} s "
                                        "(deadline)", transient=True)
        return bytes(out)

    def _sleep(self, seconds: float) -> None:
        if self._closing.wait(seconds):
            raise RemoteServerError(f"{self.base_url}: the generator was closed while waiting to retry")

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None,
                 retries: int | None = None) -> dict[str, Any]:
        """One call with retries on connection errors, 408, 429 and 5xx (exponential back-off), all of
        it within ``deadline`` seconds."""
        import json

        import httpx

        last: str = ""
        status: int | None = None
        where = f"{method} {self.base_url}{path}"
        max_retries = self.max_retries if retries is None else retries
        end = time.monotonic() + self.deadline
        for attempt in range(max_retries + 1):
            left = end - time.monotonic()
            try:
                with self._client.stream(method, path, json=payload,
                                         timeout=httpx.Timeout(min(self._client.timeout.read or left, left))) as r:
                    status = r.status_code
                    raw = self._read(r, end, where)
            except httpx.TransportError as e:
                last, status = f"{type(e).__name__}: {e}", None
                wait = self.backoff * 2 ** attempt
            else:
                if status < 400:
                    try:
                        body = json.loads(raw)
                    except ValueError as e:
                        raise RemoteServerError(f"{where} answered non-JSON: {raw[:200]!r}", status) from e
                    if not isinstance(body, dict):
                        raise RemoteServerError(f"{where} answered a JSON {type(body).__name__}, not an object",
                                                status)
                    return body
                last = f"HTTP {status}: {raw[:500].decode('utf-8', 'replace')}"
                if status not in (408, 429) and status < 500:
                    raise RemoteServerError(f"{where} failed with {last}", status)
                ra = r.headers.get("retry-after", "").strip()
                try:
                    wait = float(ra)
                except ValueError:
                    wait = self.backoff * 2 ** attempt
                if not math.isfinite(wait) or wait < 0:
                    wait = self.backoff * 2 ** attempt
                if wait > self.max_retry_after:
                    logger.info("%s asks to retry after %s s; waiting %g s (max_retry_after)", where, ra,
                                self.max_retry_after)
                    wait = self.max_retry_after
            left = end - time.monotonic()
            if attempt < max_retries and wait < left:
                logger.warning("%s failed (%s); retry %d/%d in %.1f s", where, last, attempt + 1, max_retries, wait)
                self._sleep(wait)
            elif attempt < max_retries:
                raise RemoteServerError(f"{where} failed after {attempt + 1} tries in {self.deadline:g} s "
                                        f"(deadline): {last}", status, transient=True)
        raise RemoteServerError(f"{where} failed after {max_retries + 1} tries: {last}", status, transient=True)

    def _complete(self, prompts: list[Any], desc: str, per_prompt: list[dict[str, Any]] | None = None,
                  retries: int | None = None, **params: Any) -> list[dict[str, Any]]:
        """``/completions`` for many prompts: chunks of ``batch_size`` prompts, ``concurrency`` in flight.

        ``per_prompt`` (one dict per prompt) adds request fields of each prompt's own (then one
        prompt per request). Returns one choice per prompt (``n`` per prompt, in order, when ``n > 1``).
        """
        n = int(params.get("n", 1))
        out: list[list[dict[str, Any]]] = [[] for _ in prompts]

        def run(idx: list[int], retries: int | None = None) -> None:
            payload = {"model": self.name, "prompt": [prompts[i] for i in idx] if len(idx) > 1 else prompts[idx[0]],
                       **params, **(per_prompt[idx[0]] if per_prompt is not None else {})}
            body = self._request("POST", "/completions", payload, retries=retries)
            choices = body.get("choices")
            if not isinstance(choices, list) or len(choices) != n * len(idx):
                got = len(choices) if isinstance(choices, list) else 0
                if len(idx) > 1 and got in (n, 0):
                    raise _OnePromptOnly()
                raise RemoteServerError(f"{self.base_url}/completions returned {got} choices for "
                                        f"{len(idx)} prompts x n={n}")
            if any(not isinstance(c, dict) or isinstance(c.get("index", 0), bool)
                   or not isinstance(c.get("index", 0), int) for c in choices):
                raise RemoteServerError(f"{self.base_url}/completions returned choices that are not objects with an "
                                        "integer `index`")
            choices = sorted(choices, key=lambda c: int(c.get("index", 0)))
            for j, i in enumerate(idx):
                out[i] = choices[j * n:(j + 1) * n]

        def chunks() -> list[list[int]]:
            k = 1 if per_prompt is not None else self._per_request
            return [list(range(s, min(len(prompts), s + k))) for s in range(0, len(prompts), k)]

        todo = chunks()
        if todo and len(todo[0]) > 1 and not self._lists_ok:
            try:
                run(todo[0])  # probe: does the server take a list of prompts?
                self._lists_ok = True
            except (_OnePromptOnly, RemoteServerError) as e:
                if isinstance(e, RemoteServerError) and e.transient:
                    raise  # a server that is down says nothing about lists
                run(todo[0][:1])  # an error here is not about lists: the server fails on one prompt too
                logger.warning("%s takes one prompt per request (%s); sending prompts one by one", self.base_url,
                               str(e)[:120] or type(e).__name__)
                with self._lock:
                    self._per_request = 1
                todo = chunks()[1:]
            else:
                todo = todo[1:]
        with ThreadPoolExecutor(max_workers=self.concurrency) as ex:
            futures = [ex.submit(run, idx, retries) for idx in todo]
            for f in progress(futures, show=self.show_progress, desc=desc, leave=False):
                f.result()
        return [c for cs in out for c in cs]

    # ------------------------------------------------------------------ prompts
    def _fit_passages(self, question: str, passages: Sequence[Passage]) -> list[str]:
        return fit_passages(self.tokenizer, self.template, question, passages, max_length=self.max_length,
                            answer_reserve=self.answer_reserve, passage_max_tokens=self.passage_max_tokens)

    def split_prompt(self, question: str, passages: Sequence[Passage | str]) -> tuple[str, str]:
        """``(prefix, suffix)``: the prefix (instruction + question) is the same for every ordering."""
        ps = as_passages(passages)
        return self.template.split(question, ps, self.tokenizer, self._fit_passages(question, ps))

    def build_prompt(self, question: str, passages: Sequence[Passage | str]) -> str:
        """The full prompt, built locally exactly as :class:`~ragkit.generation.Generator` builds it."""
        prefix, suffix = self.split_prompt(question, passages)
        return prefix + suffix

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: Sequence[str], answers: Sequence[str]) -> ScoreResult:
        """Teacher-forced ``log p(answer | prompt)`` from the server's echoed prompt log-probs
        (or by forced decoding, see ``score_mode``).

        Raises
        ------
        ValueError
            When the lengths differ, an answer is empty or a prompt does not fit the context.
        RemoteServerError
            When the server returns no prompt log-probs (or fails after the retries).
        """
        prompts, answers = list(prompts), list(answers)
        if len(prompts) != len(answers):
            raise ValueError(f"score() got {len(prompts)} prompts but {len(answers)} answers; "
                             "pass one answer per prompt")
        if not prompts:
            return ScoreResult.from_token_logprobs([])
        texts = [answer_text(p, a, i) for i, (p, a) in enumerate(zip(prompts, answers))]
        p_ids, a_ids = encode_answers(self.tokenizer, prompts, texts)
        for i, (p, a) in enumerate(zip(p_ids, a_ids)):
            if not a:
                raise ValueError(f"answer {i} ({answers[i]!r}) tokenises to nothing; pass a non-empty answer")
            if len(p) + len(a) >= self.max_length:
                raise ValueError(f"prompt {i} + answer has {len(p) + len(a)} tokens; the server's context is "
                                 f"{self.max_length}: build prompts with build_prompt() or set passage_max_tokens")
        if self.score_mode != "forced":
            try:
                self._probe_echo()
                return self._score_echo(prompts, texts, p_ids, a_ids)
            except _MisalignedEcho as e:
                if self.score_mode == "echo":
                    raise
                logger.warning("%s; scoring by forced (grammar-constrained) decoding from now on", e)
                self.score_mode = "forced"
        return self._score_forced(prompts, texts, a_ids)

    def _probe_echo(self) -> None:
        """Once: a short echo request settles the prompt format and catches a misaligned echo cheaply."""
        if self._probed:
            return
        prompt, answer = "Question: Which city is the capital of France?\nAnswer:", " Paris"
        p_ids, a_ids = encode_answers(self.tokenizer, [prompt], [answer])
        self._score_echo([prompt], [answer], p_ids, a_ids)
        self._probed = True

    def _score_echo(self, prompts: list[str], texts: list[str], p_ids: list[list[int]],
                    a_ids: list[list[int]]) -> ScoreResult:
        """Echo scoring; the first prompt goes alone and probes the server (token ids taken? echo aligned?)."""
        params = {"max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 1}

        def run(idx: list[int], retries: int | None = None) -> list[np.ndarray]:
            if self.prompt_format == "text":
                choices = self._complete([prompts[i] + texts[i] for i in idx], "score (remote)", retries=retries,
                                         **params)
                return [self._answer_logprobs_by_offset(c, len(prompts[i]), len(prompts[i]) + len(texts[i]), i)
                        for c, i in zip(choices, idx)]
            choices = self._complete([p_ids[i] + a_ids[i] for i in idx], "score (remote)", retries=retries, **params)
            return [self._answer_logprobs_by_count(c, len(p_ids[i]), len(a_ids[i]), i) for c, i in zip(choices, idx)]

        if self.prompt_format == "auto":
            try:
                self.prompt_format = "tokens"
                first = run([0])
            except _MisalignedEcho:
                raise
            except RemoteServerError as e:
                if e.transient:  # a server that is down or busy has not refused token ids: ask again next time
                    self.prompt_format = "auto"
                    raise
                logger.warning("%s refuses token-id prompts (%s); sending text prompts from now on",
                               self.base_url, str(e)[:200])
                self.prompt_format = "text"
                first = run([0])
        else:
            first = run([0])
        return ScoreResult.from_token_logprobs(first + (run(list(range(1, len(prompts)))) if len(prompts) > 1 else []))

    def _score_forced(self, prompts: list[str], texts: list[str], a_ids: list[list[int]]) -> ScoreResult:
        """Answer log-probs as generated-token log-probs under a grammar that admits only the answer.

        The grammar fixes the text, not its tokens: the server may spell an answer with other tokens
        than the canonical tokenisation (``a_ids``); such answers are counted in a warning, since their
        log-probs are those of the server's spelling.
        """
        n_tok = [len(t) for t in encode_prompts(self.tokenizer, texts)]
        per = [{"grammar": f"root ::= {_gbnf_literal(t)}", "max_tokens": n + 16} for t, n in zip(texts, n_tok)]
        choices = self._complete(list(prompts), "score (remote, forced)", per_prompt=per, temperature=0.0, logprobs=1)
        out = []
        for i, (c, t) in enumerate(zip(choices, texts)):
            lp = self._logprobs(c, i)
            if self._text(c, i) != t:
                raise RemoteServerError(
                    f"{self.base_url} did not follow the answer grammar for prompt {i} (returned "
                    f"{self._text(c, i)[:80]!r}, wanted {t[:80]!r}); forced decoding needs GBNF `grammar` "
                    "support (llama.cpp) and enough context for the answer")
            out.append(self._checked(lp["token_logprobs"], i))
        other = [i for i, (o, a) in enumerate(zip(out, a_ids)) if len(o) != len(a)]
        if other:
            logger.warning("%s spelled %d of %d answers with other tokens than their canonical tokenisation "
                           "(e.g. answer %d: %d tokens instead of %d); their log-probs are of that spelling",
                           self.base_url, len(other), len(out), other[0], len(out[other[0]]), len(a_ids[other[0]]))
        return ScoreResult.from_token_logprobs(out)

    def _logprobs(self, choice: dict[str, Any], i: int) -> dict[str, Any]:
        lp = choice.get("logprobs")
        if not isinstance(lp, dict) or not lp.get("token_logprobs"):
            raise RemoteServerError(
                f"{self.base_url} returned no prompt log-probs for prompt {i} (echo=true, logprobs=1). Scoring "
                "needs a server that echoes prompt log-probs: vLLM and SGLang do; llama-cpp-python's server needs "
                "`--logits_all true`; TGI's OpenAI route does not (use vLLM or SGLang)")
        return lp

    def _answer_logprobs_by_count(self, choice: dict[str, Any], n_prompt: int, n_answer: int, i: int) -> np.ndarray:
        tl = self._logprobs(choice, i)["token_logprobs"]
        if len(tl) < n_prompt + n_answer:
            raise _MisalignedEcho(f"{self.base_url} echoed {len(tl)} token log-probs for prompt {i}, fewer than its "
                                  f"{n_prompt + n_answer} tokens and the generated one")
        if len(tl) == n_prompt + n_answer:
            raise _MisalignedEcho(_MISALIGNED.format(url=self.base_url))
        return self._checked(tl[n_prompt:n_prompt + n_answer], i)

    def _answer_logprobs_by_offset(self, choice: dict[str, Any], start: int, end: int, i: int) -> np.ndarray:
        lp = self._logprobs(choice, i)
        tl, offs = lp["token_logprobs"], lp.get("text_offset")
        if not isinstance(offs, list) or len(offs) != len(tl) or any(not isinstance(o, int) or o < 0 for o in offs):
            raise RemoteServerError(f"{self.base_url} returned no usable text_offset for prompt {i}; "
                                    "use prompt_format='tokens'")
        if max(offs) < end:  # a correct echo ends with the generated token, which starts at `end`
            raise _MisalignedEcho(_MISALIGNED.format(url=self.base_url))
        # token k spans [offs[k], offs[k+1]); the answer's tokens end past the prompt (a straddling token
        # belongs to the answer); tokens starting at or after `end` are generated ones
        sel = [k for k in range(len(tl))
               if offs[k] < end and (offs[k] >= start or (offs[k + 1] if k + 1 < len(offs) else end) > start)]
        if not sel:
            raise RemoteServerError(f"{self.base_url} echoed no answer tokens for prompt {i}")
        return self._checked([tl[k] for k in sel], i)

    def _checked(self, values: Sequence[Any], i: int) -> np.ndarray:
        """Answer-token log-probs as floats; each must be a finite number <= 0 (a tiny positive rounding
        error of at most 1e-4 is read as 0)."""
        if any(v is None for v in values):
            raise RemoteServerError(f"{self.base_url} returned null log-probs for answer tokens of prompt {i}")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            bad = next(v for v in values if isinstance(v, bool) or not isinstance(v, (int, float)))
            raise RemoteServerError(f"{self.base_url} returned a log-prob that is not a number ({bad!r:.60}) for "
                                    f"prompt {i}")
        arr = np.asarray(values, dtype=np.float64)
        bad = ~np.isfinite(arr) | (arr > 1e-4)
        if bad.any():
            raise RemoteServerError(f"{self.base_url} returned the log-prob {arr[bad][0]!r} for an answer token of "
                                    f"prompt {i}; a log-probability is a finite number <= 0, so the server's "
                                    "scores cannot be trusted")
        return np.minimum(arr, 0.0)

    def _text(self, choice: dict[str, Any], i: int, max_tokens: int | None = None) -> str:
        """A choice's ``text``: a string, at most ``max_tokens`` tokens' worth of characters when given."""
        text = choice.get("text", "")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise RemoteServerError(f"{self.base_url} returned a {type(text).__name__} as the text of completion "
                                    f"{i}, not a string")
        if max_tokens is not None and len(text) > max_tokens * _MAX_CHARS_PER_TOKEN + 256:
            raise RemoteServerError(f"{self.base_url} returned {len(text)} characters for completion {i}, when "
                                    f"{max_tokens} tokens were asked; it is not an answer to the request")
        return text

    def score_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        answers: Sequence[str | Sequence[str]],
        template: PromptTemplate | None = None,
    ) -> list[ScoreResult]:
        """Score answers under several passage orderings per question (one :meth:`score` call).

        Prompts are laid out prefix-first as locally; a server with automatic prefix caching
        (SGLang's radix cache) reuses the shared prefix, vLLM computes prompt log-probs without
        its prefix cache.
        """
        prompts, ans = ordering_inputs(self, questions, passages, orderings, answers, template)
        res = self.score([p for ps in prompts for p in ps], [a for as_ in ans for a in as_])
        return per_query(res.token_logprobs, [len(ps) for ps in prompts])

    def run_orderings(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        orderings: Sequence[Sequence[Sequence[int]]],
        candidates: CandidateFn | None = None,
        max_new_tokens: int = 16,
        stop: Sequence[str] | None = None,
        min_new_tokens: int = 0,
    ) -> list[OrderingRun]:
        """Each ordering's greedy answer, then candidates scored under every ordering: the generic
        implementation (:func:`ragkit.generation.layout.run_orderings_by_parts`, one completion
        request per ordering and one scoring request; the server holds no cache to share)."""
        return run_orderings_by_parts(self, questions, passages, orderings, candidates, max_new_tokens, stop,
                                      min_new_tokens)

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 32,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        n: int = 1,
        seed: int = 0,
        top_p: float = 1.0,
        min_new_tokens: int = 0,
    ) -> list[str] | list[list[str]]:
        """Continue each prompt through ``/completions`` (greedy when ``temperature == 0``).

        ``seed`` is passed to the server (vLLM, SGLang and llama.cpp honour it); ``min_new_tokens``
        is sent as ``min_tokens`` (a vLLM/SGLang extension; other servers may ignore it).
        Stop strings are applied by the server and again here (the first one after leading
        whitespace is cut, as locally).
        """
        prompts = list(prompts)
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if not prompts:
            return []
        stops = [s for s in (stop or []) if s]
        params: dict[str, Any] = {"max_tokens": int(max_new_tokens), "temperature": float(temperature),
                                  "top_p": float(top_p), "n": int(n), "seed": int(seed)}
        if min_new_tokens > 0:
            params["min_tokens"] = int(min_new_tokens)
        if stops:
            # stops are applied here after leading whitespace; the server only gets those that cannot
            # end an answer before it starts
            server_stops = [s for s in stops if s.strip()]
            if server_stops:
                params["stop"] = server_stops
        prompt_ids = encode_prompts(self.tokenizer, prompts)
        for i, p in enumerate(prompt_ids):
            if len(p) + max_new_tokens > self.max_length:
                raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} it exceeds "
                                 f"the server's context {self.max_length}")
        choices = self._complete(prompts, "generate (remote)", **params)
        texts = [self._cut(self._text(c, i, int(max_new_tokens)), stops) for i, c in enumerate(choices)]
        if n == 1:
            return texts
        return [texts[i * n:(i + 1) * n] for i in range(len(prompts))]

    @staticmethod
    def _cut(text: str, stops: Sequence[str]) -> str:
        start = len(text) - len(text.lstrip())
        hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
        return text[:min(hits)] if hits else text

    def answer(
        self,
        questions: Sequence[str],
        passages: Sequence[Sequence[Passage | str]],
        max_new_tokens: int = 32,
        drafts: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Greedy short answers (build each prompt, generate, :meth:`clean_answer`). ``drafts`` are
        accepted for the :class:`~ragkit.generation.base.GeneratorLike` signature and not checked
        (a server offers no one-forward verification); the answers are the same either way."""
        del drafts
        questions = list(questions)
        if len(questions) != len(passages):
            raise ValueError(f"answer() got {len(questions)} questions but {len(passages)} passage lists; "
                             "pass one passage list per question")
        prompts = [self.build_prompt(q, ps) for q, ps in zip(questions, passages)]
        outs = self.generate(prompts, max_new_tokens=max_new_tokens, stop=list(self.template.stop), min_new_tokens=1)
        return [self.clean_answer(str(o)) for o in outs]

    @staticmethod
    def clean_answer(text: str) -> str:
        """The answer inside a completion (:func:`ragkit.text.extract_answer`)."""
        return extract_answer(text)


_MISALIGNED = ("{url} echoes prompt log-probs without the generated token's entry: its echo is misaligned "
               "(llama-cpp-python's server scores each token under the distribution that follows it, "
               "abetlen/llama-cpp-python#1983)")


class _MisalignedEcho(RemoteServerError):
    """The echoed prompt log-probs cannot be trusted (see ``_MISALIGNED``)."""


def _gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal (llama.cpp grammars): quotes, backslashes and controls escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class _OnePromptOnly(Exception):
    """The server answered a list of prompts with one choice: it takes one prompt per request."""
