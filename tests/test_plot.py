"""Tests of dufs.plot: valid PNG files, written atomically, and input checks that leave nothing behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dufs import plot
from dufs.errors import ParameterError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path):
    import matplotlib.image as mpimg

    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50


def test_plots_write_valid_png_without_temp_files(tmp_path):
    curves = {"mmfs": {"k": [2, 5, 10], "accuracy": [0.7, 0.8, 0.9]},
              "fisher": {"k": [2, 5, 10], "accuracy": [0.6, 0.75, 0.85]}}
    p1 = tmp_path / "topk.png"
    assert plot.plot_topk(curves, p1, title="ALLAML") == str(p1)
    p2 = tmp_path / "scores.png"
    plot.plot_scores(np.random.default_rng(0).random(500), p2, top=100)
    p3 = tmp_path / "bars.png"
    plot.plot_scores({"lapaofs": {"acc": 0.8, "nmi": 0.7}, "jcfs": {"acc": 0.75, "nmi": 0.72}}, str(p3))
    for p in (p1, p2, p3):
        check_png(p)
    plot.plot_topk(curves, p1)  # overwrite in place
    check_png(p1)
    assert sorted(os.listdir(tmp_path)) == ["bars.png", "scores.png", "topk.png"]


def test_plot_failures_leave_nothing(tmp_path):
    with pytest.raises(ParameterError, match="'curves'"):
        plot.plot_topk({}, tmp_path / "a.png")
    with pytest.raises(ParameterError, match="'curves'"):
        plot.plot_topk({"x": {"k": [1, 2], "accuracy": [0.5]}}, tmp_path / "a.png")
    with pytest.raises(ParameterError, match="'scores'"):
        plot.plot_scores([], tmp_path / "b.png")
    with pytest.raises(ParameterError, match="'path'"):
        plot.plot_scores([1.0, 2.0], tmp_path / "missing" / "b.png")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ParameterError, match="'top' parameter of plot_scores must be an int >= 1; got 0"):
        plot.plot_scores([1.0, 2.0], tmp_path / "c.png", top=0)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.name != "posix", reason="file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_figures_get_the_mode_of_the_json_beside_them(tmp_path, umask):
    """A figure is as readable as the selection JSON and any file open() makes: 0666 less the umask (0644 under
    umask 022), not mkstemp's 0600."""
    import stat

    import dufs

    old = os.umask(umask)
    try:
        sel = dufs.fit(np.random.default_rng(0).random((30, 8)), np.arange(30) % 2, method="fisher", n_features=3)
        sel.to_json(tmp_path / "sel.json")
        sel.plot(tmp_path / "scores.png")
        plot.plot_topk({"fisher": {"k": [1, 2], "accuracy": [0.5, 0.6]}}, tmp_path / "topk.png")
        with open(tmp_path / "plain.txt", "w"):
            pass
    finally:
        os.umask(old)
    mode = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert mode["plain.txt"] == 0o666 & ~umask
    assert mode["scores.png"] == mode["topk.png"] == mode["sel.json"] == mode["plain.txt"]
