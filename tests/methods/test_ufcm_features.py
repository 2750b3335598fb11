"""UFCM in pieces: its W step in pieces of features (dufs.methods.ufcm.features), whose secular solve over pieces
with all-reduced sums gives numpy's eigenpairs of the whole matrix, and its Y and labels in pieces of rows
(dufs.methods.ufcm.pieces). On a cluster both give the driver's run up to the order of additions; a lost piece of
W makes the run start again with W on the driver, a lost piece of Y is made again from W."""

from __future__ import annotations

import threading

import dask
import numpy as np
import pytest

from dufs.engine import AllSum, Matrix
from dufs.methods.ufcm import features as UF
from dufs.methods.ufcm import ufcm
from dufs.methods.ufcm.secular import top_lowrank_pieces
from tests._planted import near_pole_problem, three_groups_sparse


class _ThreadSum(AllSum):
    """The all-reduce of W threads, each a piece: every sum added in rank order from the same slots (the same bits
    on every rank, as the workers' tree gives)."""

    def __init__(self, hub: dict, rank: int, W: int):
        super().__init__("t", rank, list(range(W)))
        self.hub = hub

    def __call__(self, x):
        self.i += 1
        x = np.asarray(x, dtype=np.float64)
        with self.hub["lock"]:
            self.hub.setdefault(self.i, [None] * len(self.peers))[self.rank] = x
        self.hub["barrier"].wait(timeout=60)
        parts = self.hub[self.i]
        total = parts[0].copy()
        for p in parts[1:]:
            total = total + p
        return total


def _in_pieces(Qa, Da, k, W):
    """top_lowrank_pieces on W pieces of the rows (rank j: rows j, j + W, ...) run in threads; (vals, V whole)."""
    hub = {"lock": threading.Lock(), "barrier": threading.Barrier(W)}
    rows = [np.arange(j, Qa.shape[0], W) for j in range(W)]
    out: list = [None] * W
    errors: list = []
    Q0 = Qa.copy()

    def run(j):
        try:
            q = Qa[rows[j]].copy()
            out[j] = top_lowrank_pieces(q, Da[rows[j]].copy(), rows[j].astype(np.int64), k, _ThreadSum(hub, j, W))
            np.testing.assert_array_equal(q, Q0[rows[j]])  # given back as it was
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            hub["barrier"].abort()

    ts = [threading.Thread(target=run, args=(j,)) for j in range(W)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    assert all(o is not None for o in out)
    for o in out[1:]:
        np.testing.assert_array_equal(o[0], out[0][0])  # every piece found the same eigenvalues, bit for bit
    V = np.empty((Qa.shape[0], k))
    for j in range(W):
        V[rows[j]] = out[j][1]
    return out[0][0], V


def _assert_eigh(Qa, Da, k, W, scale=None):
    vals, V = _in_pieces(Qa, Da, k, W)
    A = Qa @ Qa.T - np.diag(Da)
    ref = np.linalg.eigvalsh(A)[::-1][:k]
    np.testing.assert_allclose(vals, ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))
    scale = max(1.0, np.abs(ref).max()) if scale is None else scale
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-10)
    np.testing.assert_allclose(A @ V, V * vals, atol=1e-8 * scale)


@pytest.mark.parametrize("W", [1, 2, 3])
def test_eigenpairs_in_pieces_are_eigh(W):
    """Roots far above the poles and among them (a Q of rank c - 1, diagonal values over 4.8 decades)."""
    rng = np.random.default_rng(11)
    m, c, k = 2500, 6, 6
    Qa = rng.standard_normal((m, c)) * 30.0
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)
    _assert_eigh(Qa, 10.0 ** rng.uniform(-0.3, 4.5, m), k, W)


@pytest.mark.parametrize("c", [2, 4])
def test_eigenpairs_in_pieces_with_duplicated_rows_across_pieces_are_eigh(c):
    """Groups of equal rows at equal diagonal values among the smallest, their rows on different pieces (deflated
    over the pieces), and rows exactly zero (eigenvectors e_i)."""
    rng = np.random.default_rng(c)
    m, k = 300, c + 2
    Qa = rng.standard_normal((m, c)) * 10.0
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)
    Da = rng.uniform(2.0, 50.0, m)
    Da[:6], Qa[:6] = 1.25, Qa[0]
    Da[6:11], Qa[6:11] = 1.5, Qa[6]
    Da[11:15] = 1.75
    Qa[20:23] = 0.0
    Da[20:23] = [0.5, 0.75, 60.0]  # zero rows: -0.5 and -0.75 are eigenvalues among the top
    _assert_eigh(Qa, Da, k, 3)


def test_eigenpairs_in_pieces_of_a_root_closer_to_a_pole_than_eps_are_eigh():
    Qa, Da = near_pole_problem()
    _assert_eigh(Qa, Da, 2, 2, scale=Da.max())


@pytest.mark.slow
@pytest.mark.parametrize("standardize", ["scale", "zscore"])
def test_w_in_pieces_beside_the_blocks_runs_as_the_driver_does(both_paths, standardize):
    """Workers on several machines (kept vectors on): W's rows in a piece a worker, the iteration's Q, D and W steps
    there. The same iterations, labels and selection as the driver's run; objective and W up to the order of the
    sums over the features."""
    got = both_paths(lambda: Matrix(three_groups_sparse(), standardize=standardize, block_width=200),
                     lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100))
    a, b = got["off"], got["on"]
    assert a.diagnostics["w_side"] == "driver" and b.diagnostics["w_side"] == "2 pieces"
    assert b.diagnostics["iterations"] == a.diagnostics["iterations"] >= 2
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-12)
    np.testing.assert_allclose(b.W, a.W, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_array_equal(np.argsort(-b.scores)[:20], np.argsort(-a.scores)[:20])


@pytest.mark.slow
def test_lost_w_pieces_start_the_run_again_on_the_driver(both_paths, monkeypatch, caplog):
    """A worker that loses its piece of W (it left or restarted) makes the next iteration say so; the run starts
    again with W on the driver and selects what the driver's run selects."""
    from dufs.engine import direct

    calls: list = []
    real = UF.FeatureSide.iterate

    def iterate(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:  # every worker forgets the state it keeps
            self.client.run(lambda: direct._RESIDENT.clear())
        return real(self, *a, **k)

    caplog.set_level("WARNING", logger="dufs.methods.ufcm.method")
    got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                     lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100),
                     lambda: monkeypatch.setattr(UF.FeatureSide, "iterate", iterate))
    b = got["on"]
    assert len(calls) == 2 and "start again" in caplog.text
    assert b.diagnostics["restarts"] == 1 and b.diagnostics["w_side"] == "driver"
    np.testing.assert_allclose(b.objective, got["off"].objective, rtol=1e-9)
    np.testing.assert_array_equal(np.argsort(-b.scores)[:20], np.argsort(-got["off"].scores)[:20])


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True], ids=["random", "sampled"])
def test_pca_start_in_pieces_runs_as_the_driver_does(both_paths, monkeypatch, sampled):
    """The PCA start with its block's rows in the pieces beside the blocks (from a random start, and, above the
    row bound, from a sample's directions refined on all rows): the driver's subspace iteration is not run, W
    and the objective are the driver's up to the order of the sums over the features; ``keep_w=False`` leaves W
    out and gives the same scores."""
    from dufs.methods.ufcm import method as UM

    if sampled:
        monkeypatch.setattr(UM, "_PCA_SAMPLE_ABOVE", 1000)
    calls: list = []
    real = UM._top_scatter

    def driver_pca(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(UM, "_top_scatter", driver_pca)
    got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                     lambda M: (ufcm(M, n_clusters=3, n_components=2, max_iter=3, dense_below=100, tol=0.0),
                                ufcm(M, n_clusters=3, n_components=2, max_iter=3, dense_below=100, tol=0.0,
                                     keep_w=False), len(calls)))
    (a, _, n_off), (b, c, n_on) = got["off"], got["on"]
    assert n_off == 2 and n_on == 2  # the driver's PCA in the driver's runs alone
    assert b.diagnostics["w_side"] == "2 pieces"
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-12)
    np.testing.assert_allclose(b.W, a.W, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(b.labels, a.labels)
    assert c.W is None and c.labels.dtype == np.int32
    np.testing.assert_allclose(c.scores, np.linalg.norm(a.W, axis=1), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_w_pieces_make_their_means_and_the_driver_no_column_statistics(cluster_client):
    """On unstandardized data W's pieces make their features' means from their blocks: the driver never makes
    the column statistics (48 bytes a feature), and the run is the driver's (which centres with them) up to the
    order of the sums over the features."""
    X = three_groups_sparse()
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off",
                                                       "dufs.engine.kept-vectors": "on"}):
        M = Matrix(X, block_width=200).persist()
        try:
            b = ufcm(M, n_clusters=3, n_components=2, max_iter=3, dense_below=100, values="raw")
            made = M.cached_stats
        finally:
            M.release()
    a = ufcm(Matrix(X, block_width=200), n_clusters=3, n_components=2, max_iter=3, dense_below=100, values="raw")
    assert b.diagnostics["w_side"] == "2 pieces" and made is None
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-12)
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_allclose(b.scores, a.scores, rtol=0, atol=1e-12)


def test_a_start_made_by_pieces_of_features_is_made_whole():
    """The PCA start's rows made for any range of features (a piece's blocks) are the whole start's rows:
    across the random streams' chunk boundaries, with a sample's directions on some features."""
    from dufs.methods.ufcm.scatter import _NORMAL_CHUNK, Start

    d = 2 * _NORMAL_CHUNK + 1234
    rng = np.random.default_rng(4)
    cols = np.sort(rng.choice(d, 500, replace=False)).astype(np.int64)
    for kk in (0, 2):
        st = Start(11, 5, cols if kk else cols[:0], rng.standard_normal((500, kk)) if kk else np.zeros((0, 0)))
        whole = st.rows(0, d)
        assert whole.shape == (d, 5) and np.all(np.isfinite(whole))
        if kk:
            np.testing.assert_array_equal(whole[cols, :kk], st.E)
            assert not np.any(whole[np.setdiff1d(np.arange(d), cols), :kk])
        cuts = np.sort(np.r_[0, d, rng.integers(0, d, 7), _NORMAL_CHUNK, _NORMAL_CHUNK + 1])
        for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):
            np.testing.assert_array_equal(st.block(lo, hi).rows(lo, hi), whole[lo:hi])
        assert abs(whole[:, kk:].std() - 1.0) < 0.01 and abs(whole[:, kk:].mean()) < 0.01


def test_no_pieces_without_a_cluster_or_with_side_pieces_off():
    M = Matrix(three_groups_sparse(), standardize="scale", block_width=200)
    assert UF.feature_pieces(M) is None
    with dask.config.set({"dufs.engine.side-pieces": "off"}):
        assert UF.feature_pieces(M) is None


def _set_sample(above, size):
    from dufs.methods.ufcm import clusters

    clusters._KMEANS_SAMPLE_ABOVE, clusters._KMEANS_SAMPLE = above, size


@pytest.mark.slow
@pytest.mark.parametrize("sampled", [False, True], ids=["whole", "sampled"])
def test_y_in_row_pieces_runs_as_the_driver_does(both_paths, cluster_client, sampled):
    """Y and the labels in a piece of rows a worker (dufs.engine.side-pieces on), W in pieces beside the blocks:
    the U step's candidates on the pieces (at or below the sampling size Y gathered whole and the driver's step
    run as it is; above it, the random starts on the same sample of rows, Lloyd's steps from all-reduced sums).
    The same labels and selection as the driver's run, the objective up to the order of the sums."""
    from dufs.methods.ufcm import clusters

    default = (clusters._KMEANS_SAMPLE_ABOVE, clusters._KMEANS_SAMPLE)
    if sampled:  # here and on the workers, where the U step runs
        cluster_client.run(_set_sample, 100, 64)
        _set_sample(100, 64)
    try:
        with dask.config.set({"dufs.engine.side-pieces": "on"}):
            got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                             lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100))
    finally:
        cluster_client.run(_set_sample, *default)
        _set_sample(*default)
    a, b = got["off"], got["on"]
    assert a.diagnostics["y_side"] == "driver" and b.diagnostics["y_side"] == "2 pieces"
    assert b.diagnostics["w_side"] == "2 pieces"
    assert b.diagnostics["iterations"] == a.diagnostics["iterations"] >= 2
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-12)
    np.testing.assert_array_equal(b.labels, a.labels)
    np.testing.assert_array_equal(np.argsort(-b.scores)[:20], np.argsort(-a.scores)[:20])


@pytest.mark.slow
def test_y_pieces_lost_are_made_again(both_paths, forget_kept, caplog):
    """A worker that loses its piece of Y (it left or restarted) makes the U step say so; the pieces are made again
    from W (one pass) and the labels from the last centroids; the run goes on to the driver's selection."""
    from dufs.methods.ufcm import pieces

    caplog.set_level("WARNING", logger="dufs.methods.ufcm.kept")
    calls: list = []
    with dask.config.set({"dufs.engine.side-pieces": "on"}):
        got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                         lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100),
                         lambda: calls.append(forget_kept(pieces.PieceY, "u_step", 2)))
    b = got["on"]
    assert len(calls[0]) >= 2 and "made again on another worker" in caplog.text
    assert b.diagnostics["y_side"] == "2 pieces"
    assert np.all(np.diff(b.objective) >= -1e-9 * np.abs(b.objective[1:]))
    np.testing.assert_array_equal(np.argsort(-b.scores)[:5], np.argsort(-got["off"].scores)[:5])


def _no_secular_in_pieces(on: bool):
    from dufs.methods.ufcm import features

    if on:
        features._real_top = getattr(features, "_real_top", features.top_lowrank_pieces)
        features.top_lowrank_pieces = lambda *a, **k: None
    elif hasattr(features, "_real_top"):
        features.top_lowrank_pieces = features._real_top


@pytest.mark.slow
def test_a_w_step_the_pieces_cannot_finish_is_made_on_the_driver(both_paths, cluster_client, caplog):
    """Where the secular solve in pieces gives up (None on every piece), the W step is made on the driver from the
    pieces' Q and D, and W goes back to them: the driver's run."""
    caplog.set_level("WARNING", logger="dufs.methods.ufcm.features")
    cluster_client.run(_no_secular_in_pieces, True)
    try:
        got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                         lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100))
    finally:
        cluster_client.run(_no_secular_in_pieces, False)
    a, b = got["off"], got["on"]
    assert b.diagnostics["w_side"] == "2 pieces" and "made on the driver" in caplog.text
    np.testing.assert_allclose(b.objective, a.objective, rtol=1e-12)
    np.testing.assert_array_equal(b.labels, a.labels)
