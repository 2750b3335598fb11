"""What UFCM reads of each stored value (``values``, docs/methods.md "What UFCM reads"): a Matrix that reads its
values as presence, log1p or sqrt is the matrix SciPy makes by transforming the data, in every pass; UFCM reading
them so is UFCM on that matrix; ``"auto"`` reads presence on sparse non-negative unstandardized data and raw values
on dense or signed data, and leaves dense data's selection as it was."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.ufcm import ufcm, ufcm_values
from tests._planted import planted_counts, planted_dense

SCIPY = {"presence": lambda v: np.ones_like(v), "log1p": np.log1p, "sqrt": np.sqrt}


def _counts(n=200, d=120, seed=1):
    """Sparse non-negative counts (8% nonzero) with a few large ones, 3 groups of rows sharing 6 features each."""
    X, _ = planted_counts(n, d, seed, 0.06, 12, 40.0)  # a few large counts
    return sp.csc_array(X)


def _scipy_valued(X, values):
    R = sp.csc_array(X, copy=True)
    R.data = SCIPY[values](R.data.astype(np.float64))
    return R


@pytest.mark.parametrize("values", ["presence", "log1p", "sqrt"])
@pytest.mark.parametrize("how", ["built", "view", "store", "dask"])
def test_a_matrix_reading_values_is_scipys_transformed_matrix_in_every_pass(values, how, store_path):
    X = _counts()
    R = _scipy_valued(X, values)
    Rd = R.toarray()
    if how == "built":
        M = Matrix(X, values=values, block_width=16)
    elif how == "view":
        M = Matrix(X, block_width=16).with_values(values)
    elif how == "store":
        st = dufs.write_store(sp.csr_array(X), store_path(), np.zeros(X.shape[0]))
        M = as_matrix(st, persist=False).with_values(values)
    else:  # a Dask array's blocks, computed each pass
        import dask.array as da

        M = Matrix(da.from_array(X.toarray(), chunks=(X.shape[0], 16))).with_values(values)
        assert M.residency["mode"] == "source"
    assert M.values == values and M.with_values(values) is M
    n, d = X.shape
    rng = np.random.default_rng(0)
    V, U = rng.standard_normal((n, 3)), rng.standard_normal((d, 2))
    labels = rng.integers(0, 4, n)
    np.testing.assert_array_equal(M.to_scipy().toarray(), Rd)
    np.testing.assert_allclose(M.stats.mean(), Rd.mean(axis=0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(M.rmatvec(V), Rd.T @ V, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(M.matvec(U), Rd @ U, rtol=1e-12, atol=1e-12)
    ind = np.eye(4)[labels]
    np.testing.assert_allclose(M.label_rmatvec(labels, 4), Rd.T @ ind, rtol=1e-12, atol=1e-12)
    Z = M.with_standardize("zscore")  # the standardization transforms the values so read
    sd = Rd.std(axis=0)
    np.testing.assert_allclose(Z.rmatvec(V), ((Rd - Rd.mean(axis=0)) / np.where(sd > 0, sd, 1.0)).T @ V,
                               rtol=1e-10, atol=1e-10)
    if how == "built":  # no raw blocks to read again
        assert M.raw_matrix is None
    else:
        np.testing.assert_array_equal(M.with_values("raw").to_scipy().toarray(), X.toarray())


def test_a_matrix_built_reading_values_cannot_read_them_raw_and_signed_data_refuse_log1p():
    X = _counts()
    with pytest.raises(ParameterError, match="build another from the input"):
        Matrix(X, values="presence").with_values("raw")
    with pytest.raises(ParameterError, match="'values' parameter must be one of"):
        Matrix(X, values="log")
    S = sp.csc_array(X, copy=True)
    S.data[0] = -1.0
    with pytest.raises(ParameterError, match="non-negative"):
        Matrix(S, values="log1p").stats  # noqa: B018 - the pass that reads the values
    np.testing.assert_array_equal(Matrix(S, values="presence").to_scipy().toarray(),
                                  _scipy_valued(S, "presence").toarray())


@pytest.mark.parametrize("values", ["presence", "log1p"])
@pytest.mark.parametrize("standardize, dense_below", [(None, 2000), (None, 0), ("scale", 0)])
def test_ufcm_reading_values_is_ufcm_on_the_data_scipy_transformed(values, standardize, dense_below):
    """UFCM with values="presence" on X is UFCM on X with its stored values replaced by ones by SciPy (log1p: by
    log(1 + x)), the same numbers: the method never sees the raw values."""
    X = _counts()
    kw = {"n_clusters": 3, "n_components": 2, "max_iter": 6, "n_init": 3, "dense_below": dense_below}
    M = Matrix(X, standardize=standardize, block_width=16)
    got = ufcm(M, values=values, **kw)
    ref = ufcm(Matrix(_scipy_valued(X, values), standardize=standardize, block_width=16), values="raw", **kw)
    assert got.diagnostics["values"] == values and ref.diagnostics["values"] == "raw"
    np.testing.assert_allclose(got.objective, ref.objective, rtol=1e-10)
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(got.labels, ref.labels)
    assert got.diagnostics["passes"] == ref.diagnostics["passes"] > 0
    assert M.passes >= got.diagnostics["passes"]  # the passes over the values so read count on M
    assert M.values == "raw"  # M itself is not changed


def test_auto_reads_presence_on_sparse_non_negative_data_and_raw_otherwise():
    X = _counts()
    assert ufcm_values(Matrix(X)) == "presence"
    assert ufcm_values(Matrix(X, standardize="zscore")) == "raw"  # a standardized matrix is not counts
    assert ufcm_values(Matrix(X), "raw") == "raw" and ufcm_values(Matrix(X), "sqrt") == "sqrt"
    assert ufcm_values(Matrix(X, values="log1p")) == "log1p"  # a matrix reading its values otherwise: as it does
    S = sp.csc_array(X, copy=True)
    S.data[::7] *= -1.0
    assert ufcm_values(Matrix(S)) == "raw"  # signed
    D = np.random.default_rng(0).random((60, 20)) + 0.1
    assert ufcm_values(Matrix(D, standardize=None)) == "raw"  # dense
    assert ufcm_values(Matrix(sp.csc_array(D))) == "raw"  # dense values in a sparse container
    kw = {"n_clusters": 3, "n_components": 2, "max_iter": 4, "n_init": 2}
    a = ufcm(Matrix(X, block_width=16), **kw)
    b = ufcm(Matrix(X, block_width=16), values="presence", **kw)
    assert a.diagnostics["values"] == "presence"
    np.testing.assert_array_equal(a.scores, b.scores)


@pytest.mark.parametrize("X", [planted_dense(), np.abs(planted_dense(1))], ids=["signed", "non-negative"])
def test_dense_data_select_what_they_did(X):
    """On dense data "auto" reads the raw values: the selection is the raw one, and it finds the planted features."""
    a = dufs.fit(X, method="ufcm", n_features=12, n_clusters=3, client=False)
    b = dufs.fit(X, method="ufcm", n_features=12, n_clusters=3, client=False, values="raw")
    assert a.diagnostics["values"] == a.provenance["values"] == "raw"
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.scores, b.scores)


def test_fit_records_the_reading_and_finds_the_groups_on_counts():
    X = _counts()
    sel = dufs.fit(sp.csr_array(X), method="ufcm", n_features=18, n_clusters=3, client=False)
    assert sel.diagnostics["values"] == sel.provenance["values"] == "presence"
    assert sel.provenance["params"]["values"] == "auto"
    raw = dufs.fit(sp.csr_array(X), method="ufcm", n_features=18, n_clusters=3, client=False, values="raw")
    assert raw.provenance["values"] == "raw"
    found = lambda s: int(np.isin(np.arange(18), s.indices).sum())  # noqa: E731
    assert found(sel) >= found(raw)


@pytest.mark.slow
def test_values_of_persisted_blocks_are_made_beside_them_and_released(cluster_client):
    """On persisted blocks the values so read are blocks of their own on the same workers: the products are SciPy's,
    UFCM on them is UFCM on SciPy's transformed matrix, and releasing them leaves the raw blocks as they were. Where
    the copies would not fit beside the raw blocks, each pass transforms the blocks where they are: the same."""
    import dask

    X = _counts()
    R = _scipy_valued(X, "presence")
    kw = {"n_clusters": 3, "n_components": 2, "max_iter": 4, "n_init": 2, "dense_below": 0}
    with cluster_client.as_current():
        M = as_matrix(X, block_width=16)
        try:
            assert M.residency["mode"] == "persisted"
            P = M.with_values("presence")
            assert P.residency["mode"] == "persisted" and P.residency["values"] == "presence"
            assert P.placement() == M.placement()  # each made on its raw block's worker
            V = np.random.default_rng(0).standard_normal((X.shape[0], 2))
            np.testing.assert_allclose(P.rmatvec(V), R.toarray().T @ V, rtol=1e-12, atol=1e-12)
            P.release()
            np.testing.assert_allclose(M.rmatvec(V), X.toarray().T @ V, rtol=1e-12, atol=1e-12)
            got = ufcm(M, **kw)
            # copies that would not fit beside the raw blocks: each pass transforms the persisted blocks where they are
            memory, raw = M.residency["cluster_memory"], M.residency["bytes"]
            with dask.config.set({"dufs.engine.persist-fraction": 1.5 * raw / memory}):
                Q = M.with_values("presence")
            assert Q.residency["mode"] == "source" and "each pass" in Q.residency["reason"]
            np.testing.assert_allclose(Q.rmatvec(V), R.toarray().T @ V, rtol=1e-12, atol=1e-12)
            Q.release()
            lazy = ufcm(Q, values="presence", **kw)
            with as_matrix(X, block_width=16, values="presence") as B:  # built so: persisted as read
                assert B.residency["mode"] == "persisted" and B.residency["values"] == "presence"
                np.testing.assert_allclose(B.rmatvec(V), R.toarray().T @ V, rtol=1e-12, atol=1e-12)
        finally:
            M.release()
    ref = ufcm(Matrix(R, block_width=16), values="raw", **kw)
    assert got.diagnostics["values"] == lazy.diagnostics["values"] == "presence"
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(lazy.scores, ref.scores, rtol=1e-8, atol=1e-10)
