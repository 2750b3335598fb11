"""Selection.transform and the estimators' transform on every input dufs.fit takes, against NumPy's column
selection: a store or store path gives SciPy CSR, SciPy sparse keeps its format, a Dask array stays lazy."""

from __future__ import annotations

from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import sparse

import dufs
from dufs.errors import ParameterError
from dufs.estimators import FisherScore, VarianceSelector

N, D = 300, 5000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A matrix with small integer values (exact in the store's float32), its labels, its store in several feature
    blocks, and a Fisher selection of 12 features (ranking order, not sorted)."""
    rng = np.random.default_rng(1)
    nnz = 20_000
    X = sp.csr_array((rng.integers(1, 9, nnz).astype(np.float64), (rng.integers(0, N, nnz), rng.integers(0, D, nnz))),
                     shape=(N, D))
    X.sum_duplicates()
    y = (np.asarray(X[:, 3000:3040].sum(axis=1)).ravel() > 5).astype(np.int64)
    path = str(tmp_path_factory.mktemp("transform") / "x.zarr")
    with dask.config.set({"dufs.store.feature-granule": 256, "dufs.store.feature-block-nnz": 2000}):
        dufs.write_store(X, path, y)
    store = dufs.open(path)
    assert store.n_blocks("csc") > 3
    sel = dufs.fit(X, y, method="fisher", n_features=12, client=False)
    assert not np.array_equal(sel.indices, np.sort(sel.indices))
    return X, y, store, sel


def _dense(A):
    if isinstance(A, da.Array):
        A = A.compute()
    if hasattr(A, "todense") and not isinstance(A, np.ndarray):
        A = A.todense()
    return np.asarray(A)


def _check_store_result(got, want):
    assert isinstance(got, sp.csr_array)
    assert got.indices.dtype == np.int32 and got.indptr.dtype == np.int32  # as LinearSVC takes them
    np.testing.assert_array_equal(got.toarray(), want)


@pytest.mark.parametrize("kind", ["store", "path", "Path"])
def test_selection_transform_of_a_store_is_csr(data, kind):
    X, _, store, sel = data
    src = {"store": store, "path": store.path, "Path": Path(store.path)}[kind]
    _check_store_result(sel.transform(src), X.toarray()[:, sel.indices].astype(np.float32))


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo", "lil", "dok", "bsr"])
@pytest.mark.parametrize("matrix", [False, True], ids=["array", "matrix"])
def test_selection_transform_keeps_the_sparse_format(data, fmt, matrix):
    X, _, _, sel = data
    A = (sp.csr_matrix(X) if matrix else X).asformat(fmt)
    got = sel.transform(A)
    assert got.format == fmt and sp.issparse(got)
    assert isinstance(got, sp.spmatrix) == matrix
    np.testing.assert_array_equal(got.toarray(), X.toarray()[:, sel.indices])


def test_selection_transform_of_numpy_pandas_and_pydata_sparse(data):
    X, _, _, sel = data
    Xd = X.toarray()
    want = Xd[:, sel.indices]
    np.testing.assert_array_equal(sel.transform(Xd), want)
    got = sel.transform(sparse.COO.from_scipy_sparse(X))
    assert isinstance(got, sparse.SparseArray)
    np.testing.assert_array_equal(got.todense(), want)
    frame = pd.DataFrame(Xd[:, :D], columns=[f"f{j}" for j in range(D)])
    got = sel.transform(frame)
    assert list(got.columns) == [f"f{j}" for j in sel.indices]
    np.testing.assert_array_equal(got.to_numpy(), want)


@pytest.mark.parametrize("kind", ["dense", "store-csc", "store-csr", "store-csc-scipy"])
def test_selection_transform_of_a_dask_array_is_lazy(data, kind):
    X, _, store, sel = data
    A = {"dense": lambda: da.from_array(X.toarray(), chunks=(100, 700)),
         "store-csc": lambda: store.to_dask("csc"), "store-csr": lambda: store.to_dask("csr"),
         "store-csc-scipy": lambda: store.to_dask("csc", kind="scipy")}[kind]()
    got = sel.transform(A)
    assert isinstance(got, da.Array) and got.shape == (N, sel.n_selected)
    want = X.toarray()[:, sel.indices]
    np.testing.assert_array_equal(_dense(got), want if kind == "dense" else want.astype(np.float32))


def test_selection_transform_refuses_other_widths(data, tmp_path):
    X, y, _, sel = data
    for bad in (X[:, :D - 1], X.toarray()[:, 1:], da.zeros((4, D + 1))):
        with pytest.raises(ParameterError, match=f"fitted on {D}"):
            sel.transform(bad)
    path = str(tmp_path / "narrow.zarr")
    dufs.write_store(X[:, :100], path, y)
    with pytest.raises(ParameterError, match=f"fitted on {D}"):
        sel.transform(path)


@pytest.mark.parametrize("cls", [FisherScore, VarianceSelector])
def test_estimator_transform_on_every_input(data, cls):
    """The estimator's columns are in column order (get_support), whatever the input."""
    X, y, store, _ = data
    est = cls(n_features=12, client=False).fit(X, y)
    cols = est.get_support(indices=True)
    Xd = X.toarray()
    want = Xd[:, cols]
    for src in (store, store.path, Path(store.path)):
        _check_store_result(est.transform(src), want.astype(np.float32))
    for fmt in ("csr", "csc", "coo"):
        got = est.transform(X.asformat(fmt))
        assert got.format == fmt
        np.testing.assert_array_equal(got.toarray(), want)
    np.testing.assert_array_equal(est.transform(Xd), want)
    lazy = est.transform(da.from_array(Xd, chunks=(100, 700)))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(lazy.compute(), want)
    lazy = est.transform(store.to_dask("csc"))
    assert isinstance(lazy, da.Array)
    np.testing.assert_array_equal(_dense(lazy), want.astype(np.float32))
    with pytest.raises(ValueError, match=f"expecting {D} features"):
        est.transform(X[:, :D - 1])
    with pytest.raises(ParameterError, match=f"fitted on {D}"):
        est.transform(da.zeros((3, D - 1)))


def test_estimator_fitted_on_a_store_transforms_it(data):
    """fit(store).transform(store): what a Pipeline step does with a store."""
    X, _, store, _ = data
    est = FisherScore(n_features=7, client=False).fit(store.path)
    got = est.fit_transform(store.path)
    _check_store_result(got, X.toarray()[:, est.get_support(indices=True)].astype(np.float32))
