"""``ragkit rerank`` and ``ragkit bias-profile``."""

from __future__ import annotations

import argparse
from typing import Any

from ragkit.cli._common import (
    add_data_args,
    add_k_arg,
    add_model_args,
    add_output_args,
    emit,
    non_negative_float,
    positive_int,
    seed_int,
    set_requirements,
)

__all__ = ["register", "add_moi_args", "moi_kwargs_from_args", "generator_from_args", "profile_from_args"]


def add_moi_args(p: argparse.ArgumentParser) -> None:
    """MoI settings shared by ``rerank`` and ``ask``.

    ``--design``, ``--budget`` and ``--outcome`` default to ``None``: the MoI preset (``rerank
    --reranker``) or :class:`ragkit.debias.MoIReranker` (``ask``) then decides, so the default is
    stated in one place (leave-one-out with the ``question`` outcome, chosen on HotpotQA train).
    """
    g = p.add_argument_group("MoI")
    g.add_argument("--design", choices=("loo", "ablate", "mixed", "cyclic", "prior", "random"), default=None,
                   help="interventions to run (default: the preset's; for moi: loo). Presence designs: loo = the "
                        "full prompt and each passage left out (k + 1 prompts), ablate = random subsets, mixed = "
                        "random subsets in random orders; permutations: cyclic = k rotations, prior = M<k "
                        "around the given order, random")
    g.add_argument("--budget", type=_budget, default=None,
                   help="number of interventions M (default: loo k + 1, fixed; cyclic/random k; prior 3; ablate "
                        "2k; mixed 3k) or 'auto' (rounds until the top of the ranking is stable)")
    g.add_argument("--outcome", choices=("question", "consensus", "confidence", "full_answer"), default=None,
                   help="label-free outcome per intervention (default: the preset's; for moi: question, the "
                        "question's likelihood after the passages; consensus: the majority answer's; "
                        "full_answer: the full prompt's answer scored under each intervention)")
    g.add_argument("--profile", default=None,
                   help="position-bias profile JSON (default: the model's cached profile from `ragkit bias-profile`; "
                        "the embedded SmolLM2's measured one; else flat, with a warning)")
    g.add_argument("--calibrate-profile", action="store_true",
                   help="with no --profile and nothing cached: calibrate on the bundled sample first (cached)")


def _budget(s: str) -> int | str:
    """``--budget``: a positive integer or ``auto``."""
    return "auto" if s == "auto" else positive_int(s)


def moi_kwargs_from_args(args: argparse.Namespace, preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """The MoI settings given on the command line (unset ones are left to the preset / MoI defaults).

    Checked before any model loads: the ``loo`` design (the default) has a fixed size, so an
    integer ``--budget`` with it is an error naming the fix.
    """
    kw = {name: getattr(args, name) for name in ("design", "budget", "outcome") if getattr(args, name) is not None}
    design = kw.get("design", (preset or {}).get("design", "loo"))
    if design == "loo" and isinstance(kw.get("budget"), int):
        raise ValueError(f"--budget {kw['budget']}: the loo design (the default) always runs k + 1 interventions; "
                         "leave --budget out, or pick --design ablate (random subsets) for another number")
    return kw


def generator_from_args(args: argparse.Namespace) -> Any:
    """The generator named by the model arguments."""
    from ragkit.generation import load_generator

    return load_generator(args.model, device=args.device, dtype=args.dtype, template=args.template,
                          batch_size=args.batch_size, passage_max_tokens=args.passage_max_tokens)


def profile_from_args(args: argparse.Namespace) -> Any:
    """The position profile of ``--profile`` (``None``: the reranker's default)."""
    from ragkit.debias.profile import PositionProfile

    return PositionProfile.load(args.profile) if args.profile else None


def _reranker_spec(spec: str | None) -> str:
    """``--reranker``: a spec for :func:`ragkit.debias.get_reranker`; a bare folder means ``student:FOLDER``."""
    if not spec:
        return "moi"
    if ":" not in spec and spec not in ("none", "random") and not spec.startswith("moi"):
        return f"student:{spec}"
    return spec


def _rerank(args: argparse.Namespace) -> int:
    from ragkit.debias import get_reranker
    from ragkit.debias.presets import parse_reranker
    from ragkit.io import read_jsonl
    from ragkit.types import Passage

    spec = _reranker_spec(args.reranker)
    kind, _ = parse_reranker(spec)  # a typo is reported before any model loads
    rows = read_jsonl(args.passages)
    if not rows:
        raise ValueError(f"{args.passages} holds no passages; write one JSON object per line "
                         '({"id": ..., "text": ..., "title": ..., "score": ...})')
    passages = [Passage.from_dict(r) for r in rows]
    seen: dict[str, int] = {}
    for i, p in enumerate(passages, 1):
        if p.id in seen:
            raise ValueError(f"{args.passages}: line {i} repeats passage id {p.id!r} of line {seen[p.id]} "
                             "(duplicate id); give every passage its own id")
        seen[p.id] = i
    with_score = [i for i, r in enumerate(rows, 1) if "score" in r]
    if with_score and len(with_score) != len(rows):
        missing = next(i for i, r in enumerate(rows, 1) if "score" not in r)
        raise ValueError(f"{args.passages}: line {missing} has no \"score\" but other lines do; give every "
                         "line a score, or none")
    scores = None
    if with_score:
        scores = []
        for i, r in enumerate(rows, 1):
            v = r["score"]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{args.passages}: line {i}: \"score\" must be a number, got {v!r}")
            scores.append(float(v))
    result: dict[str, Any] = {"query": args.query, "reranker": args.reranker or "moi"}
    if kind in ("upr", "icr", "moi_attn"):  # one-pass readers of the generator: no MoI settings
        ranked = get_reranker(spec, generator_from_args(args)).rank(args.query, passages, scores)
        result["reranker"] = kind
    elif kind.startswith("moi"):
        from ragkit.debias.presets import moi_settings

        moi_kw = moi_kwargs_from_args(args, moi_settings(kind))
        rr = get_reranker(spec, generator_from_args(args), profile=profile_from_args(args),
                          calibrate_profile=args.calibrate_profile, **moi_kw)
        ranked = rr.rank(args.query, passages, scores)
        d = ranked.info.details
        result.update({"reranker": kind, "design": d.get("design"), "outcome": d.get("outcome"),
                       "orderings": d.get("orderings"), "consensus_answer": d.get("target"),
                       "profiles": getattr(rr, "profiles_used", list)()})
    else:
        kw = {"device": args.device} if kind in ("student", "cross-encoder") else {}
        ranked = get_reranker(spec, **kw).rank(args.query, passages, scores)
    info = ranked.info
    result.update(info.to_dict(details=False))
    result["ranking"] = [{"rank": h.rank + 1, "id": h.passage.id, "score": h.score, "title": h.passage.title}
                         for h in ranked]
    text = "\n".join(f"{h.rank + 1:>3}  {h.score:+.4f}  {h.passage.id}  {h.passage.contents[:80]!r}"
                     for h in ranked)
    if info.fallback:  # never a silent fallback: the order above is the input order
        text += f"\nfell back to the input order: {info.fallback_reason}"
    emit(result, args, text)
    return 0


def _bias_profile(args: argparse.Namespace) -> int:
    from ragkit.datasets import load_dataset
    from ragkit.debias.profile import PositionProfile

    records = load_dataset(args.dataset or "hotpotqa", args.data_file, limit=args.limit)
    prof = PositionProfile.calibrate(generator_from_args(args), records, k=args.k, seed=args.seed,
                                     data=str(args.data_file),
                                     **({} if args.shrink_z is None else {"shrink_z": args.shrink_z}))
    prof.save(args.out)
    cached = prof.save_cached()  # MoI picks it up for this (model, template, k) from now on
    if args.plot:
        prof.plot(args.plot)
    text = (" ".join(f"{w:.3f}" for w in prof.weights) + f"\nsaved {args.out}"
            + (f" and {args.plot}" if args.plot else "")
            + f"\ncached as {cached}: from now on it is the default profile of MoI and bias-aware placement for "
              f"{prof.model} (template {prof.template}, k={prof.k}) in every command (reports record its path and "
              "sha256); delete that file to go back to the built-in default, or pass --profile FILE to choose")
    emit({**prof.to_dict(provenance=False), "cached_as": str(cached)}, args, text)
    return 0


def register(subparsers: Any) -> None:
    """Add ``rerank`` and ``bias-profile``."""
    p = subparsers.add_parser(
        "rerank", help="rerank passages with Mixture-of-Intervention, a distilled student or a cross-encoder",
        description="Rerank the passages of one query. --reranker: moi (default: leave-one-out, question "
                    "likelihood), moi_cyclic, moi_prior, moi_confidence, ..., student:DIR (ragkit distill), "
                    "cross-encoder:NAME, bi-encoder:NAME (a stock embedder's cosine), none, random.")
    p.add_argument("--query", required=True)
    p.add_argument("--passages", required=True, help='JSONL: {"id", "text", "title"?, "score"?} per line')
    p.add_argument("--reranker", default=None,
                   help="reranker spec (default moi); a bare folder is a distilled student (student:DIR)")
    add_moi_args(p)
    add_model_args(p)
    add_output_args(p, out_help="also write the JSON result to this file")
    p.set_defaults(func=_rerank)

    b = subparsers.add_parser("bias-profile", help="calibrate and plot a generator's position-bias profile")
    add_data_args(b, required=True, limit=20,
                  dataset_help="format of --data-file (default hotpotqa: answers and supporting facts needed)")
    add_k_arg(b, default=10, help="passages per calibration prompt")
    b.add_argument("--seed", type=seed_int, default=0)
    b.add_argument("--plot", default=None, help="PNG of the profile")
    b.add_argument("--shrink-z", type=non_negative_float, default=None,
                   help="shrink each slot's effect by this many standard errors over the questions, so that "
                        "differences within noise tie (default: ragkit.debias.profile.DEFAULT_SHRINK_Z, 1.96; "
                        "0: raw slot means)")
    add_model_args(b, passage_max_tokens=60)
    add_output_args(b, required=True, result=False, out_help="profile JSON to write")
    b.set_defaults(func=_bias_profile)
    set_requirements(b, lambda a: [(["matplotlib"], "ragkit bias-profile --plot")] if a.plot else [])
