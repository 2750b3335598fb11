"""MMFS survives lost workers and killed drivers: alpha is gathered to the driver and checkpointed (atomically)
every few rounds, the block state is rebuilt from it, and ``resume=True`` continues from the checkpoint."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize

import dufs
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.mmfs import gram, mmfs, partition
from dufs.methods.mmfs import solver as mmfs_solver
from dufs.testing import patience

GAMMA = 0.2
STORE_CFG = {"dufs.store.feature-block-nnz": 200, "dufs.store.feature-granule": 8}


@pytest.fixture(autouse=True)
def _many_rounds(monkeypatch):
    """These tests lose workers, block state and drivers mid-solve, so the solve here runs many rounds: an epoch
    over every feature first and the working sets' epochs over their nonzeros (in this process; by default, from
    the features of the largest margins and through the working sets' Gram matrix, this problem takes two)."""
    monkeypatch.setattr(mmfs_solver, "_SCREEN", 0)
    monkeypatch.setattr(gram, "GRAM_MAX", 0)


def _problem(seed=3, n=200, d=64):
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.3, rng=rng, format="csr")
    y = np.where(rng.standard_normal(n) + 2 * X[:, :3].toarray().sum(1) > 0.6, 1.0, -1.0)
    return X, y


def _qp_objective(X, y, gamma, C=1.0):
    """The dual optimum by L-BFGS-B on the dense dual, MMFS columns under standardize="scale"."""
    D = X.toarray()
    sd = D.std(0)
    sd[(sd == 0) | (D.max(0) == D.min(0))] = 1.0
    F = D / sd / np.sqrt(D.shape[0])
    yc = y - y.mean()
    rho = np.abs(F.T @ (yc / np.linalg.norm(yc)))
    K = F.T @ F + gamma
    res = minimize(lambda a: 0.5 * a @ K @ a - rho @ a, np.zeros(F.shape[1]), jac=lambda a: K @ a - rho,
                   method="L-BFGS-B", bounds=[(0.0, C)] * F.shape[1],
                   options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000, "maxcor": 50})
    return float(res.fun)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    X, y = _problem()
    path = str(tmp_path_factory.mktemp("mmfs-res") / "store.zarr")
    with dask.config.set(STORE_CFG):
        dufs.write_store(X, path, y)
    return {"X": X, "y": y, "path": path, "fref": _qp_objective(X, y, GAMMA)}


def _ckpt_round(path):
    with np.load(path) as z:
        return json.loads(bytes(z["meta"]).decode())["round"]


def _matches(d, fref, tol):
    assert d["converged"]
    assert -1e-12 <= d["objective"] - fref <= d["duality_gap"] + 1e-12
    assert d["objective"] == pytest.approx(fref, rel=2 * tol)


def _kept_here() -> int:
    from dufs.engine import kept

    return len(kept._KEPT)


@pytest.mark.slow
@pytest.mark.parametrize("kept", [False, True], ids=["driver", "kept"])
def test_sigkill_of_a_worker_mid_solve_finishes_with_the_same_objective(problem, cluster_client, kept):
    """A worker killed after round 1; with ``kept``, the worker that keeps w and its changes (dufs.engine.kept,
    the path of workers on several machines), so that w is made again from the last alpha. On the session's
    cluster (its nanny restarts the killed worker; the test waits for it before it ends), not one of its own: a
    cluster started and its workers' imports made cost more than the solves themselves."""
    class Killer(logging.Handler):
        fired = False

        def __init__(self, pick):
            super().__init__()
            self.pick = pick

        def emit(self, record):
            # after round 1 (of 3: the workers solve this problem's working sets through their Gram matrix, the
            # fixture above reaches no further than this process)
            if not self.fired and record.getMessage().startswith("round 1:"):
                Killer.fired = True
                addr, pid = self.pick()
                os.kill(pid, signal.SIGKILL)
                # until the scheduler has seen it go: the solve may otherwise finish its last round before it
                # does, and count no lost worker
                deadline = time.monotonic() + patience(60)
                while addr in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
                    time.sleep(0.05)

    tol = 1e-6
    lg = logging.getLogger("dufs.methods.mmfs.solver")  # the solver logs its rounds
    cfg = {"dufs.engine.shared-memory": "off", "dufs.engine.kept-vectors": "on"} if kept else {}
    client = cluster_client
    with client.as_current(), dask.config.set(cfg):
        M = as_matrix(problem["path"], standardize="scale", persist=True)
        assert M.n_blocks >= 4 and M.residency["mode"] == "persisted"
        ref = mmfs(M, problem["y"], gamma=GAMMA, tol=tol, max_epochs=3000, checkpoint=None)

        def pick():
            pids = client.run(os.getpid)
            if kept:  # the worker keeping the vectors
                holders = [a for a, k in client.run(_kept_here).items() if k]
                assert holders, "no worker keeps w"
                return holders[0], pids[holders[0]]
            return min(pids.items(), key=lambda kv: kv[1])

        handler = Killer(pick)
        old = lg.level
        lg.setLevel(logging.DEBUG)
        lg.addHandler(handler)
        try:
            res = mmfs(M, problem["y"], gamma=GAMMA, tol=tol, max_epochs=3000, checkpoint=None, checkpoint_every=2)
        finally:
            lg.removeHandler(handler)
            lg.setLevel(old)
        M.release()
        client.wait_for_workers(2, timeout=patience(120))  # the restarted worker, for the tests after this one
    assert Killer.fired
    d = res.diagnostics
    _matches(d, problem["fref"], tol)
    _matches(ref.diagnostics, problem["fref"], tol)
    # the loss is reported: dask recomputed the lost work from the graph, or the state was rebuilt from alpha
    assert d["workers_lost"] + d["recoveries"] >= 1
    assert d["objective"] == pytest.approx(ref.diagnostics["objective"], rel=2 * tol)


def test_lost_block_state_is_rebuilt_from_the_last_gathered_alpha(problem, tmp_path, monkeypatch):
    """A round that fails as a lost future does is replayed from the driver's copy of alpha."""
    tol = 1e-7
    M = Matrix(problem["X"], standardize="scale", block_width=8)
    real = Matrix.map_blocks
    calls = {"round": 0}

    def flaky(self, fn, *args, **kwargs):
        if fn is partition._round:
            calls["round"] += 1
            if calls["round"] in (4, 7):
                raise concurrent.futures.CancelledError("the worker holding the state was lost")
        return real(self, fn, *args, **kwargs)

    monkeypatch.setattr(Matrix, "map_blocks", flaky)
    with dask.config.set(scheduler="sync"):
        res = mmfs(M, problem["y"], gamma=GAMMA, tol=tol, max_epochs=3000, checkpoint=str(tmp_path / "ck"),
                   checkpoint_every=2)
    d = res.diagnostics
    assert d["recoveries"] == 2 and d["rounds_replayed"] >= 1
    assert [t["round"] for t in d["trace"]] == list(range(d["rounds"]))
    _matches(d, problem["fref"], tol)


def test_killed_driver_resumes_from_the_checkpoint(problem, tmp_path):
    ck = tmp_path / "ck"
    script = textwrap.dedent(f"""
        import logging, time
        import dask
        from dufs.engine import Matrix
        from dufs.methods.mmfs import mmfs

        class Slow(logging.Handler):
            def emit(self, record):
                time.sleep(0.03)

        lg = logging.getLogger("dufs.methods.mmfs.solver")  # the solver logs its rounds
        lg.setLevel(logging.DEBUG)
        lg.addHandler(Slow())
        with dask.config.set(scheduler="sync"):
            M = Matrix({problem["path"]!r}, standardize="scale")
            mmfs(M, M.y, gamma={GAMMA}, tol=1e-300, max_epochs=10**7, checkpoint={str(ck)!r}, checkpoint_every=2)
        print("FINISHED")
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    path = ck / "checkpoint.npz"
    k = 10
    try:
        deadline = time.time() + patience(60)
        while time.time() < deadline and proc.poll() is None:
            if path.exists() and _ckpt_round(path) >= k:
                break
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL and b"FINISHED" not in out
    saved = _ckpt_round(path)
    assert saved >= k
    assert not [p for p in os.listdir(ck) if ".tmp" in p]
    tol = 1e-8
    with dask.config.set(scheduler="sync"):
        M = Matrix(problem["path"], standardize="scale")
        res = mmfs(M, M.y, gamma=GAMMA, tol=tol, max_epochs=3000, checkpoint=str(ck), resume=True)
    d = res.diagnostics
    assert d["resumed_from_round"] == saved
    assert d["trace"][saved]["round"] == saved and d["rounds"] > saved
    _matches(d, problem["fref"], tol)


def test_a_checkpoint_of_another_problem_is_refused_naming_the_file(problem, tmp_path):
    ck = str(tmp_path / "ck")
    with dask.config.set(scheduler="sync"):
        M = Matrix(problem["path"], standardize="scale")
        mmfs(M, M.y, gamma=GAMMA, tol=1e-3, max_epochs=4, checkpoint=ck, checkpoint_every=1)
        target = os.path.join(ck, "checkpoint.npz")
        for kw in ({"C": 0.5}, {"gamma": 0.1}, {"theta": 0.3}):
            with pytest.raises(ParameterError, match=target.replace(".", r"\.") + ".*another problem"):
                mmfs(M, M.y, **{"gamma": GAMMA, **kw}, checkpoint=ck, resume=True)
        with pytest.raises(ParameterError, match="another problem"):
            mmfs(M.with_standardize("zscore"), M.y, gamma=GAMMA, checkpoint=ck, resume=True)
        with pytest.raises(ParameterError, match="needs a checkpoint directory"):
            mmfs(Matrix(problem["X"]), problem["y"], resume=True)
        # the default: a side directory next to the store, keyed by the problem, removed after a successful run
        # unless dufs.checkpoint.keep (tests/test_checkpoint_dir.py)
        with dask.config.set({"dufs.checkpoint.keep": True}):
            a = mmfs(M, M.y, gamma=GAMMA, tol=1e-3, max_epochs=4).diagnostics["checkpoint"]
            b = mmfs(M, M.y, gamma=GAMMA, C=0.5, tol=1e-3, max_epochs=4).diagnostics["checkpoint"]
    assert a.startswith(problem["path"] + ".dufs-side" + os.sep + "mmfs-") and os.path.exists(a) and a != b


def test_checkpoint_writes_are_atomic(problem, tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    with dask.config.set(scheduler="sync"):
        M = Matrix(problem["path"], standardize="scale")
        mmfs(M, M.y, gamma=GAMMA, tol=1e-12, max_epochs=6, checkpoint=str(ck), checkpoint_every=2)
        path = ck / "checkpoint.npz"
        before = path.read_bytes()
        assert os.listdir(ck) == ["checkpoint.npz"]
        real = np.savez

        def torn(f, **arrays):  # dies halfway through writing the file
            real(f, **arrays)
            f.truncate(40)
            raise OSError("disk full")

        monkeypatch.setattr(np, "savez", torn)
        with pytest.raises(OSError, match="disk full"):
            mmfs(M, M.y, gamma=GAMMA, tol=1e-12, max_epochs=6, checkpoint=str(ck), checkpoint_every=2)
    assert path.read_bytes() == before  # the old checkpoint is untouched, no temporary file is left
    assert os.listdir(ck) == ["checkpoint.npz"]


def _one_block_state(rng, m, d):
    """A random m x d block, its dense columns, and its MMFS state (unit coef, no shift, random margins)."""
    import scipy.sparse as sp

    from dufs.engine.blocks import FeatureBlock

    A = sp.random_array((m, d), density=0.3, format="csc", dtype=np.float32, rng=rng)
    blk = FeatureBlock(0, d, A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data)
    F = A.toarray().astype(np.float64)
    st = partition._init_state(blk, np.ones(d), np.zeros(d), F.sum(axis=0), (F * F).sum(axis=0), rng.uniform(0.1, 1, d),
                        None, 3)
    return blk, F, st


def test_a_rounds_start_keeps_the_state_it_was_given_and_tracks_alpha():
    """Round after round, ``_start`` writes alpha into the spare its state keeps (the previous state's alpha
    untouched: a task may run again) and g, an output only, over the old one; alpha after each step equals the
    steps applied to a plain copy, whatever coordinates the steps move (a spare is brought up to date at the ones
    the last step changed)."""

    rng = np.random.default_rng(2)
    m, d, C = 50, 40, 0.8
    blk, F, st = _one_block_state(rng, m, d)
    ref = np.zeros(d)
    ws, wt, b = rng.standard_normal(m), np.array([0.0, 0.0]), 0.05
    wt[1] = ws.sum()
    for r in range(8):
        idx = np.sort(rng.choice(d, rng.integers(1, 12), replace=False))
        dal = (idx, rng.uniform(-0.5, 1.0, idx.size))
        # its arrays, not the spares and scratch it lends the next round
        given = {k: v.copy() for k, v in st.items() if isinstance(v, np.ndarray) and k not in
                 ("alpha_spare", "g", "index", "alpha_changed")}
        new, (gap, sa, ra), ix = partition._start(blk, st, ws, wt, b, 0.9, float(m), C, dal)
        for k, v in given.items():  # the state given is as it was
            assert np.array_equal(st[k], v), (r, k)
        ref[idx] = np.clip(ref[idx] + 0.9 * dal[1], 0.0, C)
        np.testing.assert_array_equal(new["alpha"], ref)
        g = F.T @ ws + b
        np.testing.assert_allclose(new["g"], g, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(sa, ref.sum(), rtol=1e-12)
        G = g - new["rho"]
        keep = ~(((ref <= 0) & (G > 0)) | ((ref >= C) & (G < 0)))
        np.testing.assert_array_equal(ix, np.flatnonzero(keep))
        st = new


def test_a_rounds_start_with_momentum_moves_alpha_by_both_directions():
    """``_start`` with a step (s, t): alpha moves by s times the round's direction plus t times the change the
    step before it made (kept as ``pdir``), against the same recurrence on a plain copy."""

    rng = np.random.default_rng(4)
    m, d, C = 40, 30, 1.0
    blk, F, st = _one_block_state(rng, m, d)
    ref, prev_change = np.zeros(d), np.zeros(d)
    ws, wt, b = rng.standard_normal(m), np.array([0.0, 0.0]), 0.0
    wt[1] = ws.sum()
    for r in range(10):
        idx = np.sort(rng.choice(d, rng.integers(1, 10), replace=False))
        dal = (idx, rng.uniform(0.0, 0.3, idx.size))
        s, t = (0.7, 0.0) if r < 2 else (0.6, float(rng.uniform(-0.2, 0.4)))
        new, _, _ = partition._start(blk, st, ws, wt, b, np.array([s, t]), float(m), C, dal)
        step = np.zeros(d)
        step[idx] += s * dal[1]
        step += t * prev_change
        after = np.clip(ref + step, 0.0, C)
        prev_change, ref = after - ref, after
        np.testing.assert_allclose(new["alpha"], ref, rtol=0, atol=1e-15)
        pidx, pv = new["pdir"]
        got = np.zeros(d)
        got[pidx] = pv
        np.testing.assert_allclose(got, prev_change, rtol=0, atol=1e-15)
        st = new


def test_momentum_bounds_keep_alpha_in_the_box_and_are_tight():
    """The range of t from ``_momentum_bounds``: alpha + s d + t p in [0, C] for s in {0, 1} and t at either end,
    and outside it a little further (brute force over the coordinates)."""

    rng = np.random.default_rng(7)
    C = 1.0
    for _ in range(50):
        n = 12
        alpha = np.where(rng.random(n) < 0.3, rng.choice([0.0, C], n), rng.uniform(0, C, n))
        pidx = np.sort(rng.choice(n, 6, replace=False))
        pv = rng.uniform(-0.5, 0.5, 6)
        idx = np.sort(rng.choice(n, 5, replace=False))
        dv = rng.uniform(-0.3, 0.3, 5)
        st = {"alpha": alpha, "pdir": (pidx, pv), "dalpha": (idx, dv)}
        lo, hi = partition._momentum_bounds(st, C)
        assert lo <= 0.0 <= hi
        p, dd = np.zeros(n), np.zeros(n)
        p[pidx], dd[idx] = pv, dv

        def ok(s, t, alpha=alpha, dd=dd, p=p):
            x = alpha + s * dd + t * p
            return bool(np.all(x >= -1e-12) and np.all(x <= C + 1e-12))

        # only where alpha + s d itself is in the box (the round's own direction keeps it there)
        if not (ok(0.0, 0.0) and ok(1.0, 0.0)):
            continue
        for s in (0.0, 1.0):
            assert ok(s, lo) and ok(s, hi), (s, lo, hi)
        if np.isfinite(hi):
            assert not (ok(0.0, hi + 1e-6) and ok(1.0, hi + 1e-6))
        if np.isfinite(lo):
            assert not (ok(0.0, lo - 1e-6) and ok(1.0, lo - 1e-6))


def test_plane_step_is_the_box_constrained_minimum():
    """``_plane_step`` against a fine grid over the box (s in [0, 1], t in [lo, hi]) of random convex quadratics,
    and never worse than the step along the round's direction alone."""

    rng = np.random.default_rng(11)
    for _ in range(40):
        L = rng.standard_normal((2, 2))
        H = L @ L.T + 1e-3 * np.eye(2)
        a, c = rng.standard_normal(2)
        lo, hi = -rng.uniform(0, 2), rng.uniform(0, 2)
        s1 = float(np.clip(-a / H[0, 0], 0, 1)) if a < 0 else 0.0
        s, t = mmfs_solver._plane_step(a, c, H[0, 0], H[1, 1], H[0, 1], lo, hi, s1)
        assert 0.0 <= s <= 1.0 and lo <= t <= hi

        def q(s, t, a=a, c=c, H=H):
            return a * s + c * t + 0.5 * (H[0, 0] * s * s + 2 * H[0, 1] * s * t + H[1, 1] * t * t)

        S, T = np.meshgrid(np.linspace(0, 1, 401), np.linspace(lo, hi, 401))
        assert q(s, t) <= q(S, T).min() + 1e-9
        assert q(s, t) <= q(s1, 0.0) + 1e-15
