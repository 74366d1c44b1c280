"""The harness of the studies in ``experiments/`` and the benchmarks in ``benchmarks/``.

A study is a script with ``run(config) -> int``: ``config`` maps the script's option names (argparse
``dest`` names, ``"passage_tokens"`` for ``--passage-tokens``) to values, and an option it leaves
out takes the script's default. :func:`study_main` is every script's ``main``: it reads
``--config FILE`` (a committed JSON of option values: the settings that produced a committed
result), lets the command line override any of them, and calls ``run``. So the same study runs
from a shell, from a test (``run({...})``), and from a config file, with one set of defaults.

The rest records results honestly and portably: :func:`write_result` writes the JSON atomically
with the machine it ran on (:func:`machine_info`), and :func:`rel` records paths relative to the
data folder (``$RAGKIT_DATA/...``, :func:`ragkit.datasets.data_dir`) or to the working folder,
never a machine's absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "REFERENCE_GGUF_CMD",
    "cpu_name",
    "gpu_epilog",
    "machine_info",
    "model_label",
    "model_record",
    "plan_commit",
    "pre_registered",
    "pre_registered_parser",
    "rel",
    "resolve_recorded",
    "same_model",
    "study_config",
    "study_main",
    "write_result",
]

REFERENCE_GGUF_CMD = "bash $RAGKIT_DATA/../tools/get_qwen05.sh"
"""Assembles the reference generator (Qwen2.5-Coder-0.5B-Instruct, one GGUF file) and prints its path."""


def study_config(parser: argparse.ArgumentParser, config: Mapping[str, Any]) -> argparse.Namespace:
    """``config`` over the parser's defaults, as the namespace ``parse_args`` would give.

    Values are taken as given (a config holds typed JSON values); string defaults of options with
    a ``type`` are converted as argparse converts them. ``_argv`` on the namespace is the command
    line that set them (for the result's ``command``): the one :func:`study_main` parsed, or the
    config's settings written as flags.

    Raises
    ------
    ValueError
        A key that is no option of the script (the message lists the options).
    """
    dests = {a.dest: a for a in parser._actions if a.dest != "help"}
    unknown = sorted(k for k in set(config) - set(dests) - {"config"} if not k.startswith("_"))
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; the study's settings are {sorted(dests)}")
    ns = argparse.Namespace(**{d: _default(a) for d, a in dests.items()})
    for key, value in config.items():
        if key != "config":
            setattr(ns, key, value)
    if "_argv" not in config:  # called as run({...}): the settings it was given, as flags
        ns._argv = [x for k, v in config.items() if not k.startswith("_") and k != "config"
                    for x in (f"--{k.replace('_', '-')}", str(v))]
    return ns


def _default(action: argparse.Action) -> Any:
    """An option's default as ``parse_args`` gives it (a string default goes through ``type``)."""
    d = action.default
    if isinstance(d, str) and callable(action.type):
        return action.type(d)
    return d


def study_main(parser: argparse.ArgumentParser, run: Callable[[Mapping[str, Any]], int],
               argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (``--config FILE`` first, then the flags that override it) and return ``run(config)``.

    A config is a JSON object of settings by dest name; keys starting with ``_`` are notes (the
    command it replaces, the model to pass); a string value ``$RAGKIT_DATA/...`` is a path in the
    data folder (:func:`resolve_recorded`).

    Raises
    ------
    SystemExit
        A config file that does not exist, is not a JSON object, or names an unknown setting.
    """
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="JSON of settings (option names with _ for -); flags given here override it")
    pre_parser = argparse.ArgumentParser(add_help=False)
    pre_parser.add_argument("--config", default=None)
    pre, _ = pre_parser.parse_known_args(argv)
    if pre.config:
        path = Path(pre.config)
        if not path.is_file():
            parser.error(f"--config {path}: no such file")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            parser.error(f"--config {path}: not JSON ({e.msg} at line {e.lineno})")
        if not isinstance(cfg, dict):
            parser.error(f"--config {path}: expected a JSON object of settings")
        dests = {a.dest for a in parser._actions}
        unknown = sorted(k for k in cfg if k not in dests and not k.startswith("_"))
        if unknown:
            parser.error(f"--config {path}: unknown setting(s) {unknown}")
        settings = {k: resolve_recorded(v) if isinstance(v, str) else v for k, v in cfg.items()
                    if not k.startswith("_")}
        parser.set_defaults(**settings)
        for action in parser._actions:  # a required option the config sets is no longer required
            if action.dest in settings:
                action.required = False
    args = parser.parse_args(argv)
    return run({**vars(args), "_argv": list(sys.argv[1:] if argv is None else argv)})


def cpu_name() -> str:
    """The CPU model name (``/proc/cpuinfo``) or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info(device: str | None = None) -> dict[str, Any]:
    """Platform, CPU, Python, torch/transformers versions and the device (``cuda`` when available)."""
    info: dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0],
                            "cpu": cpu_name(), "cpu_count": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if str(device).startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:  # pragma: no cover
        info["torch"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        info["transformers"] = None
    info["device"] = device or "cpu"
    return info


def write_result(path: str | os.PathLike[str], payload: dict[str, Any], device: str | None = None) -> None:
    """Write ``payload`` as JSON atomically (:func:`ragkit.io.write_json`), with ``machine`` added.

    A ``machine`` entry already in ``payload`` is kept: a dict is merged over :func:`machine_info`,
    a string is kept as ``machine["note"]``.
    """
    from ragkit.io import write_json

    info = machine_info(device)
    given = payload.get("machine")
    if isinstance(given, dict):
        info.update(given)
    elif given is not None:
        info["note"] = given
    write_json(path, {**payload, "machine": info})


def plan_commit(path: str | os.PathLike[str]) -> str | None:
    """The last commit that touched a pre-registered plan, or ``None`` when it has uncommitted changes or is untracked.

    A study's JSON names its plan by this commit, so the history shows the plan was committed
    before the results it governs.
    """
    import subprocess

    p = Path(path).resolve()

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=p.parent, capture_output=True, text=True).stdout.strip()

    if git("status", "--porcelain", "--", p.name):
        return None
    return git("log", "-1", "--format=%H", "--", p.name) or None


def pre_registered(plan: str | os.PathLike[str], out: str | os.PathLike[str],
                   allow_uncommitted: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """Open a pre-registered study: ``(plan, result)``, the plan file's JSON and the result to extend.

    ``result`` is what ``out`` holds already (a resumed run), else ``{}``, with ``result["plan"] =
    {"path", "commit"}`` set (:func:`plan_commit`; the path as :func:`rel` records it).

    A plan may be amended while its study runs only by saying so in the plan: an entry of its
    ``"amendments"`` list whose ``"amends"`` names the commit the results so far were written under
    (the full hash or a prefix of at least 7 characters), with what changed and why. Then the run goes on
    and ``result["plan"]["earlier_commits"]`` keeps every commit it ran under, so a reader sees which
    results predate the amendment. A silent edit is still refused: a study's results must name one plan.

    Raises
    ------
    SystemExit
        The plan has uncommitted changes or is untracked (unless ``allow_uncommitted``: tests and smoke
        runs), or ``out`` was written under another commit of the plan that no amendment names.
    """
    path = Path(plan).resolve()
    spec = json.loads(path.read_text(encoding="utf-8"))
    commit = plan_commit(path)
    if commit is None and not allow_uncommitted:
        raise SystemExit(f"{path} has uncommitted changes or is not tracked: commit the plan before its run")
    result: dict[str, Any] = json.loads(Path(out).read_text(encoding="utf-8")) if Path(out).exists() else {}
    was = result.get("plan", {})
    earlier = list(was.get("earlier_commits", []))
    if result and was.get("commit") != commit:
        old = str(was.get("commit") or "")
        if not any(isinstance(a, dict) and len(str(a.get("amends", ""))) >= 7 and old.startswith(str(a["amends"]))
                   for a in spec.get("amendments", [])):
            raise SystemExit(f"{out} was written under another commit of the plan ({old[:12] or 'none'}); pass another "
                             "--out, or amend the plan openly: add to its \"amendments\" list an entry "
                             f'{{"amends": "{old[:12]}", "what": ..., "why": ...}}')
        earlier.append(old)
    result["plan"] = {"path": rel(path), "commit": commit, **({"earlier_commits": earlier} if earlier else {})}
    return spec, result


def pre_registered_parser(description: str, study_dir: str | os.PathLike[str], *, script: str, gpu_args: str,
                          workdir: str, workdir_help: str, device_help: str, passage_max_tokens: int
                          ) -> argparse.ArgumentParser:
    """The command line every pre-registered confirmation shares; the script adds its own options.

    The options (the plan fixes everything else): ``--out`` (default
    ``<study_dir>/results/confirm-qwen-cpu.json``), ``--plan`` (``<study_dir>/plan.json``, opened with
    :func:`pre_registered`), ``--model``, ``--device`` (``cpu``), ``--workdir`` (trained models,
    checkpoints and partial results, so a stopped run resumes), ``--train-file``,
    ``--passage-max-tokens``, ``--n-boot`` (2000 bootstrap resamples), ``--max-steps`` (smoke runs)
    and ``--allow-uncommitted-plan`` (tests and smoke runs; recorded). The epilog is
    :func:`gpu_epilog`'s GPU run, with the note that another generator is another study: the plan
    names its reference generator, so a run with another ``--model`` writes another ``--out``.

    Parameters
    ----------
    description : str
        The parser's description (the script's first docstring line).
    study_dir : str or os.PathLike
        The study's folder under ``experiments/``, which holds ``plan.json`` and ``results/``.
    script, gpu_args : str
        The script's path from the repository root and the flags of its GPU run (:func:`gpu_epilog`).
    workdir, workdir_help : str
        ``--workdir``'s default and what the study keeps there.
    device_help : str
        What ``--device`` moves (the study's sweeps, its training too).
    passage_max_tokens : int
        The plan's cut of each passage, ``--passage-max-tokens``'s default.
    """
    here = Path(study_dir)
    epilog = gpu_epilog(script, gpu_args, note="The plan names the reference generator; another --model is another "
                                               "study: pass another --out.")
    ap = argparse.ArgumentParser(description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(here / "results" / "confirm-qwen-cpu.json"))
    ap.add_argument("--plan", default=str(here / "plan.json"))
    ap.add_argument("--model", default=None, help="base generator: the plan's reference generator GGUF path")
    ap.add_argument("--device", default="cpu", help=device_help)
    ap.add_argument("--workdir", default=workdir, help=workdir_help)
    ap.add_argument("--train-file", default=None, help="default: $RAGKIT_DATA/hotpotqa/train.jsonl")
    ap.add_argument("--passage-max-tokens", type=int, default=passage_max_tokens,
                    help="the plan's cut of each passage")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--max-steps", type=int, default=None, help="cut training (smoke runs only)")
    ap.add_argument("--allow-uncommitted-plan", action="store_true", help="tests and smoke runs only; recorded")
    return ap


def rel(path: str | os.PathLike[str] | None) -> str | None:
    """``path`` as recorded in results JSON: ``$RAGKIT_DATA/...``, relative to the working folder, or ``~/...``.

    A path inside an installed package is recorded as ``<site-packages>/...``; a path under none of
    these is returned as given (a scratch name such as a temp folder).
    """
    from ragkit.datasets import DATA_ENV, data_dir

    if path is None:
        return None
    p = Path(path).expanduser()
    if "site-packages" in p.parts:
        i = p.parts.index("site-packages")
        return "/".join(("<site-packages>", *p.parts[i + 1:]))
    try:
        p = p.resolve()
    except OSError:  # pragma: no cover
        pass
    for base, name in ((data_dir(), f"${DATA_ENV}"), (Path.cwd(), None), (Path.home(), "~")):
        try:
            tail = p.relative_to(base.resolve())
        except (ValueError, OSError):
            continue
        return str(tail) if name is None else f"{name}/{tail}"
    return str(path)


def resolve_recorded(recorded: str) -> str:
    """The inverse of :func:`rel` for a recorded data path: ``$RAGKIT_DATA/x`` becomes a path in
    :func:`ragkit.datasets.data_dir`; any other path is returned as recorded."""
    from ragkit.datasets import DATA_ENV, data_dir

    head = f"${DATA_ENV}/"
    return str(data_dir() / recorded[len(head):]) if recorded.startswith(head) else recorded


def model_label(name: str) -> str:
    """A generator's name as recorded in results JSON: a local file or folder via :func:`rel`, a hub id as is."""
    return str(rel(name)) if os.path.isabs(name) else name


_CACHE_DIGEST = re.compile(r"-[0-9a-f]{16}$")


def model_record(name: str, loaded: str) -> dict[str, str | None]:
    """How a results JSON names its generator: ``model``, the folder ``loaded`` via :func:`rel`, and
    ``model_sha256``, the SHA-256 of ``name`` when it is a single file (a ``.gguf``), else ``None``."""
    from ragkit.io import file_sha256

    p = Path(name).expanduser()
    return {"model": rel(loaded), "model_sha256": file_sha256(p) if p.is_file() else None}


def same_model(recorded: Mapping[str, Any], now: Mapping[str, str | None]) -> bool:
    """Whether a results JSON (``recorded``) was written with the generator of :func:`model_record` ``now``.

    A ``.gguf`` file is loaded from a cache folder named ``<stem>-<digest>``, whose digest covers the
    file's path, size and modification time (:func:`ragkit.models.gguf_cache_folder`): the same
    checksum-verified file assembled again on a new machine gets a new digest. So the folder names are
    compared without it, and the files' checksums are compared wherever both are recorded. A result
    with no ``model`` yet matches anything.
    """
    if recorded.get("model") is None:
        return True
    a, b = recorded.get("model_sha256"), now.get("model_sha256")
    if a is not None and b is not None and a != b:
        return False
    return _CACHE_DIGEST.sub("", str(recorded["model"])) == _CACHE_DIGEST.sub("", str(now["model"]))


def gpu_epilog(script: str, example_args: str | None, note: str | None = None, generator: bool = True) -> str:
    """An ``argparse`` epilog: how to reproduce ``script``'s table on a GPU with a hub model, and offline.

    Use it with ``formatter_class=argparse.RawDescriptionHelpFormatter`` so the lines stay as written.

    Parameters
    ----------
    script : str
        The script's path from the repository root (``"benchmarks/cord.py"``,
        ``"experiments/cord/cord_sweep.py"``).
    example_args : str or None
        The flags of the GPU command line, only flags the script has; ``None`` when the script has no
        GPU run (``note`` then says why, and no offline line is added).
    note : str, optional
        One more paragraph (what differs on a GPU, what the hub model replaces).
    generator : bool
        Whether the script's ``--model`` takes a generator; then the offline line names the reference
        GGUF (:data:`REFERENCE_GGUF_CMD`). ``False``: only the embedder or nothing downloads.

    Raises
    ------
    ValueError
        When ``script`` is not a path to a ``.py`` file under ``benchmarks/`` or ``experiments/``.
    """
    if not (script.endswith(".py") and script.split("/", 1)[0] in ("benchmarks", "experiments")):
        raise ValueError(f"gpu_epilog: {script!r} is no script path; pass it from the repository root, "
                         "e.g. 'benchmarks/cord.py'")
    if example_args is None:
        return note.strip() if note else ""
    lines = ["GPU with a hub model (results as *-gpu.json beside the CPU ones):",
             f"  python3 {script} {example_args.strip()}"]
    if note:
        lines.append(note.strip())
    if generator:
        lines += ["Offline (HF_HUB_OFFLINE=1, e.g. a GPU machine without internet: copy the weights there): pass a",
                  f'local folder or the reference generator\'s GGUF, --model "$({REFERENCE_GGUF_CMD})" '
                  "(it prints the path)."]
    else:
        lines.append("Offline (HF_HUB_OFFLINE=1): the embedded defaults need no download; pass a local folder "
                     "instead of a hub id.")
    return "\n".join(lines)
