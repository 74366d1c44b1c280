"""Position-bias profiles: how much each prompt slot weighs in a generator's answer.

A :class:`PositionProfile` holds weights ``a_j >= 0`` with ``Σ a_j = 1`` for one (model, prompt
template, k). It is the slot weight vector of the Mixture-of-Intervention observation model
``E[o(π)] = b + Σ_j a_j u_{π(j)}`` (Lee et al., NAACL Findings 2025, arXiv 2412.10684) and,
plotted, the "lost in the middle" curve of that model.

Calibration (the gold-passage probe of Liu et al., "Lost in the Middle", TACL 2024,
arXiv 2307.03172): for each calibration question with a known gold passage, place the gold
passage at every slot ``j`` among ``k − 1`` fixed
distractors and score the gold answer's mean log-prob (teacher forcing); also score one
ordering with the gold absent (a further distractor instead). Then

    a_j ∝ max(0, m̃_j − mean_q o_q(gold absent))

normalised to sum to 1; a flat profile is the fallback when every slot is clipped to 0. ``m̃_j`` is
the slot's mean outcome with its effect soft-thresholded by its standard error, so that slot
differences within the noise of a few calibration questions do not steer the placement:

    c_qj = o_q(gold at j) − mean_j' o_q(gold at j')        (question difficulty removed)
    e_j  = mean_q c_qj,   se_j = sd_q(c_qj) / √Q
    m̃_j  = mean_qj o_q(gold at j) + sign(e_j) · max(0, |e_j| − z · se_j)

(soft thresholding, Donoho and Johnstone, "Ideal spatial adaptation by wavelet shrinkage",
Biometrika 1994; ``z = 1.96`` by default, ``z = 0`` gives the raw slot means). Slots whose effects
shrink to the same value tie, and bias-aware placement fills tied slots in slot order, so a
profile flat within its noise places a ranking best first.

Which profile MoI uses (:meth:`PositionProfile.for_generator`), per
(model, template, k):

1. a profile cached under ``$RAGKIT_CACHE/profiles/`` (written by :meth:`PositionProfile.save_cached`,
   by ``ragkit bias-profile`` and by automatic calibration);
2. for the embedded SmolLM2-135M-Instruct, the recency profile measured on it
   (:meth:`PositionProfile.recency`);
3. with ``calibrate=True``: the gold-passage probe on the bundled HotpotQA sample
   (``n_questions`` questions, ``n_questions · (k + 1)`` scored prompts in one batched call with
   the generator's progress bar: 88 full-prompt forwards at the defaults, 8 questions and
   k = 10, which is several minutes for a 135M model on 2 CPU cores), then cached;
4. otherwise (the default, since calibration costs minutes on CPU for larger models) the flat
   profile, with a warning naming ``ragkit bias-profile``. The presence designs (``loo``,
   ``ablate``, ``mixed``) do not need a profile to rank; the permutation designs do.

Every profile carries where it came from (:attr:`PositionProfile.provenance`: ``source`` one of
``file``, ``cache``, ``calibrated``, ``embedded``, ``flat``, ``given``; ``path`` and ``sha256`` of
the file it was read from or cached to), which the eval, rerank and ask reports record: a cached
profile changes later results, so a report must say which one it used. It is kept out of
the saved JSON (:meth:`PositionProfile.to_dict` with ``provenance=False``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.generation.base import GeneratorLike
from ragkit.types import Passage, QARecord

__all__ = ["PositionProfile", "DEFAULT_LAST_WEIGHT", "DEFAULT_SHRINK_Z", "profile_cache_path"]

logger = logging.getLogger(__name__)

_WARNED: set[tuple[str, str, int]] = set()

DEFAULT_LAST_WEIGHT = 0.3
"""Weight of the last slot in the label-free default profile (measured on SmolLM2-135M-Instruct)."""


def profile_cache_path(model: str, template: str, k: int) -> Path:
    """Where the profile of ``(model, template, k)`` is cached: ``$RAGKIT_CACHE/profiles/<...>.json``.

    The file name is a readable slug of the model name plus the first 10 hex digits of the
    SHA-1 of ``model|template|k`` (stable across processes, unique per key).
    """
    from ragkit.models import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(model)).name or str(model)).strip("_")[-60:] or "model"
    digest = hashlib.sha1(f"{model}|{template}|{int(k)}".encode()).hexdigest()[:10]
    return cache_dir() / "profiles" / f"{slug}-{template}-k{int(k)}-{digest}.json"


def _file_provenance(source: str, path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"source", "path", "sha256"}`` of a profile file (its bytes' SHA-256)."""
    p = Path(path)
    try:
        digest: str | None = hashlib.sha256(p.read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"source": source, "path": str(p.resolve()), "sha256": digest}


def _generator_key(generator: GeneratorLike) -> tuple[str, str]:
    name = str(getattr(generator, "name", "unknown"))
    tmpl = str(getattr(getattr(generator, "template", None), "name", "short"))
    return name, tmpl


DEFAULT_SHRINK_Z = 1.96
"""Standard errors by which a calibrated slot effect is soft-thresholded (module docstring)."""


def _slot_effects(so: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot effect ``e_j = mean_q c_qj`` and its standard error ``sd_q(c_qj) / √Q`` of the
    question-centred probe outcomes ``c_qj = o_qj − mean_j' o_qj'`` (zero errors for one question)."""
    c = so - so.mean(axis=1, keepdims=True)
    q = so.shape[0]
    se = c.std(axis=0, ddof=1) / np.sqrt(q) if q >= 2 else np.zeros(so.shape[1])
    return c.mean(axis=0), se


def _normalise(w: np.ndarray) -> np.ndarray:
    """``w / Σ w``; weights near the float maximum (whose plain sum overflows to infinity) are first
    divided by their largest, so they keep their shape; all zeros give the flat profile."""
    w = np.asarray(w, dtype=np.float64)
    top = w.max() if w.size else 0.0
    if not top > 0:
        return np.full(w.shape[0], 1.0 / w.shape[0])
    s = w.sum()
    if not np.isfinite(s):
        w = w / top
        s = w.sum()
    return w / s


def _same_model(a: str, b: str) -> bool:
    """Two generator names denote one model: equal, or the same last path part (a hub id and the
    local folder it was downloaded to, ``org/name`` and ``/models/name``)."""
    tail = lambda x: str(x).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()  # noqa: E731
    return a == b or tail(a) == tail(b)


@dataclass(frozen=True)
class PositionProfile:
    """Slot weights ``a`` of one generator + prompt template for ``k`` passages.

    Parameters
    ----------
    weights
        ``(k,)`` non-negative weights summing to 1 (normalised on construction).
    model
        Generator name the profile was measured on (``"none"`` for synthetic profiles).
    template
        Prompt template name.
    k
        Number of passages (slots).
    meta
        Extra JSON-ready data (raw per-slot probe means, number of questions, ...).
    """

    weights: np.ndarray
    model: str = "none"
    template: str = "short"
    k: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        raw = np.asarray(self.weights)
        if raw.ndim != 1 or raw.dtype == bool or not (np.issubdtype(raw.dtype, np.number)):
            raise ValueError(
                f"profile weights must be a flat list of k numbers (one per prompt slot), got "
                f"{'a ' + str(raw.ndim) + '-D array' if raw.ndim != 1 else 'values of type ' + str(raw.dtype)}; "
                "write one with `ragkit bias-profile --out FILE`")
        w = raw.astype(np.float64)
        if w.size < 1:
            raise ValueError("a position profile needs at least one slot weight")
        if np.any(w < 0) or not np.all(np.isfinite(w)):
            raise ValueError(f"profile weights must be finite and >= 0, got {w.tolist()}")
        object.__setattr__(self, "weights", _normalise(w))
        if self.k and self.k != w.size:
            raise ValueError(f"profile k={self.k} but {w.size} weights")
        object.__setattr__(self, "k", int(w.size))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def flat(cls, k: int, model: str = "none", template: str = "short") -> PositionProfile:
        """The uniform profile ``a_j = 1/k`` (no position bias)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return cls(np.full(k, 1.0 / k), model=model, template=template, k=k, meta={"kind": "flat"})

    @classmethod
    def recency(
        cls, k: int, last: float = DEFAULT_LAST_WEIGHT, model: str = "none", template: str = "short"
    ) -> PositionProfile:
        """The label-free default: ``last`` on the final slot, ``(1 − last)/(k − 1)`` elsewhere.

        This is the recency-dominant shape measured on the embedded SmolLM2-135M with the
        ``short`` template (30 HotpotQA dev questions: the gold passage counts most next to the
        question and the answer cue). Used when no calibrated profile is given.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not 0 < last < 1:
            raise ValueError(f"last must be in (0, 1), got {last}")
        if k == 1:
            return cls(np.ones(1), model=model, template=template, k=1, meta={"kind": "recency"})
        w = np.full(k, (1.0 - last) / (k - 1))
        w[-1] = last
        return cls(w, model=model, template=template, k=k, meta={"kind": "recency", "last": last})

    @classmethod
    def from_probe(
        cls,
        slot_outcomes: np.ndarray,
        absent_outcomes: np.ndarray,
        model: str = "none",
        template: str = "short",
        shrink_z: float = DEFAULT_SHRINK_Z,
    ) -> PositionProfile:
        """Profile from gold-passage probe outcomes.

        Parameters
        ----------
        slot_outcomes
            ``(Q, k)``: outcome of question ``q`` with the gold passage at slot ``j``.
        absent_outcomes
            ``(Q,)``: outcome of question ``q`` with the gold passage absent.
        shrink_z
            Soft-threshold each slot's effect by ``shrink_z`` standard errors (module docstring;
            ``0``: the raw slot means). Needs ``Q >= 2`` questions; with one there is no
            standard error and nothing is shrunk.
        """
        so = np.atleast_2d(np.asarray(slot_outcomes, dtype=np.float64))
        ab = np.asarray(absent_outcomes, dtype=np.float64).reshape(-1)
        if so.shape[0] != ab.shape[0] or so.shape[0] < 1:
            raise ValueError(f"probe outcomes of shape {so.shape} do not match absent outcomes {ab.shape}")
        if not np.isfinite(shrink_z) or shrink_z < 0:
            raise ValueError(f"shrink_z must be a finite number >= 0, got {shrink_z}")
        slot_mean = so.mean(axis=0)
        absent_mean = float(ab.mean())
        effect, se = _slot_effects(so)
        shrunk = float(so.mean()) + np.sign(effect) * np.clip(np.abs(effect) - shrink_z * se, 0.0, None)
        diff = np.clip(shrunk - absent_mean, 0.0, None)
        k = so.shape[1]
        meta = {
            "kind": "calibrated",
            "num_questions": int(so.shape[0]),
            "slot_mean": slot_mean.tolist(),
            "absent_mean": absent_mean,
            "slot_effect": effect.tolist(),
            "slot_se": se.tolist(),
            "shrink_z": float(shrink_z),
            "shrunk_slot_mean": shrunk.tolist(),
        }
        if diff.sum() <= 1e-12:
            logger.warning("gold-passage probe shows no slot above the gold-absent baseline; using a flat profile")
            meta["kind"] = "flat-fallback"
            return cls(np.full(k, 1.0 / k), model=model, template=template, k=k, meta=meta)
        return cls(diff, model=model, template=template, k=k, meta=meta)

    @classmethod
    def calibrate(
        cls,
        generator: GeneratorLike,
        records: Sequence[QARecord],
        k: int = 10,
        seed: int = 0,
        min_questions: int = 1,
        data: str | None = None,
        shrink_z: float = DEFAULT_SHRINK_Z,
    ) -> PositionProfile:
        """Measure the profile of ``generator`` with the gold-passage probe (module docstring).

        ``data`` names the records' source (e.g. a file path); it is stored in ``meta["data"]``
        with the ids of the questions used, so the JSON records what it was measured on.

        Each usable record (an answer, a gold passage among its passages) contributes ``k + 1``
        prompts: its first gold passage at each slot among ``k − 1`` fixed distractors, and the
        gold-absent prompt (a ``k``-th distractor instead). Distractors are the record's
        non-gold passages in their given order, padded with other records' non-gold passages
        (chosen with ``seed``) when a record has fewer than ``k``. All prompts of all
        questions are scored in one batched :meth:`Generator.score_orderings` call.
        ``shrink_z``: as in :meth:`from_probe`.
        """
        if k < 2:
            raise ValueError(f"calibrating a position profile needs k >= 2 slots, got k={k}")
        rng = np.random.default_rng(seed)
        pool: list[Passage] = []
        for r in records:
            gold = set(r.gold_ids)
            pool += [p for p in r.passages if p.id not in gold]
        questions: list[str] = []
        passages: list[list[Passage]] = []
        answers: list[str] = []
        used: list[str] = []
        for r in records:
            gold = set(r.gold_ids)
            golds = [p for p in r.passages if p.id in gold]
            if not r.answers or not golds or not r.answers[0].strip():
                continue
            own = [p for p in r.passages if p.id not in gold]
            if len(own) < k:
                own_ids = {p.id for p in own}
                others = list({p.id: p for p in pool if p.id not in gold and p.id not in own_ids}.values())
                if len(others) < k - len(own):
                    continue
                pick = rng.choice(len(others), size=k - len(own), replace=False)
                own = own + [others[i] for i in sorted(pick.tolist())]
            questions.append(r.question)
            used.append(str(r.id))
            passages.append([golds[0]] + own[:k])
            answers.append(r.answers[0])
        if len(questions) < min_questions:
            raise ValueError(
                f"only {len(questions)} calibration records have an answer, a gold passage and enough "
                f"distractors for k={k}; pass records with answers and gold_ids (e.g. HotpotQA train)"
            )
        # passage 0 = gold, 1..k-1 = fixed distractors, k = the extra distractor for "absent"
        distract = list(range(1, k))
        orders = [distract[:j] + [0] + distract[j:] for j in range(k)] + [list(range(1, k + 1))]
        res = generator.score_orderings(questions, passages, [orders] * len(questions), answers)
        means = [np.asarray(r.mean, dtype=np.float64) for r in res]
        slot = np.stack([m[:k] for m in means])
        absent = np.array([m[k] for m in means])
        name, tmpl = _generator_key(generator)
        prof = cls.from_probe(slot, absent, model=name, template=tmpl, shrink_z=shrink_z)
        meta = dict(prof.meta)
        meta.update({"data": data or "records passed to PositionProfile.calibrate", "question_ids": used,
                     "seed": seed})
        return cls(prof.weights, model=prof.model, template=prof.template, k=prof.k, meta=meta)

    # ------------------------------------------------------------------ cache
    def save_cached(self) -> Path:
        """Save under :func:`profile_cache_path` of this profile's (model, template, k); return the path.

        From then on :meth:`for_generator` returns it for that (model, template, k): it becomes the
        default of MoI and bias-aware placement for that model.
        """
        path = profile_cache_path(self.model, self.template, self.k)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save(path)
        return path

    @property
    def provenance(self) -> dict[str, Any]:
        """Where this profile came from: ``{"source", "path"?, "sha256"?, "model", "template", "k"}``."""
        prov = dict(self.meta.get("provenance") or {"source": self.meta.get("kind") or "given"})
        prov.update({"model": self.model, "template": self.template, "k": self.k})
        if "resized_from" in self.meta:
            prov["resized_from"] = self.meta["resized_from"]
        return prov

    def with_provenance(self, source: str, path: str | os.PathLike[str] | None = None) -> PositionProfile:
        """This profile marked as coming from ``source`` (and the file ``path``, hashed)."""
        import copy

        prov = _file_provenance(source, path) if path is not None else {"source": source}
        out = copy.copy(self)  # not the constructor: it would renormalise the weights (last-bit drift)
        object.__setattr__(out, "meta", {**self.meta, "provenance": prov})
        return out

    @classmethod
    def cached(cls, model: str, template: str, k: int) -> PositionProfile | None:
        """The cached profile of ``(model, template, k)``, or ``None``."""
        path = profile_cache_path(model, template, k)
        if not path.is_file():
            return None
        prof = cls.load(path)
        if prof.k != k:
            raise ValueError(f"cached profile {path} has k={prof.k}, expected {k}; delete it and re-run "
                             "`ragkit bias-profile`")
        return prof.with_provenance("cache", path)

    @classmethod
    def for_generator(
        cls,
        generator: GeneratorLike,
        k: int,
        calibrate: bool = False,
        records: Sequence[QARecord] | None = None,
        n_questions: int = 8,
        seed: int = 0,
    ) -> PositionProfile:
        """The profile MoI uses for ``generator`` and ``k`` passages (module docstring, steps 1-4).

        Parameters
        ----------
        calibrate
            When nothing is cached (and the model is not the embedded SmolLM2): run the
            gold-passage probe on ``records`` (default: the bundled HotpotQA sample) and cache the
            result. ``False``: the flat profile with a warning.
        n_questions
            Calibration questions (bounds the cost at ``n_questions · (k + 1)`` scored prompts).
        """
        from ragkit.models import DEFAULT_GENERATOR

        name, tmpl = _generator_key(generator)
        if k == 1:
            return cls.flat(1, model=name, template=tmpl)
        prof = cls.cached(name, tmpl, k)
        if prof is not None:
            logger.info("using the cached position profile %s", profile_cache_path(name, tmpl, k))
            return prof
        if Path(name).name == DEFAULT_GENERATOR:
            prof = cls.recency(k, model=name, template=tmpl)
            return cls(prof.weights, model=name, template=tmpl, k=k,
                       meta={**prof.meta, "data": "recency shape measured on SmolLM2-135M-Instruct "
                                                   "(30 HotpotQA dev questions, short template)",
                             "provenance": {"source": "embedded"}})
        if calibrate:
            if records is None:
                from ragkit.datasets import SAMPLE_HOTPOTQA, sample_records

                records, data = sample_records(), f"bundled sample {Path(SAMPLE_HOTPOTQA).name}"
            else:
                data = "records passed to PositionProfile.for_generator"
            usable = [r for r in records if r.answers and r.gold_ids][:n_questions]
            logger.info("calibrating the position profile of %s (%s, k=%d) on %d questions", name, tmpl, k,
                        len(usable))
            prof = cls.calibrate(generator, usable, k=k, seed=seed, data=data)
            path = prof.save_cached()
            logger.info("saved the position profile to %s", path)
            return prof.with_provenance("calibrated", path)
        if (name, tmpl, k) in _WARNED:
            return cls.flat(k, model=name, template=tmpl)
        _WARNED.add((name, tmpl, k))
        logger.warning(
            "no position profile for %s (template %s, k=%d): using the flat profile, which leaves the "
            "permutation designs (cyclic, prior, random) with the retriever order. Measure it once with "
            "`ragkit bias-profile` (cached under $RAGKIT_CACHE/profiles) or pass calibrate_profile=True / "
            "--profile FILE", name, tmpl, k)
        return cls.flat(k, model=name, template=tmpl)

    # ------------------------------------------------------------------ utilities
    def resized(self, k: int) -> PositionProfile:
        """This profile for ``k`` slots: linear interpolation over relative position, renormalised."""
        if k == self.k:
            return self
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if self.k == 1 or k == 1:
            w = np.ones(k)
        else:
            w = np.interp(np.linspace(0.0, 1.0, k), np.linspace(0.0, 1.0, self.k), self.weights)
        meta = dict(self.meta)
        meta["resized_from"] = self.k
        return PositionProfile(w, model=self.model, template=self.template, k=k, meta=meta)

    def slot_order(self) -> list[int]:
        """Slots from the heaviest to the lightest (ties: earlier slot first)."""
        return sorted(range(self.k), key=lambda j: (-float(self.weights[j]), j))

    def to_dict(self, provenance: bool = True) -> dict[str, Any]:
        """JSON-ready form (``provenance=False``: without where this copy came from, as files are saved)."""
        meta = {k: v for k, v in self.meta.items() if provenance or k != "provenance"}
        return {"weights": self.weights.tolist(), "model": self.model, "template": self.template,
                "k": self.k, "meta": meta}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PositionProfile:
        """Inverse of :meth:`to_dict`; every field is checked (a list of numbers, strings, a whole
        ``k``), never coerced: ``true`` is not a one-slot profile, nor ``[[...]]`` a flattened one."""
        if "weights" not in d:
            raise ValueError(f"a profile JSON needs a 'weights' list, got keys {sorted(d)}")
        w = d["weights"]
        if not isinstance(w, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w):
            raise ValueError(
                f"a profile's 'weights' must be a flat list of numbers (one per prompt slot), got "
                f"{json.dumps(w)[:80]}; write one with `ragkit bias-profile --out FILE`")
        for key in ("model", "template"):
            if key in d and not isinstance(d[key], str):
                raise ValueError(f"a profile's {key!r} must be a string, got {json.dumps(d[key])[:80]}")
        k = d.get("k", 0)
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"a profile's 'k' must be a whole number, got {json.dumps(k)[:40]}")
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"a profile's 'meta' must be a JSON object, got {type(meta).__name__}")
        return cls(np.asarray(w, dtype=np.float64), model=d.get("model", "none"),
                   template=d.get("template", "short"), k=k, meta=meta)

    def check_for(self, model: str, template: str) -> bool:
        """Warn when this profile was measured for another generator or prompt template than
        ``(model, template)``; returns whether it matches. A profile of another model weighs the
        slots of that model's prompt, not this one's (synthetic profiles, model ``"none"``, match
        every model)."""
        ok_model = self.model == "none" or _same_model(self.model, model)
        ok_tmpl = self.model == "none" or self.template == template
        if not (ok_model and ok_tmpl):
            logger.warning(
                "the position profile was measured for %s (template %s) but is used for %s (template %s): its slot "
                "weights describe another prompt; measure one for this generator with `ragkit bias-profile "
                "--model %s --out FILE`", self.model, self.template, model, template, model)
        return ok_model and ok_tmpl

    def check_generator(self, generator: GeneratorLike) -> bool:
        """:meth:`check_for` the name and prompt template of ``generator``."""
        return self.check_for(*_generator_key(generator))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile as JSON (atomically)."""
        from ragkit.io import write_json

        write_json(path, self.to_dict(provenance=False))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PositionProfile:
        """Read a profile written by :meth:`save`."""
        from ragkit.io import parse_json

        if Path(path).is_dir():
            raise IsADirectoryError(f"{path} is a folder; pass a position profile JSON file (written by "
                                    "`ragkit bias-profile --out FILE`)")
        try:
            with open(path, encoding="utf-8") as f:
                data = parse_json(f.read(), path)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a position profile (not JSON: {e}); write one with "
                             "`ragkit bias-profile --out FILE`") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a position profile (a JSON {type(data).__name__}, expected an "
                             "object with 'weights'); write one with `ragkit bias-profile --out FILE`")
        try:
            return cls.from_dict(data).with_provenance("file", path)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def plot(self, path: str | os.PathLike[str], title: str | None = None) -> None:
        """Save a bar chart of the weights (matplotlib, Agg backend) to ``path`` (PNG)."""
        from ragkit.types import require_extra

        require_extra(["matplotlib"], "plotting a position profile")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.2))
        x = np.arange(1, self.k + 1)
        ax.bar(x, self.weights, color="#4477aa")
        ax.axhline(1.0 / self.k, color="grey", ls="--", lw=1, label="flat")
        ax.set_xlabel("prompt slot (1 = first passage)")
        ax.set_ylabel("weight a_j")
        ax.set_xticks(x)
        ax.set_title(title or f"position profile: {self.model} ({self.template}, k={self.k})", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        from ragkit.io import save_figure

        save_figure(fig, path, dpi=120, tight=False)

