"""dufs.fit: every input kind gives the same selection; 1 and 2 workers and two blockings agree; the ranking
equals an independent dense computation."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sparse
from distributed import Client, LocalCluster

import dufs
from dufs.data.datasets import load
from dufs.errors import DufsWarning, ParameterError


@pytest.fixture(scope="module")
def text():
    X, y = load("pcmac")
    X = sp.csr_array(X[::2, :800])
    return X, y[::2].astype(np.float64)


def _fisher_ref(Xd, y):
    mu = Xd.mean(0)
    sb = sum((y == c).sum() * (Xd[y == c].mean(0) - mu) ** 2 for c in np.unique(y))
    sw = sum((y == c).sum() * Xd[y == c].var(0) for c in np.unique(y))
    s = np.where(sw > 0, sb / np.where(sw > 0, sw, 1), np.where(sb > 0, np.inf, 0))
    return np.argsort(-s, kind="stable")


@pytest.mark.slow
def test_every_input_kind_gives_the_same_selection(text, tmp_path, cluster_client):
    """In-memory kinds run in this process; Dask arrays and stores on the test cluster, and the store path on the
    LocalCluster that ``fit`` starts itself when no client is given or active ("path"), or in this process when
    it has at most ``dufs.engine.inline-nnz`` nonzeros ("small path")."""
    X, y = text
    want = _fisher_ref(X.toarray(), y)[:25]
    store = dufs.write_store(X, tmp_path / "s.zarr", y)
    inputs = {
        "numpy": X.toarray(), "scipy": X, "scipy-csc": X.tocsc(), "pydata": sparse.COO.from_scipy_sparse(X),
        "dask-dense": da.from_array(X.toarray(), chunks=(200, 300)),
        "dask-sparse": da.from_array(sparse.COO.from_scipy_sparse(X), chunks=(300, 250), asarray=False),
        "store": store, "path": str(tmp_path / "s.zarr"), "small path": str(tmp_path / "s.zarr"),
    }
    assert store.nnz > 1000
    with dask.config.set({"dufs.store.feature-block-nnz": 3000}):
        for name, Xi in inputs.items():
            yi = None if name in ("store", "path", "small path") else y
            client = cluster_client if name in ("dask-dense", "dask-sparse", "store") else None
            with dask.config.set({"dufs.engine.inline-nnz": 10**7 if name == "small path" else 1000}):
                sel = dufs.fit(Xi, yi, method="fisher", n_features=25, client=client)
            if name == "path":
                assert sel.diagnostics["n_workers"] >= 1  # the embedded cluster
            if name == "small path":
                assert sel.diagnostics["n_workers"] == 0 and sel.diagnostics["blocks"]["mode"] == "store"
            assert sel.indices.tolist() == want.tolist(), name
            assert sel.n_features_in == 800 and sel.support_mask.sum() == 25


@pytest.mark.slow
def test_one_and_two_workers_and_two_blockings_agree(text, tmp_path, cluster_client):
    X, y = text
    results = []
    # one 1-worker cluster for both blockings (a cluster started and its worker's imports made cost more than a fit)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=40) as lc, Client(lc, set_as_default=False) as one:
        for block_nnz in (2000, 10**7):
            with dask.config.set({"dufs.store.feature-block-nnz": block_nnz}):
                store = dufs.write_store(X, tmp_path / f"b{block_nnz}.zarr", y)
                results.append(dufs.fit(store, method="laplacian", n_features=40, client=cluster_client))
                results.append(dufs.fit(store, method="laplacian", n_features=40, client=one))
    assert results[0].diagnostics["n_workers"] == 2 and results[1].diagnostics["n_workers"] == 1
    for r in results[1:]:
        assert r.indices.tolist() == results[0].indices.tolist()
        np.testing.assert_array_equal(r.scores, results[0].scores)


def test_unknown_method_and_bad_n_features(text):
    X, y = text
    with pytest.raises(ParameterError, match="'method' parameter of fit"):
        dufs.fit(X, y, method="nope", n_features=3)
    for bad in (0, -3, True, 2.0, "ten"):
        with pytest.raises(ParameterError, match=r"'n_features' parameter of fisher must be an int >= 1 or 'all'"):
            dufs.fit(X, y, method="fisher", n_features=bad)
    with pytest.raises(ParameterError, match="supervised"):
        dufs.fit(X, method="correlation", n_features=3)
    with pytest.raises(ParameterError, match="does not take"):
        dufs.fit(X, y, method="variance", n_features=3, n_neighbors=4)


def test_client_false_runs_in_this_process_and_counts_passes(tmp_path):
    """``client=False`` (``dufs select --workers 0``) uses no cluster even for a store; the passes over the data
    are counted across the method's views of the matrix (Fisher: one statistics pass; correlation: a product and
    the statistics, now in the same pass)."""
    rng = np.random.default_rng(3)
    X = sp.random_array((300, 60), density=0.1, rng=rng, format="csr")
    y = rng.integers(0, 2, 300).astype(float)
    store = dufs.write_store(X, tmp_path / "s.zarr", y)
    for method, passes in (("variance", 1), ("fisher", 1), ("correlation", 1)):
        sel = dufs.fit(store, method=method, n_features=5, client=False)
        d = sel.diagnostics
        assert d["n_workers"] == 0 and d["blocks"]["mode"] == "store" and d["passes"] == passes, (method, d)


@pytest.mark.parametrize("method", ["variance", "fisher", "mmfs", "lapaofs"])
def test_n_features_beyond_the_input_keeps_all_with_a_warning(method):
    """As scikit-learn's SelectKBest: more features asked for than there are warns and selects all of them, best
    first in the same order as asking for exactly all; "all" does the same without a warning."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 5))
    y = (X[:, 2] + 0.5 * rng.normal(size=60) > 0).astype(float)
    yy = y if dufs.api.METHODS[method].supervised else None
    exact = dufs.fit(X, yy, method=method, n_features=5)
    with pytest.warns(DufsWarning, match=r"n_features=12 is greater than the 5 features of the input: all 5 are "
                                         r"selected"):
        more = dufs.fit(X, yy, method=method, n_features=12)
    every = dufs.fit(X, yy, method=method, n_features="all")
    assert sorted(exact.indices.tolist()) == [0, 1, 2, 3, 4]
    assert more.indices.tolist() == exact.indices.tolist() == every.indices.tolist()
    assert more.params["n_features"] == 5


def test_a_persisted_matrix_stays_usable_after_fits(cluster_client):
    """``dufs.fit`` fits a view of a Matrix it is given and releases only what it made itself: the caller's
    persisted blocks serve a second fit and another method (they were released after the first fit, and the next
    one failed with "lost dependencies")."""
    from dufs.engine import as_matrix

    X = sp.random_array((100, 80), density=0.1, rng=1, format="csr")
    ref = {m: dufs.fit(X, method=m, n_features=5, client=False).indices for m in ("variance", "laplacian")}
    with cluster_client.as_current():
        M = as_matrix(X, block_width=8, persist=True)
        assert M.residency["mode"] == "persisted"
        for m in ("variance", "laplacian", "variance"):
            got = dufs.fit(M, method=m, n_features=5, client=cluster_client)
            np.testing.assert_array_equal(got.indices, ref[m])
        M.release()
