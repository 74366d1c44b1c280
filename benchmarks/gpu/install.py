"""On the GPU machine: install the carried wheels the image needs, and ragkit itself, into one folder, offline.

Run from the repository root with the image's ``python3`` before ``run.py``; put the folder first
on ``PYTHONPATH`` (it shadows the image's older packages without touching them)::

    python3 benchmarks/gpu/install.py --target /tmp/site
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu/run.py --out "$OUT"

For each package the kit needs (``NEEDS``) it reads the installed version and installs the
carried wheel only when the package is missing or older than needed (``pip install --no-index
--find-links .whl --no-deps``: pip picks the wheel that matches this Python among those
carried). Then ragkit itself goes in with ``--no-deps --no-build-isolation`` (its full
dependency list would pull packages the kit does not import). It prints the Python version,
every decision and the versions that load afterwards; a failed step is reported and the run
goes on (``run.py`` records what it finds and skips what cannot run).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (distribution, oldest version the kit accepts, why); "==" marks an exact pin of the carried pydantic
NEEDS: tuple[tuple[str, str, str], ...] = (
    ("transformers", "5.23", "ragkit's floor (pyproject.toml)"),
    ("regex", "2025.10.22", "transformers >= 5.23 checks it at import"),
    ("starlette", "0.37", "ragkit serve"),
    ("uvicorn", "0.29", "ragkit serve"),
    ("pydantic", "2.7", "ragkit serve's request schemas"),
    ("annotated-types", "0.6", "pydantic"),
    ("typing-inspection", "0.4.2", "pydantic"),
    ("typing-extensions", "4.14.1", "pydantic"),
)
BROKEN = {"transformers": ("5.24.0",)}
"""Versions ragkit excludes (pyproject.toml): an installed one is replaced by the carried wheel."""
COMPANIONS = {"pydantic": "pydantic-core"}
"""Installed together with the key when it is installed (an exact pin of the carried version)."""


def _key(v: str) -> tuple[int, ...]:
    out = []
    for part in v.replace("-", ".").split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def pip(*args: str) -> bool:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--disable-pip-version-check", *args]
    print("  $ " + " ".join(cmd[2:]), flush=True)
    res = subprocess.run(cmd)
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="/tmp/site", help="install folder (put it first on PYTHONPATH)")
    ap.add_argument("--wheels", default=str(ROOT / ".whl"), help="the carried wheels (default .whl/)")
    a = ap.parse_args(argv)
    print(f"python {sys.version.split()[0]} ({sys.executable}); wheels in {a.wheels}: "
          f"{sorted(p.name for p in Path(a.wheels).glob('*.whl')) if Path(a.wheels).is_dir() else 'none'}",
          flush=True)
    todo = []
    for name, least, why in NEEDS:
        have = installed(name)
        ok = have is not None and _key(have) >= _key(least) and have not in BROKEN.get(name, ())
        print(f"  {name}: installed {have or 'no'}, needs >= {least} ({why}): "
              f"{'kept' if ok else 'install the carried wheel'}", flush=True)
        if not ok:
            todo.append(name)
            if name in COMPANIONS:
                todo.append(COMPANIONS[name])
    failed = []
    if todo and not pip("--upgrade", "--target", a.target, "--find-links", a.wheels, *todo):
        # one at a time, so that one missing wheel does not stop the others
        failed = [n for n in todo if not pip("--upgrade", "--target", a.target, "--find-links", a.wheels, n)]
    if not pip("--upgrade", "--no-build-isolation", "--target", a.target, str(ROOT)):
        print("  ragkit could not be installed; run.py imports it from the repository root on PYTHONPATH", flush=True)
        failed.append("ragkit")
    os.environ["PYTHONPATH"] = os.pathsep.join([a.target, str(ROOT), os.environ.get("PYTHONPATH", "")])
    check = ("import sys, transformers, ragkit, importlib.metadata as md; "
             "print('  loads: transformers', transformers.__version__, 'from', transformers.__file__); "
             "print('  loads: ragkit from', ragkit.__file__); "
             "[print('  ', n, md.version(n)) for n in ('tokenizers', 'huggingface-hub', 'safetensors', 'regex', "
             "'pydantic', 'pydantic-core', 'starlette', 'uvicorn', 'sentence-transformers', 'peft', 'accelerate', "
             "'torch')]")
    subprocess.run([sys.executable, "-c", check], env=os.environ)
    print(f"install: {'done' if not failed else 'failed for ' + ', '.join(failed)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
