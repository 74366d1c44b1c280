"""The package's import layers hold: CI fails when a module imports from a layer above it.

The rules are data in ``tests/core/layers.json`` (the rules of ``../shared/tools/layers.json`` plus the
shared core). Every import counts, including those inside functions and under ``TYPE_CHECKING``;
relative imports are resolved.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = json.loads((Path(__file__).with_name("layers.json")).read_text(encoding="utf-8"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, imported name)`` of every import in ``source`` (``from a import b`` gives ``a.b``)."""
    pkg = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")
                if node.level > 1:
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def matches(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / RULES["package"]).rglob("*.py")):
        src = module_name(path)
        text = path.read_text(encoding="utf-8")
        for rule in RULES["never"]:
            if not matches(src, rule["from"]) or matches(src, rule.get("except", [])):
                continue
            for line, target in imports_of(text, src, path.name == "__init__.py"):
                if matches(target, rule["to"]):
                    found.append(f"{path.relative_to(root)}:{line}: imports {target} -- {rule['why']}")
    return found


def test_layers_hold() -> None:
    found = violations()
    assert not found, "import(s) cross a layer rule:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("module", "is_package", "source", "crosses"),
    [
        ("ragkit.text", False, "def f():\n    from ragkit.eval.metrics import f1_max\n", True),  # inside a function
        ("ragkit.debias.moi", False, "from ..eval import metrics\n", True),  # relative import resolved
        ("ragkit.debias", True, "from .moi import MoI\n", False),
        ("ragkit.retrievers.bm25", False, "import ragkit.generation.generator\n", True),
        ("ragkit.eval.runner", False, "from ragkit.debias import get_reranker\n", False),  # downwards is fine
        ("ragkit.similarity", False, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from ragkit.generation import Generator\n", True),
        ("ragkit.training.cord", False, "from ragkit.cli import main\n", True),
    ],
)
def test_the_check_sees_every_kind_of_import(module: str, is_package: bool, source: str, crosses: bool) -> None:
    """The walker is not vacuous: it flags function-level, relative and type-checking imports."""
    hits = [
        target
        for rule in RULES["never"]
        if matches(module, rule["from"]) and not matches(module, rule.get("except", []))
        for _, target in imports_of(source, module, is_package)
        if matches(target, rule["to"])
    ]
    assert bool(hits) is crosses, hits


def test_rules_cover_the_core_and_every_upper_layer() -> None:
    froms = {p for r in RULES["never"] for p in r["from"]}
    assert {"ragkit.text", "ragkit.similarity", "ragkit.datasets", "ragkit.paraphrase", "ragkit.io",
            "ragkit.models", "ragkit.types", "ragkit.retrievers", "ragkit.generation", "ragkit.debias",
            "ragkit.eval", "ragkit.training"} <= froms
