"""The estimators take what dufs.fit takes (a store, a store path, sparse and dense Dask arrays), through the same
path, never densifying: the selection equals dufs.fit's on the same input, and the traced peak memory of the fit
stays far below the matrix's dense size."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.errors import ParameterError, StoreError
from dufs.estimators import CorrelationSelector, FisherScore, VarianceSelector

N, D = 20_000, 20_000  # dense float64: 3.2 GB
NNZ = 300_000
BOUND = 64 * 2 ** 20  # the traced peak of a fit; 50 times below the dense size


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 20,000 x 20,000 store with 300,000 nonzeros in several feature blocks, its labels and its matrix."""
    rng = np.random.default_rng(0)
    X = sp.csr_array((rng.integers(1, 9, NNZ).astype(np.float64), (rng.integers(0, N, NNZ), rng.integers(0, D, NNZ))),
                     shape=(N, D))
    X.sum_duplicates()
    y = (np.asarray(X[:, :50].sum(axis=1)).ravel() + 4 * rng.random(N) > 4).astype(np.int64)
    path = str(tmp_path_factory.mktemp("ooc") / "big.zarr")
    with dask.config.set({"dufs.store.feature-block-nnz": 65536}):
        dufs.write_store(X, path, y)
    store = dufs.open(path)
    assert store.n_blocks("csc") > 1
    return store, y, X


def _inputs(store, y):
    return {"store": (store, None), "path": (store.path, None), "Path": (Path(store.path), None),
            "dask-csc": (store.to_dask("csc"), y), "dask-csr": (store.to_dask("csr"), y),
            "dask-csc-scipy": (store.to_dask("csc", kind="scipy"), y)}


def _traced(fn):
    tracemalloc.start()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak


@pytest.mark.parametrize("kind", ["store", "path", "Path", "dask-csc", "dask-csr", "dask-csc-scipy"])
@pytest.mark.parametrize("cls,method", [(FisherScore, "fisher"), (VarianceSelector, "variance")])
def test_estimator_fits_out_of_core_as_dufs_fit(big, kind, cls, method):
    """Labels from the store when y is None, as dufs.fit; same indices and scores; the fit's traced peak is far
    below the 3.2 GB a dense copy would take."""
    store, y, _ = big
    X, labels = _inputs(store, y)[kind]
    ref = dufs.fit(X, labels, method=method, n_features=20, client=False)
    est, peak = _traced(lambda: cls(n_features=20, client=False).fit(X, labels))
    np.testing.assert_array_equal(est.selection_.indices, ref.indices)
    np.testing.assert_array_equal(est.scores_, ref.scores)
    np.testing.assert_array_equal(est.get_support(indices=True), np.sort(ref.indices))
    assert est.n_features_in_ == D
    assert peak < BOUND, f"{kind}: traced peak {peak / 2**20:.1f} MiB"
    assert 8 * N * D > 40 * BOUND


def test_store_labels_give_the_classes(big):
    store, y, _ = big
    est = FisherScore(n_features=5, client=False).fit(store)
    np.testing.assert_array_equal(est.classes_, np.unique(y))
    # given labels win over the store's, as in dufs.fit
    flipped = 1 - y
    ref = dufs.fit(store, flipped, method="correlation", n_features=5, client=False)
    got = CorrelationSelector(n_features=5, client=False).fit(store.path, flipped)
    np.testing.assert_array_equal(got.selection_.indices, ref.indices)


def test_dense_dask_array_goes_out_of_core(big):
    """A dense Dask array is read a column chunk at a time (dufs.fit's path), not pulled into memory whole: 2,000
    x 20,000 float64 is 320 MB, a chunk 16 MB."""
    _, y, X = big
    n = 2000
    Xc = sp.csc_array(X[:n])
    w = 1000

    def chunk(block_info=None):
        a, b = block_info[None]["array-location"][1]
        return Xc[:, a:b].toarray()

    Xd = da.map_blocks(chunk, chunks=((n,), (w,) * (D // w)), dtype=np.float64)
    ref = dufs.fit(Xc, y[:n], method="fisher", n_features=20, client=False)
    est, peak = _traced(lambda: FisherScore(n_features=20, client=False).fit(Xd, y[:n]))
    np.testing.assert_array_equal(est.selection_.indices, ref.indices)
    np.testing.assert_allclose(est.scores_, ref.scores, rtol=1e-12, equal_nan=True)
    assert peak < 8 * n * D / 3, f"traced peak {peak / 2**20:.1f} MiB of a {8 * n * D / 2**20:.0f} MiB matrix"


def test_sparse_dask_array_on_a_cluster(big, cluster_client):
    """The issue's case, FisherScore().fit(store.to_dask("csc"), y), on the active cluster: dufs.fit's result."""
    store, y, _ = big
    with cluster_client.as_current():
        ref = dufs.fit(store.to_dask("csc"), y, method="fisher", n_features=20)
        est = FisherScore(n_features=20).fit(store.to_dask("csc"), y)
    np.testing.assert_array_equal(est.selection_.indices, ref.indices)
    np.testing.assert_array_equal(est.scores_, ref.scores)


def test_out_of_core_input_errors(big, tmp_path):
    store, y, _ = big
    with pytest.raises(ParameterError, match="inconsistent numbers of samples"):
        FisherScore(client=False).fit(store.to_dask("csc"), y[:10])
    with pytest.raises(ParameterError, match="requires y"):
        FisherScore(client=False).fit(store.to_dask("csc"))
    with pytest.raises(StoreError, match="no dufs store"):
        FisherScore(client=False).fit(str(tmp_path / "missing.zarr"))
