"""LapAOFS, LapDOFS and JCFS (dufs.methods.greedy) pick exactly what the papers' own sample-space algorithms pick
(the dense reference in tests/methods/greedy_paper.py), with the same per-step criterion and objective, for any
feature blocking, on a process cluster, and through the loss of a worker."""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import subspace_angles

import dufs
from dufs.engine import Executor, Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods import greedy
from dufs.methods import jcfs as jcfs_module
from dufs.methods.greedy import partition
from tests._threads import task_threads_used
from tests.methods.greedy_paper import (
    jcfs_embedding_dense,
    jcfs_greedy_paper,
    jcfs_paper,
    knn_affinity,
    lap_objective_direct,
    lapaofs_paper,
    lapdofs_paper,
)

K = 30
REL = 1e-8
REF = {"lapaofs": lapaofs_paper, "lapdofs": lapdofs_paper}


# ---------------------------------------------------------------------------------------------------- data
@functools.cache
def _data(name):
    if name == "dense":
        rng = np.random.default_rng(0)
        Z = rng.standard_normal((80, 6))
        return Z @ rng.standard_normal((6, 60)) + 0.3 * rng.standard_normal((80, 60))
    if name == "sparse":
        return sp.random_array((100, 80), density=0.1, rng=1, format="csr")
    from dufs.data.datasets import load

    if name == "coil20":
        X, _ = load("coil20")
        return np.asarray(X[::8], dtype=np.float64)  # 180 x 1024
    if name == "orl":
        X, _ = load("orl")
        return np.asarray(X[::2], dtype=np.float64)  # 200 x 1024
    raise KeyError(name)


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X)


@functools.cache
def _graph(name, n_neighbors=4, weights="binary"):
    return knn_affinity(_dense(_data(name)), n_neighbors, weights)


@functools.cache
def _ref(method, name, lambda1=0.01, lambda2=0.01, n_neighbors=4, weights="binary"):
    return REF[method](_dense(_data(name)), _graph(name, n_neighbors, weights), K, lambda1, lambda2)


def _close(a, b, rel):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    np.testing.assert_allclose(a, b, rtol=rel, atol=rel * np.abs(b).max())


def _assert_same(sel, ref, rel=REL, X=None, W=None, lambda1=0.01, lambda2=0.01):
    """Same picks and criterion as the reference; the objective against the reference's, or, given ``X`` and
    ``W``, against the explicit k x k computation (eq. (14) in the reference loses ~n eps / lambda2 absolute)."""
    np.testing.assert_array_equal(np.asarray(sel.indices), ref.order)
    _close(sel.diagnostics["criterion"], ref.criterion, rel)
    if X is None:
        _close(sel.diagnostics["objective"], ref.objective, rel)
        return
    kind = "A" if sel.method == "lapaofs" else "D"
    direct = lap_objective_direct(_dense(X), W, ref.order, lambda1, lambda2, kind)
    _close(sel.diagnostics["objective"], direct, rel)
    _close(ref.objective, direct, 1e-6)  # the reference's own eq. (14) / (28), loosely


def _fit_lap(X, method, W, client=False, **kw):
    # the paper's reading of the data (sparse counts are read otherwise by default: tests/methods/test_lapofs_smooth.py)
    params = {"lambda1": 0.01, "lambda2": 0.01, "columns": "raw", **kw}
    if W is not None:
        params["W"] = W
    return dufs.fit(X, method=method, n_features=K, standardize=None, client=client, **params)


# ---------------------------------------------------------------------------------------------------- LapAOFS/LapDOFS
@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
@pytest.mark.parametrize("name", ["dense", "sparse", "coil20", "orl"])
def test_lap_matches_the_papers_sequential_scheme(method, name):
    X = _data(name)
    W = _graph(name)
    # the graph given dense on dense data, sparse on sparse data
    Wg = sp.csr_array(W) if sp.issparse(X) or name == "orl" else W
    _assert_same(_fit_lap(X, method, W=Wg), _ref(method, name), X=X, W=W)


def _step_dtypes_forced(monkeypatch):
    """Every step's vectors shipped in float32 where the method allows it (the size bound at 0); returns the list
    into which each step's kernel call appends the dtype of the vectors it was given."""
    monkeypatch.setattr(partition, "_STEP_F32_BYTES", 0)
    seen = []
    orig = partition.greedy_update

    def spy(*args, **kw):
        seen.append(args[5].dtype)
        return orig(*args, **kw)

    monkeypatch.setattr(partition, "greedy_update", spy)
    return seen


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
@pytest.mark.parametrize("name", ["dense", "sparse", "coil20", "orl"])
def test_lap_with_its_step_vectors_in_float32(monkeypatch, method, name):
    """Large step vectors go to the blocks in float32 (their products accumulate in float64): forced on for every
    step, the same picks as the float64 reference, and the criterion and objective (the driver's, in float64 from
    the selected columns) as close as before."""
    seen = _step_dtypes_forced(monkeypatch)
    X, W = _data(name), _graph(name)
    _assert_same(_fit_lap(X, method, W=sp.csr_array(W)), _ref(method, name), X=X, W=W)
    assert seen and set(seen) == {np.dtype(np.float32)}


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_lap_other_regularisation(method):
    X = _data("dense")
    ref = _ref(method, "dense", 0.5, 0.2, 6, "heat")
    sel = _fit_lap(X, method, W=sp.csr_array(_graph("dense", 6, "heat")), lambda1=0.5, lambda2=0.2)
    _assert_same(sel, ref, X=X, W=_graph("dense", 6, "heat"), lambda1=0.5, lambda2=0.2)


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_lap_builds_the_papers_knn_graph(method):
    X = _data("dense")
    # the default graph: 4 neighbours, binary weights
    _assert_same(_fit_lap(X, method, W=None), _ref(method, "dense"))
    sel = _fit_lap(X, method, W=None, n_neighbors=6, weights="heat")
    _assert_same(sel, _ref(method, "dense", n_neighbors=6, weights="heat"))
    Wt = knn_affinity(X, 5, "heat", t=3.0)
    ref = REF[method](X, Wt, K, 0.01, 0.01)
    _assert_same(_fit_lap(X, method, W=None, n_neighbors=5, weights="heat", t=3.0), ref)


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
@pytest.mark.parametrize("name,widths", [("sparse", (7, 64)), ("coil20", (128, 300))])
def test_lap_does_not_depend_on_the_blocking(method, name, widths):
    X = _data(name)
    W = sp.csr_array(_graph(name))
    a = _fit_lap(Matrix(X, block_width=widths[0]), method, W=W)
    b = _fit_lap(Matrix(X, block_width=widths[1]), method, W=W)
    np.testing.assert_array_equal(a.indices, b.indices)
    _close(a.diagnostics["criterion"], b.diagnostics["criterion"], 1e-10)
    _close(a.diagnostics["objective"], b.diagnostics["objective"], 1e-10)
    np.testing.assert_array_equal(a.indices, _ref(method, name).order)


@pytest.mark.parametrize("method", ["lapaofs"])
def test_a_worker_of_two_threads_runs_its_partition_side_by_side(method):
    """A worker process of two threads holds one partition of all its blocks and runs them side by side on its
    threads (a machine of one process of many threads: a few tasks a step, not a few a thread): the picks and the
    criterion are those of this process, to the bit."""
    import distributed

    X = _data("sparse")
    W = sp.csr_array(_graph("sparse"))

    def fit(M, client=False):
        if method == "jcfs":
            return _fit_jcfs(M, W, 12, 3, 1e-3, client=client, max_iter=2)
        return _fit_lap(M, method, W=W, client=client)

    local = fit(X)
    with (distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None)
          as cluster, distributed.Client(cluster, set_as_default=False) as client, client.as_current()):
        M = as_matrix(X, block_width=8, persist=True)
        assert partition._partitions(M) == [list(range(M.n_blocks))]
        sel = fit(M, client)
        ran = client.run(task_threads_used)
    np.testing.assert_array_equal(sel.indices, local.indices)
    for key in ("criterion", "objective"):
        if key in local.diagnostics:
            np.testing.assert_array_equal(sel.diagnostics[key], local.diagnostics[key])
    assert max(ran.values()) == 2  # the blocks ran on both threads


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_lap_on_a_process_cluster(cluster_client, method):
    """The same picks as in this process and as the paper's scheme; the 10 blocks' state is kept in one partition
    a worker thread, so a step costs a few tasks a thread (3: the step, its state, its proposals), not a block."""
    from distributed import get_task_stream

    X = _data("sparse")
    W = sp.csr_array(_graph("sparse"))
    local = _fit_lap(X, method, W=W)
    with cluster_client.as_current():
        M = as_matrix(X, block_width=8, persist=True)
        assert M.residency["mode"] == "persisted" and M.n_blocks == 10
        with get_task_stream(cluster_client) as ts:
            sel = _fit_lap(M, method, W=W, client=cluster_client)
    np.testing.assert_array_equal(sel.indices, local.indices)
    np.testing.assert_array_equal(sel.indices, _ref(method, "sparse").order)
    _close(sel.diagnostics["criterion"], local.diagnostics["criterion"], 1e-10)
    _close(sel.diagnostics["objective"], local.diagnostics["objective"], 1e-10)
    assert sel.diagnostics["n_workers"] == 2
    passes = K  # the first (the initial proposals), then one after each pick but the last
    threads = sum(cluster_client.nthreads().values())
    assert len(ts.data) <= passes * 3 * threads + 10, len(ts.data)  # by block it was passes * 3 * 10


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs", "jcfs"])
def test_heavy_columns_are_fetched_alone(monkeypatch, method):
    """Proposals carry their column only when it is light; a heavier winner is read from its block afterwards.
    With every column "heavy" the picks still equal the paper's."""
    monkeypatch.setattr(partition, "ATTACH", 0)
    X = _data("sparse")
    if method == "jcfs":
        Y = _orthonormal(X.shape[0], 4, 7)
        ref = jcfs_greedy_paper(_dense(X), Y, K, 1e-4)
        r = jcfs_module.jcfs_select(Matrix(X, standardize=None, block_width=16), Y, K, 1e-4)
        np.testing.assert_array_equal(np.asarray(r.indices), ref.order)
        _close(r.criterion, ref.criterion, REL)
        return
    _assert_same(_fit_lap(Matrix(X, block_width=16), method, W=sp.csr_array(_graph("sparse"))), _ref(method, "sparse"))


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_a_partitions_best_carries_its_heavy_column(monkeypatch, method):
    """On a cluster the blocks' state is kept in partitions, and each partition's best proposal carries its column
    however heavy (within a step's budget): the winner is always some partition's best, so no column is read
    afterwards; with no budget every winner is read alone. The picks equal the paper's either way (a threaded
    cluster, so that the patched limits reach the workers)."""
    import distributed

    monkeypatch.setattr(partition, "ATTACH", 0)
    X = _data("sparse")
    W = sp.csr_array(_graph("sparse"))
    reads = []
    columns = Matrix.columns

    def counted(self, ids):
        reads.append(list(ids))
        return columns(self, ids)

    monkeypatch.setattr(Matrix, "columns", counted)
    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None)
          as cluster, distributed.Client(cluster, set_as_default=False) as client, client.as_current()):
        M = as_matrix(X, block_width=8, persist=True)
        for budget, fetched in ((1 << 22, 0), (0, K)):
            monkeypatch.setattr(partition, "ATTACH_STEP", budget)
            reads.clear()
            sel = _fit_lap(M, method, W=W, client=client)
            assert len(reads) == fetched
            _assert_same(sel, _ref(method, "sparse"))


# ---------------------------------------------------------------------------------------------------- JCFS
def _orthonormal(n, c, seed):
    Q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, c)))
    return Q


@pytest.mark.parametrize("name,c,gamma", [("dense", 3, 1e-4), ("dense", 3, 0.1), ("sparse", 4, 1e-4),
                                          ("sparse", 4, 0.1), ("coil20", 20, 1e-4), ("orl", 40, 1e-4)])
def test_jcfs_select_matches_the_papers_greedy_step(name, c, gamma):
    X = _data(name)
    n = X.shape[0]
    Y = _orthonormal(n, c, 7)
    ref = jcfs_greedy_paper(_dense(X), Y, K, gamma)
    widths = (5, 32) if X.shape[1] < 100 else (128, 300)
    got = [jcfs_module.jcfs_select(Matrix(X, standardize=None, block_width=w), Y, K, gamma) for w in widths]
    for r in got:
        np.testing.assert_array_equal(np.asarray(r.indices), ref.order)
        _close(r.criterion, ref.criterion, REL)
        _close(r.objective, ref.objective, REL)
    np.testing.assert_array_equal(got[0].indices, got[1].indices)
    _close(got[0].criterion, got[1].criterion, 1e-10)


def _assert_embedding(X, S, W, c, lam, gamma):
    Yr, vr = jcfs_embedding_dense(_dense(X), S, W, c + 1, lam, gamma)
    assert vr[c] - vr[c - 1] > 1e-6 * max(abs(vr[c]), 1.0)  # the subspace is well defined
    Y, vals = jcfs_module.jcfs_embedding(Matrix(X, standardize=None, block_width=16), S, sp.csr_array(W), c, lam, gamma)
    Y = np.asarray(Y)
    assert Y.shape == (X.shape[0], c)
    _close(vals, vr[:c], 1e-8)
    assert subspace_angles(Y, Yr[:, :c]).max() < 1e-6


@pytest.mark.parametrize("name,c,lam", [("dense", 3, 1e-3), ("sparse", 4, 1e-4), ("orl", 40, 1e-5)])
def test_jcfs_embedding_matches_dense_eigh(name, c, lam):
    X = _data(name)
    W = knn_affinity(_dense(X), 5)
    gamma = 1e-4
    _assert_embedding(X, [], W, c, lam, gamma)
    Y0, _ = jcfs_embedding_dense(_dense(X), [], W, c, lam, gamma)
    S = jcfs_greedy_paper(_dense(X), Y0, 12, gamma).order
    _assert_embedding(X, S, W, c, lam, gamma)


def _fit_jcfs(X, W, m, c, lam, client=False, max_iter=10, **kw):
    return dufs.fit(X, method="jcfs", n_features=m, n_clusters=c, lambda_=lam, gamma=1e-4, n_neighbors=5, W=W,
                    max_iter=max_iter, standardize=None, client=client, **kw)


@pytest.mark.parametrize("name,m,c,lam", [("dense", 20, 3, 1e-3), ("sparse", 15, 4, 1e-4), ("coil20", K, 20, 1e-3)])
def test_jcfs_matches_algorithm_1(name, m, c, lam):
    X = _data(name)
    W = knn_affinity(_dense(X), 5)
    ref = jcfs_paper(_dense(X), W, m, c, lam, 1e-4, max_iter=10)
    # the paper reads the values as they are (sparse non-negative data read by default as presence at unit norm)
    sel = _fit_jcfs(X, sp.csr_array(W), m, c, lam, values="raw", rows="raw")
    np.testing.assert_array_equal(np.asarray(sel.indices), ref.order)
    assert sel.diagnostics["iterations"] == ref.iterations


def test_jcfs_keeps_its_step_vectors_in_float64(monkeypatch):
    """JCFS's steps stay in float64 whatever their size (docs/methods.md: an in-span candidate's score is a ratio of
    two rounding-level numbers), and pick as Algorithm 1 does."""
    seen = _step_dtypes_forced(monkeypatch)
    X = _data("dense")
    W = knn_affinity(_dense(X), 5)
    ref = jcfs_paper(_dense(X), W, 20, 3, 1e-3, 1e-4, max_iter=10)
    np.testing.assert_array_equal(np.asarray(_fit_jcfs(X, sp.csr_array(W), 20, 3, 1e-3).indices), ref.order)
    assert seen and set(seen) == {np.dtype(np.float64)}


def test_jcfs_as_printed_with_m0_one_half():
    """select_gamma=2 runs Algorithm 1 with its printed M_0 = I/2 (the spectral step keeps gamma)."""
    X = _data("coil20")
    W = knn_affinity(_dense(X), 5)
    ref = jcfs_paper(_dense(X), W, 15, 20, 1e-3, 1e-4, max_iter=10, m0=0.5)
    sel = _fit_jcfs(X, sp.csr_array(W), 15, 20, 1e-3, select_gamma=2.0)
    np.testing.assert_array_equal(np.asarray(sel.indices), ref.order)
    assert sel.diagnostics["iterations"] == ref.iterations
    assert not np.array_equal(np.sort(sel.indices), np.sort(jcfs_paper(_dense(X), W, 15, 20, 1e-3).order))


def test_jcfs_builds_the_graph_and_stops_at_max_iter():
    X = _data("dense")
    W = knn_affinity(X, 5)
    ref = jcfs_paper(X, W, 20, 3, 1e-3, 1e-4, max_iter=10)
    sel = _fit_jcfs(X, None, 20, 3, 1e-3)
    np.testing.assert_array_equal(np.asarray(sel.indices), ref.order)
    assert sel.diagnostics["iterations"] == ref.iterations
    one = _fit_jcfs(X, None, 20, 3, 1e-3, max_iter=1)
    np.testing.assert_array_equal(np.asarray(one.indices), ref.selections[0])
    assert one.diagnostics["iterations"] == 1


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs", "jcfs", "lapaofs-anchor"])
def test_a_side_kept_on_a_worker_selects_what_the_driver_does(cluster_client, kept_calls, method):
    """With the selected set and a step's vectors kept on a worker (dufs.engine.kept, the path of workers on
    several machines), the picks, criterion and objective are the driver's, to the bit; the steps ran there."""
    import dask

    from dufs.methods.greedy import run as run_module

    calls = kept_calls(run_module)
    X = _data("sparse")
    W = sp.csr_array(_graph("sparse"))
    name, kw = method.split("-")[0], {}
    if method == "lapaofs-anchor":
        kw = {"graph": "anchor", "n_anchors": 16, "embed_dim": 8}
    got = {}
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off"}):
        M = as_matrix(X, block_width=8, persist=True)
        for kv in ("off", "on"):
            with dask.config.set({"dufs.engine.kept-vectors": kv}):
                if name == "jcfs":
                    got[kv] = _fit_jcfs(M, W, 12, 3, 1e-3, client=cluster_client, max_iter=2)
                else:
                    got[kv] = _fit_lap(M, name, W=None if kw else W, client=cluster_client, **kw)
        M.release()
    a, b = got["off"], got["on"]
    np.testing.assert_array_equal(b.indices, a.indices)
    for key in ("criterion", "objective"):
        if key in a.diagnostics:
            np.testing.assert_array_equal(b.diagnostics[key], a.diagnostics[key])
    assert "make_side" in calls and "side_call" in calls


def test_jcfs_on_a_process_cluster(cluster_client):
    X = _data("dense")
    W = sp.csr_array(knn_affinity(X, 5))
    local = _fit_jcfs(X, W, 20, 3, 1e-3)
    with cluster_client.as_current():
        M = as_matrix(X, block_width=16, persist=True)
        sel = _fit_jcfs(M, W, 20, 3, 1e-3, client=cluster_client)
    np.testing.assert_array_equal(sel.indices, local.indices)
    assert sel.diagnostics["iterations"] == local.diagnostics["iterations"]


# ---------------------------------------------------------------------------------------------------- a lost worker
_ENGINE_CALLS = ("map_blocks", "rmatvec", "matvec", "columns", "dense_columns", "topk", "column_stats",
                 "similarity_column", "executor.run_resident")


def _count_engine_calls(monkeypatch, on_call):
    """Wrap the Matrix operations a method can run; ``on_call(i)`` before the i-th (from 1)."""
    count = [0]
    for name in _ENGINE_CALLS:
        cls = Executor if name.startswith("executor.") else Matrix
        name = name.removeprefix("executor.")
        real = getattr(cls, name)

        def wrapped(self, *a, _real=real, **k):
            count[0] += 1
            on_call(count[0])
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, name, wrapped)
    return count


def _kept_here() -> int:
    from dufs.engine import kept

    return len(kept._KEPT)


@pytest.mark.slow
@pytest.mark.parametrize("kept", [False, True], ids=["driver", "kept"])
def test_a_worker_killed_mid_run_changes_nothing(monkeypatch, kept):
    """A LapAOFS run counts its engine calls, a second run SIGKILLs a worker halfway (``run`` takes "jcfs" too;
    left out to keep the file fast); with ``kept``, the worker that keeps the selected set and the step's vectors
    (dufs.engine.kept, the path of workers on several machines), which are then made again from the selection."""
    import dask

    distributed = pytest.importorskip("distributed")
    cfg = {"dufs.engine.shared-memory": "off", "dufs.engine.kept-vectors": "on"} if kept else {}
    X = _data("dense")
    W = sp.csr_array(knn_affinity(X, 5))

    def run(method, client):
        M = as_matrix(X, block_width=8, persist=True)
        assert M.residency["mode"] == "persisted"
        if method == "lapaofs":
            return _fit_lap(M, method, W=W, client=client)
        return _fit_jcfs(M, W, 20, 3, 1e-3, client=client, max_iter=2)

    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                   silence_logs=50) as cluster,
          distributed.Client(cluster, set_as_default=False) as client, client.as_current(), dask.config.set(cfg)):
        for method in ("lapaofs",):
            client.wait_for_workers(2)
            with monkeypatch.context() as mp:
                calls = _count_engine_calls(mp, lambda i: None)
                ref = run(method, client)
            total = calls[0]
            assert total >= 4, "too few engine calls to kill a worker in the middle"
            fired = []

            def kill(i, total=total, fired=fired):
                if i == total // 2 and not fired:
                    fired.append(i)
                    pids = client.run(os.getpid)
                    holders = [a for a, k in client.run(_kept_here).items() if k] if kept else []
                    assert holders or not kept, "no worker keeps the selected set"
                    os.kill(pids[holders[0]] if kept else sorted(pids.values())[0], signal.SIGKILL)

            with monkeypatch.context() as mp:
                _count_engine_calls(mp, kill)
                sel = run(method, client)
            assert fired, method
            np.testing.assert_array_equal(sel.indices, ref.indices)
            if method == "lapaofs":
                _close(sel.diagnostics["criterion"], ref.diagnostics["criterion"], 1e-10)
                np.testing.assert_array_equal(ref.indices, _ref("lapaofs", "dense", n_neighbors=5).order)
            else:
                assert sel.diagnostics["iterations"] == ref.diagnostics["iterations"]


def test_a_loss_during_the_rebuild_is_rebuilt_again(monkeypatch):
    """The rebuild after a lost pass can meet the same loss (its first pass may start before the scheduler has
    removed the dead worker): it is tried again, and the picks are the paper's."""
    from distributed.client import FutureCancelledError

    X = _data("dense")
    W = sp.csr_array(knn_affinity(X, 5))
    real_pass, real_rebuild = greedy.GreedyRun.pass_, greedy.GreedyRun.rebuild
    failed = {"pass": 0, "rebuild": 0}

    def pass_(self, p, *a, **k):
        if len(self.ids) == 12 and not failed["pass"]:
            failed["pass"] += 1
            raise FutureCancelledError("x", reason="lost dependencies")
        return real_pass(self, p, *a, **k)

    def rebuild(self, done):
        if not failed["rebuild"]:
            failed["rebuild"] += 1
            raise FutureCancelledError("y", reason="lost dependencies")
        return real_rebuild(self, done)

    monkeypatch.setattr(greedy.GreedyRun, "pass_", pass_)
    monkeypatch.setattr(greedy.GreedyRun, "rebuild", rebuild)
    sel = _fit_lap(Matrix(X, block_width=8), "lapaofs", W=W)
    assert failed == {"pass": 1, "rebuild": 1} and sel.diagnostics["recoveries"] == 2
    assert sel.diagnostics["passes_replayed"] == 11  # the second rebuild replays the 11 passes after the first
    np.testing.assert_array_equal(sel.indices, _ref("lapaofs", "dense", n_neighbors=5).order)


# ---------------------------------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("method,params,name", [
    ("lapaofs", {"lambda1": -1.0}, "lambda1"),
    ("lapaofs", {"lambda2": 0.0}, "lambda2"),
    ("lapdofs", {"lambda2": -0.5}, "lambda2"),
    ("lapdofs", {"n_neighbors": 0}, "n_neighbors"),
    ("lapaofs", {"weights": "gauss"}, "weights"),
    ("lapaofs", {"weights": "heat", "t": -1.0}, r"\bt\b"),
    ("lapaofs", {"W": np.eye(7)}, r"\bW\b"),
    ("lapdofs", {"n_features": 0}, "n_features"),
    ("lapdofs", {"n_features": 1.5}, "n_features"),
    ("jcfs", {"n_clusters": 0}, "n_clusters"),
    ("jcfs", {"lambda_": -1.0}, "lambda_"),
    ("jcfs", {"gamma": 0.0}, "gamma"),
    ("jcfs", {"max_iter": 0}, "max_iter"),
    ("jcfs", {"n_neighbors": 80}, "n_neighbors"),
    ("jcfs", {"W": np.ones((5, 5))}, r"\bW\b"),
])
def test_bad_parameters_name_the_parameter(method, params, name):
    X = _data("dense")
    base = {"n_features": 10}
    if method == "jcfs":
        base.update(n_clusters=3, lambda_=1e-3, gamma=1e-4, max_iter=3)
    kw = {**base, **params}
    with pytest.raises(ParameterError, match=name):
        dufs.fit(X, method=method, standardize=None, client=False, **kw)


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_more_features_than_the_input_warns_and_keeps_all(method):
    """As scikit-learn's SelectKBest: n_features beyond the input warns (a DufsWarning) and selects every feature."""
    X = _data("dense")
    with pytest.warns(dufs.errors.DufsWarning, match=f"n_features={X.shape[1] + 1} is greater than the "
                                                      f"{X.shape[1]} features"):
        sel = dufs.fit(X, method=method, n_features=X.shape[1] + 1, standardize=None, client=False)
    assert sorted(sel.indices.tolist()) == list(range(X.shape[1]))


def test_jcfs_select_rejects_bad_parameters():
    X = _data("dense")
    M = Matrix(X, block_width=16)
    Y = _orthonormal(X.shape[0], 3, 1)
    with pytest.raises(ParameterError, match="gamma"):
        jcfs_module.jcfs_select(M, Y, 5, 0.0)
    with pytest.raises(ParameterError, match="n_features"):
        jcfs_module.jcfs_select(M, Y, 0, 1e-4)
    with pytest.raises(ParameterError, match=r"\bY\b"):
        jcfs_module.jcfs_select(M, Y[:-1], 5, 1e-4)
