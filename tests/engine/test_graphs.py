"""kNN graphs equal scikit-learn's kneighbors_graph, symmetrised as He et al. eq. (2), for arrays and for a Matrix
(computed on the workers, each standardization); anchor graphs against dense brute-force references."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.neighbors import kneighbors_graph

from dufs.data.datasets import load
from dufs.engine import Matrix
from dufs.engine.graphs import anchor_graph, knn_graph, laplacian, laplacian_operator, projection_rows
from dufs.errors import ParameterError
from dufs.kernels.projection import projection_scale
from dufs.methods.filters import laplacian_scores


def _reference(X, k, heat_t=None):
    A = kneighbors_graph(X, k, mode="distance", include_self=False)
    A = sp.csr_array(A)
    if heat_t is None:
        A.data[:] = 1.0
    else:
        A.data = np.exp(-(A.data ** 2) / heat_t)
    return A.maximum(A.T)


@pytest.mark.parametrize("k", [1, 4, 5])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_binary_knn_equals_sklearn(k, kind):
    rng = np.random.default_rng(k)
    X = rng.standard_normal((230, 12))
    if kind == "sparse":
        X = sp.random_array((230, 40), density=0.3, rng=rng, format="csr")
    W = knn_graph(X, k, block_rows=64)
    R = _reference(X, k)
    assert abs(W - R).max() == 0
    assert (W != W.T).nnz == 0 and W.diagonal().max() == 0


def test_heat_knn_equals_sklearn_on_real_data():
    X, _ = load("coil20")
    X = X[:300]
    W = knn_graph(X, 5, weights="heat", t=50.0, block_rows=100)
    R = _reference(X, 5, heat_t=50.0)
    assert (W != 0).sum() == (R != 0).sum()
    np.testing.assert_allclose(W.toarray(), R.toarray(), rtol=1e-9, atol=1e-12)


def test_laplacians():
    rng = np.random.default_rng(0)
    W = knn_graph(rng.standard_normal((50, 3)), 3)
    L, d = laplacian(W)
    assert np.allclose(L.toarray(), np.diag(W.toarray().sum(1)) - W.toarray())
    Ln, _ = laplacian(W, normed=True)
    Dm = np.diag(1 / np.sqrt(d))
    assert np.allclose(Ln.toarray(), np.eye(50) - Dm @ W.toarray() @ Dm)


def test_bad_parameters():
    X = np.zeros((5, 2))
    with pytest.raises(ParameterError, match="'n_neighbors' parameter of knn_graph"):
        knn_graph(X, 5)
    with pytest.raises(ParameterError, match="'weights'"):
        knn_graph(X, 2, weights="cosine")


# ---------------------------------------------------------------------------------------------------- Matrix input
def _dense_z(Xd, standardize):
    """The explicitly transformed dense matrix (population std, a zero std taken as 1)."""
    Xd = np.asarray(Xd, dtype=np.float64)
    sd = Xd.std(axis=0)
    sd[sd == 0] = 1.0
    if standardize == "zscore":
        return (Xd - Xd.mean(axis=0)) / sd
    if standardize == "scale":
        return Xd / sd
    return Xd


def _sparse_data(n=150, d=37, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.3, rng=rng, format="csr")
    X.data = rng.standard_normal(X.data.shape[0]) * 3 + 1
    X = X.tolil()
    X[:, 5] = 2.0  # a constant column (std 0, taken as 1)
    return sp.csr_array(X)


@pytest.mark.parametrize("dense_rows", [True, False])
@pytest.mark.parametrize("standardize", ["zscore", "scale", None])
def test_knn_graph_of_matrix_equals_sklearn_on_transformed_dense(standardize, dense_rows, monkeypatch):
    """Either way of making a Gram block (its rows dense, the default where they are small, or sparse x sparse)
    gives sklearn's graph."""
    import dask

    from dufs.engine import knn

    if not dense_rows:
        monkeypatch.setattr(knn, "_GRAM_DENSE_ROWS_BYTES", 0)
    X = _sparse_data()
    Zd = _dense_z(X.toarray(), standardize)
    want_bin = _reference(Zd, 4)
    want_heat = _reference(Zd, 4, heat_t=7.5)
    with dask.config.set(scheduler="synchronous"):
        for bw, br in ((6, 40), (37, 150)):
            M = Matrix(X, standardize=standardize, block_width=bw)
            W = knn_graph(M, 4, block_rows=br)
            assert abs(W - want_bin).max() == 0
            Wh = knn_graph(M, 4, weights="heat", t=7.5, block_rows=br)
            assert (Wh != 0).sum() == (want_heat != 0).sum()
            np.testing.assert_allclose(Wh.toarray(), want_heat.toarray(), rtol=1e-9, atol=1e-12)
            assert (W != W.T).nnz == 0 and W.diagonal().max() == 0


def test_knn_graph_of_matrix_on_the_process_cluster(cluster_client):
    X = _sparse_data(120, 23, seed=3)
    with cluster_client.as_current():
        for standardize in ("zscore", "scale"):
            Zd = _dense_z(X.toarray(), standardize)
            M = Matrix(X, standardize=standardize, block_width=5)
            assert abs(knn_graph(M, 3, block_rows=50) - _reference(Zd, 3)).max() == 0
            Wh = knn_graph(M, 3, weights="heat", t=4.0)
            np.testing.assert_allclose(Wh.toarray(), _reference(Zd, 3, heat_t=4.0).toarray(), rtol=1e-9,
                                       atol=1e-12)


def _unit_rows(Xd):
    """The dense rows scaled to unit norm (an empty row stays zero), as scikit-learn's normalize."""
    from sklearn.preprocessing import normalize

    return normalize(np.asarray(Xd, dtype=np.float64))


def test_cosine_knn_equals_sklearn_on_unit_rows(cluster_client):
    """metric="cosine": the kNN graph of the rows scaled to unit norm (scikit-learn's on normalize(X)), for an
    array, a sparse matrix, and a Matrix on the workers (its scaling applied first, as for Euclidean distances);
    heat weights exp(-||x_i/|x_i| - x_j/|x_j|||^2 / t)."""
    X = _sparse_data(160, 31, seed=11)
    X = sp.csr_array(X.multiply(np.random.default_rng(1).uniform(0.2, 9.0, (160, 1))))  # rows of many lengths
    ref = _reference(_unit_rows(X.toarray()), 4)
    assert abs(ref - _reference(X.toarray(), 4)).max() > 0  # the lengths change the neighbours here
    assert abs(knn_graph(X, 4, metric="cosine", block_rows=50) - ref).max() == 0
    assert abs(knn_graph(X.toarray(), 4, metric="cosine") - ref).max() == 0
    with cluster_client.as_current():
        for standardize in (None, "scale"):
            Zd = _dense_z(X.toarray(), standardize)
            M = Matrix(X, standardize=standardize, block_width=6)
            assert abs(knn_graph(M, 4, metric="cosine", block_rows=70) - _reference(_unit_rows(Zd), 4)).max() == 0
            Wh = knn_graph(M, 4, weights="heat", t=0.7, metric="cosine")
            np.testing.assert_allclose(Wh.toarray(), _reference(_unit_rows(Zd), 4, heat_t=0.7).toarray(),
                                       rtol=1e-9, atol=1e-12)
    with pytest.raises(ParameterError, match="'metric' parameter of knn_graph"):
        knn_graph(X, 4, metric="cos")


def test_graph_metric_is_cosine_for_sparse_raw_rows_and_the_setting_overrides_it():
    from dufs.engine.graphs import graph_metric, graph_rows

    X = _sparse_data(150, 37)  # 30% nonzero: dense for graphs
    sparse = sp.random_array((150, 400), density=0.02, rng=0, format="csr")
    assert graph_metric(Matrix(sparse)) == "cosine"
    assert graph_metric(graph_rows(Matrix(sparse, standardize="zscore"))) == "cosine"
    assert graph_metric(Matrix(sparse, standardize="zscore")) == "euclidean"  # standardized rows as asked
    assert graph_metric(Matrix(X)) == "euclidean" and graph_metric(X) == "euclidean"
    with dask.config.set({"dufs.graph.metric": "euclidean"}):
        assert graph_metric(Matrix(sparse)) == "euclidean"
    with dask.config.set({"dufs.graph.metric": "cosine"}):
        assert graph_metric(Matrix(X)) == "cosine"
    with dask.config.set({"dufs.graph.metric": "manhattan"}), pytest.raises(ParameterError, match="graph.metric"):
        graph_metric(Matrix(X))


def _counts(n=160, d=31, seed=11):
    """Sparse non-negative counts with a heavy tail (values 1 to about 400), rows of many lengths."""
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.25, rng=rng, format="csr")
    X.data = np.floor(np.exp(rng.normal(0.5, 1.8, X.data.shape[0]))) + 1
    return X


def _read(Xd, values):
    """The dense array as a graph reads it: presence (1 where nonzero), log(1 + x) or sqrt(x)."""
    Xd = np.asarray(Xd, dtype=np.float64)
    if values == "sqrt":
        return np.sqrt(Xd)
    return (Xd != 0).astype(np.float64) if values == "presence" else np.log1p(Xd)


@pytest.mark.parametrize("values", ["presence", "log1p", "sqrt"])
def test_knn_graph_values_equal_the_graph_of_the_transformed_rows(values, cluster_client):
    """values="presence" / "log1p" / "sqrt": the kNN graph of the rows read as 1 where nonzero / log(1 + x) /
    sqrt(x), Euclidean and cosine, for an array, a sparse matrix and a Matrix on the workers: the graph of those
    rows made explicitly (scikit-learn's for log1p and sqrt; presence rows tie at nearly every distance, where the
    order of the rounding decides, so there the graph of the explicit rows by the same blocked distances)."""
    X = _counts()
    Xd = X.toarray()
    T = sp.csr_array(_read(Xd, values))
    for metric, unit in (("cosine", _unit_rows), ("euclidean", np.asarray)):
        ref = knn_graph(T, 4, metric=metric, block_rows=50)
        if values != "presence":
            assert abs(ref - _reference(unit(T.toarray()), 4)).max() == 0
        assert abs(ref - _reference(unit(Xd), 4)).max() > 0  # what the graph reads changes the neighbours here
        assert abs(knn_graph(X, 4, metric=metric, values=values, block_rows=50) - ref).max() == 0
        assert abs(knn_graph(Xd, 4, metric=metric, values=values, block_rows=50) - ref).max() == 0
        with cluster_client.as_current():
            got = knn_graph(Matrix(X, block_width=6), 4, metric=metric, values=values, block_rows=70)
            want = knn_graph(Matrix(T, block_width=6), 4, metric=metric, block_rows=70)
        assert abs(got - want).max() == 0
        if values != "presence":
            assert abs(got - ref).max() == 0
    assert X.data.max() > 2  # the input is not changed in place
    with pytest.raises(ParameterError, match="'values' parameter of knn_graph"):
        knn_graph(X, 4, values="binary")


def test_graph_values_read_counts_by_their_logarithm_and_the_setting_overrides_it():
    from dufs.engine.graphs import SPARSE_GRAPH_VALUES, graph_rows, graph_values

    counts = sp.random_array((150, 400), density=0.02, rng=0, format="csr")
    counts.data = np.ceil(counts.data * 9)
    signed = counts.copy()
    signed.data[::3] *= -1
    assert SPARSE_GRAPH_VALUES in ("presence", "log1p")
    assert graph_values(Matrix(counts)) == SPARSE_GRAPH_VALUES
    assert graph_values(graph_rows(Matrix(counts, standardize="zscore"))) == SPARSE_GRAPH_VALUES
    assert graph_values(Matrix(counts, standardize="zscore")) == "raw"  # standardized rows: as asked
    assert graph_values(Matrix(signed)) == "raw"  # negative values: log1p is not defined for all of them
    assert graph_values(Matrix(_sparse_data(150, 37))) == "raw"  # dense for graphs
    assert graph_values(counts) == "raw"  # not a Matrix: as graph_metric, the rows as given
    with dask.config.set({"dufs.graph.values": "presence"}):
        assert graph_values(Matrix(counts)) == "presence" and graph_values(Matrix(signed)) == "presence"
        assert graph_values(Matrix(counts, standardize="zscore")) == "raw"
    with dask.config.set({"dufs.graph.values": "raw"}):
        assert graph_values(Matrix(counts)) == "raw"
    with dask.config.set({"dufs.graph.values": "binary"}), pytest.raises(ParameterError, match="graph.values"):
        graph_values(Matrix(counts))


# ---------------------------------------------------------------------------------------------------- anchor graph
@pytest.fixture(scope="module")
def anchor_case():
    import dask

    X = _sparse_data(200, 45, seed=7)
    M = Matrix(X, standardize="zscore", block_width=7)
    with dask.config.set(scheduler="synchronous"):
        G = anchor_graph(M, n_anchors=20, n_neighbors=3, embed_dim=8, random_state=5)
    return X, M, G


def test_embedding_equals_dense_z_times_r(anchor_case):
    X, M, G = anchor_case
    R = projection_rows(0, X.shape[1], 8, 5)
    np.testing.assert_allclose(G.embedding, _dense_z(X.toarray(), "zscore") @ R, rtol=1e-10, atol=1e-10)
    # R is the same rows whatever the range asked for, and the blocking does not matter
    np.testing.assert_array_equal(projection_rows(3, 9000, 8, 5)[:42], R[3:45])
    assert set(np.unique(R / projection_scale(8)).round(12)) <= {-1.0, 0.0, 1.0}
    R2 = projection_rows(0, 5000, 8, 5)
    assert abs((R2 != 0).mean() - 1 / 3) < 0.02 and abs((R2 > 0).mean() - 1 / 6) < 0.02
    assert abs(R2.var() * 8 - 1.0) < 0.05  # variance 1 / embed_dim


def test_anchor_weights_are_the_s_nearest_and_sum_to_one(anchor_case):
    _, _, G = anchor_case
    E, U = G.embedding, G.anchors
    D = ((E[:, None, :] - U[None, :, :]) ** 2).sum(-1)  # brute force
    Zd = G.Zh.toarray()
    np.testing.assert_allclose(Zd.sum(1), 1.0, rtol=1e-12)
    assert np.all((Zd != 0).sum(1) == 3)
    for i in range(E.shape[0]):
        near = np.argsort(D[i], kind="stable")[:3]
        assert set(np.flatnonzero(Zd[i])) == set(near)
        sig = D[i, near].mean()
        k = np.exp(-D[i, near] / sig)
        np.testing.assert_allclose(Zd[i, near], k / k.sum(), rtol=1e-9)


@pytest.mark.parametrize("shared", ["off", "all"])
def test_anchor_products_in_row_pieces(cluster_client, shared):
    """W V, the degrees and the Laplacian computed piece by piece on the row blocks (the driver never gathers Zh,
    as for a Zh above dufs.engine.graph-driver-bytes) equal the same graph's Zh formed densely afterwards, with the
    vectors and results sent as messages or (``shared="all"``: every size eligible) through /dev/shm; Zh P also
    written in float32."""
    from dufs.engine import shm

    shm.release_files()  # no pooled results' file from earlier tests
    X = _sparse_data(300, 40, seed=3)
    conf = {"dufs.engine.shared-memory": "off"} if shared == "off" else {"dufs.engine.shared-memory-bytes": 1}
    with cluster_client.as_current(), dask.config.set(conf):
        M = Matrix(X, standardize="zscore", block_width=9)
        with dask.config.set({"dufs.store.row-block": 64}):
            G = anchor_graph(M, n_anchors=12, n_neighbors=3, embed_dim=8, random_state=2, keep_embedding=False)
        assert G.in_pieces and len(G.pieces.items) == 5
        V = np.random.default_rng(1).standard_normal((300, 2))
        P = np.random.default_rng(2).standard_normal((12, 2))
        with dask.config.set({"dufs.engine.graph-driver-bytes": 1}):  # as for a large Zh
            WV, deg, LV = G.matvec_W(V), G.degrees, G.laplacian(normed=True) @ V[:, 0]
            ZP32, ZtV = G.zp(P, dtype=np.float32), G.zt(V[:, 0])
        assert G.in_pieces  # nothing was gathered
        Zd = G.Zh.toarray()
    assert bool(shm._RESULTS.free) == (shared == "all")  # the products' results came through its pooled files
    shm.release_files()
    assert ZP32.dtype == np.float32
    np.testing.assert_allclose(ZP32, Zd @ P, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ZtV, Zd.T @ V[:, 0], rtol=1e-12, atol=1e-12)
    lam = Zd.sum(0)
    Wd = Zd @ np.diag(np.where(lam > 0, 1 / np.where(lam > 0, lam, 1), 0)) @ Zd.T
    np.testing.assert_allclose(WV, Wd @ V, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(deg, Wd.sum(1), rtol=1e-12)
    Dm = np.diag(1 / np.sqrt(Wd.sum(1)))
    np.testing.assert_allclose(LV, (np.eye(300) - Dm @ Wd @ Dm) @ V[:, 0], rtol=1e-10, atol=1e-12)


def test_anchor_laplacian_operator_equals_dense(anchor_case):
    _, _, G = anchor_case
    n = G.shape[0]
    Zd = G.Zh.toarray()
    lam = Zd.sum(0)
    Wd = Zd @ np.diag(np.where(lam > 0, 1 / np.where(lam > 0, lam, 1), 0)) @ Zd.T
    d = Wd.sum(1)
    Ld = np.diag(d) - Wd
    Dm = np.diag(1 / np.sqrt(d))
    Lnd = np.eye(n) - Dm @ Wd @ Dm
    np.testing.assert_allclose(G.degrees, d, rtol=1e-12)
    rng = np.random.default_rng(0)
    V = rng.standard_normal((n, 4))
    L, Ln = G.laplacian(), G.laplacian(normed=True)
    np.testing.assert_allclose(G.matvec_W(V), Wd @ V, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(L @ V, Ld @ V, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(L.matvec(V[:, 0]), Ld @ V[:, 0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Ln @ V, Lnd @ V, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(Ln.matvec(V[:, 1]), Lnd @ V[:, 1], rtol=1e-10, atol=1e-12)  # one kernel, Zh here
    np.testing.assert_allclose(Ln @ V[:, 2:3], Lnd @ V[:, 2:3], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(L @ np.ones(n), 0.0, atol=1e-12)
    LV = L @ V
    np.testing.assert_allclose(V.T @ LV, (V.T @ LV).T, rtol=1e-10, atol=1e-12)  # symmetric
    assert np.all(np.einsum("ij,ij->j", V, LV) >= -1e-12)  # PSD
    assert np.all(np.einsum("ij,ij->j", V, Ln @ V) >= -1e-12)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_anchor_laplacian_vec_in_row_ranges_is_scipy(threads):
    """L v = v - s (Zh (li (Zh^T (s v)))) with Zh's rows in ranges on several threads (rows without anchors among
    them) against SciPy's separate products; one thread gives the fused kernel's numbers bit for bit."""
    from dufs.engine.laplacian import _anchor_laplacian_vec
    from dufs.kernels.anchor import normed_laplacian_vec

    rng = np.random.default_rng(threads)
    n, m = 70_001, 40
    per = rng.integers(0, 4, n)
    Zh = sp.csr_array((rng.uniform(0.1, 1.0, per.sum()), rng.integers(0, m, per.sum()), np.r_[0, np.cumsum(per)]),
                      shape=(n, m))
    s, li, v = rng.uniform(0.5, 1.5, n), rng.uniform(0.1, 1.0, m), rng.standard_normal(n)
    got = _anchor_laplacian_vec(Zh.indptr, Zh.indices, Zh.data, s, li, v, threads)
    np.testing.assert_allclose(got, v - s * (Zh @ (li * (Zh.T @ (s * v)))), rtol=1e-12, atol=1e-12)
    if threads == 1:
        one = normed_laplacian_vec(Zh.indptr, Zh.indices, Zh.data, s, li, v, np.empty(m), np.empty(n))
        np.testing.assert_array_equal(got, one)


def test_laplacian_operator_of_sparse_w():
    rng = np.random.default_rng(1)
    W = knn_graph(rng.standard_normal((60, 3)), 4, weights="heat")
    V = rng.standard_normal((60, 3))
    for normed in (False, True):
        L, _ = laplacian(W, normed=normed)
        op = laplacian_operator(W, normed=normed)
        np.testing.assert_allclose(op @ V, L @ V, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(op.matvec(V[:, 0]), L @ V[:, 0], rtol=1e-12, atol=1e-12)


def _eq3_dense(Xd, Wd):
    """He et al. eq. (3) with dense NumPy: f~ = f - (f^T D 1 / 1^T D 1) 1, L_r = f~^T L f~ / f~^T D f~."""
    d = Wd.sum(1)
    D = np.diag(d)
    L = D - Wd
    out = np.empty(Xd.shape[1])
    for r in range(Xd.shape[1]):
        f = Xd[:, r]
        ft = f - (f @ d) / d.sum()
        den = ft @ D @ ft
        out[r] = np.inf if den <= 1e-12 * max(f @ D @ f, 1e-300) else (ft @ L @ ft) / den
    return out


def test_anchor_laplacian_scores_equal_dense_eq3(anchor_case):
    import dask

    X, M, G = anchor_case
    Zd = G.Zh.toarray()
    Wd = Zd @ np.diag(1 / Zd.sum(0)) @ Zd.T
    want = _eq3_dense(X.toarray(), Wd)
    with dask.config.set(scheduler="synchronous"):
        got = laplacian_scores(M, G)
        got2 = laplacian_scores(M, graph="anchor", n_anchors=20, anchor_neighbors=3, embed_dim=8, random_state=5)
    fin = np.isfinite(want)
    assert not fin[5] and fin.sum() == X.shape[1] - 1
    assert np.array_equal(fin, np.isfinite(got))
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got2, got, rtol=1e-12)


def test_knn_laplacian_scores_from_the_matrix_on_the_cluster(cluster_client):
    X = _sparse_data(100, 19, seed=11)
    Xd = X.toarray()
    want = _eq3_dense(Xd, _reference(Xd, 5).toarray())
    with cluster_client.as_current():
        got = laplacian_scores(Matrix(X, block_width=4))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-9, atol=1e-12)


def test_anchor_bad_parameters():
    M = Matrix(_sparse_data(30, 6), block_width=3)
    with pytest.raises(ParameterError, match="'n_anchors'"):
        anchor_graph(M, n_anchors=31)
    with pytest.raises(ParameterError, match="'n_neighbors' parameter of anchor_graph"):
        anchor_graph(M, n_anchors=4, n_neighbors=5)
    with pytest.raises(ParameterError, match="needs a dufs.engine.Matrix"):
        anchor_graph(np.zeros((5, 2)))
    with pytest.raises(ParameterError, match="'graph'"):
        laplacian_scores(M, graph="full")


def test_ties_go_to_the_lower_index():
    import dask

    # sample 0 is at distance 1 from samples 1..4 (all tied); sample 5 is far away
    X = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0], [9.0, 9.0]])
    with dask.config.set(scheduler="synchronous"):
        for Xi in (X, Matrix(sp.csr_array(X), block_width=1)):
            W = knn_graph(Xi, 2, block_rows=2)
            A = sp.csr_array(W).toarray()
            # 0's two nearest are 1 and 2 (lower indices among the four tied); 1..4 all have 0 as nearest
            assert A[0].tolist() == [0, 1, 1, 1, 1, 0]
            assert A[5, 1] == 1 and A[5, 2] == 1 and A[5].sum() == 2


# ---------------------------------------------------------------------------------------------------- by row blocks
@pytest.fixture(scope="module")
def row_store(tmp_path_factory):
    """A store of several CSR row blocks (row-block 64) and its dense copy."""
    import dask

    import dufs

    X = _sparse_data(300, 37, seed=13)
    path = str(tmp_path_factory.mktemp("rows") / "s.zarr")
    with dask.config.set({"dufs.store.row-block": 64}):
        dufs.write_store(X, path)
    return X, path


@pytest.mark.parametrize("standardize", [None, "zscore"])
def test_anchor_graph_of_a_store_by_row_blocks_on_the_cluster(cluster_client, row_store, monkeypatch, standardize):
    """Rows embedded block by block on the workers (R hashed per nonzero) equal dense Z R; k-means over the row
    pieces (sample, then Lloyd map-reduce steps); Zh's rows are each sample's s nearest anchors, never whole on
    the driver until asked for; the Laplacian scores equal eq. (3) with that graph densely."""
    from dufs.engine import anchors
    from dufs.engine.rows import Pieces

    monkeypatch.setattr(anchors, "KMEANS_SAMPLE", 120)  # 300 samples: the sample-then-Lloyd route
    X, path = row_store
    Zd = _dense_z(X.toarray(), standardize) if standardize else X.toarray()
    with cluster_client.as_current():
        M = Matrix(path, standardize=standardize)
        G = anchor_graph(M, n_anchors=12, n_neighbors=3, embed_dim=8, random_state=2)
        assert isinstance(G.pieces, Pieces) and len(G.pieces.items) == 5  # 300 rows in blocks of 64
        assert G._Zh is None  # noqa: SLF001 (not gathered yet)
        E = G.embedding
        np.testing.assert_allclose(E, Zd @ projection_rows(0, X.shape[1], 8, 2), rtol=1e-10, atol=1e-10)
        # the anchors are a fixed point of one more Lloyd step or close to it; Zh links each row to its 3 nearest
        Zdense = G.Zh.toarray()
        got = laplacian_scores(M, G)
    U = G.anchors
    D = ((E[:, None, :] - U[None, :, :]) ** 2).sum(-1)
    for i in range(E.shape[0]):
        assert set(np.flatnonzero(Zdense[i])) == set(np.argsort(D[i], kind="stable")[:3])
    np.testing.assert_allclose(Zdense.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(G.lam, Zdense.sum(0), rtol=1e-12)
    lam = Zdense.sum(0)
    Wd = Zdense @ np.diag(np.where(lam > 0, 1 / np.where(lam > 0, lam, 1), 0)) @ Zdense.T
    want = _eq3_dense(X.toarray(), Wd)
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_a_graph_from_a_closed_cluster_says_so(row_store):
    """An anchor graph keeps its rows' pieces on the cluster that built it: used after that cluster is closed (a
    benchmark once built it on its 1-worker cluster and reused it on the 2-worker one), it says what happened
    instead of distributed's "Client is closed"."""
    from distributed import Client, LocalCluster

    from dufs.errors import DufsError

    _, path = row_store
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as lc, \
            Client(lc) as client, client.as_current():
        G = anchor_graph(Matrix(path), n_anchors=12, n_neighbors=3, embed_dim=8, random_state=2)
        assert G.pieces is not None
    with pytest.raises(DufsError, match="cluster that has been closed since"):
        G.zh_shared()


def test_lloyd_step_over_row_pieces_equals_dense(cluster_client, row_store):
    from dufs.engine.anchors import _rows_embed, _rows_lloyd
    from dufs.engine.rows import Rows

    X, path = row_store
    rng = np.random.default_rng(0)
    with cluster_client.as_current():
        rows = Rows.of(Matrix(path))
        E = rows.map(_rows_embed, args=(6, 1, None, None), width=6)
        U = rng.standard_normal((7, 6))
        sums, counts, inertia = rows.reduce(_rows_lloyd, E, args=(U,))
        Ed = E.gather()
    D = ((Ed[:, None, :] - U[None]) ** 2).sum(-1)
    lab = D.argmin(1)
    np.testing.assert_array_equal(counts, np.bincount(lab, minlength=7))
    np.testing.assert_allclose(sums, np.stack([Ed[lab == k].sum(0) for k in range(7)]), rtol=1e-10, atol=1e-12)
    assert inertia[0] == pytest.approx(D.min(1).sum(), rel=1e-10)


def test_row_pieces_are_never_gathered_over_the_task_bound(row_store):
    import dask

    X, path = row_store
    with dask.config.set({"dufs.engine.max-task-bytes": 1000}):
        G = anchor_graph(Matrix(path), n_anchors=5, n_neighbors=2, embed_dim=4, keep_embedding=False)
        with pytest.raises(ParameterError, match="max-task-bytes"):
            G.Zh  # noqa: B018
        assert G.degrees.shape == (300,)  # an n-vector, piece by piece



def test_anchor_graph_of_sparse_standardized_data_is_built_on_the_raw_rows():
    """Standardizing sparse columns gives a feature seen in r of n rows values of order sqrt(n / r): the anchor
    graph of those rows carries none of the samples' structure (scikit-learn's k-means on its spectral embedding
    agrees with the planted clusters at chance level), that of the raw rows does. sample_graph therefore builds it
    on the raw rows of sparse data (the same Zh as the unstandardized matrix's), and dense data keep theirs."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    from dufs.data.synthetic import SyntheticSpec, generate_rows
    from dufs.engine.graphs import graph_rows
    from dufs.methods.graph import sample_graph
    from dufs.methods.jcfs import anchor_spectral_embedding

    n, d = 4000, 20_000
    ip, ix, da, y = generate_rows(SyntheticSpec(n_rows=n, n_features=d, n_clusters=4, seed=0), 0, n)
    X = sp.csr_array((da, ix, ip), shape=(n, d))
    M = Matrix(X, standardize="zscore")
    assert graph_rows(M).standardize is None and graph_rows(M).passes == M.passes
    dense = Matrix(np.random.default_rng(0).standard_normal((50, 4)), standardize="zscore")
    assert graph_rows(dense) is dense

    def ari(G):
        U, _ = anchor_spectral_embedding(G, 4)
        E = U / np.linalg.norm(U, axis=1, keepdims=True)
        return adjusted_rand_score(y, KMeans(4, n_init=4, random_state=0).fit_predict(E))

    G = sample_graph(M, graph="anchor", n_anchors=64, anchor_neighbors=3)
    raw = anchor_graph(Matrix(X), 64, 3, metric="cosine")  # sparse raw rows: cosine (graph_metric)
    assert abs(G.Zh - raw.Zh).max() < 1e-12
    standardized = anchor_graph(M, 64, 3)
    assert ari(G) > 0.15 and abs(ari(standardized)) < 0.02
    assert ari(anchor_graph(Matrix(X), 64, 3)) > 0.15  # Euclidean on the raw rows also carries the clusters here


@pytest.mark.parametrize("where", ["memory", "store"])
def test_cosine_anchor_graph_is_the_euclidean_one_of_the_unit_rows(where, row_store, cluster_client):
    """metric="cosine" embeds e_i / ||z_i|| (the projection is linear): the anchor graph of the rows scaled to
    unit norm, built explicitly, by feature blocks (in memory) or by row blocks (a store, on the workers)."""
    from sklearn.preprocessing import normalize

    X, path = row_store
    X = sp.csr_array(X.multiply(np.random.default_rng(2).uniform(0.5, 6.0, (X.shape[0], 1))))
    Xn = sp.csr_array(normalize(X))
    if where == "memory":
        got = anchor_graph(Matrix(X, block_width=9), 12, 3, embed_dim=8, random_state=4, metric="cosine")
        want = anchor_graph(Matrix(Xn, block_width=9), 12, 3, embed_dim=8, random_state=4)
    else:
        import dufs

        p1, p2 = path.replace("s.zarr", "len.zarr"), path.replace("s.zarr", "unit.zarr")
        with dask.config.set({"dufs.store.row-block": 64}):
            dufs.write_store(X, p1, overwrite=True)
            dufs.write_store(Xn, p2, overwrite=True)
        with cluster_client.as_current():
            got = anchor_graph(Matrix(p1), 12, 3, embed_dim=8, random_state=4, metric="cosine")
            want = anchor_graph(Matrix(p2), 12, 3, embed_dim=8, random_state=4)
    np.testing.assert_allclose(got.embedding, want.embedding, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.Zh.toarray(), want.Zh.toarray(), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("values", ["presence", "log1p"])
@pytest.mark.parametrize("where", ["memory", "store"])
def test_anchor_graph_values_are_the_graph_of_the_transformed_rows(where, values, tmp_path, cluster_client):
    """values="presence" / "log1p" embeds the rows read as 1 / log(1 + x): the anchor graph of those rows built
    explicitly, by feature blocks (in memory) or by row blocks (a store, on the workers), Euclidean and cosine."""
    X = _counts(300, 37, seed=5)
    T = X.copy()
    T.data = _read(T.data, values)
    for metric in ("euclidean", "cosine"):
        if where == "memory":
            got = anchor_graph(Matrix(X, block_width=9), 12, 3, embed_dim=8, random_state=4, metric=metric,
                               values=values)
            want = anchor_graph(Matrix(T, block_width=9), 12, 3, embed_dim=8, random_state=4, metric=metric)
        else:
            import dufs

            p1, p2 = str(tmp_path / f"x-{metric}.zarr"), str(tmp_path / f"t-{metric}.zarr")
            with dask.config.set({"dufs.store.row-block": 64}):
                dufs.write_store(X, p1)
                dufs.write_store(T, p2)
            with cluster_client.as_current():
                got = anchor_graph(Matrix(p1), 12, 3, embed_dim=8, random_state=4, metric=metric, values=values)
                want = anchor_graph(Matrix(p2), 12, 3, embed_dim=8, random_state=4, metric=metric)
        np.testing.assert_allclose(got.embedding, want.embedding, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(got.Zh.toarray(), want.Zh.toarray(), rtol=1e-7, atol=1e-9)
    raw = anchor_graph(Matrix(X, block_width=9), 12, 3, embed_dim=8, random_state=4)
    assert abs(raw.embedding - got.embedding).max() > 1e-3  # the values change the embedding here


def test_k_smallest_breaks_ties_as_a_stable_full_sort():
    """The anchor graph's nearest anchors (_k_smallest): the k smallest of each row, ties at the k-th value broken
    by the lower index without sorting the row: the same (index, value) pairs as NumPy's stable full sort, on
    integer distances that tie at nearly every row."""
    from dufs.engine.knn import _k_smallest

    rng = np.random.default_rng(0)
    for trial in range(300):
        m, r = int(rng.integers(2, 60)), int(rng.integers(1, 20))
        k = int(rng.integers(1, m + 1))
        D = rng.integers(0, 4, size=(r, m)).astype(float)
        if trial % 3 == 0:
            D[:, 0] = np.inf  # a self-distance
        idx, val = _k_smallest(D, k)
        full = np.argsort(D, axis=1, kind="stable")[:, :k]
        fval = np.take_along_axis(D, full, axis=1)
        order = np.lexsort((full, fval), axis=1)
        np.testing.assert_array_equal(idx, np.take_along_axis(full, order, axis=1))
        np.testing.assert_array_equal(val, np.take_along_axis(fval, order, axis=1))


def test_knn_select_breaks_ties_as_a_stable_full_sort():
    """The k nearest of each row of a Gram block, ties at the k-th distance broken by the lower index in one sweep:
    the same (index, distance) pairs as NumPy's stable full sort of the block's distances (self left out), on
    integer distances that tie at nearly every row, for a block anywhere among the samples."""
    from dufs.kernels.knn import knn_select

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 60))
        m = int(rng.integers(1, n + 1))
        a = int(rng.integers(0, n - m + 1))
        k = int(rng.integers(1, n))
        D = rng.integers(0, 4, size=(m, n)).astype(float)
        sq = rng.integers(0, 3, size=n).astype(float)
        # d = sq_i + sq_j - 2 G exactly (small integers and halves): G from the distances wanted
        G = ((sq[a:a + m, None] + sq[None, :] - D) / 2.0).T.copy()
        idx, val = knn_select(G, sq, a, k)
        D[np.arange(m), np.arange(a, a + m)] = np.inf  # itself left out
        full = np.argsort(D, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(idx, full)
        np.testing.assert_array_equal(val, np.take_along_axis(D, full, axis=1))
