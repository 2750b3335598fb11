"""``dufs bench pass`` at a tiny size: it runs end to end and prints its figures (no timing assertions)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dufs.cli import app


@pytest.mark.slow
def test_bench_pass_prints_the_table_and_reuses_the_store(tmp_path):
    args = ["bench", "pass", "--rows", "3000", "--features", "4000", "--nnz-per-row", "5", "--repeats", "2",
            "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    out = res.output
    assert "store: building" in out
    for label in ("SciPy X.T @ v", "dufs rmatvec, 1 worker", "dufs rmatvec, 2 workers", "Mnnz/s",
                  "1 worker / SciPy", "speed-up 2 workers vs 1", "where a pass goes, 1 worker", "overhead",
                  "results agree with SciPy: yes"):
        assert label in out, (label, out)
    # the breakdown found the pass's tasks in the task stream (it once matched none and printed 0 ms and inf)
    assert "inf ms" not in out, out
    bad = CliRunner().invoke(app, ["bench", "greedy", "--ks", "50,x"])
    assert bad.exit_code == 2 and "--ks must be comma-separated integers" in bad.output

    # the same spec again: the store is reused, not rebuilt
    from dufs.bench import ensure_synthetic_store
    from dufs.data.synthetic import SyntheticSpec

    said: list[str] = []
    (store,) = tmp_path.glob("synthetic-3000x4000x5-*.zarr")
    st = ensure_synthetic_store(store, SyntheticSpec(n_rows=3000, n_features=4000, nnz_per_row=5), say=said.append)
    assert st.shape == (3000, 4000)
    assert said and said[0].startswith("store: reusing")


def test_bench_rejects_an_unknown_benchmark():
    res = CliRunner().invoke(app, ["bench", "nothing"])
    assert res.exit_code != 0
    assert "ingest, pass" in res.output


@pytest.mark.slow
def test_bench_mmfs_prints_its_figures(tmp_path):
    """``dufs bench mmfs`` at a tiny size: LIBLINEAR against our epoch, the visit orders, 1 and 2 workers, memory."""
    pytest.importorskip("liblinear.liblinearutil", reason="liblinear-official is not installed (dufs[bench])")
    args = ["bench", "mmfs", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())  # the console wraps lines
    for label in ("LIBLINEAR -e 0.1", "s/iteration", "dufs dcd_epoch, random (default)", "x LIBLINEAR",
                  "visit orders", "storage order", "block-random, runs of 256", "1 worker", "2 workers",
                  "converged", "rounds", "speed-up 2 workers vs 1", "of the gradient pass's speed-up",
                  "median of 11 solves after an untimed one", "peak RSS per worker", "vectors of",
                  "the solver's code", "(files the first solve mapped)",
                  "the gradient pass alone through the cluster", "median of 22, half before the solves and half after"):
        assert label in out, (label, out)
    assert "NOT converged" not in out


@pytest.mark.slow
def test_bench_greedy_prints_its_figures(tmp_path):
    """``dufs bench greedy`` at a tiny size: LapAOFS and LapDOFS steps against a plain pass with 1 and 2 workers,
    the checkpointed step, peak memory at two k (no timing assertions)."""
    args = ["bench", "greedy", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path),
            "--ks", "8,20", "--repeats", "2"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())  # the console wraps lines
    for label in ("anchor graph built on each cluster", "1 worker", "2 workers", "plain pass Z^T v",
                  "LapAOFS step (k = 8)",
                  "of which the driver", "LapDOFS step", "checkpointed each step", "speed-up of a step",
                  "k = 20: peak RSS per worker", "peak at k = 20 / peak at k = 8", "machine ceiling",
                  "of this machine's ceiling", "the step's floor", "half before the steps and half after",
                  "where a step goes (medians): the update pass", "the slower worker's calls"):
        assert label in out, (label, out)


def test_ingest_file_is_kddb_shaped(tmp_path):
    """The ingest bench's libsvm file has kddb's 30 nonzeros a row (about) and its features per row (29,890,095
    features over 19,264,097 rows), read back by scikit-learn; ``n_features`` sets the features instead."""
    from sklearn.datasets import load_svmlight_file

    from dufs.bench import make_libsvm_file

    f = tmp_path / "f.svm"
    size = make_libsvm_file(f, 0.5)
    X, _ = load_svmlight_file(str(f))
    assert size == f.stat().st_size
    assert X.nnz == pytest.approx(30 * X.shape[0], rel=0.01)  # a row drawing an index twice keeps it once
    assert X.shape[1] == pytest.approx(X.shape[0] * 29_890_095 / 19_264_097, rel=0.01)
    make_libsvm_file(f, 0.5, n_features=5_000_000)
    X, _ = load_svmlight_file(str(f))
    assert 4_900_000 < X.shape[1] <= 5_000_000


def test_ingest_time_split_is_the_median_run():
    """The split printed is the median run's: task phases over the workers, driver phases as they are, and the rest
    of the wall time."""
    from dufs.bench.convert import _time_split

    runs = [(9.0, {"parse": 8.0, "finalize: close": 0.5}), (2.0, {"parse": 1.0, "finalize: close": 0.1}),
            (5.0, {"parse": 4.0, "spill": 2.0, "finalize: close": 0.25})]
    one = _time_split(runs, 1)
    assert "5.00 s went" in one and "parse 4.00, spill 2.00, finalize: close 0.25, rest -1.25" in one
    two = _time_split(runs, 2)
    assert "parse 2.00, spill 1.00, finalize: close 0.25, rest 1.75" in two and "sum / 2" in two


@pytest.mark.slow
def test_bench_ingest_prints_its_figures(tmp_path):
    """``dufs bench ingest`` at a tiny size, into a --dir that does not exist yet (made, as the other benches' is):
    scikit-learn's rate, dufs on 1 and 2 workers with the time split, the parser-alone ceiling, .bz2, memory."""
    where = tmp_path / "not" / "yet"
    args = ["bench", "ingest", "--size-mb", "0.3", "--repeats", "1", "--dir", str(where)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    for label in ("sklearn load_svmlight_file", "dufs convert, 1 worker", "dufs convert, 2 workers", "went",
                  "the numba parser alone", "machine ceiling", "single-threaded decompression alone",
                  "dufs convert .bz2, 2 workers, ranges", ".bz2 on 2 workers", "peak worker memory 4x / 1x"):
        assert label in out, (label, out)
    assert where.is_dir() and not list(where.iterdir())  # its scratch files are removed


@pytest.mark.slow
def test_bench_ufcm_prints_its_figures(tmp_path):
    """``dufs bench ufcm`` at a tiny size: an outer iteration against a plain pass on 1 and 2 workers, split into
    its passes and the method's own algebra (no timing assertions)."""
    args = ["bench", "ufcm", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path),
            "--repeats", "2"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    for label in ("1 worker", "2 workers", "plain pass Z^T v", "UFCM outer iteration", "target <= 60",
                  "where an iteration goes: 2 passes (Zc^T U of the 10 clusters' labels, Zc W of 10)",
                  "the method's own algebra in this process", "the floor of this target", "peak RSS per worker",
                  "machine ceiling", "of this machine's ceiling"):
        assert label in out, (label, out)


@pytest.mark.slow
def test_bench_m3fs_prints_each_run_against_its_own_passes(tmp_path):
    """``dufs bench m3fs`` at a tiny size: each run's outer iteration against the plain passes around it, on 1 and
    2 workers, and the median of the runs (no timing assertions)."""
    import re

    args = ["bench", "m3fs", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path),
            "--repeats", "2"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    out = res.output
    for label in ("1 worker", "2 workers", "plain passes' time (target <= 25; the median of 2 runs",
                  "the 6 passes just before and after it", "v-solver iterations", "peak RSS per worker",
                  "machine ceiling"):
        assert label in out, (label, out)
    # each worker count: two runs, each "<outer> s / <pass> ms = <ratio>", and their median the figure
    found = re.findall(r"outer iteration = ([\d.]+) plain passes' time.*?: (.*?)\); the median run", out, re.S)
    assert len(found) == 2, out
    for line in found:
        runs = [float(r) for r in re.findall(r"= ([\d.]+)", line[1])]
        assert len(runs) == 2 and float(line[0]) == pytest.approx(sum(runs) / 2, abs=0.06), line


def test_rss_files_counts_the_pages_of_a_mapped_file(tmp_path):
    """The memory check's "solver's code": the resident pages that map files (numba's cached kernels, libraries).
    A 32 MiB file mapped and read adds about its size to it, and to the resident memory; an anonymous array of the
    same size adds to the resident memory only."""
    import mmap
    import os

    import numpy as np

    from dufs.bench.common import rss, rss_files

    if not os.path.exists("/proc/self/status"):
        assert rss_files() == 0
        return
    size = 32 << 20
    path = tmp_path / "f.bin"
    path.write_bytes(np.arange(size // 8, dtype=np.int64).tobytes())
    f0, r0 = rss_files(), rss()
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
        assert int(np.frombuffer(mm, dtype=np.int64)[::512].sum()) > 0  # a value of every page read
        f1, r1 = rss_files(), rss()
    assert 0.8 * size <= f1 - f0 <= 1.2 * size and r1 - r0 >= 0.8 * size
    f2, r2 = rss_files(), rss()
    a = np.ones(size // 8)  # its pages written: resident
    f3, r3 = rss_files(), rss()
    assert abs(f3 - f2) < (4 << 20) and r3 - r2 >= 0.8 * size and a[-1] == 1.0


@pytest.mark.slow
def test_bench_scale_prints_each_methods_iteration(tmp_path):
    from dufs.testing.emulated import unavailable

    if unavailable() is not None:
        pytest.skip(unavailable())
    args = ["bench", "scale", "--rows", "3000", "--features", "5000", "--nnz-per-row", "4", "--machines", "2",
            "--methods", "fisher,mmfs,lapdofs", "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for label in ("2 machines x 2 processes", "fisher  :", "mmfs    :", "lapdofs :", "into a machine",
                  "through the driver", "task transitions"):
        assert label in res.output, (label, res.output)
    bad = CliRunner().invoke(app, ["bench", "scale", "--methods", "fisher,nothing"])
    assert bad.exit_code == 2 and "nothing not measured by the scale bench" in bad.output
