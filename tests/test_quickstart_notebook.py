"""examples/quickstart.ipynb runs as written: its code cells, in order, in a fresh Python process (where the
notebook's kernel would run them), from an empty folder. Run without Jupyter: the cells are plain Python, and the
test install stays without a kernel and its dozens of packages (the fresh-install time of issue 59)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def _code(nb: dict) -> str:
    return "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def test_the_notebook_is_a_notebook():
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4 and nb["metadata"]["kernelspec"]["language"] == "python"
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds[0] == "markdown" and kinds.count("code") >= 6
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            assert c["outputs"] == [] and c["execution_count"] is None  # saved clean: no stale outputs
    code = _code(nb)
    for what in ("dufs.fit(X, y", "da.from_array", "dufs.write_store", "Pipeline", "n_features", ".plot("):
        assert what in code  # an in-memory matrix, a Dask array, a store, a Pipeline, the plots


@pytest.mark.slow
def test_the_notebook_runs(tmp_path):
    nb = json.loads(NOTEBOOK.read_text())
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(NOTEBOOK.parents[1])}
    got = subprocess.run([sys.executable, "-c", _code(nb)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert got.returncode == 0, got.stderr[-4000:]
    out = got.stdout
    assert "(1943, 3289)" in out and "accuracy, 3-fold:" in out and "clusters:" in out
    acc = float(out.split("accuracy, 3-fold:")[1].split()[0])
    assert acc > 0.8  # 100 Fisher-selected words separate the two newsgroups (20 random words: 0.55)
    assert (tmp_path / "fisher-scores.png").stat().st_size > 1000
    assert (tmp_path / "laplacian-20.json").is_file() and (tmp_path / "quickstart.zarr").is_dir()
