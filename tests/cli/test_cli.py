"""The ``ragkit`` command line as a whole: one vocabulary, one error style, README commands parse."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ragkit.cli import build_parser, main
from ragkit.datasets import SAMPLE_HOTPOTQA
from ragkit.io import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    """Every ``ragkit ...`` / ``accelerate launch -m ragkit.cli ...`` line of README.md's bash blocks."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            line = re.sub(r"^accelerate launch( --\S+ \S+)* -m ragkit\.cli ", "ragkit ", line)
            if line.startswith("ragkit "):
                cmds.append(line.split(" > ")[0].split(" && ")[0])
    return cmds


def test_readme_commands_parse() -> None:
    """Every README command line is accepted by the parser (flag spellings stay in sync)."""
    cmds = _readme_commands()
    assert len(cmds) >= 15
    parser = build_parser()
    for cmd in cmds:
        argv = shlex.split(cmd, comments=True)[1:]
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # pragma: no cover - the failure message names the command
            pytest.fail(f"README command does not parse (exit {e.code}): {cmd}")
        assert callable(getattr(args, "func", None)), cmd


def test_version_and_group_alone_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from ragkit import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ragkit {__version__}"
    assert main(["train"]) == 2
    out = capsys.readouterr().out
    assert "cord" in out and "psgrpo" in out
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_quiet_and_verbose_after_the_subcommand() -> None:
    p = build_parser()
    a = p.parse_args(["search", "-q", "x", "--quiet", "-v"])
    assert a.quiet is True and a.verbose == 1
    b = p.parse_args(["--quiet", "-vv", "search", "-q", "x"])
    assert b.quiet is True and b.verbose == 2  # the top-level value is not reset by the subcommand
    c = p.parse_args(["eval", "sweep", "--data-file", "f", "--quiet"])
    assert c.quiet is True


def test_one_vocabulary_and_hidden_aliases() -> None:
    p = build_parser()
    a = p.parse_args(["rerank", "--query", "q", "--passages", "p.jsonl", "--passage-tokens", "40"])
    assert a.passage_max_tokens == 40
    b = p.parse_args(["bias-profile", "--data", "f.jsonl", "--out", "p.json"])
    assert b.data_file == "f.jsonl"
    for argv in (["search", "-q", "x", "--k", "3"], ["search", "-q", "x", "-k", "3"],
                 ["ask", "q?", "--k", "3"], ["eval", "-k", "3"], ["bias-profile", "--data-file", "f", "-k", "3",
                                                               "--out", "p"]):
        assert p.parse_args(argv).k == 3, argv
    # --json is a boolean everywhere, --out the file or folder
    for argv in (["search", "-q", "x", "--json"], ["eval", "--json"], ["ask", "q?", "--json"],
                 ["distill", "--labels", "l", "--out", "d", "--json"], ["index", "--out", "d", "--json"],
                 ["eval", "consistency", "--json"], ["rerank", "--query", "q", "--passages", "p", "--json"]):
        assert p.parse_args(argv).json is True, argv
    for hidden in ("--passage-tokens", "--data "):
        assert hidden not in p._subparsers._group_actions[0].choices["bias-profile"].format_help()


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--limit", "-1"],
        ["eval", "sweep", "--data-file", "f", "--limit", "0"],
        ["eval", "consistency", "--limit", "-1"],
        ["eval", "--max-new-tokens", "0"],
        ["search", "-q", "x", "-k", "0"],
        ["distill", "labels", "--data-file", "f", "--out", "o", "--limit", "-1"],
    ],
)
def test_nonsense_numbers_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_required_data_file_also_through_its_alias(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bias-profile", "--out", "p.json"]) == 2
    assert "required: --data-file" in capsys.readouterr().err


def test_errors_are_one_line_and_tracebacks_need_v(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["rerank", "--query", "q", "--passages", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ragkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["-v", "rerank", "--query", "q", "--passages", str(missing)]) == 1
    assert "Traceback" in capsys.readouterr().err
    bad = tmp_path / "p.jsonl"
    write_jsonl(bad, [{"id": "a", "text": "x"}])
    assert main(["rerank", "--query", "q", "--passages", str(bad), "--reranker", "moi_typo"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ragkit: error: ") and "moi_typo" in err and err.count("\n") == 1


def test_out_folder_refused_before_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "is a folder" in err and "result.json" in err


def test_device_cuda_without_cuda_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["ask", "Who?", "--device", "cuda"]) == 1
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu" in err and err.count("\n") == 1


def test_json_on_stdout_summary_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "-q", "Arthur's Magazine", "-k", "2", "--json", "--quiet"]) == 0
    out = capsys.readouterr().out
    res = json.loads(out)  # nothing but JSON on stdout
    assert res["k"] == 2 and len(res["results"][0]["hits"]) == 2


def test_python_dash_m_ragkit_cli_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "ragkit.cli", "--version"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ragkit ")


def test_library_never_imports_the_cli() -> None:
    hits = [str(p.relative_to(ROOT)) for p in (ROOT / "ragkit").rglob("*.py")
            if "cli" not in p.relative_to(ROOT / "ragkit").parts[:1]
            and re.search(r"from ragkit\.cli|import ragkit\.cli", p.read_text(encoding="utf-8"))]
    assert hits == []


def test_bias_profile_reads_its_data_through_the_one_detector(tmp_path: Path, capsys) -> None:
    """A non-HotpotQA file is refused with the format named, before any model loads."""
    nq = tmp_path / "x.jsonl"
    write_jsonl(nq, [{"question": "q", "answers": ["a"], "ctxs": [{"title": "t", "text": "x"}]}])
    assert main(["bias-profile", "--data-file", str(nq), "--out", str(tmp_path / "p.json")]) == 1
    assert "holds nq-open records, not hotpotqa" in capsys.readouterr().err
    assert SAMPLE_HOTPOTQA.exists()
