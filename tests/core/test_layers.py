"""The import rules hold: layers, public names for the lab, and no import circle.

The rules are data in ``tests/core/layers.json``, the one rules file of the repository (``layers``:
lowest first; a module imports only from its own group and lower layers; every module belongs to a
group). Every import counts, including those inside functions and under ``TYPE_CHECKING``; relative
imports are resolved. The scripts in ``benchmarks/`` and ``experiments/`` import only public ragkit
names (no ``_`` component) and their own folder's ``_*.py`` shared module, never a script, never the
other folder; and nothing in ``ragkit/``, ``benchmarks/`` or ``experiments/`` imports in a circle.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = json.loads((Path(__file__).with_name("layers.json")).read_text(encoding="utf-8"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
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


def _groups() -> list[tuple[int, int, list[str], bool]]:
    """``(layer index, group index, prefixes, exact)`` of every group."""
    return [(li, gi, g, bool(layer.get("exact"))) for li, layer in enumerate(RULES["layers"])
            for gi, g in enumerate(layer["groups"])]


def group_of(name: str) -> tuple[int, int] | None:
    """The ``(layer, group)`` of a ragkit module or name: the group with the longest matching prefix."""
    best: tuple[int, int, int] | None = None
    for li, gi, prefixes, exact in _groups():
        for p in prefixes:
            if (name == p) or (not exact and name.startswith(p + ".")):
                if best is None or len(p) > best[2]:
                    best = (li, gi, len(p))
    return None if best is None else (best[0], best[1])


def crossing(src: str, target: str) -> str | None:
    """Why ``src`` importing ``target`` breaks a layer rule, or ``None``."""
    if not matches(target, [RULES["package"]]):
        return None
    a, b = group_of(src), group_of(target)
    if b is None and target.count(".") == 1:  # "from ragkit import Name": a name of the facade
        b = group_of(RULES["package"])
    if a is None or b is None or a == b:
        return None
    if b[0] > a[0]:
        return f"a lower layer imports a higher one ({RULES['layers'][b[0]]['name']}): {RULES['layers'][b[0]]['why']}"
    if b[0] == a[0]:
        return f"peers of one layer import each other: {RULES['layers'][a[0]]['why']}"
    return None


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / RULES["package"]).rglob("*.py")):
        src = module_name(path, root)
        for line, target in imports_of(path.read_text(encoding="utf-8"), src, path.name == "__init__.py"):
            why = crossing(src, target)
            if why:
                found.append(f"{path.relative_to(root)}:{line}: imports {target} -- {why}")
    return found


def test_layers_hold() -> None:
    found = violations()
    assert not found, "import(s) cross a layer rule:\n" + "\n".join(found)


def test_every_module_is_in_a_layer() -> None:
    missing = [module_name(p) for p in sorted((ROOT / RULES["package"]).rglob("*.py"))
               if group_of(module_name(p)) is None]
    assert not missing, f"modules in no group of tests/core/layers.json: {missing}"


@pytest.mark.parametrize(
    ("module", "is_package", "source", "crosses"),
    [
        ("ragkit.text", False, "def f():\n    from ragkit.eval.metrics import f1_max\n", True),  # inside a function
        ("ragkit.debias.moi", False, "from ..eval import metrics\n", True),  # relative import resolved
        ("ragkit.debias", True, "from .moi import MoI\n", False),
        ("ragkit.retrievers.bm25", False, "import ragkit.generation.generator\n", True),  # peers
        ("ragkit.eval.runner", False, "from ragkit.debias import get_reranker\n", False),  # downwards is fine
        ("ragkit.similarity", False, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from ragkit.generation import Generator\n", True),
        ("ragkit.training.cord", False, "from ragkit.cli import main\n", True),
        ("ragkit.serve.app", False, "from ragkit.pipeline import RAGPipeline\n", True),  # peers
        ("ragkit.reranking", False, "from ragkit.debias import MoI\n", True),
        ("ragkit.batching", False, "from ragkit.types import Passage\n", False),
        ("ragkit.debias.moi", False, "from ragkit import Passage\n", True),  # the facade sits above
    ],
)
def test_the_check_sees_every_kind_of_import(module: str, is_package: bool, source: str, crosses: bool) -> None:
    """The walker is not vacuous: it flags function-level, relative and type-checking imports."""
    hits = [t for _, t in imports_of(source, module, is_package) if crossing(module, t)]
    assert bool(hits) is crosses, hits


# ----------------------------------------------------------------------------- benchmarks/ and experiments/
def _scripts(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in RULES["scripts"]["folders"] for p in (root / folder).rglob("*.py")
                  if "results" not in p.parts)


def script_violations(path: Path, root: Path = ROOT) -> list[str]:
    """What a lab file imports against the rules: private ragkit names, scripts, the other folder."""
    folder = path.relative_to(root).parts[0]
    others = [f for f in RULES["scripts"]["folders"] if f != folder]
    local = {p.stem for p in path.parent.glob("*.py")}
    found = []
    for line, target in imports_of(path.read_text(encoding="utf-8"), path.stem, False):
        head = target.split(".")[0]
        where = f"{path.relative_to(root)}:{line}: imports {target}"
        if head == RULES["package"]:
            if any(part.startswith("_") for part in target.split(".")):
                found.append(f"{where} -- a private ragkit name; use (or make) a public one")
        elif head in others or head in RULES["scripts"]["folders"]:
            found.append(f"{where} -- {RULES['scripts']['why']}")
        elif head in local and not head.startswith("_"):
            found.append(f"{where} -- a script imports another script; share code through ragkit or the "
                         "folder's _*.py module")
    return found


def test_lab_imports_only_public_ragkit_names() -> None:
    found = [v for p in _scripts() for v in script_violations(p)]
    assert not found, "\n".join(found)


def test_the_lab_check_sees_scripts_and_private_names(tmp_path: Path) -> None:
    (tmp_path / "experiments" / "s").mkdir(parents=True)
    (tmp_path / "experiments" / "s" / "a.py").write_text(
        "import b\nfrom _lab import x\nfrom ragkit.eval.runner import _private\nimport ragkit.retrievers._bm25_numba\n"
        "from ragkit.eval.stats import paired_ci\nfrom benchmarks import y\n")
    (tmp_path / "experiments" / "s" / "b.py").write_text("")
    (tmp_path / "experiments" / "s" / "_lab.py").write_text("")
    found = script_violations(tmp_path / "experiments" / "s" / "a.py", tmp_path)
    assert [f.split(": imports ")[1].split(" --")[0] for f in found] == [
        "b", "ragkit.eval.runner._private", "ragkit.retrievers._bm25_numba", "benchmarks.y"]


# ----------------------------------------------------------------------------- circles
def _graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules it imports, over ragkit/ and each lab folder (a script's folder-local imports)."""
    graph: dict[str, set[str]] = {}
    mods = {module_name(p, root): p for p in (root / RULES["package"]).rglob("*.py")}
    for name, path in mods.items():
        out = graph.setdefault(name, set())
        for _, target in imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"):
            while target and target not in mods:  # "from a.b import name" -> a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    for path in _scripts(root):
        name = module_name(path, root)
        local = {p.stem: module_name(p, root) for p in path.parent.glob("*.py")}
        out = graph.setdefault(name, set())
        for _, target in imports_of(path.read_text(encoding="utf-8"), path.stem, False):
            if target.split(".")[0] in local:
                out.add(local[target.split(".")[0]])
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its modules is no circle: drop the edges into a package's own
    # __init__ from its submodules, and from the __init__ to its submodules keep them
    for name in list(graph):
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    known = [sorted(c) for c in RULES.get("known_circles", [])]
    found = [c for c in circles(graph) if c not in known]
    assert not found, "import circle(s):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_check_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
