"""Passes run as direct calls on the workers that hold the blocks (dufs.engine.direct): no task in the pass, the
numbers of dense NumPy, and a call that cannot run (its blocks not where it was sent) runs the pass as tasks."""

from __future__ import annotations

import os
import time

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from distributed import get_task_stream

from dufs.engine import as_matrix, direct, shm
from dufs.engine.cluster import is_lost

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")

ALL = {"dufs.engine.shared-memory-bytes": 1}  # every vector and result, however small, through shared memory


def _zscores(X):
    D = X.toarray().astype(np.float64)
    sd = D.std(axis=0)
    sd[sd == 0] = 1.0
    return (D - D.mean(axis=0)) / sd


def _tasks(ts) -> list[str]:
    return [str(r["key"][0] if isinstance(r["key"], tuple) else r["key"]) for r in ts.data]


@pytest.mark.parametrize("mode", ["on", "off"])
def test_products_as_direct_calls_or_tasks_give_dense_numpys_numbers(cluster_client, mode):
    """Z^T V and Z U over persisted blocks: with direct passes on, no task runs in the pass (each worker is called
    once) and the pass is counted; off, one task a worker; both against dense NumPy."""
    X = sp.csc_array(sp.random(2500, 800, density=0.02, format="csc", random_state=7, dtype=np.float32))
    rng = np.random.default_rng(7)
    v, V, U = rng.standard_normal(2500), rng.standard_normal((2500, 3)), rng.standard_normal((800, 2))
    Z = _zscores(X)
    with cluster_client.as_current(), dask.config.set({**ALL, "dufs.engine.direct-passes": mode}):
        M = as_matrix(X, block_width=100, standardize="zscore", persist=True)
        M.stats  # noqa: B018 - the statistics' pass before the products
        for fn, arg, ref in ((M.rmatvec, v, Z.T @ v), (M.rmatvec, V, Z.T @ V), (M.matvec, U, Z @ U)):
            passes = M.passes
            with get_task_stream(cluster_client) as ts:
                got = fn(arg)
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10 * np.abs(ref).max())
            assert M.passes == passes + 1
            names = [t for t in _tasks(ts) if "partition" in t]
            if mode == "on":
                assert names == [] and len(direct.last_timeline()) == 2, names
            else:
                assert len(names) == 2, names
        M.release()


def test_a_call_sent_where_the_blocks_are_not_runs_the_pass_as_tasks(cluster_client):
    """The matrix's record of where its blocks live is wrong (every block said to be on the other worker): the
    direct calls find no block there and fail, the pass runs as tasks (the same numbers as dense NumPy) and the
    results' file the calls were given is not reused; the record is asked again, and the next pass is direct."""
    X = sp.csc_array(sp.random(2000, 600, density=0.03, format="csc", random_state=8, dtype=np.float32))
    v = np.random.default_rng(8).standard_normal(2000)
    ref = X.toarray().astype(np.float64).T @ v
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, block_width=60, persist=True)
        shm.release_files()  # one results' file in the pool after this pass: the one the direct calls are given
        np.testing.assert_allclose(M.rmatvec(v), ref, rtol=0, atol=1e-10 * np.abs(ref).max())
        when, units, where = M.executor.placed(cluster_client)
        a, b = sorted(set(where))
        swapped = [b if w == a else a for w in where]
        M.executor.placed_at = {cluster_client.id: (time.monotonic(), units, swapped)}
        results = {f[0] for f in shm._RESULTS.free + shm._RESULTS.lent}
        assert len(results) == 1
        with get_task_stream(cluster_client) as ts:
            got = M.rmatvec(v)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10 * np.abs(ref).max())
        assert len([t for t in _tasks(ts) if "partition" in t]) == 2  # as tasks
        assert not results & {f[0] for f in shm._RESULTS.free + shm._RESULTS.lent}  # the direct calls' file dropped
        assert M.executor.placed(cluster_client)[2] == where  # asked again
        with get_task_stream(cluster_client) as ts:
            np.testing.assert_allclose(M.rmatvec(2 * v), 2 * ref, rtol=0, atol=2e-10 * np.abs(ref).max())
        assert not [t for t in _tasks(ts) if "partition" in t]  # direct again
        M.release()


def _sum_of(d):
    return float(np.sum(d["x"]))


def test_held_keys_are_replaced_by_the_workers_values(cluster_client):
    """``run_on_holders``: each worker's calls in turn, futures replaced by what that worker holds; a key the worker
    does not hold fails the whole call (DirectFailed, its cause chained)."""
    a, b = sorted(cluster_client.scheduler_info(n_workers=-1)["workers"])
    fa = cluster_client.scatter(np.arange(5.0), workers=[a])
    fb = cluster_client.scatter(np.arange(3.0), workers=[b])
    got = direct.run_on_holders(cluster_client, np.sum, {a: [(fa,), ([1.0, 2.0],)], b: [(fb,)]})
    assert got == {a: [10.0, 3.0], b: [3.0]}
    # within a dict too (a map_blocks call's keyword arguments)
    assert direct.run_on_holders(cluster_client, _sum_of, {a: [({"x": fa},)]}) == {a: [10.0]}
    with pytest.raises(direct.DirectFailed) as err:
        direct.run_on_holders(cluster_client, np.sum, {a: [(fb,)]})
    assert isinstance(err.value.__cause__, direct.HeldLost) and is_lost(err.value.__cause__)


def test_state_stays_on_the_workers_and_large_results_come_back_through_shared_memory(cluster_client):
    """map_blocks with state over persisted blocks: direct calls keep the state in the workers' memory (gathered,
    it is what dense NumPy says), large results come back through /dev/shm files that are gone after, and the
    released state is dropped on the workers with the next call; with direct passes off the same numbers as
    tasks."""
    X = sp.csc_array(sp.random(500, 300, density=0.05, format="csc", random_state=9, dtype=np.float32))
    counts = np.diff(X.indptr).astype(np.float64)
    mine = f"dufs-{os.getpid()}-"

    def ours() -> set:
        return {f for f in os.listdir("/dev/shm") if f.startswith("dufs-")} - set(before)

    with cluster_client.as_current():
        M = as_matrix(X, block_width=50, persist=True)
        parts = M.partition(2)
        before = [f for f in os.listdir("/dev/shm") if f.startswith("dufs-")]
        got = {}
        for mode in ("on", "off"):
            with dask.config.set({"dufs.engine.direct-passes": mode}):
                state = [np.zeros(sum(M.blocks[i].width for i in p)) for p in parts]
                for r in range(3):
                    res, new = M.map_blocks(_in_parts, r + 1.0, state=state, partitions=parts)
                    if hasattr(state, "release"):
                        state.release()
                    state = new
                assert state.resident == (mode == "on")
                got[mode] = (res, state.gather())
                state.release()
        for p, r, s in zip(parts, *got["on"], strict=True):
            c = np.concatenate([counts[M.blocks[i].start:M.blocks[i].stop] for i in p])
            np.testing.assert_array_equal(r[:c.size], c)  # the results through /dev/shm
            np.testing.assert_array_equal(s, np.full(c.size, 6.0))  # 1 + 2 + 3, kept on the workers
        for a, b in zip(got["on"][0] + got["on"][1], got["off"][0] + got["off"][1], strict=True):
            np.testing.assert_array_equal(a, b)
        assert not [f for f in ours() if not f.startswith(mine)]  # no result file left by a worker
        M.release()


def _in_parts(blocks, state, inc):
    """New state: the previous one plus ``inc``; result: the partition's column nonzero counts, as float64, repeated
    to at least 300 KiB (a result that comes back through /dev/shm)."""
    counts = np.concatenate([np.diff(b.indptr).astype(np.float64) for b in blocks])
    return state + inc, np.tile(counts, -(-40_000 // max(counts.size, 1)))


def _kept_on_worker() -> int:
    return len(direct._RESIDENT)


def test_releasing_the_matrix_drops_every_state_it_kept_on_the_workers(cluster_client):
    """A solver's last state may never be released by it: releasing the matrix drops every state item its direct
    calls (and its views') kept, so nothing stays on a cluster that outlives the driver."""
    X = sp.csc_array(sp.random(400, 200, density=0.05, format="csc", random_state=10, dtype=np.float32))
    with cluster_client.as_current():
        M = as_matrix(X, block_width=40, persist=True)
        parts = M.partition(2)
        V = M.with_standardize("scale")
        cluster_client.run(lambda: direct._RESIDENT.clear())
        _, a = M.map_blocks(_in_parts, 1.0, state=[np.zeros(sum(M.blocks[i].width for i in p)) for p in parts],
                            partitions=parts)
        _, b = V.map_blocks(_in_parts, 2.0, state=a, partitions=parts)  # a stays referenced, not released
        assert a.resident and b.resident and sum(cluster_client.run(_kept_on_worker).values()) == 2 * len(parts)
        V.release()  # a view owns nothing
        assert sum(cluster_client.run(_kept_on_worker).values()) == 2 * len(parts)
        M.release()
        assert sum(cluster_client.run(_kept_on_worker).values()) == 0


def _size(b):
    return int(b.nnz)


def test_state_kept_on_a_worker_follows_a_block_that_moved(cluster_client):
    """A task that needs a block runs on the other worker (it fetches the block), then the block's first copy is
    dropped (as Dask's active memory manager drops a replica): the next map_blocks over the state kept where the
    block was fetches the block back instead of saying the state was lost, with the same numbers."""
    X = sp.csc_array(sp.random(400, 200, density=0.05, format="csc", random_state=12, dtype=np.float32))
    counts = np.diff(X.indptr).astype(np.float64)
    with cluster_client.as_current():
        M = as_matrix(X, block_width=40, persist=True)
        parts = M.partition(2)
        _, state = M.map_blocks(_in_parts, 1.0, state=[np.zeros(sum(M.blocks[i].width for i in p)) for p in parts],
                                partitions=parts)
        assert state.resident
        i = parts[0][0]
        fut = M.executor.src[i]
        (home,) = cluster_client.who_has([fut])[fut.key]
        other = next(a for a in cluster_client.scheduler_info(n_workers=-1)["workers"] if a != home)
        # Dask's memory manager paused while the test makes and drops the replica itself (it could drop either
        # copy first: the full suite once saw only one left right after the fetch)
        amm = cluster_client.amm
        was_running = amm.running()
        amm.stop()
        try:
            assert cluster_client.submit(_size, fut, workers=[other], allow_other_workers=False).result() > 0
            assert set(cluster_client.who_has([fut])[fut.key]) == {home, other}
            cluster_client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.request_remove_replicas(home, [fut.key], stimulus_id="test"))
            deadline = time.monotonic() + 10
            while set(cluster_client.who_has([fut])[fut.key]) != {other} and time.monotonic() < deadline:
                time.sleep(0.05)
            assert set(cluster_client.who_has([fut])[fut.key]) == {other}  # the block moved
        finally:
            if was_running:
                amm.start()
        M.executor.placed_at = {}  # and the matrix knows it (its record of where the blocks are asked again)
        res, new = M.map_blocks(_in_parts, 2.0, state=state, partitions=parts)
        state.release()
        assert new.resident
        for p, r, s in zip(parts, res, new.gather(), strict=True):
            c = np.concatenate([counts[M.blocks[j].start:M.blocks[j].stop] for j in p])
            np.testing.assert_array_equal(r[:c.size], c)
            np.testing.assert_array_equal(s, np.full(c.size, 3.0))  # 1 + 2: the state was not rebuilt
        # fetched back where the state is (Dask's memory manager may drop a copy again since)
        story = cluster_client.run(lambda dask_worker, k=fut.key: [str(x) for x in dask_worker.state.story(k)],
                                   workers=[home])[home]
        assert any("gather-" in x for x in story), story
        new.release()
        M.release()


def test_persisted_blocks_come_back_after_every_worker_is_lost(cluster_client, tmp_path):
    """Both worker processes killed at once (their nannies start new ones, at new addresses): the next pass has dask
    recompute the persisted blocks from the store on the new workers and gives SciPy's product. Placed when loaded,
    the blocks are not tied to the lost workers: restricted to an address that no longer exists, a block that went
    to "no-worker" while no worker was running stayed there for good, and the pass with it."""
    import signal
    import threading

    from dufs.data import write_store
    from dufs.testing import patience
    from tests.deploy._support import wait_until

    rng = np.random.default_rng(3)
    X = sp.random(400, 90, density=0.1, format="csr", random_state=rng, dtype=np.float64)
    store = write_store(X, tmp_path / "s.zarr", feature_block=15, value_dtype=np.float64)
    v = rng.standard_normal(400)
    with cluster_client.as_current():
        M = as_matrix(store.path, persist=True)
        assert M.residency["mode"] == "persisted"
        np.testing.assert_allclose(M.rmatvec(v), X.T @ v, rtol=1e-12)
        pids = cluster_client.run(os.getpid)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)

        def restarted() -> bool:  # both workers back, at new addresses
            now = cluster_client.scheduler_info(n_workers=-1)["workers"]
            return len(now) == 2 and not set(now) & set(pids)

        wait_until(restarted, patience(120), "both workers restarted")
        got: list = []

        def product() -> None:
            with cluster_client.as_current():  # the client is current per thread
                got.append(M.rmatvec(v))

        # in a daemon thread: a stalled pass fails the test instead of hanging the suite (or its exit)
        t = threading.Thread(target=product, daemon=True)
        t.start()
        t.join(patience(120))
        assert got, "the pass after every worker was lost did not finish"
        np.testing.assert_allclose(got[0], X.T @ v, rtol=1e-12)
        M.release()
