"""Real CORD run: LoRA-train a generator (default: embedded SmolLM2) with cord and shuffle, then a sweep.

Stages (results are written after each one, so a cut-off run still leaves a partial table):
base sweep -> train cord -> cord sweep -> train shuffle -> shuffle sweep.
The sweep is :func:`ragkit.eval.sweep.position_sweep` on NQ-open (gold passage at each slot among
answer-free distractors), scoring the gold answer's mean log-prob (``--generate`` adds greedy EM).

    python experiments/cord/cord_sweep.py --out experiments/cord/results/cord_sweep-cpu.json

A ``--losses`` entry may carry its own settings, ``cord:alpha=1:lam=4`` (:func:`parse_loss_spec`):
variants of a loss land beside the others in the same JSON, against the same base sweep.

``--sweep-only`` re-runs the sweeps on the models a previous run left in ``--workdir`` (its
training records are kept from ``--out``). Beside each curve the JSON keeps every question's
per-slot log-probs and a paired bootstrap over questions (1,000 resamples, seed 0) of the
best-minus-worst gap of each model and of the gap differences between models.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.datasets import data_path
from ragkit.eval.harness import gpu_epilog, rel, study_config, study_main, write_result
from ragkit.eval.stats import gap_bootstrap


def _final(run: Path) -> str:
    """The trained model of a CORD run folder (``final/``; older runs saved it in the folder itself)."""
    return str(run / "final") if (run / "final" / "config.json").exists() else str(run)


def _trained(run: Path) -> bool:
    """Whether a CORD run folder holds the trained model that :func:`_final` names."""
    return (Path(_final(run)) / "config.json").exists()


def _sweep(model_path: str | None, recs: list, pool: list, args: argparse.Namespace) -> dict[str, Any]:
    from ragkit.eval.sweep import position_sweep
    from ragkit.generation import Generator

    gen = Generator(model=model_path, device=args.device, passage_max_tokens=args.passage_max_tokens,
                    batch_size=8, show_progress=False)
    t0 = time.perf_counter()
    res = position_sweep(gen, recs, k=args.k, pool=pool, seed=0, generate=args.generate, score=True,
                         max_new_tokens=12)
    d = res.to_dict()
    per_q = d.pop("per_question", [])
    slot_ids = sorted({r["slot"] for r in per_q if r["setting"] == "slot"})
    by_q: dict[str, list[float]] = {}
    for r in per_q:
        if r["setting"] == "slot":
            by_q.setdefault(r["qid"], [float("nan")] * len(slot_ids))[slot_ids.index(r["slot"])] = r["logprob"]
    slots = [r for r in d["rows"] if r["setting"] == "slot"]
    out = {
        "seconds": time.perf_counter() - t0,
        "curve_logprob": {r["slot"]: r["logprob"] for r in slots},
        "mean_logprob": sum(r["logprob"] for r in slots) / len(slots),
        "gap_logprob": d["summary"][str(args.k)]["logprob"]["gap"],
        "worst_slot": d["summary"][str(args.k)]["logprob"]["worst_slot"],
        "closed_book_logprob": next(r["logprob"] for r in d["rows"] if r["setting"] == "closed_book"),
        "oracle_logprob": next(r["logprob"] for r in d["rows"] if r["setting"] == "oracle"),
        "per_question_slot_logprob": by_q,
    }
    if args.generate:
        out["curve_em"] = {r["slot"]: r["subspan_em"] for r in slots}
        out["mean_em"] = sum(r["subspan_em"] for r in slots) / len(slots)
        out["gap_em"] = d["summary"][str(args.k)]["subspan_em"]["gap"]
    return out


#: Training settings a ``--losses`` entry may override for itself, with their types.
VARIANT_KEYS: dict[str, type] = {"lam": float, "alpha": float, "gamma": float, "lr": float, "steps": int,
                                 "ce_on": str}
#: The :class:`~ragkit.training.cord.CORDConfig` field of a :data:`VARIANT_KEYS` key, where the names differ.
_CONFIG_FIELD = {"lr": "learning_rate", "steps": "max_steps"}


def parse_loss_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split a ``--losses`` entry ``LOSS[:KEY=VALUE...]`` into the loss and its own settings.

    ``cord:alpha=1:lam=4`` trains ``cord`` on uniformly shuffled orders with lambda 4; the entry
    itself names the model in the JSON, so variants of one loss sit beside the base and the
    other losses in one table (one shared base sweep, paired intervals between all of them).

    Raises
    ------
    SystemExit
        An unknown key or a value of the wrong type, naming the allowed keys.
    """
    loss, *parts = spec.strip().split(":")
    overrides: dict[str, Any] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in VARIANT_KEYS:
            raise SystemExit(f"--losses entry {spec!r}: {part!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(VARIANT_KEYS)} (e.g. cord:alpha=1:lam=4)")
        try:
            overrides[key] = VARIANT_KEYS[key](value)
        except ValueError:
            kind = VARIANT_KEYS[key].__name__
            raise SystemExit(f"--losses entry {spec!r}: {key}={value!r} is not a {kind}") from None
    return loss, overrides


#: Settings that change a run's numbers; a resume refuses an ``--out`` whose settings differ in one.
RESULT_KEYS = ("model", "train_file", "sweep_file", "train_limit", "train_k", "steps", "lr", "lam",
               "passage_max_tokens", "k", "sweep_questions", "generate")


def resume_mismatch(prev: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The :data:`RESULT_KEYS` on which a stored run's config and this one's differ."""
    return [k for k in RESULT_KEYS if prev.get(k) != now.get(k)]


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    epilog = gpu_epilog(
        "experiments/cord/cord_sweep.py",
        "--model Qwen/Qwen2.5-7B-Instruct --device cuda --train-limit 300 --train-k 10 --k 10 "
        "--sweep-questions 100 --losses cord,shuffle,score_aware --out "
        "experiments/cord/results/cord_sweep-gpu.json")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None,
                    help="base generator: hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct; "
                         "the reference generator: --model \"$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)\")")
    ap.add_argument("--device", default="cpu",
                    help="device of the sweeps (training uses accelerate's: CUDA when present)")
    ap.add_argument("--train-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/train.jsonl")
    ap.add_argument("--sweep-file", default=None, help="default: $RAGKIT_DATA/nq_open/nq-open-oracle.jsonl.gz")
    ap.add_argument("--train-limit", type=int, default=60)
    ap.add_argument("--train-k", type=int, default=5, help="top-k BM25 passages per training question")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--passage-max-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=5, help="sweep context size")
    ap.add_argument("--sweep-questions", type=int, default=30)
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--losses", default="cord,shuffle",
                    help="comma-separated losses, each optionally with its own settings, LOSS[:KEY=VALUE...] with "
                         f"KEY one of {', '.join(VARIANT_KEYS)}: e.g. cord,shuffle,cord:alpha=1:lam=4 (the entry "
                         "names the model in the JSON)")
    ap.add_argument("--workdir", default="/tmp/cord-real")
    ap.add_argument("--sweep-only", action="store_true",
                    help="sweep the models already in --workdir; keep the training records of --out")
    ap.add_argument("--save-steps", type=int, default=25,
                    help="checkpoint every this many steps (a cut-off run resumes from the last one)")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the finished sweeps and trainings of an --out with the same settings, run only "
                         "the rest (default); --no-resume starts over")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    a = study_config(ap, config)
    a.train_file = str(a.train_file or data_path("hotpotqa", "train.jsonl"))
    a.sweep_file = str(a.sweep_file or data_path("nq_open", "nq-open-oracle.jsonl.gz"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    from ragkit.datasets import load_dataset
    from ragkit.models import resolve_generator_path
    from ragkit.training.cord import LOSSES, CORDConfig, train_cord
    from ragkit.training.data import load_examples

    names = [x.strip() for x in a.losses.split(",")]
    specs = [parse_loss_spec(x) for x in names]
    unknown = [x for x, (loss, _) in zip(names, specs) if loss not in LOSSES]
    if unknown:
        raise SystemExit(f"--losses: unknown loss in {', '.join(unknown)}; use one of {', '.join(LOSSES)}")

    base = resolve_generator_path(a.model)
    pool = load_dataset("nq-open", a.sweep_file, limit=300)
    recs = pool[: a.sweep_questions]
    result: dict[str, Any] = {"model": rel(base), "config": {**vars(a), "train_file": rel(a.train_file),
                                                            "sweep_file": rel(a.sweep_file)}, "sweep": {}, "train": {}}

    def save() -> None:
        # the intervals cover every sweep written so far, so a cut-off or resumed run's file never lacks them
        result["gap_bootstrap"] = gap_bootstrap(result["sweep"])
        write_result(a.out, result)

    if a.sweep_only and Path(a.out).exists():
        prev = json.loads(Path(a.out).read_text())
        result["train"] = prev.get("train", {})
        result["config"] = {**prev.get("config", {}), "sweep_only": True}
    elif a.resume and Path(a.out).exists():
        prev = json.loads(Path(a.out).read_text())
        differ = resume_mismatch(prev.get("config", {}), result["config"])
        if differ:
            raise SystemExit(f"{a.out} holds a run with other settings ({', '.join(differ)}); pass --no-resume "
                             "to start over, or another --out")
        result["sweep"], result["train"] = prev.get("sweep", {}), prev.get("train", {})
        logging.info("resuming %s: sweeps done %s, trainings done %s", a.out, sorted(result["sweep"]),
                     sorted(result["train"]))
    if "none" not in result["sweep"]:
        result["sweep"]["none"] = _sweep(base, recs, pool, a)
        save()
    examples = [] if a.sweep_only else load_examples(a.train_file, limit=a.train_limit, k=a.train_k)
    for name, (loss, own) in zip(names, specs):
        out = Path(a.workdir) / name.replace(":", "_")
        if a.sweep_only:
            result["sweep"][name] = _sweep(_final(out), recs, pool, a)
            continue
        if name in result["sweep"] and name in result["train"]:
            continue
        if name in result["train"] and not _trained(out):
            logging.warning("%s: %s is recorded as trained but %s holds no model (another machine's --workdir?); "
                            "training it again", a.out, name, out)
            del result["train"][name]
        if name not in result["train"]:
            cfg = {"lam": a.lam, "learning_rate": a.lr, "max_steps": a.steps,
                   **{_CONFIG_FIELD.get(k, k): v for k, v in own.items()}}
            st = CORDConfig(output_dir=str(out), model=base, loss=loss, lora=True, per_device_train_batch_size=1,
                            passage_max_tokens=a.passage_max_tokens, logging_steps=5, seed=0,
                            save_steps=max(1, min(a.save_steps, cfg["max_steps"])), resume_from_checkpoint="last",
                            **cfg)
            s = train_cord(examples, st)
            result["train"][name] = {**{k: v for k, v in s.items() if k != "settings"}, "overrides": own}
            save()
        result["sweep"][name] = _sweep(_final(out), recs, pool, a)
        save()
    save()
    for name, v in result["gap_bootstrap"].get("gap_difference", {}).items():
        logging.info("gap difference %s: %.3f nats, 95%% CI %s", name, v["value"], v["ci95"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
