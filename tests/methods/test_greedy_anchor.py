"""The greedy selectors and JCFS on an anchor graph built by row blocks (the route at kddb size): the same picks as on
the same graph given densely, JCFS's exact low-rank Y-step against a dense eigendecomposition of eq. (9), and no
task taking more than ``dufs.engine.max-task-bytes`` of inputs."""

from __future__ import annotations

import functools

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import subspace_angles

import dufs
from dufs.engine import Matrix
from dufs.engine.graphs import anchor_graph
from dufs.methods import jcfs as jcfs_module
from tests.methods.greedy_paper import jcfs_embedding_dense, lapaofs_paper, lapdofs_paper

REF = {"lapaofs": lapaofs_paper, "lapdofs": lapdofs_paper}


def _clustered(n=300, d=40, n_clusters=3, seed=3):
    """Sparse nonnegative data with ``n_clusters`` groups of rows, each raising its own five features."""
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.08, rng=seed, format="lil")
    lab = rng.integers(0, n_clusters, size=n)
    for i in range(n):
        for f in range(5 * lab[i], 5 * lab[i] + 5):
            if rng.random() < 0.6:
                X[i, f] = 1.0 + rng.random()
    return sp.csr_array(X)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    X = _clustered()
    path = str(tmp_path_factory.mktemp("anchor") / "s.zarr")
    with dask.config.set({"dufs.store.row-block": 64}):
        dufs.write_store(X, path)
    return X, path


@functools.cache
def _wdense(G):
    """W = Zh Lambda^-1 Zh^T formed densely from the graph's pieces (not gathering Zh into the graph)."""
    Zd = sp.csr_array(G.pieces.gather()).toarray()
    return sp.csr_array((Zd * G.lam_inv[None, :]) @ Zd.T)


def _graph(M):
    return anchor_graph(M, n_anchors=24, n_neighbors=3, embed_dim=8, random_state=1)


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_lap_on_the_row_block_anchor_graph_picks_as_on_its_dense_w(cluster_client, store, method):
    """The same W, once as the anchor graph's row pieces (products Zh Lambda^-1 Zh^T v, x^T W x by the anchor
    kernel) and once as an explicit sparse n x n matrix: the same sequence, criterion and objective, and the papers'
    sample-space algorithm on that W picks the same."""
    X, path = store
    with cluster_client.as_current():
        M = Matrix(path, standardize=None)
        G = _graph(M)
        assert G.pieces is not None and len(G.pieces.items) == 5
        got = dufs.fit(path, method=method, n_features=12, standardize=None, W=G, client=cluster_client)
        Wd = _wdense(G)
        dense = dufs.fit(path, method=method, n_features=12, standardize=None, W=Wd, client=cluster_client)
    np.testing.assert_array_equal(got.indices, dense.indices)
    np.testing.assert_allclose(got.diagnostics["criterion"], dense.diagnostics["criterion"], rtol=1e-10)
    np.testing.assert_allclose(got.diagnostics["objective"], dense.diagnostics["objective"], rtol=1e-10)
    ref = REF[method](X.toarray(), Wd.toarray(), 12, 0.01, 0.01)
    np.testing.assert_array_equal(got.indices, ref.order)


@pytest.mark.parametrize("lam", [1e-6, 1e-2])
def test_jcfs_y_step_on_an_anchor_graph_equals_dense_eigh(cluster_client, store, lam):
    """Eq. (9) on the anchor graph solved exactly through the (n_anchors + k)-square matrix of its factor and the
    selected columns, against numpy.linalg.eigh of L_norm + lambda (X_S X_S^T + gamma I)^-1 formed densely: the
    same eigenvalues and subspace, with and without selected features."""
    X, path = store
    gamma, c = 1e-4, 3
    with cluster_client.as_current():
        M = Matrix(path, standardize=None)
        G = _graph(M)
        Wd = _wdense(G).toarray()
        for S in ([], [0, 5, 10, 17, 33]):
            Y, vals = jcfs_module.jcfs_embedding(M, S, G, c, lam, gamma)
            assert G.in_pieces  # the row-block route, the selected columns read by the row blocks
            Yr, vr = jcfs_embedding_dense(X.toarray(), S, Wd, c + 1, lam, gamma)
            assert vr[c] - vr[c - 1] > 1e-6  # the subspace is well defined
            np.testing.assert_allclose(vals, vr[:c], rtol=1e-9, atol=1e-9)
            assert subspace_angles(Y, Yr[:, :c]).max() < 1e-7
            np.testing.assert_allclose(Y.T @ Y, np.eye(c), atol=1e-9)


def test_jcfs_on_the_row_block_anchor_graph_picks_as_on_its_dense_w(cluster_client, store):
    X, path = store
    params = {"n_clusters": 3, "lambda_": 1e-6, "gamma": 1e-4, "max_iter": 3, "standardize": None}
    with cluster_client.as_current():
        G = _graph(Matrix(path, standardize=None))
        got = dufs.fit(path, method="jcfs", n_features=10, W=G, client=cluster_client, **params)
        dense = dufs.fit(path, method="jcfs", n_features=10, W=_wdense(G), client=cluster_client, **params)
    np.testing.assert_array_equal(got.indices, dense.indices)
    assert got.diagnostics["iterations"] == dense.diagnostics["iterations"]


@pytest.mark.parametrize("method,params", [
    ("laplacian", {}), ("lapaofs", {}), ("lapdofs", {}), ("jcfs", {"n_clusters": 3, "max_iter": 2}),
    # uniform random data have no clusters: M3FS may put every sample on one side (warned), the bound holds the same
    pytest.param("m3fs", {"solver": "alternating", "max_iter": 2},
                 marks=pytest.mark.filterwarnings("ignore::dufs.errors.DufsWarning")),
    ("ufcm", {"n_clusters": 3, "max_iter": 2, "n_init": 2}),
])
def test_no_task_of_an_unsupervised_method_takes_more_than_the_bound(cluster_client, tmp_path, method, params):
    """With dufs.engine.max-task-bytes below the n x embed_dim embedding, each unsupervised method runs on a store
    (the graph-based ones on its anchor graph) with no task receiving more than the bound (a scheduler plugin sums
    each task's inputs): the embedding and the k-means steps stay in row pieces; Zh (n x 2) whole is an input of
    the feature passes."""
    from dufs.testing.tasks import task_inputs

    X = sp.random_array((3000, 40), density=0.05, rng=21, format="csr")
    path = str(tmp_path / "s.zarr")
    with dask.config.set({"dufs.store.row-block": 256}):
        dufs.write_store(X, path)
    bound = 256 * 1024  # E is 3000 x 32 x 8 = 768 KB; Zh 3000 x 2 x 12 = 72 KB; an n-vector 24 KB
    graph = {"graph": "anchor", "n_anchors": 16, "anchor_neighbors": 2, "embed_dim": 32} if method != "ufcm" else {}
    with cluster_client.as_current(), dask.config.set({"dufs.engine.max-task-bytes": bound}):
        with task_inputs(cluster_client) as seen:
            sel = dufs.fit(path, method=method, n_features=5, client=cluster_client, **graph, **params)
    assert seen.tasks > (12 if method != "ufcm" else 4)  # row blocks, k-means steps, the feature passes
    assert seen.max_bytes <= bound, (seen.max_bytes, seen.max_key)
    if method == "laplacian":
        assert seen.max_bytes >= 3000 * 2 * 12  # what the plugin sees: Zh whole is an input of the feature pass
    assert len(sel.indices) == 5 and np.isfinite(sel.selected_scores).all()


def test_m3fs_on_the_row_block_anchor_graph_picks_as_on_its_dense_w(cluster_client, store):
    """M3FS's spectral start on the anchor graph comes from the graph's factor (no eigensolver over the samples):
    the same split as numpy.linalg.eigh of the dense normalised Laplacian (up to naming the two sides), and the
    alternating solver then selects the same features as with the graph given densely."""
    from dufs.engine.graphs import laplacian
    from dufs.methods.m3fs.alternating import _init_labels, m3fs_alternating

    X, path = store
    with cluster_client.as_current():
        M = Matrix(path, standardize="zscore").persist()  # the v-steps' passes on persisted blocks: a third the time
        G = _graph(M)
        Wd = _wdense(G)
        lab = _init_labels(M, None, "spectral", 2, 0, 3000, G)
        Ln, _ = laplacian(Wd, normed=True)
        _, U = np.linalg.eigh(Ln.toarray())
        want = (U[:, 1] > np.median(U[:, 1])).astype(np.int64)
        assert min(np.sum(lab != want), np.sum(lab == want)) == 0
        # no polish (its label flips re-run the solve, tested on its own): the two graphs, not the flips
        got = m3fs_alternating(M, n_features=8, W=G, max_iter=5, polish=0)
        dense = m3fs_alternating(M, n_features=8, W=Wd, max_iter=5, polish=0)
    np.testing.assert_array_equal(np.sort(got.selected), np.sort(dense.selected))
    np.testing.assert_allclose(got.objective, dense.objective, rtol=1e-6)


def test_the_default_graph_is_knn_for_moderate_n_and_the_anchor_graph_above(monkeypatch, store):
    """graph="auto" (the default): exact kNN up to KNN_MAX_SAMPLES samples, the anchor graph above (exact kNN at
    kddb's 19 million samples would take millions of passes)."""
    import dufs.engine.graphs as graphs
    from dufs.errors import ParameterError

    assert graphs.resolve_graph("auto", graphs.KNN_MAX_SAMPLES) == "knn"
    assert graphs.resolve_graph("auto", graphs.KNN_MAX_SAMPLES + 1) == "anchor"
    assert graphs.resolve_graph("knn", 10**8) == "knn"
    with pytest.raises(ParameterError, match="'graph'.*'auto', 'knn' or 'anchor'"):
        graphs.resolve_graph("nearest", 10)
    X, path = store
    small = {"n_anchors": 24, "embed_dim": 8}
    got = dufs.fit(path, method="lapdofs", n_features=3, client=False, **small)
    assert got.diagnostics["graph"] == "knn"
    monkeypatch.setattr(graphs, "KNN_MAX_SAMPLES", 200)  # these 300 samples are "many"
    got = dufs.fit(path, method="lapdofs", n_features=3, client=False, **small)
    assert got.diagnostics["graph"] == "anchor"
    want = dufs.fit(path, method="lapdofs", n_features=3, client=False, graph="anchor", **small)
    np.testing.assert_array_equal(got.indices, want.indices)


def test_jcfs_keeps_y_in_float32_above_the_bound(cluster_client, store):
    """Y (n x n_clusters) comes to the driver whole: float64 while it fits dufs.engine.max-task-bytes, float32 above
    (kddb with 10 clusters: 0.77 GB instead of 1.5), refused beyond even that; the picks do not change."""
    from dufs.errors import ParameterError

    X, path = store
    params = {"n_clusters": 3, "lambda_": 1e-6, "gamma": 1e-4, "max_iter": 2, "standardize": None}
    with cluster_client.as_current():
        M = Matrix(path, standardize=None)
        G = _graph(M)
        Y64, v64 = jcfs_module.jcfs_embedding(M, [0, 5, 10], G, 3, 1e-6, 1e-4)
        with dask.config.set({"dufs.engine.max-task-bytes": 300 * 3 * 6}):
            Y32, v32 = jcfs_module.jcfs_embedding(M, [0, 5, 10], G, 3, 1e-6, 1e-4)
            single = dufs.fit(path, method="jcfs", n_features=10, W=G, client=cluster_client, **params)
        with dask.config.set({"dufs.engine.max-task-bytes": 300 * 3 * 3}), \
                pytest.raises(ParameterError, match="n_clusters"):
            jcfs_module.jcfs_embedding(M, [], G, 3, 1e-6, 1e-4)
        double = dufs.fit(path, method="jcfs", n_features=10, W=G, client=cluster_client, **params)
    assert Y64.dtype == np.float64 and Y32.dtype == np.float32
    np.testing.assert_allclose(Y32, Y64, atol=1e-6)
    np.testing.assert_allclose(v32, v64, rtol=1e-12)
    np.testing.assert_array_equal(single.indices, double.indices)


def test_a_greedy_selection_reports_where_its_steps_went(cluster_client, store):
    """Each step's time split in the diagnostics: the update pass (none in the first step, which follows the start
    pass) and the driver's part within the step's time, and the slowest worker's calls within the pass where it
    ran as direct calls on the persisted blocks (``None`` where not)."""
    from dufs.engine import as_matrix
    from dufs.methods.greedy import lapofs

    _, path = store
    with cluster_client.as_current():
        M = as_matrix(path, standardize=None, persist=True)
        try:
            r = lapofs(M, n_features=6, criterion="A", W=_graph(M), checkpoint=None)
        finally:
            M.release()
    dg = r.diagnostics
    steps, drv, upd, calls = (dg[key] for key in ("step_seconds", "driver_seconds", "pass_seconds",
                                                  "pass_call_seconds"))
    assert len(steps) == len(drv) == len(upd) == len(calls) == 6
    assert upd[0] == 0.0 and calls[0] is None
    assert all(u > 0 for u in upd[1:])
    assert all(u + d <= s for u, d, s in zip(upd, drv, steps, strict=True))
    assert all(c is None or 0 < c <= u for c, u in zip(calls, upd, strict=True))
    assert any(c is not None for c in calls), "the steps ran as direct calls on the persisted blocks"
