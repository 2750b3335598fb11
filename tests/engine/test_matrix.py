"""The feature-blocked Matrix: column statistics and implicitly standardized products against dense NumPy."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dufs.data import write_store
from dufs.engine import ColumnStats, Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.testing.references import check_column_stats as _check_stats
from dufs.testing.references import dense_z as _dense_z
from dufs.testing.references import tame as _tame
from dufs.testing.strategies import sparse_matrices

TOL = {"rtol": 1e-10, "atol": 1e-10}
MODES = ["zscore", "scale", None]








def _check_products(M, D, mode, rng, p):
    n, d = D.shape
    Z = _dense_z(D, mode)
    V = rng.standard_normal((n, p))
    U = rng.standard_normal((d, p))
    np.testing.assert_allclose(M.rmatvec(V), Z.T @ V, **TOL)
    np.testing.assert_allclose(M.matvec(U), Z @ U, **TOL)
    r1, m1 = M.rmatvec(V[:, 0]), M.matvec(U[:, 0])
    assert r1.shape == (d,) and m1.shape == (n,)
    np.testing.assert_allclose(r1, Z.T @ V[:, 0], **TOL)
    np.testing.assert_allclose(m1, Z @ U[:, 0], **TOL)
    # a float32 result: the float64 product rounded once (to within an ulp of its float32 rounding)
    r32 = M.rmatvec(V, dtype=np.float32)
    assert r32.dtype == np.float32 and r32.shape == (d, p)
    ref = Z.T @ V
    np.testing.assert_allclose(r32, ref.astype(np.float32), rtol=2 ** -22, atol=1e-10 + 2 ** -22 * np.abs(ref).max())
    _check_label_rmatvec(M, Z, rng)


def _check_label_rmatvec(M, Z, rng):
    """Z^T U for U the indicator of labels against dense NumPy, and the same numbers as M.rmatvec(U); a float32
    result rounded once; a label with no sample gives its column of the transform's part alone."""
    n, d = Z.shape
    c = int(rng.integers(1, 5))
    labels = rng.integers(0, c, n)
    U = np.zeros((n, c + 1))
    U[np.arange(n), labels] = 1.0  # label c has no sample
    got = M.label_rmatvec(labels, c + 1)
    assert got.shape == (d, c + 1) and got.dtype == np.float64
    np.testing.assert_allclose(got, Z.T @ U, **TOL)
    assert np.array_equal(got, M.rmatvec(U))
    g32 = M.label_rmatvec(labels.astype(np.int8), c + 1, dtype=np.float32)
    ref = Z.T @ U
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, ref.astype(np.float32), rtol=2 ** -22, atol=1e-10 + 2 ** -22 * np.abs(ref).max())


@settings(max_examples=60, deadline=None)
@given(X=sparse_matrices(max_rows=25, max_cols=20), width=st.integers(1, 25), mode=st.sampled_from(MODES),
       p=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_matrix_from_scipy_matches_dense(X, width, mode, p, seed):
    X = _tame(X)
    D = X.toarray().astype(np.float64)
    M = Matrix(X, standardize=mode, block_width=width)
    assert M.n_blocks == -(-X.shape[1] // width)
    np.testing.assert_array_equal(M.bounds, np.r_[np.arange(0, X.shape[1], width), X.shape[1]])
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, X.shape[0]).astype(np.float64)
    _check_stats(M.column_stats(), D)
    _check_stats(M.column_stats(y), D, y)
    _check_products(M, D, mode, rng, p)
    np.testing.assert_array_equal(M.to_scipy().toarray(), X.toarray())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(X=sparse_matrices(max_rows=20, max_cols=15), fb=st.integers(1, 16), mode=st.sampled_from(MODES),
       seed=st.integers(0, 2**32 - 1))
def test_matrix_from_store_equals_matrix_from_scipy(tmp_path_factory, X, fb, mode, seed):
    X = _tame(X)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, X.shape[0]).astype(np.float64)
    path = tmp_path_factory.mktemp("store") / "s.zarr"
    store = write_store(X, path, y, feature_block=fb, value_dtype=X.dtype)
    Ms = Matrix(store, standardize=mode)
    Mx = Matrix(X, standardize=mode, block_width=fb)
    np.testing.assert_array_equal(Ms.y, y)
    a, b = Ms.column_stats(Ms.y), Mx.column_stats(y)
    for name in ("sum", "sumsq", "nnz", "min", "max", "m2", "class_count", "class_sum", "class_sumsq"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), **TOL)
    n, d = X.shape
    V, U = rng.standard_normal((n, 2)), rng.standard_normal((d, 2))
    np.testing.assert_allclose(Ms.rmatvec(V), Mx.rmatvec(V), **TOL)
    np.testing.assert_allclose(Ms.matvec(U), Mx.matvec(U), **TOL)
    _check_products(Matrix(str(path), standardize=mode), X.toarray().astype(np.float64), mode, rng, 2)


@settings(max_examples=40, deadline=None)
@given(X=sparse_matrices(min_rows=2, max_rows=25, max_cols=10), cut=st.integers(1, 24),
       seed=st.integers(0, 2**32 - 1))
def test_column_stats_merge_over_rows(X, cut, seed):
    X = _tame(X)
    n = X.shape[0]
    cut = min(cut, n - 1)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.float64)
    top = Matrix(X[:cut], block_width=4).column_stats(y[:cut])
    bottom = Matrix(X[cut:], block_width=3).column_stats(y[cut:])
    _check_stats(top.merge(bottom), X.toarray().astype(np.float64), y)


@pytest.mark.parametrize("mode", MODES)
def test_constant_and_empty_columns_stay_finite(mode):
    D = np.array([[0.1, 0.0, 5.0, 1.0], [0.1, 0.0, 0.0, 2.0], [0.1, 0.0, 0.0, 4.0]])
    M = Matrix(sp.csr_array(D), standardize=mode, block_width=2)
    np.testing.assert_array_equal(M.scale[:2], [1.0, 1.0])
    Z = _dense_z(D, mode)
    np.testing.assert_allclose(M.matvec(np.eye(4)), Z, **TOL)
    np.testing.assert_allclose(M.rmatvec(np.eye(3)), Z.T, **TOL)
    if mode == "zscore":
        np.testing.assert_allclose(M.matvec(np.eye(4))[:, 0], 0.0, atol=1e-15)


def test_products_under_distributed_client(cluster_client, tmp_path):
    rng = np.random.default_rng(1)
    X = sp.random_array((300, 70), density=0.05, format="csr", rng=rng)
    store = write_store(X, tmp_path / "s.zarr", feature_block=16, value_dtype=np.float64)
    Z = _dense_z(X.toarray(), "zscore")
    V, U = rng.standard_normal((300, 3)), rng.standard_normal((70, 3))
    with cluster_client.as_current():
        M = Matrix(store, standardize="zscore")
        np.testing.assert_allclose(M.rmatvec(V), Z.T @ V, **TOL)
        np.testing.assert_allclose(M.matvec(U), Z @ U, **TOL)
        for Mp in (M, Matrix(store)):  # a float32 result on the workers, with the transform and without
            ref = _dense_z(X.toarray(), Mp.standardize).T @ V
            r32 = Mp.rmatvec(V, dtype=np.float32)
            assert r32.dtype == np.float32
            np.testing.assert_allclose(r32, ref, rtol=2 ** -22, atol=1e-10 + 2 ** -22 * np.abs(ref).max())
        with pytest.raises(ParameterError, match="dtype"):
            M.rmatvec(V, dtype=np.int32)
        _check_label_rmatvec(M, Z, rng)  # tasks over blocks read from the store
        _check_label_rmatvec(Matrix(store, standardize="zscore").persist(), Z, rng)  # one task a worker
        # a wide product (n x p above dufs.engine.wide-product-bytes): one accumulating task per worker, persisted
        # blocks or re-read ones
        for Mw in (Matrix(X.tocsc(), standardize="zscore", block_width=16),
                   Matrix(X.tocsc(), standardize="zscore", block_width=16).persist()):
            with dask.config.set({"dufs.engine.wide-product-bytes": 1}):
                assert len(Mw.executor.matvec_partitions(300 * 3 * 8)) == 2
                np.testing.assert_allclose(Mw.matvec(U), Z @ U, **TOL)
                np.testing.assert_allclose(Mw.matvec(U[:, 0]), Z @ U[:, 0], **TOL)


def test_a_partitions_product_on_two_threads_is_numpys():
    """A partition's Z U on a worker of two threads (:func:`~dufs.scheduling.worker_threads` stands for one here):
    its blocks cut into a run a thread, balanced by nonzeros, each run into its own buffer, added; X U as NumPy
    makes it, on both threads. Its Z^T V on two threads: one thread's numbers."""
    from dufs import scheduling
    from dufs.engine.blocks import partition_matvec, partition_rmatvec, thread_runs

    rng = np.random.default_rng(6)
    X = sp.random_array((200, 90), density=0.1, format="csc", rng=rng)
    U = rng.standard_normal((90, 2))
    M = Matrix(X, block_width=10)
    blks = list(M.executor.src)
    assert len(blks) == 9 and thread_runs(blks, 2) in ([list(range(5)), list(range(5, 9))],
                                                       [list(range(4)), list(range(4, 9))])
    Ws = [U[b.start:b.stop] for b in M.blocks]
    scheduling._TASK_POOLS.pop(2, None)
    with scheduling.worker_threads(2):
        got = partition_matvec(blks, Ws, 200)
    assert 2 in scheduling._TASK_POOLS  # the runs ran on a pool of two threads
    np.testing.assert_allclose(got, X @ U, rtol=1e-13, atol=1e-13)
    # Z^T V: each block writes its own rows, side by side on the two threads: one thread's numbers, bit for bit
    V = rng.standard_normal((200, 3))
    tfs = [(None, None)] * len(blks)
    one = partition_rmatvec(blks, V, None, tfs).copy()
    scheduling._TASK_POOLS.pop(2, None)
    with scheduling.worker_threads(2):
        two = partition_rmatvec(blks, V, None, tfs)
    assert 2 in scheduling._TASK_POOLS
    np.testing.assert_array_equal(two, one)
    np.testing.assert_allclose(one, X.T @ V, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_wide_products_in_column_groups_match_dense(mode, monkeypatch):
    """A product wider than the cache holds runs in contiguous groups of columns (one sweep each): the same
    numbers as one sweep over all of them, and dense NumPy's; column_groups' widths."""
    from dufs.kernels import blockops

    assert blockops.column_groups(200_000, 20) == [(0, 5), (5, 5), (10, 5), (15, 5)]
    assert blockops.column_groups(200_000, 4) == [(0, 4)]
    assert blockops.column_groups(2_000_000, 20) == [(0, 20)]  # even 4 columns far past the cache: one sweep
    rng = np.random.default_rng(5)
    X = sp.random_array((60, 40), density=0.2, format="csc", rng=rng)
    D = X.toarray()
    Z = _dense_z(D, mode)
    V, U = rng.standard_normal((60, 9)), rng.standard_normal((40, 9))
    M = Matrix(X, standardize=mode, block_width=16)
    one = M.rmatvec(V), M.matvec(U)
    monkeypatch.setattr(blockops, "_GROUP_BYTES", 60 * 8 * 4)  # groups of 3 columns
    assert blockops.column_groups(60, 9) == [(0, 3), (3, 3), (6, 3)]
    got = M.rmatvec(V), M.matvec(U)
    np.testing.assert_allclose(got[0], Z.T @ V, **TOL)
    np.testing.assert_allclose(got[1], Z @ U, **TOL)
    assert np.array_equal(got[0], one[0]) and np.array_equal(got[1], one[1])


def test_bad_parameters():
    X = sp.csr_array(np.eye(3))
    with pytest.raises(ParameterError):
        Matrix(X, standardize="center")
    with pytest.raises(ParameterError):
        Matrix(X, block_width=0)
    with pytest.raises(ParameterError):
        Matrix(X).rmatvec(np.ones(4))
    with pytest.raises(ParameterError):
        Matrix(X).matvec(np.ones((2, 2)))
    with pytest.raises(ParameterError):
        Matrix(X).column_stats(np.ones(2))
    bad = [(np.array([0, 1, 2]), 2, r"in \[0, n_labels\) = \[0, 2\)"), (np.array([0, -1, 1]), 2, "lie in"),
           (np.zeros(3), 2, "integers"), (np.zeros(2, int), 2, r"shape \(n_samples,\)"),
           (np.zeros(3, int), 0, "n_labels"), (np.zeros(3, int), 1.5, "n_labels")]
    for labels, c, what in bad:
        with pytest.raises(ParameterError, match=what):
            Matrix(X).label_rmatvec(labels, c)
    with pytest.raises(ParameterError):
        Matrix([[1.0]])
    assert isinstance(Matrix(X).column_stats(), ColumnStats)
    assert "3 x 3" in repr(Matrix(X))


def _group_colsums(blocks, scale, tag):
    # one group: its blocks' column sums times their PerBlock scale, and the tag passed whole
    return [(b.start, b.to_scipy(30).sum(axis=0) * s, tag) for b, s in zip(blocks, scale, strict=True)]


def _block_sq(b, w):
    return (b.to_scipy(30).T @ w) ** 2


def _block_state(b, state, w):
    state = (state or 0) + b.width
    return state, float((b.to_scipy(30).T @ w).sum()) * state


@pytest.mark.parametrize("source", ["scipy", "store"])
def test_inline_passes_equal_the_dask_graph_bit_for_bit(source, tmp_path):
    """Small matrices without a distributed client run their passes inline (no graph); every product must equal,
    to the bit, what the threaded Dask graph computes when ``engine.inline-nnz`` sends them there."""
    import dask
    from dask.callbacks import Callback

    X = sp.random(30, 50, density=0.3, random_state=2, format="csc")
    src = X if source == "scipy" else write_store(X, tmp_path / "s.zarr", np.zeros(30), feature_block=7)
    rng = np.random.default_rng(0)
    V, U, w = rng.standard_normal((30, 3)), rng.standard_normal((50, 2)), rng.standard_normal(30)

    def run():
        M = Matrix(src, standardize="zscore", block_width=7)
        st = M.column_stats(rng.integers(0, 2, 30) * 1.0)
        total, state = M.map_blocks(_block_state, w, state=[None] * M.n_blocks, reduce="sum")
        return [st.sum, st.m2, st.class_sum, M.rmatvec(V), M.matvec(U), M.columns([3, 41, 7]).toarray(),
                np.concatenate(M.map_blocks(_block_sq, w)), M.map_blocks(_block_sq, w, reduce="sum"),
                M.topk(_block_sq, 5, w)[0], np.array(state.gather()), total]

    graphs = []

    class Count(Callback):
        def _start(self, dsk):
            graphs.append(len(dsk))

    with Count(), dask.config.set(scheduler="threads"):
        rng = np.random.default_rng(1)
        inline = run()
        assert graphs == [], "a small matrix built a Dask graph"
        with dask.config.set({"dufs.engine.inline-nnz": 0}):
            rng = np.random.default_rng(1)
            graph = run()
        assert len(graphs) >= 8
    for a, b in zip(inline, graph, strict=True):
        np.testing.assert_array_equal(a, b)


def _group_state(blocks, state, w):
    state = (state or 0) + 1
    return state, sum(float(b.to_scipy(30).T @ w @ np.ones(b.width)) for b in blocks) + 0 * state


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_map_blocks_over_groups_matches_dense(n):
    from dufs.engine import PerBlock

    X = sp.random(30, 50, density=0.3, random_state=1, format="csc")
    M = Matrix(X, block_width=7)
    groups = M.partition(n)
    assert len(groups) == n and sorted(i for g in groups for i in g) == list(range(M.n_blocks))
    nnz = [sum(M.blocks[i].nnz for i in g) for g in groups]
    # balanced: the largest group holds at most its share plus one block (what a greedy cut guarantees)
    assert max(nnz) <= M.nnz / n + max(b.nnz for b in M.blocks)
    scale = np.arange(50, dtype=np.float64)
    got = M.map_blocks(_group_colsums, PerBlock(scale), "t", partitions=groups)
    sums = np.zeros(50)
    for part, g in zip(got, groups, strict=True):
        assert [p[0] for p in part] == [M.blocks[i].start for i in g] and all(p[2] == "t" for p in part)
        for start, v, _ in part:
            sums[start:start + v.shape[0]] = v
    np.testing.assert_allclose(sums, X.toarray().sum(0) * scale)
    w = np.linspace(-1, 1, 30)
    total, state = M.map_blocks(_group_state, w, state=[None] * n, partitions=groups, reduce="sum")
    assert total == pytest.approx(float(w @ X.toarray() @ np.ones(50)))
    assert state.gather() == [1] * n
    with pytest.raises(ParameterError, match="The 'partitions' parameter of map_blocks must split the 8 blocks"):
        M.map_blocks(_group_colsums, PerBlock(scale), "t", partitions=[[0, 1]])
    with pytest.raises(ParameterError, match="2 items for 3 partitions"):
        M.map_blocks(_group_state, w, state=[None] * 2, partitions=M.partition(3))


def _rows_times(block, span, n, scale):
    a, b = span
    return block.to_scipy(n)[a:b] @ scale


def _then_affine(total, span, c):
    return total * c + span[0]


@pytest.mark.parametrize("where", ["inline", "graph", "cluster"])
def test_map_sums_equals_dense(where, request):
    """One pass of several sums over the blocks, each finished where it was summed: X[a:b] @ scale per key, then
    c * it + a, against NumPy; keys in order, none for no keys."""
    import dask

    from dufs.engine import PerBlock

    X = sp.random(40, 50, density=0.3, random_state=2, format="csc")
    M = Matrix(X, block_width=7)
    scale = np.linspace(0.5, 2.0, 50)
    c = np.arange(1.0, 4.0)[:, None] * np.ones((3, 1))  # a shared argument of the finishing step
    keys = [(0, 13), (13, 14), (14, 40)]
    want = [X.toarray()[a:b] @ scale for a, b in keys]
    if where == "cluster":
        ctx = request.getfixturevalue("cluster_client").as_current()
    else:
        limit = 10**9 if where == "inline" else 0  # passes inline, or as Dask graphs
        ctx = dask.config.set({"scheduler": "synchronous", "dufs.engine.inline-nnz": limit})
    with ctx:
        got = M.map_sums(_rows_times, keys, 40, PerBlock(scale))
        fin = M.map_sums(_rows_times, keys, 40, PerBlock(scale), then=_then_affine, then_args=(c,))
        assert M.map_sums(_rows_times, [], 40, PerBlock(scale)) == []
        empty = Matrix(sp.csc_array((40, 0)))  # no blocks: sums of nothing are None, as map_blocks'
        assert empty.map_sums(_rows_times, keys, 40, None) == [None] * 3
        assert empty.map_sums(_rows_times, keys, 40, None, then=lambda t, k: (t, k)) == [(None, k) for k in keys]
    for g, f, w, (a, _) in zip(got, fin, want, keys, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-12)
        np.testing.assert_allclose(f, w[None, :] * c + a, rtol=1e-12)


def _state_where(blocks, state, w):
    from distributed import get_worker

    big = np.full(200_000, (0 if state is None else state[0]) + 1.0)  # a state worth moving (1.6 MB)
    return big, (get_worker().address, sum(float(w @ b.to_scipy(w.shape[0]) @ np.ones(b.width)) for b in blocks))


def test_map_blocks_state_stays_on_the_worker_of_its_blocks(cluster_client):
    """On 2 worker processes, a partition's task and its new state stay on the worker holding (most of) its persisted
    blocks, round after round: no state copied to the other worker; and the results are dense NumPy's."""
    import distributed

    from dufs.engine import as_matrix

    X = sp.random(400, 240, density=0.2, random_state=3, format="csc")
    w = np.linspace(-1, 1, 400)
    with cluster_client.as_current():
        M = as_matrix(X, block_width=20, persist=True)
        where = M.placement()
        assert len(set(where)) == 2, "the blocks were not spread over both workers"
        parts = M.partition(2, where)
        home = []
        for q in parts:
            nnz = {}
            for i in q:
                nnz[where[i]] = nnz.get(where[i], 0) + M.blocks[i].nnz
            home.append(max(sorted(nnz), key=nnz.__getitem__))
        state = [None, None]
        for _ in range(40):
            out, state = M.map_blocks(_state_where, w, state=state, partitions=parts)
            assert [o[0] for o in out] == home
            distributed.wait(state.items)  # the picks of the states may finish after the results came back
            held = cluster_client.who_has(state.items)
            assert [sorted(held[f.key]) for f in state.items] == [[h] for h in home]
            total = sum(o[1] for o in out)
            assert total == pytest.approx(float(w @ X.toarray() @ np.ones(240)))
        assert [float(s[0]) for s in state.gather()] == [40.0, 40.0]
        M.release()


def _slow_first_block(b, delay):
    """Each feature's number of nonzeros, the first block's after a delay (its result arrives last)."""
    import time

    if b.start == 0:
        time.sleep(delay)
    return np.diff(b.indptr).astype(np.float64)


def test_block_scores_break_ties_by_index_whatever_order_the_blocks_arrive(cluster_client):
    """Tied scores in different blocks: the top k are the lower indices, also when the first block's result comes
    back last (the blocks' results are consumed as they arrive)."""
    X = sp.lil_array((50, 40))
    for j in (3, 17, 35):  # three tied features, one in each of three blocks
        X[:10, j] = 1.0
    X[:2, 20] = 1.0
    with cluster_client.as_current():
        M = as_matrix(sp.csc_array(X), block_width=12, standardize=None, persist=True)
        scores, top = M.block_scores(_slow_first_block, 0.5, k=2)
        np.testing.assert_array_equal(top, [3, 17])
        np.testing.assert_array_equal(scores, np.diff(sp.csc_array(X).indptr))
        M.release()
