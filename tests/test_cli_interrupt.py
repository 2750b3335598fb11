"""Ctrl-C during ``dufs convert``: exit 130 with one line naming the partial store it keeps and how to finish it
(``--resume``), and the same command with ``--resume`` then finishes it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import dufs
from dufs.testing import patience
from tests._scripts import console_script

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.name != "posix", reason="sends SIGINT to a process")]

ROWS, REPEATS = 10_000, 40  # a conversion of about 3 s: time to interrupt it on a loaded machine


def _write_libsvm(path: Path) -> None:
    """About 140 MB of libsvm text (ROWS distinct lines of 30 nonzeros, REPEATS times): a few seconds to convert,
    written in about two."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(ROWS):
        idx = np.sort(rng.choice(100_000, 30, replace=False)) + 1
        lines.append(("1" if i % 2 else "-1") + " " + " ".join(f"{j}:{v:.3g}" for j, v in zip(idx, rng.random(30),
                                                                                                strict=True)))
    chunk = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as f:
        for _ in range(REPEATS):
            f.write(chunk)


def _ctrl_c_reaches() -> None:
    """In the child before it runs: SIGINT delivered and default, as in a terminal, whatever this test process
    inherited (a child keeps an ignored or blocked SIGINT across exec: seen once where the tests ran in
    pytest-xdist's workers, a conversion that ran to its end)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_convert_says_where_the_partial_store_is_and_resume_finishes_it(tmp_path):
    dufs_cmd = console_script("dufs")
    assert dufs_cmd is not None
    _write_libsvm(tmp_path / "big.svm")
    args = [*dufs_cmd, "convert", "big.svm", "big.zarr", "--workers", "0", "--block-bytes", "1MiB"]
    partial = tmp_path / "big.zarr.dufs-partial"
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_reaches)
    try:
        end = time.monotonic() + patience(60)
        while not partial.exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.01)
        assert proc.poll() is None, "the conversion ended before it could be interrupted"
        time.sleep(0.2)  # into the parse
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=patience(60))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert not (tmp_path / "big.zarr").exists()
    assert partial.is_dir()
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("interrupted"), lines[0]
    assert str(partial) in lines[0] and "--resume" in lines[0], lines[0]

    res = subprocess.run([*args, "--resume"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=patience(120))
    assert res.returncode == 0, res.stderr
    assert not partial.exists()
    assert dufs.open(str(tmp_path / "big.zarr")).shape[0] == ROWS * REPEATS
