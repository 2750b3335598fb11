"""``dufs bench pass`` at a tiny size: it runs end to end and prints its figures (no timing assertions)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dufs.cli import app


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory):
    """The --dir of the benches on the 2,000 x 3,000 x 5 synthetic store (mmfs, greedy, m3fs, ufcm): the first of
    them builds the store (on a cluster of its own, which costs more than these benches' runs), the others reuse
    it; each still runs end to end on it. Building a store and reusing it are test_bench_pass's checks."""
    return tmp_path_factory.mktemp("bench-shared")


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
def test_bench_mmfs_prints_its_figures(shared_dir):
    """``dufs bench mmfs`` at a tiny size: LIBLINEAR against our epoch, the visit orders, 1 and 2 workers, memory."""
    pytest.importorskip("liblinear.liblinearutil", reason="liblinear-official is not installed (dufs[bench])")
    args = ["bench", "mmfs", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(shared_dir)]
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
def test_bench_greedy_prints_its_figures(shared_dir):
    """``dufs bench greedy`` at a tiny size: LapAOFS and LapDOFS steps against a plain pass with 1 and 2 workers,
    the checkpointed step, peak memory at two k (no timing assertions)."""
    args = ["bench", "greedy", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(shared_dir),
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
def test_bench_ufcm_prints_its_figures(shared_dir):
    """``dufs bench ufcm`` at a tiny size: an outer iteration against a plain pass on 1 and 2 workers, split into
    its passes and the method's own algebra (no timing assertions)."""
    args = ["bench", "ufcm", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(shared_dir),
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
def test_bench_m3fs_prints_each_run_against_its_own_passes(shared_dir):
    """``dufs bench m3fs`` at a tiny size: each run's outer iteration against the plain passes around it, on 1 and
    2 workers, and the median of the runs (no timing assertions)."""
    import re

    args = ["bench", "m3fs", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(shared_dir),
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
            "--methods", "mmfs,lapdofs", "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for label in ("2 machines x 2 processes", "mmfs    :", "lapdofs :", "into a machine",
                  "through the driver", "task transitions", "1 machines x 1 processes", "model parameters",
                  "compute on one process", "machine_in  =", "lapdofs: an iteration, projected seconds",
                  "mmfs: a round (rounds not modelled)", "kddb     W=64", "10x kddb W=10", "weak: 10x kddb on 10",
                  "strong: kddb 64 vs 1 machine", "rounds (log fit"):
        assert label in res.output, (label, res.output)
    assert "PASS" in res.output or "MISS" in res.output
    saved = json.loads((tmp_path / "scale-3000x5000x4.json").read_text())
    assert {r["method"] for r in saved["runs"]} == {"mmfs", "lapdofs"} and len(saved["compute"]) == 2
    bad = CliRunner().invoke(app, ["bench", "scale", "--methods", "fisher,nothing"])
    assert bad.exit_code == 2 and "nothing not measured by the scale bench" in bad.output
    bad = CliRunner().invoke(app, ["bench", "scale", "--layout", "2"])
    assert bad.exit_code == 2 and "--layout must be processes x threads" in bad.output


def _made_up_params():
    from dufs.bench.model import Formula, MethodModel, Params

    m = MethodModel(c_nz=1e-8, c_fixed=0.1, machine_in=Formula(("nP",), (8.0,)),
                    driver_bytes=Formula(("n", "WP"), (8.0, 1000.0)), driver_cpu=Formula(("n",), (1e-7,)),
                    tasks=Formula(("1", "WP"), (10.0, 2.0)))
    return Params(P=4, link=1e9, efficiency=0.5, t_task=1e-3, methods={"x": m})


def test_scale_model_projects_by_hand():
    from dufs.bench.model import project

    # n = 1e6, d = 2e6, nnz = 1e7, P = 4, W = 2, by hand:
    # compute 1e-8 * 1e7 / (2 * 4 * 0.5) + 0.1 = 0.125; network (8 * 1e6 * 4 + 8 * 1e6 + 1000 * 8) / 1e9 = 0.040008
    # driver 1e-7 * 1e6 = 0.1; scheduler (10 + 2 * 8) * 1e-3 = 0.026; total 0.291008
    p = project(_made_up_params(), "x", 1e6, 2e6, 1e7, 2)
    assert (p.compute, p.network, p.driver, p.scheduler) == pytest.approx((0.125, 0.040008, 0.1, 0.026))
    assert p.total == pytest.approx(0.291008)
    # one machine: no link crossed; compute 0.1 / 2 + 0.1, scheduler (10 + 2 * 4) * 1e-3
    assert project(_made_up_params(), "x", 1e6, 2e6, 1e7, 1).total == pytest.approx(0.15 + 0.1 + 0.018)
    # one process of 4 threads a machine (P = 1, T = 4): the compute as before (W P T threads), the terms in W P
    # a process's: network (8 * 1e6 * 1 + 8 * 1e6 + 1000 * 2) / 1e9 = 0.016002, scheduler (10 + 2 * 2) * 1e-3
    from dataclasses import replace

    p = project(replace(_made_up_params(), P=1, T=4), "x", 1e6, 2e6, 1e7, 2)
    assert (p.compute, p.network, p.driver, p.scheduler) == pytest.approx((0.125, 0.016002, 0.1, 0.014))


def test_scale_model_adds_the_kept_vectors_work_to_the_driver():
    """The work on vectors kept on one worker (dufs.engine.kept) is serial, as the driver's is: fitted to the runs'
    "kept" seconds as a cost a sample and added to the driver's term at every W (a run saved before it has none)."""
    from dataclasses import replace

    from dufs.bench.model import Formula, fit_params, project

    params = _made_up_params()
    m = replace(params.methods["x"], kept=Formula(("n",), (2e-8,)))
    p = project(replace(params, methods={"x": m}), "x", 1e6, 2e6, 1e7, 2)
    assert p.driver == pytest.approx(0.1 + 0.02)  # 1e-7 n + 2e-8 n
    run = {"method": "mmfs", "machines": 2, "procs": 2, "machine_in": 1.0, "driver": 1.0, "cpu": 0.01,
           "transitions": 10.0, "sched_cpu": 0.01, "wall": 0.1}
    one = {**run, "machines": 1, "procs": 1}
    data = {"n_rows": 1000, "n_features": 2000, "nnz": 4000, "runs": [{**run, "kept": 0.004}], "compute": [one]}
    old = {"n_rows": 1000, "n_features": 2000, "nnz": 4000, "runs": [run], "compute": [one]}
    assert fit_params([data]).methods["mmfs"].kept.coefs == pytest.approx((4e-6,))
    assert fit_params([old]).methods["mmfs"].kept(1e6, 0, 0, 2, 2) == 0.0


def test_scale_model_targets_by_hand():
    from dufs.bench.model import Formula, MethodModel, Params, targets

    none = Formula((), ())
    # compute alone: 10x kddb on 10 machines takes what kddb takes on one (weak 1.0), 64 machines 64x faster
    flat = Params(methods={"x": MethodModel(1e-9, 0.0, none, none, none, none)})
    t = targets(flat, "x")
    assert t["weak"] == pytest.approx(1.0) and t["speedup"] == pytest.approx(64.0)
    assert t["weak_pass"] and t["strong_pass"] and t["memory"] is None
    # and 8 bytes a row to each of 16 processes: kddb on one machine 1e-9 * 566,345,888 / 8 = 0.070793236 s; on
    # 64 0.070793236 / 64 + 8 * 19,264,097 * 16 / 1.25e9 = 0.0011061443 + 1.9726435328 s; the bound 0.0011061443 +
    # 16 * (19,264,097 + 29,890,095) / 64 / 1.25e9 = 0.0109369827 s
    links = Params(methods={"x": MethodModel(1e-9, 0.0, Formula(("nP",), (8.0,)), none, none, none)})
    t = targets(links, "x")
    assert t["speedup"] == pytest.approx(0.070793236 / 1.9737496771)
    assert t["bound_speedup"] == pytest.approx(0.070793236 / 0.0109369827)
    assert not t["strong_pass"]
    # 10x kddb on 10: 0.070793236 + 8 * 192,640,970 * 16 / 1.25e9 = 0.070793236 + 19.726435328 s
    assert t["weak"] == pytest.approx((0.070793236 + 19.726435328) / 0.070793236) and not t["weak_pass"]


def test_scale_model_fit_memory_and_rounds():
    from dufs.bench.model import driver_memory, fit, mmfs_rounds

    # y = 3 n + 5 W P at n = 100, P = 2: 320 at W = 2, 340 at W = 4; "1" cannot be told from "n" at one n
    pts = [((100, 50, 400, 2, 2), 320.0), ((100, 50, 400, 4, 2), 340.0)]
    f = fit(("n", "1", "WP"), pts)
    assert f.terms == ("n", "WP") and f.coefs == pytest.approx((3.0, 5.0))
    # falling with W: the W P coefficient would be negative, so n alone, (320 + 340) / 2 / 100
    f = fit(("n", "WP"), [(pts[0][0], 340.0), (pts[1][0], 320.0)])
    assert f.terms == ("n",) and f.coefs == pytest.approx((3.3,))
    # 184 n + 80 d at n = 1000, d = 2000 (seven n-vectors, the 16-column embedding; ten d-vectors)
    assert driver_memory("m3fs", 1000, 2000, 4) == pytest.approx(184_000 + 256_000)
    assert driver_memory("lapdofs", 1000, 2000, 4) is None
    # r = a + b log2 K through (0, 12), (1, 54), (3, 73): b = 789 / 42, a = 2682 / 126
    assert mmfs_rounds(1) == pytest.approx(2682 / 126) and mmfs_rounds(8) == pytest.approx(2682 / 126 + 3 * 789 / 42)
