"""The emulated multi-machine cluster (issue 57): machines in network namespaces that dufs must treat as remote,
their links counted, and nothing left behind."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

import dufs
from dufs.testing.emulated import EmulatedCluster, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


def _leftovers(token: str) -> list[str]:
    """Namespaces and links of the cluster ``token`` still on this machine."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return [line for line in (ns + links).splitlines() if token in line]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    X = sp.random(3000, 600, density=0.02, format="csr", random_state=rng, dtype=np.float64)
    y = np.where(X[:, :10].sum(axis=1) > 0, 1.0, -1.0)
    path = tmp_path_factory.mktemp("emulated") / "x.zarr"
    dufs.write_store(X, path, y, feature_block=100)
    return str(path)


def test_machines_are_remote_their_links_counted_and_removed(store):
    from distributed import Client

    from dufs.engine.shm import workers_share_memory

    want = {m: dufs.fit(store, method=m, n_features=15) for m in ("variance", "fisher")}
    with EmulatedCluster(machines=2, procs=1) as cluster:
        token = cluster.token
        assert _leftovers(token)
        with Client(cluster.address) as client:
            # the workers do not see this process's /dev/shm: every shortcut of a shared machine is off
            assert workers_share_memory(client) == 0
            hosts = {w["host"] for w in client.scheduler_info(n_workers=-1)["workers"].values()}
            assert hosts == set(cluster.machine_addresses)
            before = cluster.link_bytes()
            got = {m: dufs.fit(store, method=m, n_features=15, client=client) for m in want}
            moved = EmulatedCluster.since(before, cluster.link_bytes())
    for m, sel in got.items():
        np.testing.assert_array_equal(sel.indices, want[m].indices)
        np.testing.assert_allclose(sel.scores, want[m].scores, rtol=1e-12)
    # every machine read its blocks' tasks and sent results back over its link
    assert all(b.into > 0 and b.out_of > 0 for b in moved), moved
    assert _leftovers(token) == []


def test_a_cluster_that_cannot_start_leaves_nothing():
    cluster = EmulatedCluster(machines=2, procs=1, memory_limit="not-a-size")
    with pytest.raises(RuntimeError, match="ended|did not get"):
        with cluster:
            pass
    assert _leftovers(cluster.token) == []


_HOLD = """
import sys, time
from dufs.testing.emulated import EmulatedCluster
with EmulatedCluster(machines=1, procs=1) as c:
    print(c.token, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_killed_driver_leaves_nothing_for_long(how):
    """SIGTERM: the cluster cleans up before the driver exits; SIGKILL: the next cluster (or remove_leftovers)
    removes what the dead driver left."""
    import signal
    import sys

    from dufs.testing import patience
    from dufs.testing.emulated import remove_leftovers

    p = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
    try:
        token = p.stdout.readline().strip()
        assert token and _leftovers(token)
        p.send_signal(getattr(signal, how))
        p.wait(timeout=patience(60))
    finally:
        if p.poll() is None:
            p.kill()
    if how == "SIGTERM":
        assert p.returncode != 0 and _leftovers(token) == []
    else:
        assert _leftovers(token)  # nothing ran: the namespaces are still there
        assert token in remove_leftovers()
        assert _leftovers(token) == []


def test_the_client_for_a_scheduler_address_fetches_from_the_workers_itself(tmp_path):
    """`dufs select --scheduler` (get_client with an address): vectors and results go between the driver and the
    workers, not through the scheduler, which relayed twice the driver's bytes (docs/scaling.md). Many samples, so
    that MMFS's w (8 n bytes a round) outweighs the scheduler's own messages."""
    from dufs.engine import get_client

    rng = np.random.default_rng(4)
    X = sp.random(200_000, 400, density=0.01, format="csr", random_state=rng, dtype=np.float64)
    y = np.where(X[:, :10].sum(axis=1) > 0, 1.0, -1.0)
    store = str(tmp_path / "wide.zarr")
    dufs.write_store(X, store, y, feature_block=100)
    with EmulatedCluster(machines=2, procs=1) as cluster, get_client(scheduler_address=cluster.address) as client:
        dufs.fit(store, method="variance", n_features=5, client=client)  # blocks persisted, warm
        s0, d0 = cluster.scheduler_bytes(), cluster.driver_bytes()
        dufs.fit(store, method="mmfs", n_features=5, client=client, max_epochs=5)
        s1, d1 = cluster.scheduler_bytes(), cluster.driver_bytes()
    sched = (s1.into - s0.into) + (s1.out_of - s0.out_of)
    driver = (d1.into - d0.into) + (d1.out_of - d0.out_of)
    assert driver > 100_000  # w and the results went through the driver's link
    assert sched < 0.25 * driver, (sched, driver)


def test_a_vector_every_worker_reads_reaches_each_machine_that_reads_it_once():
    """``shipped(..., broadcast=True)`` on workers of several machines, sent on by the pass to its readers'
    machines (:func:`~dufs.engine.dispatch.spread`): one copy a machine, copied between the machines (the driver
    sends it once), read by both of a machine's worker processes; a machine none of whose workers read it gets
    nothing (issue 57: the bytes into a machine must not grow with its processes, nor the driver's with the
    machines)."""
    import zlib

    from distributed.comm import get_address_host

    from dufs.engine import get_client
    from dufs.engine.dispatch import shipped, spread

    v = np.random.default_rng(0).standard_normal(1_000_000)  # 8 MB
    with EmulatedCluster(machines=4, procs=2) as cluster, get_client(scheduler_address=cluster.address) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        idle = cluster.machine_addresses[3]  # the fourth machine reads nothing
        readers = [w for w in workers if get_address_host(w) != idle]
        assert len(readers) == 6
        before, d0 = cluster.link_bytes(), cluster.driver_bytes()
        with shipped(v, broadcast=True) as ref:
            spread(client, [ref], readers)
            crcs = client.gather([client.submit(zlib.crc32, ref, workers=[w], pure=False) for w in readers])
        moved, d1 = EmulatedCluster.since(before, cluster.link_bytes()), cluster.driver_bytes()
    assert crcs == [zlib.crc32(v)] * 6  # every reader read all of it
    assert all(0.9 * v.nbytes < b.into < 1.3 * v.nbytes for b in moved[:3]), moved
    assert moved[3].into < 0.05 * v.nbytes, moved
    assert d1.out_of - d0.out_of < 1.3 * v.nbytes


def test_a_product_on_several_machines_is_a_task_a_worker_not_a_block():
    """Z U on workers of several machines: one task a worker process (its blocks accumulated into one buffer), the
    partials summed within each machine, then over the machines (issue 57: tasks a pass a small multiple of the
    machines, not of the blocks); the product NumPy's."""
    from distributed import get_task_stream

    from dufs.engine import as_matrix, get_client

    rng = np.random.default_rng(4)
    X = sp.random(2000, 400, density=0.03, format="csr", random_state=rng, dtype=np.float64)
    U = rng.standard_normal((400, 3))
    with (EmulatedCluster(machines=2, procs=2) as cluster,
          get_client(scheduler_address=cluster.address) as client, client.as_current()):
        M = as_matrix(X, block_width=25, persist=True, standardize=None)
        assert M.n_blocks == 16
        M.matvec(U)  # the placement asked once
        with get_task_stream(client) as ts:
            got = M.matvec(U)
    np.testing.assert_allclose(got, X @ U, rtol=1e-12, atol=1e-12)
    names = [t["key"][0] if isinstance(t["key"], tuple) else t["key"] for t in ts.data]
    products = [k for k in names if "matvec" in k]
    assert len(products) == 4 and all(k.startswith("partition_matvec") for k in products), names
    assert len(names) <= 4 + 3 + 2, names  # the products, the adds, and the vector's pieces



def test_a_sum_over_machines_goes_in_pieces_peer_to_peer():
    """A sum of one n-vector a machine over four machines (:func:`~dufs.engine.dispatch.tree_sum_machines`): each
    machine's partial cut into four pieces, each piece added on its machine and the sums gathered at the root
    (:mod:`dufs.engine.exchange`), so the root receives 2 x 3/4 of a partial and the others 3/4, where the binary
    tree took two partials into its root (issue 57: the bytes into a machine must not grow with log2 W); the sum the
    tree's, bit for bit."""
    import dask

    from dufs.engine import get_client
    from dufs.engine.dispatch import machines, tree_sum_machines, tree_sum_values

    n = 1_000_000  # 8 MB a partial
    with EmulatedCluster(machines=4, procs=1) as cluster, get_client(scheduler_address=cluster.address) as client:
        homes = [ws[0] for ws in machines(client).values()]
        assert len(homes) == 4

        def parts():
            out = []
            for i, w in enumerate(homes):
                with dask.annotate(workers=[w], allow_other_workers=False):
                    out.append(dask.delayed(np.random.default_rng(i).standard_normal, pure=False)(n))
            return out

        got = {}
        for how in ("tree", "auto"):
            with dask.config.set({"dufs.engine.machine-sums": how}):
                total = tree_sum_machines(parts(), homes, client)
                before = cluster.link_bytes()
                fut = client.compute(total)
                client.gather(fut)  # counted to the end of the sum, before the driver fetches it
                moved = EmulatedCluster.since(before, cluster.link_bytes())
                got[how] = (fut.result(), [b.into for b in moved])
                del fut
    want = tree_sum_values([np.random.default_rng(i).standard_normal(n) for i in range(4)])
    for how, (value, _) in got.items():
        np.testing.assert_array_equal(value, want, err_msg=how)
    part = 8 * n
    tree, pieces = got["tree"][1], got["auto"][1]
    assert max(tree) > 1.9 * part, tree  # the tree's root: two partials
    assert max(pieces) < 1.6 * part and min(pieces) > 0.7 * part, pieces  # 2 x 3/4 at the root, 3/4 elsewhere

def test_a_product_over_machines_sends_each_machine_s_touched_rows_only():
    """Z U over four machines, the partials added by a reduce-scatter: each machine's partial is zero off the rows
    its blocks touch, so it sends only those rows of each piece (:mod:`dufs.engine.touched`), 1 - exp(-0.5) = 0.39
    of them here (two nonzeros a row, a quarter of the features a machine); the product the same bits as with the
    whole pieces, and NumPy's. Each partition's product runs where its blocks are: none of them moves. Where a
    machine touches nearly every row, its pieces go whole."""
    import dask

    from dufs.engine import as_matrix, get_client

    rng = np.random.default_rng(8)
    X = sp.random(100_000, 800, density=0.0025, format="csr", random_state=rng, dtype=np.float64)
    U = rng.standard_normal((800, 2))
    dense = sp.random(20_000, 800, density=0.05, format="csr", random_state=rng, dtype=np.float64)
    got = {}
    with (EmulatedCluster(machines=4, procs=1) as cluster,
          get_client(scheduler_address=cluster.address) as client, client.as_current()):
        for name, Z in (("", X), ("dense ", dense)):
            M = as_matrix(Z, block_width=100, persist=True, standardize=None)
            for how in ("off", "on"):
                with dask.config.set({"dufs.engine.touched-rows": how}):
                    M.matvec(U)  # the placement, and the rows touched, made once
                    before = cluster.link_bytes()
                    value = M.matvec(U)
                    got[name + how] = (value, sorted(b.into for b in EmulatedCluster.since(before,
                                                                                            cluster.link_bytes())))
    # where each machine touches nearly every row (ten nonzeros a row a machine), the pieces go whole: no more bytes
    np.testing.assert_array_equal(got["dense on"][0], got["dense off"][0])
    np.testing.assert_allclose(got["dense on"][0], dense @ U, rtol=1e-12, atol=1e-12)
    assert sum(got["dense on"][1]) < 1.02 * sum(got["dense off"][1]), got
    np.testing.assert_array_equal(got["on"][0], got["off"][0])
    np.testing.assert_allclose(got["on"][0], X @ U, rtol=1e-12, atol=1e-12)
    part = 8 * U.shape[1] * X.shape[0]
    off, on = got["off"][1], got["on"][1]  # into each machine, sorted: the root's (the summed pieces too) last
    assert all(0.7 * part < b < 0.8 * part for b in off[:3]) and 1.45 * part < off[3] < 1.6 * part, off
    assert all(0.25 * part < b < 0.35 * part for b in on[:3]), on  # 3/4 of a partial x 0.39 of its rows
    assert on[3] < off[3] - 0.3 * part, on


_ITERATIVE = {
    "mmfs": {"tol": 1e-6},
    "lapaofs": {"graph": "anchor", "n_anchors": 32, "embed_dim": 8},
    "lapdofs": {"graph": "anchor", "n_anchors": 32, "embed_dim": 8},
    "jcfs": {"graph": "anchor", "n_anchors": 32, "embed_dim": 8, "max_iter": 2, "n_clusters": 2},
    "m3fs": {"solver": "alternating", "graph": "anchor", "n_anchors": 32, "embed_dim": 8, "max_iter": 2,
             "n_clusters": 2, "max_passes": 40},  # its passes budgeted: the same path, a fraction of the time
    "ufcm": {"max_iter": 3, "n_clusters": 2, "n_components": 2},
}


def test_every_iterative_method_selects_on_machines_what_it_selects_on_one(store):
    """The remote paths (one copy of a vector a machine, partial scores summed on the workers) select what a
    LocalCluster of as many worker processes on the path remote workers take selects: the same features, the
    scores equal but for the order of floating-point sums; MMFS's objective within its duality gap."""
    import dask
    from distributed import Client, LocalCluster

    def fits(client):
        return {m: dufs.fit(store, method=m, n_features=12, client=client, **kw) for m, kw in _ITERATIVE.items()}

    with dask.config.set({"dufs.engine.shared-memory": "off", "dufs.engine.direct-passes": "off"}), \
            LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            Client(lc) as client:
        want = fits(client)
    with EmulatedCluster(machines=2, procs=2) as cluster, Client(cluster.address) as client:
        got = fits(client)
    for m in _ITERATIVE:
        if m == "mmfs":
            a, b = got[m].diagnostics, want[m].diagnostics
            assert abs(a["objective"] - b["objective"]) <= a["duality_gap"] + b["duality_gap"] + 1e-9, (a, b)
            continue
        np.testing.assert_array_equal(got[m].indices, want[m].indices, err_msg=m)
        np.testing.assert_allclose(got[m].scores, want[m].scores, rtol=1e-9, atol=1e-12, err_msg=m)


def _two_clusters(n: int, seed: int) -> sp.csr_matrix:
    """``n`` rows, 2400 features, in two clusters (eight features mark the first)."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, 2400, density=0.002, format="lil", random_state=rng, dtype=np.float64)  # W step matrix-free
    X[: n // 2, :8] = rng.random((n // 2, 8))
    return X.tocsr()


def _two_clusters_on_three_processes(tmp_path, n: int, seed: int, method: str, kw: dict):
    """A store of ``n`` rows in two clusters (eight features mark the first; above the size a sum over machines
    goes whole), and ``method``'s selection on it by a LocalCluster of three worker processes on the path remote
    workers take: (its path, the selection)."""
    import dask
    from distributed import Client, LocalCluster

    path = tmp_path / f"{method}.zarr"
    dufs.write_store(_two_clusters(n, seed), path, feature_block=400)
    with dask.config.set({"dufs.engine.shared-memory": "off", "dufs.engine.direct-passes": "off"}), \
            LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            Client(lc) as client:
        return path, dufs.fit(str(path), method=method, n_features=8, client=client, **kw)


def test_ufcm_on_three_machines_reads_y_where_the_reduce_scatter_summed_it(tmp_path, monkeypatch):
    """UFCM on three machines: W in pieces beside the blocks, Y and the labels in a piece of rows a machine, each
    piece reading its rows of Zc W where the pass's reduce-scatter added them (no gather at the root), the labels
    sent to the W step's pass as the rows each machine's blocks touch. It selects
    what a LocalCluster of as many worker processes selects, the scores equal but for the order of the sums."""
    from distributed import Client

    from dufs.engine import stateful
    from dufs.methods.ufcm import pieces

    kw = {"max_iter": 3, "n_clusters": 2, "n_components": 2}
    path, want = _two_clusters_on_three_processes(tmp_path, 20_000, 5, "ufcm", kw)  # Y (n x 2) above that size
    reads: list = []
    real = pieces.PieceY._held

    def held(self, h):
        got = real(self, h)
        reads.append(hasattr(got[0][0], "key"))  # a future of the piece's own rows, not (address, token)
        return got

    monkeypatch.setattr(pieces.PieceY, "_held", held)
    touched: list = []  # the W step's labels go to each machine as the rows its blocks touch
    real_mv = stateful.machine_vectors
    monkeypatch.setattr(stateful, "machine_vectors", lambda *a: touched.append(1) or real_mv(*a))
    with EmulatedCluster(machines=3, procs=1) as cluster, Client(cluster.address) as client:
        got = dufs.fit(str(path), method="ufcm", n_features=8, client=client, **kw)
    assert touched, touched
    d = got.diagnostics
    # W in a piece a worker that holds blocks when it starts (a block may have moved to another machine by then)
    assert d["y_side"] == "3 pieces" and d["w_side"] in ("2 pieces", "3 pieces"), d
    assert reads and all(reads), reads
    np.testing.assert_array_equal(got.indices, want.indices)
    assert set(got.indices[:8]) == set(range(8))
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-9, atol=1e-12)


def test_m3fs_on_three_machines_reads_its_scores_where_the_reduce_scatter_summed_them(tmp_path, monkeypatch):
    """M3FS on three machines: the v-step's scores in a piece of rows a machine, made in the order in which the
    pass's reduce-scatter leaves its sum, so that each piece reads its rows (and the nine dots) of the pass's sum
    where they were added (no gather at the root, no fetches), and R sent from its pieces to each machine as the
    rows its blocks touch. It selects what a LocalCluster of as many worker
    processes selects, the scores equal but for the order of the sums."""
    from distributed import Client

    from dufs.engine import HeldPieces, stateful
    from dufs.methods.m3fs import piece_scores

    kw = _ITERATIVE["m3fs"]
    path, want = _two_clusters_on_three_processes(tmp_path, 40_000, 6, "m3fs", kw)  # the scores above that size
    reads: list = []
    real = piece_scores.PieceScores.trial

    def trial(self, both, *a):
        reads.append(isinstance(both, HeldPieces) and both.receivers == self.peers)
        return real(self, both, *a)

    monkeypatch.setattr(piece_scores.PieceScores, "trial", trial)
    touched: list = []  # R goes to each machine as the rows its blocks touch
    real_mv = stateful.machine_vectors
    monkeypatch.setattr(stateful, "machine_vectors", lambda *a: touched.append(1) or real_mv(*a))
    with EmulatedCluster(machines=3, procs=1) as cluster, Client(cluster.address) as client:
        got = dufs.fit(str(path), method="m3fs", n_features=8, client=client, **kw)
    assert reads and all(reads), reads
    assert len(touched) == len(reads), (len(touched), len(reads))
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-9, atol=1e-12)


def test_a_greedy_step_sends_each_machine_the_rows_its_blocks_touch(tmp_path, monkeypatch):
    """LapAOFS on three machines with its side in pieces of rows: each pass gets V as the rows of each machine's
    blocks, from the pieces where they were made (no whole copy); the rows a machine is sent are fewer than n and,
    over the machines, are the rows with a nonzero (SciPy's). It selects what a LocalCluster of as many worker
    processes selects, the scores equal but for the order of the sums."""
    from distributed import Client

    from dufs.engine import stateful

    kw = _ITERATIVE["lapaofs"]
    n = 20_000
    path, want = _two_clusters_on_three_processes(tmp_path, n, 7, "lapaofs", kw)
    layouts: list = []
    real = stateful.machine_vectors

    def spy(executor, client, v, groups, hosts, workers):
        got = real(executor, client, v, groups, hosts, workers)
        layouts.extend(lay for key, lay in executor.touched.items()  # the layout over V's pieces
                       if key[1] == tuple(k.address for k in v.pieces) and key[2] == tuple(v.bounds))
        return got

    monkeypatch.setattr(stateful, "machine_vectors", spy)
    with EmulatedCluster(machines=3, procs=1) as cluster, Client(cluster.address) as client:
        got = dufs.fit(str(path), method="lapaofs", n_features=8, client=client, **kw)
        rows = client.gather(list(layouts[-1].rows.values())) if layouts else []
    assert len(layouts) >= 7, len(layouts)  # every step after the first
    assert len(rows) == 3 and all(len(r) < n for r in rows), [len(r) for r in rows]
    touched = np.unique(_two_clusters(n, 7).nonzero()[0])
    np.testing.assert_array_equal(np.unique(np.concatenate(rows)), touched)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-9, atol=1e-12)


def _kept_here() -> int:
    from dufs.engine.kept import _KEPT

    return len(_KEPT)


@pytest.mark.parametrize("method", ["lapaofs", "m3fs"])
def test_a_worker_killed_mid_run_on_the_touched_rows_path_changes_nothing(tmp_path, monkeypatch, method):
    """LapAOFS and M3FS on three machines of two processes, their vectors (V, R) and M3FS's sums sent as the rows
    each machine touches: a worker that keeps a piece SIGKILLed at the fifth pass (its touched rows, its pieces and
    its blocks with it). The run recovers (the vectors made again, the rows touched made again for the new
    placement) and selects what it selects undisturbed."""
    import os
    import signal

    from distributed import Client

    from dufs.engine import Matrix, stateful

    # (M3FS's passes not budgeted: a recovery spends passes, and the budget would stop it elsewhere)
    kw = {k: v for k, v in _ITERATIVE[method].items() if k != "max_passes"}
    path = tmp_path / "x.zarr"
    dufs.write_store(_two_clusters(40_000, 9), path, feature_block=400)

    def run(client):
        M = Matrix(str(path)).persist()
        try:
            return dufs.fit(M, method=method, n_features=8, client=client, **kw)
        finally:
            M.release()

    with EmulatedCluster(machines=3, procs=2) as cluster, Client(cluster.address) as client:
        ref = run(client)
        real, count, fired = Matrix.map_blocks, [0], []

        def killing(self, *a, **k):
            count[0] += 1
            if count[0] == 5 and not fired:
                pids = client.run(os.getpid)
                holders = sorted(w for w, n in client.run(_kept_here).items() if n)
                fired.append(holders[1])
                os.kill(pids[holders[1]], signal.SIGKILL)
            return real(self, *a, **k)

        monkeypatch.setattr(Matrix, "map_blocks", killing)
        touched: list = []
        real_mv = stateful.machine_vectors
        monkeypatch.setattr(stateful, "machine_vectors", lambda *a: touched.append(1) or real_mv(*a))
        got = run(client)
    assert fired and touched
    np.testing.assert_array_equal(got.indices, ref.indices)
    np.testing.assert_allclose(got.scores, ref.scores, rtol=1e-9, atol=1e-12)
    if method == "lapaofs":
        np.testing.assert_allclose(got.diagnostics["criterion"], ref.diagnostics["criterion"], rtol=1e-10)
        assert got.diagnostics["recoveries"] >= 1
