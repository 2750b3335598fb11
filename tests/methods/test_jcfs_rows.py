"""Rows read at unit norm (``Matrix(rows="unit")``) and what JCFS reads (``values``, ``rows``; docs/methods.md "What
JCFS reads"): a Matrix reading its rows at unit norm is the matrix SciPy makes with ``normalize(X, axis=1)`` (of the
values as it reads them) in every pass, an all-zero row staying zero; JCFS reading them so is JCFS on that matrix;
``"auto"`` reads presence at unit norm on sparse non-negative data only, and dense data select what they did."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.preprocessing import normalize

import dufs
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.jcfs import jcfs, jcfs_reading
from tests._planted import planted_counts, planted_dense

SCIPY = {"raw": lambda v: v, "presence": lambda v: np.ones_like(v), "log1p": np.log1p}


def _counts(n=150, d=90, seed=1):
    """Sparse non-negative counts (about 8% nonzero), 3 groups of rows sharing 6 features each, documents of varying
    length (rows scaled by 1-6), a few large counts and one empty row (7)."""
    X, rng = planted_counts(n, d, seed, 0.05, 10, 30.0)
    X = sp.csr_array(X)
    X = sp.csr_array(sp.diags(rng.integers(1, 7, n).astype(np.float64)) @ X)
    X = sp.lil_array(X)
    X[7, :] = 0.0
    X = sp.csc_array(X)
    X.eliminate_zeros()
    return X


def _scipy_unit(X, values):
    R = sp.csr_array(X, copy=True).astype(np.float64)
    R.data = SCIPY[values](R.data)
    return sp.csc_array(normalize(R, axis=1))


@pytest.mark.parametrize("values", ["raw", "presence", "log1p"])
@pytest.mark.parametrize("how", ["built", "view", "store", "dask"])
def test_rows_at_unit_norm_are_scipys_normalized_matrix_in_every_pass(values, how, store_path):
    X = _counts()
    R = _scipy_unit(X, values)
    Rd = R.toarray()
    if how == "built":
        M = Matrix(X, values=values, rows="unit", block_width=16)
    elif how == "view":
        M = Matrix(X, block_width=16).with_values(values, "unit")
    elif how == "store":
        st = dufs.write_store(sp.csr_array(X), store_path(), np.zeros(X.shape[0]))
        M = as_matrix(st, persist=False).with_values(values, "unit")
        assert M.residency["rows"] == "unit"
    else:  # a Dask array's blocks, computed each pass
        import dask.array as da

        M = Matrix(da.from_array(X.toarray(), chunks=(X.shape[0], 16))).with_values(values, "unit")
        assert M.residency["mode"] == "source"
    assert (M.values, M.rows) == (values, "unit") and M.with_values(values) is M
    n, d = X.shape
    rng = np.random.default_rng(0)
    V, U = rng.standard_normal((n, 3)), rng.standard_normal((d, 2))
    labels = rng.integers(0, 4, n)
    np.testing.assert_allclose(M.to_scipy().toarray(), Rd, rtol=1e-14, atol=1e-15)
    assert not Rd[7].any() and not M.to_scipy().toarray()[7].any()  # the empty row stays zero
    norms = np.ones(n)
    norms[7] = 0.0
    np.testing.assert_allclose(M.row_norms(), norms, rtol=1e-12, atol=0)
    np.testing.assert_allclose(M.stats.mean(), Rd.mean(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(M.stats.sumsq, (Rd * Rd).sum(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(M.rmatvec(V), Rd.T @ V, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(M.matvec(U), Rd @ U, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(M.label_rmatvec(labels, 4), Rd.T @ np.eye(4)[labels], rtol=1e-12, atol=1e-12)
    Z = M.with_standardize("zscore")  # the standardization transforms the rows so scaled
    sd = Rd.std(axis=0)
    np.testing.assert_allclose(Z.rmatvec(V), ((Rd - Rd.mean(axis=0)) / np.where(sd > 0, sd, 1.0)).T @ V,
                               rtol=1e-10, atol=1e-10)
    if how != "built":
        np.testing.assert_array_equal(M.with_values("raw", "raw").to_scipy().toarray(), X.toarray())
    M.release()


def test_rows_parameter_is_checked_and_a_built_reading_cannot_go_back():
    X = _counts()
    with pytest.raises(ParameterError, match="'rows' parameter must be one of"):
        Matrix(X, rows="l2")
    M = Matrix(X, values="presence", rows="unit")
    assert M.raw_matrix is not None  # built from a raw matrix of its own: the norms were a pass over it
    np.testing.assert_array_equal(M.with_values("raw", "raw").to_scipy().toarray(), X.toarray())
    with pytest.raises(ParameterError, match="build another from the input"):
        Matrix(X, values="presence").with_values("presence", "unit")


@pytest.mark.parametrize("standardize, dense_below, graph", [("zscore", 3000, "knn"), (None, 0, "knn"),
                                                             ("zscore", 3000, "anchor")])
def test_jcfs_reading_rows_at_unit_norm_is_jcfs_on_scipys_normalized_matrix(standardize, dense_below, graph):
    """JCFS with values="presence", rows="unit" on X is JCFS on ``normalize(presence(X))`` read as it is: the same
    graph, embedding and greedy steps, the same selection."""
    X = _counts()
    kw = {"n_features": 12, "n_clusters": 3, "max_iter": 4, "dense_below": dense_below, "graph": graph,
          "n_anchors": 32}
    M = Matrix(X, standardize=standardize, block_width=16)
    got = jcfs(M, values="presence", rows="unit", **kw)
    ref = jcfs(Matrix(_scipy_unit(X, "presence"), standardize=standardize, block_width=16), values="raw",
               rows="raw", **kw)
    assert (got.diagnostics["values"], got.diagnostics["rows"]) == ("presence", "unit")
    assert (ref.diagnostics["values"], ref.diagnostics["rows"]) == ("raw", "raw")
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.criterion, ref.criterion, rtol=1e-7)
    assert got.diagnostics["iterations"] == ref.diagnostics["iterations"]
    assert (M.values, M.rows) == ("raw", "raw")  # M itself is not changed
    assert M.passes > 0


def test_auto_reads_presence_at_unit_norm_on_sparse_non_negative_data_only():
    X = _counts()
    assert jcfs_reading(Matrix(X)) == ("presence", "unit")
    assert jcfs_reading(Matrix(X, standardize="zscore")) == ("presence", "unit")  # the stored values are counts
    assert jcfs_reading(Matrix(X), "raw", "raw") == ("raw", "raw")
    assert jcfs_reading(Matrix(X), "log1p") == ("log1p", "unit")
    assert jcfs_reading(Matrix(X), rows="raw") == ("presence", "raw")
    assert jcfs_reading(Matrix(X, values="sqrt")) == ("sqrt", "raw")  # a matrix reading otherwise: as it does
    S = sp.csc_array(X, copy=True)
    S.data[::7] *= -1.0
    assert jcfs_reading(Matrix(S, standardize="zscore")) == ("raw", "raw")  # signed
    D = np.random.default_rng(0).random((60, 20)) + 0.1
    assert jcfs_reading(Matrix(D, standardize="zscore")) == ("raw", "raw")  # dense
    assert jcfs_reading(Matrix(sp.csc_array(D))) == ("raw", "raw")  # dense values in a sparse container


@pytest.mark.parametrize("X", [planted_dense(), np.abs(planted_dense(1))], ids=["signed", "non-negative"])
def test_dense_data_select_what_they_did(X):
    """On dense data "auto" reads the raw values and rows: the selection is the raw one, and it finds the planted
    features."""
    a = dufs.fit(X, method="jcfs", n_features=12, n_clusters=3, client=False)
    b = dufs.fit(X, method="jcfs", n_features=12, n_clusters=3, client=False, values="raw", rows="raw")
    assert a.diagnostics["values"] == a.provenance["values"] == "raw"
    assert a.diagnostics["rows"] == a.provenance["rows"] == "raw"
    np.testing.assert_array_equal(a.indices, b.indices)
    assert np.isin(np.arange(12), a.indices).sum() >= 10


def test_fit_and_the_estimator_record_the_reading_on_counts():
    X = sp.csr_array(_counts())
    sel = dufs.fit(X, method="jcfs", n_features=18, n_clusters=3, client=False)
    assert (sel.provenance["values"], sel.provenance["rows"]) == ("presence", "unit")
    assert sel.provenance["params"]["values"] == sel.provenance["params"]["rows"] == "auto"
    ref = dufs.fit(_scipy_unit(X, "presence"), method="jcfs", n_features=18, n_clusters=3, client=False,
                   values="raw", rows="raw")
    np.testing.assert_array_equal(sel.indices, ref.indices)
    est = dufs.JCFS(n_features=18, n_clusters=3, client=False).fit(X)
    np.testing.assert_array_equal(est.selection_.indices, sel.indices)
    raw = dufs.JCFS(n_features=18, n_clusters=3, values="raw", rows="raw", client=False).fit(X)
    assert raw.selection_.provenance["rows"] == "raw"


@pytest.mark.slow
def test_rows_of_persisted_blocks_at_unit_norm(cluster_client):
    """On persisted blocks the rows at unit norm are blocks of their own beside the raw ones (the inverse norms
    scattered once): SciPy's normalized matrix in every product, JCFS on them JCFS on that matrix."""
    X = _counts()
    R = _scipy_unit(X, "presence")
    kw = {"n_features": 12, "n_clusters": 3, "max_iter": 3}
    with cluster_client.as_current():
        M = as_matrix(X, block_width=16, standardize="zscore")
        try:
            assert M.residency["mode"] == "persisted"
            P = M.with_values("presence", "unit")
            assert P.residency["mode"] == "persisted" and P.residency["rows"] == "unit"
            V = np.random.default_rng(0).standard_normal((X.shape[0], 2))
            np.testing.assert_allclose(P.with_standardize(None).rmatvec(V), R.toarray().T @ V, rtol=1e-12,
                                       atol=1e-12)
            P.release()
            got = jcfs(M, **kw)
        finally:
            M.release()
    ref = jcfs(Matrix(R, block_width=16, standardize="zscore"), values="raw", rows="raw", **kw)
    np.testing.assert_array_equal(got.indices, ref.indices)


def test_rows_of_store_blocks_on_a_cluster_go_to_the_workers_once(cluster_client, store_path):
    """Store blocks read each pass on a cluster: the inverse row norms are one scattered vector the block tasks
    depend on, not n floats inside every block's task (150 MB a task at kddb's 19M rows)."""
    import cloudpickle

    rng = np.random.default_rng(5)
    X = sp.random_array((20_000, 40), density=0.05, rng=rng, format="csr")
    X.data = np.ceil(X.data * 5)
    st = dufs.write_store(X, store_path(), np.zeros(X.shape[0]))
    R = _scipy_unit(X, "presence")
    V = rng.standard_normal((X.shape[0], 2))
    with cluster_client.as_current():
        M = as_matrix(st, persist=False)
        assert M.residency["mode"] != "persisted"
        P = M.with_values("presence", "unit")
        try:
            np.testing.assert_allclose(P.rmatvec(V), R.toarray().T @ V, rtol=1e-12, atol=1e-12)
            src = P.executor.src[0]
            assert len(cloudpickle.dumps(dict(src.__dask_graph__()))) < 8 * X.shape[0] // 4
        finally:
            P.release()
            M.release()
