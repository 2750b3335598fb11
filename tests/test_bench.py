"""``dufs bench pass`` at a tiny size: it runs end to end and prints its figures (no timing assertions)."""

from __future__ import annotations

from typer.testing import CliRunner

from dufs.cli import app


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


def test_rmatvec_kernel_float32_vector_and_one_column_path_are_exact():
    """What the pass benchmark leans on: a float32 V gives bit-for-bit the products of the same values in float64
    (the kernel multiplies and sums in float64), and the one-vector fast path equals the general one."""
    import numpy as np
    import scipy.sparse as sp

    from dufs.kernels.blockops import csc_rmatvec

    rng = np.random.default_rng(0)
    A = sp.random_array((500, 80), density=0.05, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    ip, ix, dt = A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data
    v32 = rng.standard_normal((500, 1)).astype(np.float32)
    o32, o64 = np.empty((80, 1)), np.empty((80, 1))
    csc_rmatvec(ip, ix, dt, v32, o32)
    csc_rmatvec(ip, ix, dt, v32.astype(np.float64), o64)
    assert np.array_equal(o32, o64)
    two = np.empty((80, 2))
    csc_rmatvec(ip, ix, dt, np.repeat(v32.astype(np.float64), 2, axis=1), two)
    assert np.array_equal(two[:, :1], o64) and np.array_equal(two[:, 1:], o64)
    np.testing.assert_allclose(o64[:, 0], A.astype(np.float64).T @ v32[:, 0].astype(np.float64), rtol=1e-12,
                               atol=1e-12)


def test_bench_mmfs_prints_its_figures(tmp_path):
    """``dufs bench mmfs`` at a tiny size: LIBLINEAR against our epoch, the visit orders, 1 and 2 workers, memory."""
    import pytest

    pytest.importorskip("liblinear.liblinearutil", reason="liblinear-official is not installed (dufs[bench])")
    args = ["bench", "mmfs", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    for label in ("LIBLINEAR -e 0.1", "s/iteration", "dufs dcd_epoch, random (default)", "x LIBLINEAR",
                  "visit orders", "storage order", "block-random, runs of 256", "1 worker", "2 workers",
                  "converged", "rounds", "speed-up 2 workers vs 1", "peak RSS per worker", "vectors of"):
        assert label in out, (label, out)
    assert "NOT converged" not in out


def test_dcd_epoch_visit_orders_visit_every_active_coordinate_once():
    """The default call is unchanged (no ``order`` = ``order=0``, bit for bit); storage and block-random orders
    visit each active coordinate once and the solves reach the same dual optimum."""
    import numpy as np
    import scipy.sparse as sp

    from dufs.kernels.dcd import _block_order, dcd_epoch, dcd_gradient, gap_terms

    rng = np.random.default_rng(1)
    index = rng.permutation(1000).astype(np.int64)
    for order in (-1, 1, 7, 64, 5000):
        ix = index.copy()
        _block_order(ix, 600, 1000, order, np.array([np.uint64(3)], dtype=np.uint64))
        assert sorted(ix[:600]) == sorted(index[:600]) and sorted(ix[600:]) == sorted(index[600:])
        if order < 0:
            assert np.array_equal(ix[:600], np.sort(index[:600]))

    m, d = 300, 200
    A = sp.random_array((m, d), density=0.05, format="csc", dtype=np.float32, rng=rng)
    A.sort_indices()
    ip, ixs, dt = A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data
    coef = 1.0 / np.maximum(np.sqrt(np.asarray((A.multiply(A)).sum(axis=0), dtype=np.float64)), 1e-3)
    shift, colsum = np.zeros(d), np.asarray(A.sum(axis=0), dtype=np.float64) * 1.0
    qii = coef**2 * np.asarray((A.multiply(A)).sum(axis=0), dtype=np.float64)
    rho = rng.uniform(0.05, 0.5, d)

    def solve(order, epochs=300, default=False):
        alpha, ws, wt, bias = np.zeros(d), np.zeros(m), np.zeros(2), np.zeros(1)
        index, r = np.arange(d, dtype=np.int64), np.array([np.uint64(5)], dtype=np.uint64)
        pg = np.array([np.inf, -np.inf])
        n_act = d
        for _ in range(epochs):
            args = (ip, ixs, dt, coef, shift, colsum, qii, rho, alpha, 1.0, 1.0, ws, wt, float(m), bias, True, index,
                    n_act, pg, r)
            n_act, pgmax, pgmin, _ = dcd_epoch(*args) if default else dcd_epoch(*args, order)
            n_act, pg = d, np.array([np.inf, -np.inf])  # no shrinking: the order alone differs
        g = np.empty(d)
        dcd_gradient(ip, ixs, dt, coef, shift, colsum, ws, wt, float(m), bias[0], g)
        gap, _, ra = gap_terms(g, rho, alpha, 1.0)
        obj = 0.5 * float(ws @ ws) + 0.5 * bias[0] ** 2 - ra
        return alpha, obj, gap

    a0, o0, g0 = solve(0, epochs=5, default=True)
    a1, o1, g1 = solve(0, epochs=5)
    assert np.array_equal(a0, a1) and o0 == o1
    ref = solve(0)[1]
    for order in (-1, 16, 64):
        _, obj, gap = solve(order)
        assert gap <= 1e-8 * max(abs(obj), 1.0)
        np.testing.assert_allclose(obj, ref, rtol=1e-9, atol=1e-12)


def test_bench_greedy_prints_its_figures(tmp_path):
    """``dufs bench greedy`` at a tiny size: LapAOFS and LapDOFS steps against a plain pass with 1 and 2 workers,
    the checkpointed step, peak memory at two k (no timing assertions)."""
    args = ["bench", "greedy", "--rows", "2000", "--features", "3000", "--nnz-per-row", "5", "--dir", str(tmp_path),
            "--ks", "8,20", "--repeats", "2"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    for label in ("anchor graph built once", "1 worker", "2 workers", "plain pass Z^T v", "LapAOFS step (k = 8)",
                  "of which the driver", "LapDOFS step", "checkpointed each step", "speed-up of a step",
                  "k = 20: peak RSS per worker", "peak at k = 20 / peak at k = 8"):
        assert label in out, (label, out)
