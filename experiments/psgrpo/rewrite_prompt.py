"""Two rewrite prompts of ``LLMParaphraser`` side by side, judged blind by a reader: which keeps the question?

The paraphrase audit (``paraphrase_audit.json``) found that 58% of the reference generator's
rewrites, through the library's two-shot prompt, ask another question, mostly by dropping a hop of
a multi-hop question or turning a wh-question into a statement. This script samples rewrites of
questions no study reads (HotpotQA train rows 120-139 by default) with the library's prompt and
with a candidate prompt (a multi-hop and a yes/no example, and the instruction to keep every step),
without a filter (the raw rewrites are what the prompt controls), and writes them to a
**blind** file: every (question, rewrite) pair in a seeded random order, the prompt hidden. A reader
labels each pair ``same`` or ``changed`` by the audit's criterion; ``--score LABELS`` then unblinds
and counts.

    python3 experiments/psgrpo/rewrite_prompt.py --model "$(bash $RAGKIT_DATA/../tools/get_qwen05.sh)"
    python3 experiments/psgrpo/rewrite_prompt.py --score experiments/psgrpo/rewrite_prompt_labels.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragkit.datasets import data_path, load_hotpotqa
from ragkit.eval.harness import gpu_epilog, machine_info, rel, study_config, study_main, write_result

HERE = Path(__file__).resolve().parent
SCRIPT = "experiments/psgrpo/rewrite_prompt.py"
#: the candidate: a multi-hop and a yes/no example, and the instruction to keep every step and the question form
CANDIDATE = (
    "Rewrite the question in different words. The rewrite must ask for exactly the same answer: keep "
    "every name, number and every step that links them, keep it a question of the same kind, and do "
    "not answer it.\n\n"
    "Question: Which city is the capital of France?\n"
    "Rewrite: What is the name of France's capital city?\n\n"
    "Question: In what year did the father of the director of Jaws die?\n"
    "Rewrite: The man who directed Jaws had a father who died in which year?\n\n"
    "Question: Are Blur and Oasis both British bands?\n"
    "Rewrite: Do Blur and Oasis both come from Britain?\n\n"
    "Question: {q}\n"
    "Rewrite:"
)


def build_parser() -> argparse.ArgumentParser:
    """Sampling options, or ``--score`` to unblind a labelled file."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=gpu_epilog(SCRIPT, None, note="GPU: not applicable: a reader judges 120 rewrites; sampling them "
                                               "takes minutes on a CPU."))
    p.add_argument("--model", default=None, help="the rewriter (default: the reference generator's GGUF path)")
    p.add_argument("--rows", default="120,140", help="HotpotQA train rows START,END (0-based, end excluded)")
    p.add_argument("--n", type=int, default=3, help="rewrites per question and prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=str(HERE / "results" / "rewrite-prompt-qwen-cpu.json"),
                   help="the sampled rewrites with the prompt of each (the key) and the blind file beside it")
    p.add_argument("--score", default=None, metavar="LABELS",
                   help="a labels JSON {pair id: same|changed}: unblind it against --out and count")
    return p


def run(config: Mapping[str, Any]) -> int:
    """Sample and write the blind file, or score a labelled one."""
    a = study_config(build_parser(), config)
    out = Path(a.out)
    if a.score:
        return score(out, Path(a.score))
    import inspect

    from ragkit.generation import Generator
    from ragkit.models import resolve_generator_path
    from ragkit.paraphrase import LLMParaphraser

    library_prompt = inspect.signature(LLMParaphraser).parameters["prompt"].default

    os.environ.setdefault("RAGKIT_NO_PROGRESS", "1")
    start, end = (int(x) for x in a.rows.split(","))
    recs = load_hotpotqa(data_path("hotpotqa", "train.jsonl"))[start:end]
    model = resolve_generator_path(a.model)
    gen = Generator(model, device="cpu", dtype=a.dtype, template="auto", batch_size=8, show_progress=False)
    prompts = {"library": library_prompt, "candidate": CANDIDATE}
    rewrites: list[dict[str, Any]] = []
    fallback: dict[str, int] = {}
    for name, prompt in prompts.items():
        rep = LLMParaphraser(gen, seed=a.seed, prompt=prompt, tries=1).paraphrase_with_report(
            [r.question for r in recs], a.n)
        for r, ps, fb in zip(recs, rep.paraphrases, rep.fallback):
            for i, text in enumerate(ps[: len(ps) - fb]):  # the rule fallback's rewrites are not the prompt's
                rewrites.append({"question_id": r.id, "question": r.question, "rewrite": text, "prompt": name,
                                 "index": i})
        fallback[name] = rep.fallback_count
    random.Random(a.seed).shuffle(rewrites)
    for i, x in enumerate(rewrites):
        x["id"] = f"p{i:03d}"
    result = {"what": __doc__.split("\n\n")[0], "rows": [start, end], "n": a.n, "seed": a.seed, "dtype": a.dtype,
              "model": rel(Path(model)), "prompts": prompts,
              "fallback": fallback,
              "pairs": rewrites, "machine": machine_info("cpu")}
    write_result(out, result)
    blind = out.with_name(out.stem + ".blind.json")
    write_result(blind, {"criterion": "experiments/psgrpo/paraphrase_audit.json", "pairs": [
        {"id": x["id"], "question": x["question"], "rewrite": x["rewrite"]}
        for x in sorted(rewrites, key=lambda x: x["id"])]})
    print(f"{len(rewrites)} rewrites; blind file: {blind}")
    return 0


def score(out: Path, labels_path: Path) -> int:
    """Unblind ``labels_path`` against the key in ``out``: per prompt, the share of rewrites that keep the question."""
    key = json.loads(out.read_text(encoding="utf-8"))
    labels = json.loads(labels_path.read_text(encoding="utf-8"))["labels"]
    missing = [x["id"] for x in key["pairs"] if x["id"] not in labels]
    if missing:
        raise SystemExit(f"{len(missing)} pair(s) unlabelled (e.g. {missing[0]}); label every pair of the blind file")
    counts: dict[str, dict[str, int]] = {}
    for x in key["pairs"]:
        c = counts.setdefault(x["prompt"], {"same": 0, "changed": 0})
        c[labels[x["id"]]] += 1
    key["scores"] = {p: {**c, "same_share": c["same"] / max(1, c["same"] + c["changed"])} for p, c in counts.items()}
    key["labels"] = {"path": rel(labels_path)}
    write_result(out, key)
    print("| prompt | rewrites | same | changed | same share | from the rule fallback |\n|---|---|---|---|---|---|")
    for p, c in key["scores"].items():
        print(f"| {p} | {c['same'] + c['changed']} | {c['same']} | {c['changed']} | {c['same_share']:.2f} | "
              f"{key['fallback'].get(p)} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--config FILE`` and flags, then :func:`run`."""
    return study_main(build_parser(), run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
