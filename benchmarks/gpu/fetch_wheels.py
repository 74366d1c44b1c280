"""Download the wheels the GPU kit needs and the GPU machine's image lacks, and check what travels fits.

The GPU machine reaches no package index; it receives the working tree (tracked files and
untracked files git does not ignore) plus the ignored paths a device call names in ``carry``,
64 MiB in all. This script, run HERE (where pip reaches PyPI), puts exactly these wheels in
``.whl/`` (ignored by ``.gitignore``; carried with ``carry: [".whl"]``):

===================  =====================================================================
transformers 5.23.0  ragkit requires transformers >= 5.23, != 5.24.0 (5.24.0 cannot build
                     Qwen2); the image has 5.17 (its tokenizers 0.23.2, huggingface-hub 1.33,
                     safetensors 0.8 satisfy 5.23's requirements, so they are not carried)
regex                transformers >= 5.23 requires regex >= 2025.10.22 and checks it at
                     import; the image's version is unknown, so one binary wheel per likely
                     Python (cp310, cp311, cp312; the image's python3 was 3.12.3 when last seen)
starlette, uvicorn,  ``ragkit serve`` (the serve extra); the image has none of them (it has
pydantic (+ core,    prometheus-client, httpx, anyio, h11 and click); pydantic-core is binary
annotated-types,     (one wheel per Python), typing-extensions is carried because pydantic needs
typing-inspection,   >= 4.14.1 and the image's version is unknown
typing-extensions)
===================  =====================================================================

Not carried: FAISS GPU (``faiss-gpu-cu12`` 1.14.1.post1 for cp312 is a 48.4 MB wheel, 46 MiB,
and needs the CUDA 12 ``nvidia-cublas-cu12`` runtime that the CUDA 13 image lacks, hundreds of
MB more: the kit's dense search uses a torch matrix product and says so), and every other
ragkit dependency (bm25s, faiss-cpu, spacy, ...): the kit imports only what it measures.

It prints each wheel's size, the working tree's, and the total against 64 MiB, and exits 1 when
the total is over. ``--check-only`` downloads nothing and reports what is already there.

    python3 benchmarks/gpu/fetch_wheels.py            # here, before the device call
    python3 benchmarks/gpu/fetch_wheels.py --check-only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_MIB = 64.0

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
PYTHONS = ("3.10", "3.11", "3.12")

# (requirement, binary: one wheel per Python in PYTHONS; else one pure-Python wheel)
WHEELS: tuple[tuple[str, bool], ...] = (
    ("transformers==5.23.0", False),
    ("regex==2026.5.9", True),
    ("starlette==1.10.0", False),
    ("uvicorn==0.54.0", False),
    ("pydantic==2.13.4", False),
    ("pydantic-core==2.46.4", True),
    ("annotated-types==0.7.0", False),
    ("typing-inspection==0.4.2", False),
    ("typing-extensions==4.16.0", False),
)


def tree_files(root: Path = ROOT) -> list[Path]:
    """The files that travel with the working tree: tracked and untracked-not-ignored (``git ls-files -co``)."""
    out = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=root, check=True,
                         capture_output=True).stdout
    return [root / p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]


def size_bytes(paths: list[Path]) -> int:
    """Total size of the regular files among ``paths`` (a deleted file still listed by git counts 0)."""
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def download(dest: Path) -> None:
    """``pip download`` each of :data:`WHEELS` into ``dest`` (no dependencies: the image has them)."""
    dest.mkdir(parents=True, exist_ok=True)
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    for req, binary in WHEELS:
        for py in PYTHONS if binary else (PYTHONS[-1],):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                   "--python-version", py, "--implementation", "cp", *plat, "-d", str(dest), req]
            print(f"  pip download {req} (cp{py.replace('.', '')})" if binary else f"  pip download {req}",
                  flush=True)
            subprocess.run(cmd, check=True)


def report(dest: Path, root: Path = ROOT) -> float:
    """Print the wheels' and the working tree's sizes against the limit; return the total in MiB."""
    wheels = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    for w in wheels:
        print(f"  {w.stat().st_size / 2**20:8.2f} MiB  {w.name}")
    w_mib = size_bytes(wheels) / 2**20
    t_mib = size_bytes(tree_files(root)) / 2**20
    total = w_mib + t_mib
    print(f"wheels {w_mib:.2f} MiB ({len(wheels)} files) + working tree {t_mib:.2f} MiB = {total:.2f} MiB "
          f"of the {LIMIT_MIB:.0f} MiB that travel: {'fits' if total <= LIMIT_MIB else 'OVER THE LIMIT'}")
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default=str(ROOT / ".whl"), help="wheel folder (default .whl/ in the repository root)")
    ap.add_argument("--check-only", action="store_true", help="download nothing; report sizes only")
    a = ap.parse_args(argv)
    dest = Path(a.dest)
    if not a.check_only:
        download(dest)
    return 0 if report(dest) <= LIMIT_MIB else 1


if __name__ == "__main__":
    raise SystemExit(main())
