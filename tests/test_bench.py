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
