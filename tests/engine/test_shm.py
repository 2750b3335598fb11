"""Vectors shared through /dev/shm with the workers on this machine (dufs.engine.shm): the mapping itself, its
clean-up, and passes, greedy steps and MMFS rounds that read their vectors from it, against SciPy, the greedy
selectors' paper references and the serial solve."""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.engine import as_matrix, shm

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")

ALL = {"dufs.engine.shared-memory-bytes": 1}  # every vector, however small, through shared memory


def _ours() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith(f"dufs-{os.getpid()}-")}


def _results() -> set[str]:
    """This process's pooled results' files (free, or lent to a pass's result)."""
    return {os.path.basename(f[0]) for f in shm._RESULTS.free + shm._RESULTS.lent}


def _worker_maps() -> list[str]:
    from dufs.engine import shm as mod

    return list(mod._MAPS)


def _worker_results_maps() -> list[str]:
    from dufs.engine import shm as mod

    return list(mod._WMAPS)


def test_published_array_maps_read_only_and_its_pooled_file_refuses_an_older_publication():
    """A vector's file is mapped read-only, once per process; after its block the file goes back to the pool and
    the next vector that fits is copied into it: a task still holding the earlier reference (a rerun of a finished
    pass) is refused with an error that the solvers take as lost state, never given the later vector. A block that
    raises removes its file; ``release_files`` removes the pool's."""
    from dufs.engine.cluster import is_lost

    shm.release_files()
    x = np.random.default_rng(0).standard_normal((1000, 3))
    assert shm.local_array(x) is x
    before = _ours()
    with shm.publish(x) as ref:
        assert os.path.exists(ref.path) and ref.nbytes == x.nbytes
        got = shm.local_array(ref)
        np.testing.assert_array_equal(got, x)
        assert got.dtype == x.dtype and got.shape == x.shape and not got.flags.writeable
        again = shm.local_array(ref)  # mapped once per process: the same memory, one mapping kept
        assert np.shares_memory(again, got) and list(shm._MAPS).count(ref.path) == 1
    assert _ours() == before | {os.path.basename(ref.path)}  # back in the pool
    np.testing.assert_array_equal(shm.local_array(ref), x)  # not reused yet: still that publication
    y = np.arange(1500, dtype=np.float64)  # smaller: the same file
    with shm.publish(y) as ref_y:
        assert ref_y.path == ref.path and ref_y.gen != ref.gen
        np.testing.assert_array_equal(shm.local_array(ref_y), y)
        with pytest.raises(shm.SharedArrayLost, match="was lost") as lost:
            shm.local_array(ref)
        assert is_lost(lost.value)
    z = np.ones(10_000)  # larger than the pooled file: a second one
    with shm.publish(z) as ref_z:
        assert ref_z.path != ref.path
        np.testing.assert_array_equal(shm.local_array(ref_z), z)
    assert len(_ours() - before) == 2
    with pytest.raises(RuntimeError), shm.publish(x) as ref2:
        raise RuntimeError("a failed pass")
    assert not os.path.exists(ref2.path)
    shm._MAPS.clear()  # as a process that had not mapped it
    with pytest.raises(FileNotFoundError, match="shared-memory"):
        shm.local_array(ref2)
    shm.release_files()
    assert _ours() == before - {os.path.basename(ref.path), os.path.basename(ref_z.path)}


def test_several_files_stay_mapped_and_a_removed_one_is_unmapped_at_the_next_lookup():
    """A caller holding results cycles the pool through several files: a process keeps six of them mapped at once
    (each mapped once, not again on every pass), and drops the mapping of a file removed since at its next lookup
    of any file (a mapping holds its file's memory)."""
    import contextlib

    shm.release_files()
    shm._MAPS.clear()
    xs = [np.full(1000 * (i + 1), float(i)) for i in range(6)]
    with contextlib.ExitStack() as stack:
        refs = [stack.enter_context(shm.publish(x)) for x in xs]  # six files in use at once
        assert len({r.path for r in refs}) == 6
        first = {r.path: shm.local_array(r) for r in refs}
        maps = dict(shm._MAPS)
        for _ in range(3):
            for r, x in zip(refs, xs, strict=True):
                got = shm.local_array(r)
                np.testing.assert_array_equal(got, x)
                assert np.shares_memory(got, first[r.path])
        assert all(shm._MAPS[r.path] is maps[r.path] for r in refs)  # none of the six mapped again
    del first, got
    shm.release_files()  # the pool's files removed; this process still maps them
    assert not any(os.path.exists(r.path) for r in refs) and set(maps) <= set(shm._MAPS)
    with shm.publish(np.arange(10.0)) as ref:
        np.testing.assert_array_equal(shm.local_array(ref), np.arange(10.0))
        assert list(shm._MAPS) == [ref.path]  # the removed files' mappings dropped
    shm.release_files()


def test_files_of_dead_processes_are_removed():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    old, young = (f"/dev/shm/dufs-{int(dead.stdout)}-{age}" for age in ("old", "young"))
    for path in (old, young):
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
    os.utime(old, (os.path.getmtime(old) - 2 * shm._STALE_S,) * 2)
    try:
        shm._SWEPT = False
        with shm.publish(np.zeros(4)):
            pass
        assert not os.path.exists(old)
        assert os.path.exists(young)  # perhaps a live driver's, whose process number is not ours to judge
    finally:
        for path in (old, young):
            if os.path.exists(path):
                os.unlink(path)


def test_pass_reads_one_shared_copy_on_the_cluster(cluster_client):
    X = sp.csc_array(sp.random(3000, 700, density=0.02, format="csc", random_state=1, dtype=np.float32))
    rng = np.random.default_rng(1)
    v, V = rng.standard_normal(3000), rng.standard_normal((3000, 3))
    D = X.toarray().astype(np.float64)
    sd = D.std(axis=0)
    sd[sd == 0] = 1.0
    Z = (D - D.mean(axis=0)) / sd  # dense NumPy z-scores
    with cluster_client.as_current(), dask.config.set(ALL):
        assert shm.workers_share_memory(cluster_client)
        M = as_matrix(X, block_width=64, standardize="zscore", persist=True)
        for vec in (v, V):
            for dt in (np.float64, np.float32):
                got = M.rmatvec(vec, dtype=dt)
                ref = Z.T @ vec
                assert got.dtype == dt
                np.testing.assert_allclose(got, ref, rtol=0, atol=(1e-12 if dt == np.float64 else 1e-6)
                                           * np.abs(ref).max())
        labels = rng.integers(0, 4, 3000)
        U = np.zeros((3000, 4))
        U[np.arange(3000), labels] = 1.0
        np.testing.assert_allclose(M.label_rmatvec(labels, 4), Z.T @ U, rtol=0, atol=1e-12 * np.abs(Z.T @ U).max())
        maps = cluster_client.run(_worker_maps)
        written = cluster_client.run(_worker_results_maps)
        M.release()
    assert all(any(p.startswith(f"/dev/shm/dufs-{os.getpid()}-") for p in m) for m in maps.values()), maps
    # the results were written by the tasks into this process's results files, not sent back
    assert all(any(p.startswith(f"/dev/shm/dufs-{os.getpid()}-") for p in m) for m in written.values()), written
    assert not _ours()
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off"}):
        assert not shm.shared_eligible(cluster_client, v)
        np.testing.assert_allclose(as_matrix(X, block_width=64, standardize="zscore").rmatvec(v), Z.T @ v,
                                   rtol=0, atol=1e-12 * np.abs(Z.T @ v).max())


@pytest.mark.parametrize("method", ["lapaofs", "lapdofs"])
def test_greedy_steps_from_shared_memory_pick_as_in_process(cluster_client, method):
    from tests.methods.test_greedy import K, _data, _fit_lap, _graph, _ref

    X = _data("sparse")
    W = sp.csr_array(_graph("sparse"))
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, block_width=8, persist=True)
        sel = _fit_lap(M, method, W=W, client=cluster_client)
        maps = cluster_client.run(_worker_maps)
        M.release()
    assert len(sel.indices) == K and all(maps.values())
    np.testing.assert_array_equal(sel.indices, _ref(method, "sparse").order)
    assert not _ours()


def test_mmfs_rounds_from_shared_memory_reach_the_serial_objective(cluster_client):
    from dufs.methods.mmfs import mmfs
    from dufs.testing.references import labelled_problem

    X, y = labelled_problem(3, n=300, d=64)
    serial = mmfs(dufs.engine.Matrix(X, standardize="scale", block_width=8), y, gamma=0.2, tol=1e-8,
                  max_epochs=5000, n_partitions=1)
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        res = mmfs(M, y, gamma=0.2, tol=1e-8, max_epochs=5000, n_partitions=2)
        maps = cluster_client.run(_worker_maps)
        M.release()
    assert res.diagnostics["n_partitions"] == 2 and all(maps.values())
    assert res.diagnostics["objective"] == pytest.approx(serial.diagnostics["objective"], rel=1e-6)
    assert not _ours()


def test_mmfs_margins_read_the_labels_from_shared_memory(cluster_client):
    """The blocks' margins (MarginSpec: the scaled labels, an n-vector) go to the workers through /dev/shm where
    they share it, not scattered inside the spec; the margins the blocks compute there are those of the whole
    matrix computed here (mmfs.margins, dense reference of the same formulas), and the file goes with the block."""
    from dufs.methods.mmfs import margin_spec, margins
    from dufs.methods.mmfs.solver import margin_summary, spec_shared
    from dufs.testing.references import labelled_problem

    X, y = labelled_problem(5, n=9000, d=48)  # the labels 72 KB: a spec shipped once
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        _, spec = margin_spec(M, y, 0.5, 0.2, "correlation")
        assert spec.dufs_ship  # the labels as an array: scattered once
        with spec_shared(spec) as sp:
            assert isinstance(sp.yn, shm.SharedArray) and not sp.dufs_ship
        got = margin_summary(M, spec)
        M.release()
    rho = margins(dufs.engine.Matrix(X, standardize="scale"), y, 0.5, 0.2, "correlation")[3]
    np.testing.assert_allclose(got, [rho.sum(), np.linalg.norm(rho), rho.max()], rtol=1e-10)
    assert not _ours()


def test_results_files_are_pooled_and_a_full_dev_shm_sends_them_back(cluster_client, monkeypatch):
    """A pass's results are written into a pooled /dev/shm file: the same file serves the next pass of that size,
    results against dense NumPy each time; where /dev/shm cannot hold the file (its pages reserved up front fail)
    the results come back as messages instead, the same numbers, and no file is left."""
    import errno

    X = sp.csc_array(sp.random(2000, 900, density=0.02, format="csc", random_state=4, dtype=np.float32))
    v = np.random.default_rng(4).standard_normal(2000)
    ref = X.toarray().astype(np.float64).T @ v
    tol = 1e-12 * np.abs(ref).max()
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, block_width=100, persist=True)
        shm.release_files()
        np.testing.assert_allclose(M.rmatvec(v), ref, rtol=0, atol=tol)
        pooled = _results()
        assert len(pooled) == 1 and pooled <= _ours()  # the results' file, back in the pool
        vectors = _ours() - pooled
        assert len(vectors) == 1  # and V's (publish)
        np.testing.assert_allclose(M.rmatvec(2 * v), 2 * ref, rtol=0, atol=2 * tol)
        assert _results() == pooled and _ours() - pooled == vectors  # the same files again
        np.testing.assert_allclose(M.rmatvec(v, dtype=np.float32), ref, rtol=0, atol=1e-6 * np.abs(ref).max())
        assert _results() == pooled  # a smaller result in the same file
        V = np.column_stack([v, -v, 3 * v])
        np.testing.assert_allclose(M.rmatvec(V), ref[:, None] * [1, -1, 3], rtol=0, atol=3 * tol)
        assert len(_results()) == 2  # a larger one: a new file, both kept
        np.testing.assert_allclose(M.rmatvec(v), ref, rtol=0, atol=tol)
        assert len(_results()) == 2
        shm.release_files()
        assert not _ours()

        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(shm.os, "posix_fallocate", full)
        with pytest.raises(OSError):
            with shm.receive((10, 1), np.float64):
                pass
        np.testing.assert_allclose(M.rmatvec(v), ref, rtol=0, atol=tol)
        assert not _ours()
        M.release()


def test_results_of_two_sizes_held_across_passes_come_from_the_pool(monkeypatch):
    """A caller that holds its last float64 and float32 results while it makes the next ones ('dufs bench pass'
    does) gets every result's file from the pool once the first rounds have made the files it needs (a new file
    allocates its pages before a pass can start: 25-35 ms for 38 MiB here). Each array holds what was written
    into it."""
    made: list[int] = []
    new_file = shm._new_file
    monkeypatch.setattr(shm, "_new_file", lambda nbytes: made.append(nbytes) or new_file(nbytes))
    d = 1_000_000

    def result(value: float, dtype: type) -> np.ndarray:
        with shm.receive((d, 1), dtype) as (ref, arr):
            arr[:] = value  # what a pass's workers write
            assert shm.lend(ref)
            return arr

    shm.release_files()
    out = result(0, np.float64)
    result(0, np.float32)  # dropped at once (the bench's warm-up)
    for r in range(1, 9):
        if r == 4:
            assert 0 < len(made) <= 5
            made.clear()
        out = result(r, np.float64)
        out32 = result(-r, np.float32)
        assert (out == r).all() and (out32 == -r).all()
    assert made == []
    del out, out32
    shm.release_files()
    assert not _ours()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_pass_result_is_its_results_file_until_its_caller_lets_go(cluster_client, monkeypatch):
    """A pass's result is the array of the /dev/shm file its workers wrote (no copy): a result the caller still
    holds keeps its numbers through later passes (they take another file), the file of one it dropped serves the
    next pass; where /dev/shm is short of room the results are copied out into the driver's pool
    (dufs.engine.buffers) instead, the dropped one's memory reused the same way. SciPy's numbers each time."""
    from dufs.engine import buffers

    X = sp.csc_array(sp.random(500, 40_000, density=0.002, format="csc", random_state=5, dtype=np.float32))
    v = np.random.default_rng(5).standard_normal(500)
    ref = X.astype(np.float64).T @ v
    tol = 1e-12 * np.abs(ref).max()
    with cluster_client.as_current(), dask.config.set(ALL):
        M = as_matrix(X, block_width=5000, persist=True)
        shm.release_files()
        a = M.rmatvec(v)
        np.testing.assert_allclose(a, ref, rtol=0, atol=tol)
        assert any(np.shares_memory(a, f[1]) for f in shm._RESULTS.lent)  # the file's own array
        b = M.rmatvec(2 * v)  # a held: another file
        assert not np.shares_memory(a, b)
        np.testing.assert_allclose(a, ref, rtol=0, atol=tol)  # a untouched by the later pass
        at = _address(a)
        del a
        c = M.rmatvec(3 * v)
        assert _address(c) == at  # the dropped result's file
        np.testing.assert_allclose(b, 2 * ref, rtol=0, atol=2 * tol)
        np.testing.assert_allclose(c, 3 * ref, rtol=0, atol=3 * tol)
        assert len(_results()) == 2
        del b, c

        class Short:  # /dev/shm with 1 KiB free: no file may stay lent
            f_bavail, f_frsize = 1, 1024

        monkeypatch.setattr(shm.os, "statvfs", lambda path: Short())
        buffers.clear()
        a = M.rmatvec(v)
        assert not any(np.shares_memory(a, f[1]) for f in shm._RESULTS.free + shm._RESULTS.lent)
        at = _address(a)  # the (d, 1) pooled buffer a views
        del a
        b = M.rmatvec(2 * v)
        assert _address(b) == at  # the dropped result's buffer
        c = M.rmatvec(3 * v)
        assert not np.shares_memory(b, c)  # b is held: another buffer
        np.testing.assert_allclose(b, 2 * ref, rtol=0, atol=2 * tol)
        np.testing.assert_allclose(c, 3 * ref, rtol=0, atol=3 * tol)
        M.release()


def test_a_vector_of_any_size_is_shared_unless_capped(cluster_client):
    """Two workers on this machine share a vector larger than any cache (a copy each costs a transfer each, one
    copy a write); ``dufs.engine.shared-memory-max-bytes`` caps it."""
    big = np.zeros(6_000_000)  # 48 MB
    assert shm.shared_eligible(cluster_client, big)
    with dask.config.set({"dufs.engine.shared-memory-max-bytes": "32MiB"}):
        assert not shm.shared_eligible(cluster_client, big)
        assert shm.shared_eligible(cluster_client, big[:3_000_000])
    with dask.config.set({"dufs.engine.shared-memory-bytes": "64MiB"}):
        assert not shm.shared_eligible(cluster_client, big)


def test_one_worker_reads_the_vector_from_shared_memory():
    """A single worker on this machine maps the pass's vector from /dev/shm too when it is at most 8 MiB (scattered,
    it cost a transfer every pass; a larger one is read faster from the worker's own huge pages), and the products
    agree with dense NumPy."""
    from distributed import Client, LocalCluster

    X = sp.csc_array(sp.random(2000, 300, density=0.02, format="csc", random_state=2, dtype=np.float32))
    v = np.random.default_rng(2).standard_normal(2000)
    D = X.toarray().astype(np.float64)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=40) as lc, Client(lc, set_as_default=False) as one, one.as_current(), \
            dask.config.set(ALL):
        assert shm.shared_eligible(one, v)
        assert not shm.shared_eligible(one, np.zeros(2_000_000))  # 16 MB: scattered, into the worker's huge pages
        M = as_matrix(X, block_width=64, persist=True)
        np.testing.assert_allclose(M.rmatvec(v), D.T @ v, rtol=0, atol=1e-12 * np.abs(D.T @ v).max())
        maps = one.run(_worker_maps)
        M.release()
    assert all(any(p.startswith(f"/dev/shm/dufs-{os.getpid()}-") for p in m) for m in maps.values()), maps


def test_products_z_u_sum_their_partials_from_shared_memory_as_the_workers_do(cluster_client):
    """Z U on the cluster: each block's partial product written into its slot of a /dev/shm results file and summed
    here by the workers' fixed tree: the same numbers, bit for bit, as the workers' own sum (shared memory off),
    and dense NumPy's to rounding, with and without the transform."""
    X = sp.csc_array(sp.random(1500, 600, density=0.03, format="csc", random_state=5, dtype=np.float32))
    rng = np.random.default_rng(5)
    u, U = rng.standard_normal(600), rng.standard_normal((600, 3))
    D = X.toarray().astype(np.float64)
    with cluster_client.as_current():
        for std in (None, "zscore"):
            with dask.config.set(ALL):
                M = as_matrix(X, block_width=70, standardize=std, persist=True)
                cluster_client.run(lambda: shm._WMAPS.clear())
                got = [M.matvec(u), M.matvec(U)]
                used = cluster_client.run(_worker_results_maps)
            assert all(used.values()), used  # the partials went through the results file
            with dask.config.set({"dufs.engine.shared-memory": "off"}):
                want = [M.matvec(u), M.matvec(U)]
            Z = D if std is None else (D - D.mean(axis=0)) / np.where(D.std(axis=0) > 0, D.std(axis=0), 1.0)
            for g, w, x in zip(got, want, (u, U), strict=True):
                np.testing.assert_array_equal(g, w)
                np.testing.assert_allclose(g, Z @ x, rtol=0, atol=1e-12 * np.abs(Z @ x).max())
            M.release()


def test_resolved_maps_shared_arrays_inside_containers_and_dataclasses():
    """What the engine gives a method's function: every SharedArray mapped, inside lists, tuples, dicts and
    dataclasses (a copy with the field replaced); anything without one is returned as it is."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Spec:
        m: int
        yn: object = None

    a = np.arange(300_000, dtype=np.float64)
    plain = (1, [2.0, "x"], {"k": a}, Spec(3, a))
    assert shm.resolved(plain) is plain and shm.resolved(plain[3]) is plain[3]
    with shm.publish(a) as ref:
        got = shm.resolved((ref, [ref, 2], {"k": ref}, Spec(3, ref), 5))
        for x in (got[0], got[1][0], got[2]["k"], got[3].yn):
            assert isinstance(x, np.ndarray) and not x.flags.writeable
            np.testing.assert_array_equal(x, a)
        assert got[1][1] == 2 and got[3].m == 3 and got[4] == 5 and type(got[1]) is list
    with shm.receive((4, 3), np.float64) as (ref, view):
        out = shm.resolved([ref])[0]  # a results' file: given for writing, the driver's view sees the writes
        out[1] = 7.0
        np.testing.assert_array_equal(view[1], [7.0, 7.0, 7.0])
