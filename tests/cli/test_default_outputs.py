"""Commands that write a file by default write distinct files for distinct settings."""

from __future__ import annotations

import argparse

from ragkit.cli import _lock_targets, build_parser
from ragkit.cli.eval import default_report_name


def _args(line: str) -> argparse.Namespace:
    args = build_parser().parse_args(line.split())
    args.out = args.out or args._default_out(args)
    return args


def test_eval_examples_write_distinct_reports() -> None:
    lines = [
        "eval",
        "eval --dataset hotpotqa --data-file dev.jsonl --limit 50 --methods none,moi,voting",
        "eval --dataset msmarco --data-file qna_v1.1_sample.json --limit 50",
        "eval --data-file dev.jsonl --limit 50",
        "eval --data-file dev.jsonl --limit 50 --retriever bm25",
    ]
    names = [_args(line).out for line in lines]
    assert names[0] == "ragkit-eval-report.json"  # the main job keeps its documented name
    assert len(set(names)) == len(names), names
    assert names[1] == "ragkit-eval-hotpotqa-dev-50q-none+moi+voting.json"
    # the lock covers the file the run writes
    assert _lock_targets(_args(lines[1]))[0].endswith(names[1])


def test_explicit_out_wins() -> None:
    args = build_parser().parse_args("eval --data-file dev.jsonl --out mine.json".split())
    assert args.out == "mine.json"
    assert default_report_name(args).startswith("ragkit-eval-")


def test_ask_cuts_passages_by_default() -> None:
    """`ragkit ask` scores k + 1 prompts: its passages are cut unless asked otherwise (0 = no cut)."""
    from ragkit.cli.ask import ASK_PASSAGE_TOKENS

    assert build_parser().parse_args(["ask", "Who wrote Hamlet?"]).passage_max_tokens == ASK_PASSAGE_TOKENS == 64
    assert build_parser().parse_args(["ask", "q", "--passage-max-tokens", "0"]).passage_max_tokens == 0
