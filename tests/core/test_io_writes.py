"""``ragkit.io.write_json`` and ``save_figure``: atomic writes that leave no temp file behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragkit.io import save_figure, write_json


def test_write_json_round_trip_and_replaces_atomically(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "r.json"
    write_json(p, {"name": "Röntgen", "x": np.float32(0.5), "path": tmp_path})
    text = p.read_text(encoding="utf-8")
    assert text.endswith("\n") and "Röntgen" in text
    assert json.loads(text) == {"name": "Röntgen", "x": "0.5", "path": str(tmp_path)}
    write_json(p, [1, 2])
    assert json.loads(p.read_text()) == [1, 2]
    assert sorted(x.name for x in p.parent.iterdir()) == ["r.json"]


def test_write_json_failure_keeps_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    write_json(p, {"ok": 1})
    with pytest.raises(ValueError):
        write_json(p, {"loop": float("nan")} | {"bad": _Circular()})
    assert json.loads(p.read_text()) == {"ok": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["r.json"]


class _Circular:
    def __str__(self) -> str:
        raise ValueError("cannot be written")


def test_save_figure_png_and_pdf(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in ("f.png", "f.pdf"):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        out = save_figure(fig, tmp_path / name)
        assert out == str(tmp_path / name)
        assert not plt.fignum_exists(fig.number)  # closed
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "f.pdf").read_bytes()[:4] == b"%PDF"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["f.pdf", "f.png"]


def test_atomic_writes_keep_the_umask_and_the_replaced_mode(tmp_path: Path) -> None:
    """A new file gets what ``open`` would give under the umask (not mkstemp's private 0600), a new
    artifact folder what ``mkdir`` would (not mkdtemp's 0700), and a rewrite keeps the old mode."""
    import os
    import stat

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ragkit.io import atomic_dir

    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    old = os.umask(0o022)
    try:
        p = tmp_path / "r.json"
        write_json(p, {"a": 1})
        assert mode(p) == 0o644
        p.chmod(0o640)
        write_json(p, {"a": 2})
        assert mode(p) == 0o640 and json.loads(p.read_text()) == {"a": 2}
        fig = tmp_path / "f.png"
        save_figure(plt.figure(), fig)
        assert mode(fig) == 0o644
        d = tmp_path / "index"
        with atomic_dir(d, "index") as tmp:
            (tmp / "x.txt").write_text("x")
        assert mode(d) == 0o755
        d.chmod(0o750)
        with atomic_dir(d, "index", overwrite=True) as tmp:
            (tmp / "x.txt").write_text("y")
        assert mode(d) == 0o750 and (d / "x.txt").read_text() == "y"
    finally:
        os.umask(old)
