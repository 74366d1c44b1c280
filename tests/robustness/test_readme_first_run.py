"""README first-run examples work on the bundled sample: its questions, its gold paragraphs retrieved."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ragkit.datasets import sample_records

ROOT = Path(__file__).resolve().parents[2]
_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _bash_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("ragkit "):
                cmds.append(line)
    return cmds


def _on_bundled_data(cmd: str) -> bool:
    """ask/search/index commands that read the bundled sample (no file of the user's)."""
    argv = shlex.split(cmd)
    if argv[1] == "ask":
        return "--index" not in argv
    if argv[1] == "index":
        return "--corpus" not in argv
    if argv[1] == "search":
        return "--index" not in argv or argv[argv.index("--index") + 1] in _bundled_indexes()
    return False


def _bundled_indexes() -> set[str]:
    out = set()
    for cmd in _bash_commands():
        argv = shlex.split(cmd)
        if argv[1] == "index" and "--corpus" not in argv:
            out.add(argv[argv.index("--out") + 1])
    return out


def _gold_of(question: str) -> set[str]:
    recs = {r.query.text: r for r in sample_records()}
    assert question in recs, f"README question is not in the bundled sample: {question!r}"
    return set(recs[question].gold_ids)


def test_readme_questions_are_in_the_bundled_sample() -> None:
    """``ragkit ask "..."`` and the Python pipeline on the embedded defaults ask questions of the bundled sample."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    asked = re.findall(r'ragkit ask "([^"]+)"', text)
    asked += re.findall(r'RAGPipeline\.default\(.*?\)\n\w+ = rag\.ask\("([^"]+)"\)', text)
    assert len(asked) >= 2
    for q in asked:
        _gold_of(q)  # names the question when it is not in the sample


def test_readme_examples_on_bundled_data_retrieve_the_gold(tmp_path: Path, tiny_lm_dir: Path) -> None:
    cmds = [c for c in _bash_commands() if _on_bundled_data(c)]
    kinds = {shlex.split(c)[1] for c in cmds}
    assert {"ask", "index", "search"} <= kinds, cmds
    questions = [shlex.split(c)[2] for c in cmds if shlex.split(c)[1] == "ask"]
    for cmd in cmds:
        argv = shlex.split(cmd)[1:]
        if argv[0] == "ask":
            argv += ["--model", str(tiny_lm_dir), "--json"]
        if argv[0] == "search" and "--json" not in argv:
            argv.append("--json")
        r = subprocess.run([sys.executable, "-m", "ragkit.cli", *argv, "--quiet"], cwd=tmp_path, env=_ENV,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{cmd}\n{r.stderr}"
        if argv[0] == "ask":
            got = {p["id"] for p in json.loads(r.stdout)["passages"]}
            gold = _gold_of(argv[1])
        elif argv[0] == "search":
            res = json.loads(r.stdout)["results"]
            got = {h["id"] for q in res for h in q["hits"]}
            # the query names the question's entities: the gold paragraphs of the README question
            gold = set().union(*(_gold_of(q) for q in questions))
        else:
            continue
        assert gold <= got, f"{cmd}: gold {gold} not retrieved, got {got}"


def test_readme_trained_model_path_is_where_cord_writes() -> None:
    """``--model runs/cord/final``: CORD writes ``<output_dir>/final`` and the README trains into runs/cord."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    from ragkit.training import cord

    assert '"final"' in Path(cord.__file__).read_text(encoding="utf-8")
    dirs = re.findall(r"ragkit train cord .*?--output[-_]dir (\S+)", text)
    loaded = re.findall(r"--model (runs/\S+?)[`\s]", text)
    assert dirs and loaded
    for m in loaded:
        assert any(m.rstrip("/") == f"{d.rstrip('/')}/final" for d in dirs), (m, dirs)
