"""Every result the README and the result pages cite exists: each script path, each results path, and
each ``*-cpu.json`` named bare is a file of the repository (the moves keep their numbers traceable)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted({ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md"),
                *(ROOT / "experiments").rglob("README.md"), ROOT / "benchmarks" / "README.md"})
RESULTS = {p.name for p in [*ROOT.glob("benchmarks/results/*"), *ROOT.glob("experiments/*/results/*")]}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_scripts_and_results_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = []
    for path in re.findall(r"(?<![\w/.-])((?:benchmarks|experiments)/[\w./-]+\.(?:py|json|jsonl\.gz|md))\b", text):
        if not (ROOT / path).exists() and "-gpu" not in path and "*" not in path and "NAME" not in path:
            missing.append(path)
    for name in re.findall(r"`([\w.-]+-cpu\.json)`", text):
        if name not in RESULTS and "NAME" not in name:
            missing.append(name)
    assert not missing, f"{page.relative_to(ROOT)} cites what does not exist: {sorted(set(missing))}"
