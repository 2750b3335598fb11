"""Property tests of the feature-blocked Matrix against dense NumPy/SciPy, under three schedulers.

Every public operation (column statistics, products, kernel columns, column gathers, top-k, map_blocks with
per-block arguments, sums and state) is compared with the same quantity computed on the explicitly transformed
dense matrix, on the synchronous scheduler, the threaded scheduler and a 2-process LocalCluster (persisted
blocks and store-backed blocks). Functions that run on the workers are module-level.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dufs import write_store
from dufs.engine import BlockState, Matrix, PerBlock, as_matrix
from dufs.testing.references import check_column_stats as _check_stats
from dufs.testing.references import dense_z as _dense_z
from dufs.testing.references import tame as _tame
from dufs.testing.strategies import sparse_matrices

# the cluster's client threads use the global ``random`` module while Hypothesis draws an example (harmless here)
pytestmark = pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")

TOL = {"rtol": 1e-10, "atol": 1e-10}
MODES = ["zscore", "scale", None]
SCHEDULERS = ["sync", "threads", "processes"]
#: examples per scheduler: the process cluster costs a round trip per pass
EXAMPLES = {"sync": 25, "threads": 15, "processes": 8}
#: how the matrix is held, per scheduler: in memory (persisted on the cluster) or in a store (read on the workers,
#: or persisted from it)
SOURCES = {"sync": ["memory", "store"], "threads": ["memory", "store"],
           "processes": ["persisted", "store", "persisted-store"]}


def _settings(sched):
    return settings(max_examples=EXAMPLES[sched], deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------- references




def _ref_topk(s, k, largest):
    """Indices of the k best scores: NaN worst (after an infinite score in the worst direction too), ties to the
    lower index (a stable sort)."""
    nan = np.isnan(s)
    key = np.where(nan, 0.0, -s if largest else s)
    order = np.argsort(key, kind="stable")
    order = order[np.argsort(nan[order], kind="stable")][:k]
    return order, s[order]


# ---------------------------------------------------------------------------------------------------- worker functions
def _pid(block):
    return os.getpid()


def _score_slice(block, s):
    return s[block.start:block.stop]


def _nnz_per_column(block):
    return np.diff(block.indptr).astype(np.float64)


def _column_of_entries(block):
    return np.repeat(np.arange(block.width), np.diff(block.indptr))


def _colsums_times(block, w):
    sums = np.bincount(_column_of_entries(block), weights=block.data.astype(np.float64), minlength=block.width)
    return sums * w


def _start_and_item(block, item):
    return block.start, item


def _rowsums(block, n):
    return np.bincount(block.indices, weights=block.data.astype(np.float64), minlength=n)


def _count_step(block, state, inc):
    """New state: the previous one plus the nnz of each column plus ``inc``; result: the block's width."""
    return state + np.diff(block.indptr) + inc, block.width


# ---------------------------------------------------------------------------------------------------- set-up
@contextlib.contextmanager
def _scheduler(request, sched):
    if sched == "processes":
        client = request.getfixturevalue("cluster_client")
        with client.as_current():
            yield client
    else:
        with dask.config.set(scheduler=sched):
            yield None


def _write(X, path, y, width):
    """A store of X with CSC feature blocks of ``width`` features (a granule of 1, so no rounding up)."""
    with dask.config.set({"dufs.store.feature-granule": 1, "dufs.store.row-block": 7}):
        store = write_store(X, path, y, feature_block=width, value_dtype=X.dtype)
    d = X.shape[1]
    np.testing.assert_array_equal(store.bounds("csc"), np.r_[np.arange(0, d, width), d])
    return store


def _build(X, y, width, mode, source, tmp_path):
    """The Matrix under test (built inside the scheduler context)."""
    if source in ("memory", "persisted"):
        M = as_matrix(X, standardize=mode, block_width=width, persist=source == "persisted")
        assert M.residency["mode"] == ("persisted" if source == "persisted" else "driver")
        return M
    path = tmp_path / f"s-{uuid.uuid4().hex}.zarr"
    _write(X, path, y, width)
    if source == "persisted-store":
        M = as_matrix(str(path), standardize=mode)
        assert M.residency["mode"] == "persisted"
    else:
        M = Matrix(path, standardize=mode)
        assert M.residency["mode"] == "store"
    np.testing.assert_array_equal(M.y, y)
    assert M.shape == X.shape
    d = X.shape[1]
    np.testing.assert_array_equal(M.bounds, np.r_[np.arange(0, d, width), d])
    return M




def _matrices(max_rows=20, max_cols=14):
    """Any sparsity edge case, float32 or float64, canonical or not (explicit zeros, duplicates, unsorted)."""
    return sparse_matrices(max_rows=max_rows, max_cols=max_cols, canonical=False).map(_tame)


# ---------------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("sched", SCHEDULERS)
def test_stats_and_products_match_dense(request, tmp_path, sched):
    @_settings(sched)
    @given(X=_matrices(), width=st.integers(1, 15), mode=st.sampled_from(MODES), p=st.integers(1, 3),
           source=st.sampled_from(SOURCES[sched]), seed=st.integers(0, 2**32 - 1))
    def check(X, width, mode, p, source, seed):
        rng = np.random.default_rng(seed)
        n, d = X.shape
        D = X.toarray().astype(np.float64)
        Z = _dense_z(D, mode)
        y = rng.integers(0, 3, n).astype(np.float64)
        V, U = rng.standard_normal((n, p)), rng.standard_normal((d, p))
        with _scheduler(request, sched):
            M = _build(X, y, width, mode, source, tmp_path)
            try:
                _check_stats(M.column_stats(), D)
                _check_stats(M.column_stats(y), D, y)
                r2, r1 = M.rmatvec(V), M.rmatvec(V[:, 0])
                m2, m1 = M.matvec(U), M.matvec(U[:, 0])
                center, scale = M.center, M.scale
            finally:
                M.release()
        sd = D.std(0)
        sd[(D.max(0) == D.min(0)) | (sd == 0)] = 1.0
        np.testing.assert_allclose(center, D.mean(0) if mode == "zscore" else np.zeros(d), **TOL)
        np.testing.assert_allclose(scale, np.ones(d) if mode is None else sd, **TOL)
        assert r2.shape == (d, p) and r1.shape == (d,) and m2.shape == (n, p) and m1.shape == (n,)
        np.testing.assert_allclose(r2, Z.T @ V, **TOL)
        np.testing.assert_allclose(r1, Z.T @ V[:, 0], **TOL)
        np.testing.assert_allclose(m2, Z @ U, **TOL)
        np.testing.assert_allclose(m1, Z @ U[:, 0], **TOL)

    check()


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_similarity_column_and_columns_match_dense(request, tmp_path, sched):
    @_settings(sched)
    @given(X=_matrices(), width=st.integers(1, 15), mode=st.sampled_from(MODES),
           source=st.sampled_from(SOURCES[sched]), gamma=st.floats(1e-3, 2.0), seed=st.integers(0, 2**32 - 1),
           n_ids=st.integers(0, 6))
    def check(X, width, mode, source, gamma, seed, n_ids):
        rng = np.random.default_rng(seed)
        n, d = X.shape
        D = X.toarray().astype(np.float64)
        Z = _dense_z(D, mode)
        i = int(rng.integers(d))
        ids = rng.integers(0, d, n_ids).tolist()  # any order, duplicates allowed, maybe empty
        kid = ids or [i]
        with _scheduler(request, sched):
            M = _build(X, None, width, mode, source, tmp_path)
            try:
                C = M.columns(ids)
                Cd = M.dense_columns(ids)
                got = {(kind, g, which): M.similarity_column(i if which == "int" else kid, kind, gamma=g)
                       for kind in ("linear", "poly2", "rbf") for g in (None, gamma) for which in ("int", "list")
                       if kind == "rbf" or g is None}
            finally:
                M.release()
        assert sp.issparse(C) and C.shape == (n, len(ids))
        np.testing.assert_array_equal(C.toarray(), X.toarray()[:, ids])
        assert Cd.shape == (n, len(ids)) and Cd.dtype == np.float64
        np.testing.assert_allclose(Cd, Z[:, ids], **TOL)
        for (kind, g, which), K in got.items():
            cols = [i] if which == "int" else kid
            G = Z.T @ Z[:, cols]
            if kind == "poly2":
                ref = G * G
            elif kind == "rbf":
                D2 = ((Z[:, :, None] - Z[:, None, cols]) ** 2).sum(0)
                ref = np.exp(-(1.0 / n if g is None else g) * D2)
            else:
                ref = G
            if which == "int":
                assert K.shape == (d,)
                ref = ref[:, 0]
            else:
                assert K.shape == (d, len(cols))
            np.testing.assert_allclose(K, ref, rtol=1e-9, atol=1e-9, err_msg=f"{kind}, gamma={g}, {which}")

    check()


@pytest.mark.parametrize("sched", SCHEDULERS)
def test_topk_and_map_blocks_match_numpy(request, tmp_path, sched):
    @_settings(sched)
    @given(X=_matrices(), width=st.integers(1, 15), source=st.sampled_from(SOURCES[sched]),
           k=st.integers(1, 16), largest=st.booleans(), seed=st.integers(0, 2**32 - 1))
    def check(X, width, source, k, largest, seed):
        rng = np.random.default_rng(seed)
        n, d = X.shape
        D = X.toarray().astype(np.float64)
        s = rng.integers(-2, 3, d).astype(np.float64)  # many ties
        s[rng.random(d) < 0.25] = np.nan
        s[rng.random(d) < 0.1] = np.inf
        s[rng.random(d) < 0.1] = -np.inf
        w = rng.standard_normal(d)
        inc = int(rng.integers(0, 5))
        with _scheduler(request, sched):
            M = _build(X, None, width, None, source, tmp_path)
            try:
                bounds = M.bounds
                top = M.topk(_score_slice, k, s, largest=largest)
                top_nnz = M.topk(_nnz_per_column, k)
                am = M.argmax(_score_slice, s)
                per = M.map_blocks(_colsums_times, PerBlock(w))
                items = M.map_blocks(_start_and_item, PerBlock([f"b{j}" for j in range(M.n_blocks)]))
                total = M.map_blocks(_rowsums, n, reduce="sum")
                res1, state1 = M.map_blocks(_count_step, inc, state=[np.zeros(b.width, np.int64) for b in M.blocks])
                res2, state2 = M.map_blocks(_count_step, inc, state=state1, reduce="sum")
                new1, new2 = state1.gather(), state2.gather()
                state1.release()
                state2.release()
            finally:
                M.release()
        nb = bounds.shape[0] - 1
        assert bounds[0] == 0 and bounds[-1] == d and np.all(np.diff(bounds) > 0)
        for (ids, sc), ref in ((top, _ref_topk(s, k, largest)), (top_nnz, _ref_topk((D != 0).sum(0) * 1.0, k, True))):
            np.testing.assert_array_equal(ids, ref[0])
            np.testing.assert_array_equal(sc, ref[1])
        ref_i, ref_s = _ref_topk(s, 1, True)
        assert am[0] == ref_i[0] and (am[1] == ref_s[0] or np.isnan(am[1]) and np.isnan(ref_s[0]))
        assert len(per) == nb
        want = D.sum(0) * w
        for j in range(nb):
            np.testing.assert_allclose(per[j], want[bounds[j]:bounds[j + 1]], **TOL)
        assert items == [(int(bounds[j]), f"b{j}") for j in range(nb)]
        np.testing.assert_allclose(total, D.sum(1), **TOL)
        assert res1 == np.diff(bounds).tolist() and res2 == d
        assert isinstance(state1, BlockState) and isinstance(state2, BlockState)
        nnz = (D != 0).sum(0)
        np.testing.assert_array_equal(np.concatenate(new1), nnz + inc)
        np.testing.assert_array_equal(np.concatenate(new2), 2 * (nnz + inc))

    check()


# ---------------------------------------------------------------------------------------------------- determinism
@pytest.fixture(scope="module")
def one_worker_client():
    """A 1-worker cluster (in this process: cheap to start), to compare with the 2-process one."""
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0",
                                 silence_logs=40) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client


def _results(M, y, V, U):
    st_ = M.column_stats(y)
    out = {name: getattr(st_, name) for name in ("sum", "sumsq", "nnz", "min", "max", "m2", "class_count",
                                                   "class_sum", "class_sumsq")}
    out["rmatvec"], out["matvec"] = M.rmatvec(V), M.matvec(U)
    out["rmatvec1"], out["matvec1"] = M.rmatvec(V[:, 0]), M.matvec(U[:, 0])
    out["kernel"] = M.similarity_column([0, M.shape[1] - 1], "rbf")
    return out


@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(X=_matrices(max_rows=30, max_cols=20), width=st.integers(1, 8), mode=st.sampled_from(MODES),
       seed=st.integers(0, 2**32 - 1))
def test_results_bitwise_equal_across_schedulers(cluster_client, one_worker_client, tmp_path_factory, X, width, mode,
                                                 seed):
    rng = np.random.default_rng(seed)
    n, d = X.shape
    y = rng.integers(0, 3, n).astype(np.float64)
    V, U = rng.standard_normal((n, 3)), rng.standard_normal((d, 3))
    path = tmp_path_factory.mktemp("bitwise") / "s.zarr"
    _write(X, path, y, width)
    got = {}
    for sched in ("sync", "threads"):
        with dask.config.set(scheduler=sched):
            got[sched, "memory"] = _results(Matrix(X, standardize=mode, block_width=width), y, V, U)
            got[sched, "store"] = _results(Matrix(path, standardize=mode), y, V, U)
    with cluster_client.as_current():
        M = as_matrix(X, standardize=mode, block_width=width, persist=True)
        got["cluster", "memory"] = _results(M, y, V, U)
        M.release()
        got["cluster", "memory-unpersisted"] = _results(Matrix(X, standardize=mode, block_width=width), y, V, U)
        got["cluster", "store"] = _results(Matrix(path, standardize=mode), y, V, U)
        M = as_matrix(path, standardize=mode)
        got["cluster", "store-persisted"] = _results(M, y, V, U)
        M.release()
    with one_worker_client.as_current():
        M = as_matrix(X, standardize=mode, block_width=width, persist=True)
        assert M.residency["mode"] == "persisted" and M.residency["n_workers"] == 1
        got["one-worker", "memory"] = _results(M, y, V, U)
        M.release()
        got["one-worker", "store"] = _results(Matrix(path, standardize=mode), y, V, U)
    for (sched, source), res in got.items():
        base = got["sync", "store" if source.startswith("store") else "memory"]
        for name, val in res.items():
            assert np.array_equal(val, base[name]), f"{name} differs: {sched}/{source} vs sync"


# ---------------------------------------------------------------------------------------------------- placement
def test_work_runs_on_the_workers(cluster_client, tmp_path):
    rng = np.random.default_rng(3)
    X = sp.random_array((60, 40), density=0.1, format="csr", rng=rng)
    y = rng.integers(0, 2, 60).astype(np.float64)
    _write(X, tmp_path / "s.zarr", y, 8)
    worker_pids = set(cluster_client.run(os.getpid).values())
    assert len(worker_pids) == 2 and os.getpid() not in worker_pids
    with cluster_client.as_current():
        persisted = as_matrix(X, block_width=7, persist=True)
        stored = Matrix(tmp_path / "s.zarr")
        stored_persisted = as_matrix(str(tmp_path / "s.zarr"))
        try:
            assert persisted.residency["mode"] == "persisted" and persisted.residency["n_workers"] == 2
            assert stored.residency["mode"] == "store"
            assert stored_persisted.residency["mode"] == "persisted"
            assert all(hasattr(s, "key") for s in persisted.executor.src)  # futures on the workers
            for M in (persisted, stored, stored_persisted):
                pids = M.map_blocks(_pid)
                assert len(pids) == M.n_blocks and set(pids) <= worker_pids, M.residency
                res, state = M.map_blocks(_count_step, 0, state=[np.zeros(b.width, np.int64) for b in M.blocks])
                # the state stays on the workers: futures, or (persisted blocks) kept by the direct calls
                assert all(hasattr(f, "key") for f in state.items) or \
                    (M.residency["mode"] == "persisted" and state.resident), (state.items, M.residency)
                Xc = X.tocsc()
                assert [s.tolist() for s in state.gather()] == [np.diff(Xc.indptr)[b.start:b.stop].tolist()
                                                                for b in M.blocks]
                state.release()
            # persisted blocks are spread over both workers (placed by nnz)
            assert set(persisted.map_blocks(_pid)) == worker_pids
            # too little room: the store-backed matrix stays in the store and says why
            tiny = Matrix(tmp_path / "s.zarr").persist(fraction=1e-12)
            assert tiny.residency["mode"] == "store"
            assert "not persisted" in tiny.residency["reason"] and "exceeds" in tiny.residency["reason"]
            assert set(tiny.map_blocks(_pid)) <= worker_pids
            np.testing.assert_allclose(tiny.rmatvec(np.ones(60)), X.toarray().sum(0), **TOL)
        finally:
            persisted.release()
            stored_persisted.release()


def _loads(place, est, workers):
    load = dict.fromkeys(workers, 0)
    for i, a in place.items():
        load[a] += max(est[i], 1)
    return load


def _greedy_max_load(est, n_workers):
    """The largest load of the plain greedy placement (largest block first onto the least loaded worker)."""
    load = [0] * n_workers
    for e in sorted((max(x, 1) for x in est), reverse=True):
        load[load.index(min(load))] += e
    return max(load)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**7), min_size=1, max_size=40), st.integers(1, 5))
def test_placement_is_the_greedy_one_or_better_and_no_move_or_swap_lowers_it(est, n_workers):
    """``plan_placement``: every block on one of the workers; the largest load at most the plain greedy
    placement's; and no single block moved from the most loaded worker to another, nor swapped with one of its
    blocks, would leave both below the largest load (checked here by brute force)."""
    from dufs.engine.placement import plan_placement

    workers = [f"tcp://w{j}" for j in range(n_workers)]
    place = plan_placement(est, workers)
    assert sorted(place) == list(range(len(est))) and set(place.values()) <= set(workers)
    load = _loads(place, est, workers)
    top = max(load.values())
    assert top <= _greedy_max_load(est, n_workers)
    hi = max(workers, key=lambda a: (load[a], -workers.index(a)))
    e = [max(x, 1) for x in est]
    for lo in workers:
        if lo == hi:
            continue
        for i in (i for i, a in place.items() if a == hi):
            assert max(load[hi] - e[i], load[lo] + e[i]) >= top
            for j in (j for j, a in place.items() if a == lo):
                assert max(load[hi] - e[i] + e[j], load[lo] + e[i] - e[j]) >= top


def test_placement_balances_the_bench_stores_blocks_as_the_best_split():
    """The 2M x 5M bench store's 16 feature blocks (their nonzeros) on 2 workers: the plain greedy placement left
    30.8M / 29.2M; the placement's largest load is the best two-way split's (found by trying every split)."""
    from dufs.engine.placement import plan_placement

    est = [4192667, 4194015, 4177160, 2785848, 4194039, 3005963, 4179185, 4182167, 4188811, 4193788, 3990336,
           4187447, 4118648, 3923054, 4176258, 303049]
    e = np.array(est)
    masks = (np.arange(1 << 15)[:, None] >> np.arange(15)[None, :]) & 1  # block 15 on the second worker
    side = masks @ e[:15]
    best = int(np.min(np.maximum(side, e.sum() - side)))
    assert _greedy_max_load(est, 2) == 30_842_321
    assert max(_loads(plan_placement(est, ["a", "b"]), est, ["a", "b"]).values()) == best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from([0.0, 1.0, -1.0, 2.5, np.nan, np.inf, -np.inf, 1e-300]) | st.floats(-5, 5),
                min_size=0, max_size=60),
       st.integers(0, 70), st.booleans(), st.sampled_from([1, 3, 7, 1 << 20]))
def test_ranked_head_is_the_head_of_numpy_stable_argsort(monkeypatch, values, k, higher, chunk):
    """The slice-by-slice top k equals the first k of NumPy's stable argsort of the key (NaN as +inf): ties to the
    lower index, NaN last, across slice boundaries and ties that straddle them."""
    from dufs.engine import blocks
    from dufs.methods.registry import rank

    monkeypatch.setattr(blocks, "_RANK_CHUNK", chunk)
    s = np.asarray(values, dtype=np.float64)
    key = -s if higher else s.copy()
    key[np.isnan(key)] = np.inf
    want = np.argsort(key, kind="stable")[:k]
    np.testing.assert_array_equal(blocks.ranked_head(s, k, higher), want)
    np.testing.assert_array_equal(rank(s, higher, k=k), want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(X=sparse_matrices(), width=st.integers(1, 7), negate=st.booleans(), data=st.data())
def test_nonnegative_is_numpys_with_or_without_the_statistics(X, width, negate, data):
    """Matrix.nonnegative: whether no stored value is negative, as NumPy says, from a pass of its own (the column
    statistics not made) and from the statistics once made."""
    X = sp.csc_array(X)
    if negate and X.nnz:
        X.data[data.draw(st.integers(0, X.nnz - 1))] = -1.5
    want = bool(X.nnz == 0 or X.data.min() >= 0)
    M = Matrix(X, block_width=width)
    assert M.nonnegative() == want and M.cached_stats is None
    M.stats  # noqa: B018 -- made now
    assert M.nonnegative() == want
