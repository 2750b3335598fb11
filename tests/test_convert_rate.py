"""``dufs convert`` reports a rate only where it measures the parse: not on a small input, whose time is the start
(numba compiling the parser on a first run: "0.0 MB/s")."""

from __future__ import annotations

import re

import numpy as np
from typer.testing import CliRunner

from dufs.cli import app
from dufs.cli.stores import RATE_MIN_BYTES


def _summary(src, out) -> str:
    res = CliRunner().invoke(app, ["convert", str(src), str(out), "--workers", "0"])
    assert res.exit_code == 0, res.stderr
    return next(line for line in res.stderr.splitlines() if line.startswith("converted "))


def test_a_small_input_reports_no_rate(tmp_path):
    (tmp_path / "small.svm").write_text("1 1:2 3:4\n0 2:1\n")
    line = _summary(tmp_path / "small.svm", tmp_path / "small.zarr")
    assert re.search(r"converted 2 rows, 3 nonzeros, 3 features \(one-based\) in \d+\.\d s; data lines 2", line), line
    assert "MB/s" not in line


def test_a_large_input_reports_its_rate(tmp_path):
    rng = np.random.default_rng(0)
    rows = [f"{i % 2} " + " ".join(f"{j}:{v:.6f}" for j, v in zip(np.sort(rng.choice(5000, 20, replace=False)) + 1,
                                                                   rng.random(20), strict=True))
            for i in range(2000)]
    text = ("\n".join(rows) + "\n").encode()
    src = tmp_path / "large.svm"
    with open(src, "wb") as f:
        for _ in range(RATE_MIN_BYTES // len(text) + 1):
            f.write(text)
    size = src.stat().st_size
    line = _summary(src, tmp_path / "large.zarr")
    m = re.search(r" in (\d+\.\d) s \(([\d,.]+) MB/s\);", line)
    assert m, line
    seconds, rate = float(m[1]), float(m[2].replace(",", ""))
    assert rate > 0 and abs(rate - size / max(seconds, 0.05) / 1e6) <= 0.5 * rate  # bytes over the time printed
