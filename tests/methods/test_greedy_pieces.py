"""A greedy selection's work over the samples in row pieces, one a worker (dufs.methods.greedy.pieces, the path
of workers on several machines; ``dufs.engine.side-pieces: on`` makes a piece a worker process on this machine):
the picks are the driver's and the criterion and objective equal up to the order of additions; a kNN graph's
side stays whole; a worker that keeps a piece, killed mid-run, changes nothing."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.engine import Matrix, as_matrix, piece_bounds
from dufs.methods.greedy.pieces import _column_rows

K = 12
_PIECES = {"dufs.engine.shared-memory": "off", "dufs.engine.kept-vectors": "on", "dufs.engine.side-pieces": "on"}


def _data(seed=1):
    return sp.random_array((120, 80), density=0.1, rng=seed, format="csr")


def _fit(X, method, client, graph):
    kw = {"graph": "anchor", "n_anchors": 16, "embed_dim": 8} if graph == "anchor" else {"n_neighbors": 4}
    if method == "jcfs":
        kw = {**kw, "n_clusters": 3, "max_iter": 2}
    return dufs.fit(X, method=method, n_features=K, standardize=None, client=client, **kw)


def test_a_column_cut_to_a_piece_of_rows():
    rows, vals = np.array([0, 3, 4, 9], dtype=np.int32), np.array([1.0, 2.0, 3.0, 4.0])
    got = [_column_rows((rows, vals), a, b) for a, b in zip(piece_bounds(10, 3)[:-1], piece_bounds(10, 3)[1:],
                                                             strict=True)]
    assert piece_bounds(10, 3) == [0, 3, 6, 10]
    assert [g[0].tolist() for g in got] == [[0], [0, 1], [3]]
    assert [g[1].tolist() for g in got] == [[1.0], [2.0, 3.0], [4.0]]
    assert got[0][0].dtype == np.int32


def test_a_piece_of_v_takes_the_whole_vectors_dtype():
    """LapAOFS's V goes to the blocks in float32 once the whole n x 2 vector passes 8 MiB in float64; a piece of it
    takes the whole vector's dtype, not its own size's, so that V has the same bits on any number of machines."""
    from dufs.kernels.greedy import A_OPTIMAL, JCFS
    from dufs.methods.greedy.side import step_vectors

    piece = np.random.default_rng(0).standard_normal((1000, 2))
    n = (1 << 23) // 16 + 1  # n x 2 float64 just over 8 MiB
    assert step_vectors(piece, (), mode=A_OPTIMAL)[1][0].dtype == np.float64
    got = step_vectors(piece, (), mode=A_OPTIMAL, rows=n)[1][0]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, piece.astype(np.float32))
    assert step_vectors(piece, (), mode=A_OPTIMAL, rows=n - 1)[1][0].dtype == np.float64
    assert step_vectors(piece, (), mode=JCFS, rows=n)[1][0].dtype == np.float64  # JCFS's ratios need float64


@pytest.mark.parametrize("method,graph", [("lapaofs", "anchor"), ("lapdofs", "anchor"), ("jcfs", "anchor"),
                                          ("lapaofs", "knn")])
def test_pieces_select_what_the_driver_does(cluster_client, method, graph):
    import dask

    X = _data()
    got = {}
    with cluster_client.as_current():
        M = as_matrix(X, block_width=8, persist=True)
        for how, cfg in (("driver", {"dufs.engine.kept-vectors": "off"}), ("pieces", _PIECES)):
            with dask.config.set({"dufs.engine.shared-memory": "off", **cfg}):
                got[how] = _fit(M, method, cluster_client, graph)
        M.release()
    a, b = got["driver"], got["pieces"]
    assert a.diagnostics["samples_side"] == "driver"
    # a kNN graph's Laplacian mixes the rows: its side stays whole, on one worker
    assert b.diagnostics["samples_side"] == ("one worker" if graph == "knn" else "2 pieces")
    np.testing.assert_array_equal(b.indices, a.indices)
    for key in ("criterion", "objective"):
        if key in a.diagnostics:
            np.testing.assert_allclose(b.diagnostics[key], a.diagnostics[key], rtol=1e-10, atol=1e-12)


def _kept_here() -> int:
    from dufs.engine import kept

    return len(kept._KEPT)


@pytest.mark.slow
def test_a_worker_that_keeps_a_piece_killed_mid_run_changes_nothing(monkeypatch, tmp_path):
    """(A LocalCluster of its own: one of its two workers is SIGKILLed at the fifth pass of the second run.)"""
    import dask

    distributed = pytest.importorskip("distributed")
    path = str(tmp_path / "x.zarr")
    dufs.write_store(_data(2), path, y=np.zeros(120), feature_block=10)

    def run(client):
        M = Matrix(path).persist()
        try:
            return _fit(M, "lapaofs", client, "anchor")
        finally:
            M.release()

    with (distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                   silence_logs=50) as cluster,
          distributed.Client(cluster, set_as_default=False) as client, client.as_current(), dask.config.set(_PIECES)):
        client.wait_for_workers(2)
        ref = run(client)
        assert ref.diagnostics["samples_side"] == "2 pieces"
        client.wait_for_workers(2)
        real, count, fired = Matrix.map_blocks, [0], []

        def killing(self, *a, **k):
            count[0] += 1
            if count[0] == 5 and not fired:
                pids = client.run(os.getpid)
                holders = sorted(w for w, n in client.run(_kept_here).items() if n)
                assert len(holders) == 2, "each worker keeps a piece"
                fired.append(holders[1])
                os.kill(pids[holders[1]], signal.SIGKILL)
            return real(self, *a, **k)

        monkeypatch.setattr(Matrix, "map_blocks", killing)
        got = run(client)
    assert fired
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.diagnostics["criterion"], ref.diagnostics["criterion"], rtol=1e-10)
    assert got.diagnostics["recoveries"] >= 1


def test_pieces_that_land_on_one_worker_are_made_again_not_waited_on(cluster_client, monkeypatch):
    """Two pieces on one worker (the worker named for one was lost while they were made, and its task ran on the
    other's): their steps' all-reduce would wait rank on rank in that worker's one thread until the exchange's
    timeout. They are taken as lost at once and made again on the workers there are; no step runs among them."""
    import dask

    from dufs.methods.greedy import pieces, run

    X = _data(3)
    real_workers, real_calls = run.piece_workers, pieces.kept_calls
    asked, peers_of_steps = [], []

    def workers(client, n):  # the first time, both pieces named on one worker
        got = real_workers(client, n)
        asked.append(got)
        return [got[0]] * len(got) if len(asked) == 1 else got

    def calls(client, fn, calls_, **kw):
        if fn is pieces.piece_call:
            peers_of_steps.append(list(calls_[0][6]))
        return real_calls(client, fn, calls_, **kw)

    monkeypatch.setattr(run, "piece_workers", workers)
    monkeypatch.setattr(pieces, "kept_calls", calls)
    with cluster_client.as_current():
        M = as_matrix(X, block_width=8, persist=True)
        with dask.config.set({"dufs.engine.shared-memory": "off", "dufs.engine.kept-vectors": "off"}):
            want = _fit(M, "lapaofs", cluster_client, "anchor")
        with dask.config.set(_PIECES):
            got = _fit(M, "lapaofs", cluster_client, "anchor")
        M.release()
    assert len(asked) >= 2 and peers_of_steps
    assert all(len(set(p)) == len(p) for p in peers_of_steps), peers_of_steps
    assert got.diagnostics["recoveries"] >= 1 and got.diagnostics["samples_side"] == "2 pieces"
    np.testing.assert_array_equal(got.indices, want.indices)
