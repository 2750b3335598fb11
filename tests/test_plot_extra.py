"""matplotlib is an extra (``pip install 'dufs[plot]'``): without it a figure asked for raises one clear error naming
the extra, nothing is written, and everything else works."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dufs
from dufs import plot
from dufs.errors import DufsError, MissingExtraError

# a process in which matplotlib cannot be imported (as after a plain install)
_HIDDEN = "import sys; sys.modules['matplotlib'] = None\n"


def test_without_matplotlib_a_figure_says_which_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert not plot.can_plot()
    X = np.random.default_rng(0).random((30, 8))
    sel = dufs.fit(X, method="variance", n_features=3)
    with pytest.raises(MissingExtraError, match=r"pip install 'dufs\[plot\]'") as err:
        sel.plot(tmp_path / "scores.png")
    assert isinstance(err.value, ImportError) and isinstance(err.value, DufsError)
    assert list(tmp_path.iterdir()) == []


def test_with_matplotlib_figures_can_be_drawn():
    pytest.importorskip("matplotlib")
    assert plot.can_plot()


def test_dufs_evaluate_prints_its_table_and_says_why_no_figure(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.random((60, 6))
    y = np.where(X[:, 0] > 0.5, 1, -1)
    store = dufs.write_store(X, tmp_path / "x.zarr", y)
    dufs.fit(store, method="fisher", n_features=3).to_json(tmp_path / "sel.json")
    code = _HIDDEN + ("from dufs.cli import main\nsys.argv = ['dufs', 'evaluate', *sys.argv[1:]]\nmain()")
    res = subprocess.run([sys.executable, "-c", code, str(store.path), str(tmp_path / "sel.json"), "--ks", "1,2",
                          "--figure", str(tmp_path / "f.png")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "accuracy" in res.stdout
    assert "figure: not drawn (it needs matplotlib: pip install 'dufs[plot]')" in " ".join(
        (res.stdout + res.stderr).split())
    assert not (tmp_path / "f.png").exists()
