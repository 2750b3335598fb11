"""A Dask array of sparse chunks with few nonzeros runs in this process like the SciPy matrix it holds: its
elements (9.7 million here) are no measure of its size; its nonzeros, counted in one threaded pass, are."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

import dufs
from dufs.api import _small_dask


def _sparse_dask(n=1993, d=4862, density=0.01):
    X = sp.csr_matrix(sp.random_array((n, d), density=density, rng=0, format="csr"))
    return X, da.from_array(X, chunks=(500, 1000), asarray=False)


def test_a_sparse_dask_array_of_few_nonzeros_runs_here():
    X, D = _sparse_dask()
    assert D.shape[0] * D.shape[1] > dask.config.get("dufs.engine.inline-nnz")  # too many elements to count them
    sel = dufs.fit(D, method="variance", n_features=10)
    assert sel.diagnostics["n_workers"] == 0  # no cluster started
    Xd = X.toarray()
    want = np.argsort(-Xd.var(axis=0), kind="stable")[:10]
    assert sorted(sel.indices.tolist()) == sorted(want.tolist())


def test_the_nonzeros_decide_not_the_elements():
    X, D = _sparse_dask()
    with dask.config.set({"dufs.engine.inline-nnz": X.nnz}):
        assert _small_dask(D)
    with dask.config.set({"dufs.engine.inline-nnz": X.nnz - 1}):
        assert not _small_dask(D)
    dense = da.from_array(X.toarray(), chunks=(500, 1000))
    assert not _small_dask(dense)  # dense chunks: their elements are what a pass reads
