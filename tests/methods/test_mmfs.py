"""MMFS-DCD against a generic bound-constrained QP solver on the dense dual (DESIGN.md section 7.1)."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize

import dufs
from dufs.data.datasets import load
from dufs.engine import Matrix, as_matrix
from dufs.errors import ParameterError
from dufs.methods.mmfs import mmfs
from dufs.testing.references import labelled_problem as _problem
from dufs.testing.references import mmfs_features as _features


def _qp(F, y, C, gamma, theta=0.5):
    """min 1/2 a^T (F^T F + gamma 1 1^T) a - rho^T a over 0 <= a <= C by L-BFGS-B (a generic box-QP solver)."""
    yc = y - y.mean()
    yc = yc / np.linalg.norm(yc)
    rho = theta / (1 - theta) * np.abs(F.T @ yc)
    K = F.T @ F + gamma
    res = minimize(lambda a: 0.5 * a @ K @ a - rho @ a, np.zeros(F.shape[1]), jac=lambda a: K @ a - rho,
                   method="L-BFGS-B", bounds=[(0.0, C)] * F.shape[1],
                   options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000, "maxcor": 50})
    return float(res.fun), res.x, rho



@pytest.mark.parametrize("mode", ["zscore", "scale", None])
@pytest.mark.parametrize(("width", "parts"), [(None, "auto"), (7, "auto"), (7, 3)])
@pytest.mark.parametrize("gamma", [1.0, 0.05])
def test_objective_equals_a_generic_qp_solver(mode, width, parts, gamma, monkeypatch):
    import dufs.methods.mmfs.solver as mod

    monkeypatch.setattr(mod, "_SERIAL_NNZ", 0)  # partitions run their own epochs (held bias)
    X, y = _problem(1)
    F = _features(X, mode)
    fref, _, rho = _qp(F, y, 1.0, gamma)
    with dask.config.set(scheduler="sync"):
        res = mmfs(Matrix(X, standardize=mode, block_width=width), y, gamma=gamma, tol=1e-9, max_epochs=5000,
                   n_partitions=parts)
    d = res.diagnostics
    assert d["converged"] and d["n_partitions"] == (1 if parts == "auto" else parts)
    assert d["objective"] == pytest.approx(fref, rel=1e-6)
    if parts == "auto":  # one partition: the round whose start finds the gap within tol runs no epoch
        assert d["trace"][-1]["updates"] == 0 and d["trace"][-1]["relative_gap"] <= 1e-9
    # the reported gap bounds the distance to the optimum, and D(alpha) recomputed densely is the reported one
    K = F.T @ F + gamma
    D = 0.5 * res.alpha @ K @ res.alpha - rho @ res.alpha
    assert D == pytest.approx(d["objective"], rel=1e-9, abs=1e-12)
    assert -1e-12 <= D - fref <= d["duality_gap"] + 1e-12  # the QP's optimum is itself only 1e-16 exact
    # primal from dual: w = sum alpha_j f_j, b = gamma sum alpha_j; g = F^T w + b
    np.testing.assert_allclose(res.w, F @ res.alpha, atol=1e-12)
    assert res.b == pytest.approx(gamma * res.alpha.sum(), abs=1e-12)
    np.testing.assert_allclose(res.g, F.T @ (F @ res.alpha) + res.b, atol=1e-10)
    np.testing.assert_allclose(res.rho, rho, atol=1e-12)
    assert ((res.alpha >= 0) & (res.alpha <= 1.0)).all()


def test_gap_certificate_is_an_upper_bound_before_convergence():
    X, y = _problem(2)
    F = _features(X, "zscore")
    fref, _, _ = _qp(F, y, 1.0, 0.5)
    for parts in (1, 4):
        for rounds in (1, 2, 4, 8):
            with dask.config.set(scheduler="sync"):
                res = mmfs(Matrix(X, standardize="zscore", block_width=9), y, gamma=0.5, tol=1e-12,
                           max_epochs=rounds, n_partitions=parts)
            d = res.diagnostics
            assert d["objective"] - fref <= d["duality_gap"] + 1e-12
            assert d["duality_gap"] >= 0


def test_cocoa_local_step_minimises_the_sigma_scaled_subproblem():
    """One sigma-scaled epoch over a block (CoCoA+'s local subproblem) against coordinate descent on its dense
    form: min over the block's alphas of grad^T d + sigma/2 (||F_k d||^2 + gamma (1^T d)^2), 0 <= alpha + d <= C,
    with the same visit order (storage order)."""
    from dufs.engine import FeatureBlock
    from dufs.kernels.dcd import dcd_epoch

    X, y = _problem(8, n=60, d=20)
    F = _features(X, None)
    A = sp.csc_array(F)
    C, gamma, sigma = 1.0, 0.3, 3.0
    rng = np.random.default_rng(0)
    rho = rng.uniform(0.1, 1.0, 20)
    alpha = rng.uniform(0.0, C, 20) * (rng.random(20) < 0.5)
    ws = F @ alpha + rng.normal(size=60)  # any (w, b): the other partitions' share
    b = 0.7
    blk = FeatureBlock(0, 20, A.indptr.astype(np.int64), A.indices.astype(np.int32), A.data)
    a = alpha.copy()
    wsl, wtl, bias = ws.copy(), np.array([0.0, ws.sum()]), np.array([b])
    dcd_epoch(blk.indptr, blk.indices, blk.data, np.ones(20), np.zeros(20), np.asarray(F.sum(0)), (F * F).sum(0),
              rho, a, C, gamma, wsl, wtl, 60.0, bias, True, np.arange(20, dtype=np.int64), 20,
              np.array([np.inf, -np.inf]), np.array([3], dtype=np.uint64), -1, sigma)
    # dense reference
    grad0 = F.T @ ws + b - rho
    Q = F.T @ F + gamma
    d = np.zeros(20)
    for j in range(20):
        gj = grad0[j] + sigma * (Q[j] @ d)
        d[j] = np.clip(alpha[j] + d[j] - gj / (sigma * Q[j, j]), 0.0, C) - alpha[j]
    np.testing.assert_allclose(a - alpha, d, atol=1e-12)
    np.testing.assert_allclose(wsl - ws, sigma * (F @ d), atol=1e-12)
    assert bias[0] - b == pytest.approx(sigma * gamma * d.sum(), abs=1e-12)


def test_cocoa_rule_reaches_the_qp_and_never_raises_the_objective():
    from dufs.methods.mmfs import margins, solve

    X, y = _problem(9)
    F = _features(X, "scale")
    fref, _, _ = _qp(F, y, 1.0, 0.3)
    M = Matrix(X, standardize="scale", block_width=6)
    with dask.config.set(scheduler="sync"):
        _, geo, _, rho = margins(M, y, 0.5, 0.3, "correlation")
        out = solve(M, rho, geo, C=1.0, gamma=0.3, tol=1e-8, max_epochs=20000, partitions=M.partition(4), rule="cocoa+")
    assert out["converged"]
    assert out["objective"] == pytest.approx(fref, rel=1e-6)
    objs = [t["objective"] for t in out["trace"]]
    assert all(t["rule"] == "cocoa+" for t in out["trace"][1:])
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objs, objs[1:], strict=False))


def test_auto_partitions_one_per_worker_or_one_for_small_data(cluster_client, monkeypatch):
    import dufs.methods.mmfs.method as mod

    X, y = _problem(3, n=200, d=64)
    assert mod.auto_partitions(Matrix(X, block_width=8)) == 1  # no cluster: serial DCD in this process
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        small = mod.auto_partitions(M)
        monkeypatch.setattr(mod, "_SMALL_NNZ", 0)
        monkeypatch.setattr(mod, "_DENSE", 1.0)
        big = mod.auto_partitions(M)
        res = mmfs(M, y, gamma=0.2, tol=1e-6, max_epochs=3000)
        M.release()
    assert small == 1 and big == 2
    assert res.diagnostics["n_partitions"] == 2 and res.diagnostics["n_blocks"] == 8


def test_implicit_zscore_equals_explicit_dense_standardization():
    X, y = load("relathe")
    X, y = sp.csr_array(X)[::4, :400], y[::4]
    F = _features(X, "zscore")
    with dask.config.set(scheduler="sync"):
        a = mmfs(Matrix(X, standardize="zscore", block_width=150), y, gamma=0.2, tol=1e-9, max_epochs=3000)
        b = mmfs(Matrix(F, standardize=None, block_width=150), y, gamma=0.2, tol=1e-9, max_epochs=3000)
    assert a.diagnostics["objective"] == pytest.approx(b.diagnostics["objective"], rel=1e-7)
    np.testing.assert_allclose(a.w, b.w, atol=1e-6)


def test_real_set_matches_the_qp():
    X, y = load("allaml")
    X = X[:, :300]
    F = _features(X, "zscore")
    fref, _, _ = _qp(F, y.astype(float), 1.0, 0.5)
    with dask.config.set(scheduler="sync"):
        res = mmfs(Matrix(X, standardize="zscore"), y, gamma=0.5, tol=1e-9, max_epochs=20000)
    assert res.diagnostics["objective"] == pytest.approx(fref, rel=1e-6)


@pytest.mark.parametrize("n_partitions", [1, 4])
@pytest.mark.parametrize("serial_nnz", [None, 0])
def test_vectors_kept_on_a_worker_solve_as_the_driver_does(cluster_client, n_partitions, serial_nnz, monkeypatch,
                                                          kept_calls):
    """With w, its change and the momentum direction kept on the worker that sums a round (dufs.engine.kept, the
    path of workers on several machines), the driver's and the working sets' epochs run there: the solve is the
    one the driver makes with them here, round for round and bit for bit, and it did keep them there."""
    import dufs.methods.mmfs.solver as mod

    if serial_nnz is not None:
        monkeypatch.setattr(mod, "_SERIAL_NNZ", serial_nnz * n_partitions)
        monkeypatch.setattr(mod, "_SCREEN", 0)
    from dufs.methods.mmfs import kept_round

    calls = kept_calls(mod, kept_round)
    X, y = _problem(3, n=200, d=64)
    got = {}
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": "off"}):
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        for kv in ("off", "on"):
            with dask.config.set({"dufs.engine.kept-vectors": kv}):
                got[kv] = mmfs(M, y, gamma=0.2, tol=1e-6, max_epochs=3000, n_partitions=n_partitions,
                               checkpoint=None)
        M.release()
    a, b = got["off"], got["on"]
    assert b.diagnostics["converged"] and b.diagnostics["rounds"] == a.diagnostics["rounds"]
    assert b.diagnostics["objective"] == a.diagnostics["objective"]
    np.testing.assert_array_equal(b.w, a.w)
    np.testing.assert_array_equal(b.alpha, a.alpha)
    assert "_after_round" in calls and "_after_step" in calls
    if n_partitions > 1 and serial_nnz is None:  # the working sets' epochs ran on the worker
        assert "_epochs_kept" in calls


@pytest.mark.parametrize("n_partitions", [2, 4, 8])
@pytest.mark.parametrize("serial_nnz", [None, 0, 400])
def test_distributed_rounds_reach_the_same_objective(cluster_client, n_partitions, serial_nnz, monkeypatch):
    """Every round's epoch where it runs: on the driver over the union of the working sets (the default for small
    working sets), in the partitions with the bias held (serial_nnz 0), or mixed (400 nonzeros: partitions with
    larger working sets run their own)."""
    import dufs.methods.mmfs.solver as mod

    if serial_nnz is not None:
        monkeypatch.setattr(mod, "_SERIAL_NNZ", serial_nnz * n_partitions)
        monkeypatch.setattr(mod, "_SCREEN", 0)  # the cold start's epoch over every feature, in the partitions
    X, y = _problem(3, n=200, d=64)
    F = _features(X, "scale")
    fref, _, _ = _qp(F, y, 1.0, 0.2)
    tol = 1e-6
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        assert M.n_blocks == 8 and M.residency["mode"] == "persisted"
        where = M.placement()
        groups = M.partition(n_partitions)
        res = mmfs(M, y, gamma=0.2, tol=tol, max_epochs=3000, n_partitions=n_partitions)
        M.release()
    # every partition's blocks sit on one worker, so a round's task reads only local blocks
    assert len(groups) == n_partitions and sorted(i for g in groups for i in g) == list(range(8))
    assert all(len({where[i] for i in g}) == 1 for g in groups)
    d = res.diagnostics
    assert d["converged"] and d["n_partitions"] == n_partitions
    rules = {t["rule"] for t in d["trace"]}
    assert ("serial working set" in rules) == (serial_nnz != 0)
    # the partitions ran epochs of their own (the first round from alpha = 0 solves CoCoA+'s subproblems, the
    # bias moving locally; the held-bias rule after it)
    assert bool(rules & {"held-bias", "cocoa+"}) == (serial_nnz is not None)
    assert d["trace"][0]["rule"] == ("cocoa+" if serial_nnz is not None else "serial working set")
    assert "held-bias" in rules or serial_nnz != 0
    # the round whose start found the gap within tol runs no epoch on the driver (its step would not be applied)
    last = d["trace"][-1]
    assert last["relative_gap"] <= tol
    if last["rule"] == "serial working set":
        assert last["updates"] == 0 and last["reused_nnz"] == 0
    assert any(t["updates"] > 0 for t in d["trace"] if t["rule"] == "serial working set") == (serial_nnz != 0)
    assert -1e-12 <= d["objective"] - fref <= d["duality_gap"] + 1e-12
    assert d["relative_gap"] <= tol
    assert d["objective"] == pytest.approx(fref, rel=2 * tol)


def test_fit_selects_the_support_ranked_by_alpha_and_follows_the_gamma_path():
    X, y = _problem(4, n=120, d=50)
    sel = dufs.fit(X, y, method="mmfs", n_features=12, tol=1e-8)
    d = sel.diagnostics
    # gamma = 1, 1/2, 1/4, ...: the first gamma whose support holds 12 features
    assert d["gamma_path"] and d["support"] >= 12 and d["gamma"] in [2.0 ** -k for k in range(31)]
    F = _features(X, "zscore")
    fref, aref, _ = _qp(F, y, 1.0, d["gamma"])
    assert d["objective"] == pytest.approx(fref, rel=1e-6)
    # here K is nonsingular (m > d): alpha is unique, so the QP's support and order are ours
    top = np.flatnonzero(aref > 1e-6)
    top = top[np.argsort(-aref[top], kind="stable")]
    assert set(sel.indices[:12]) <= set(top)
    assert sel.indices[:5].tolist() == top[:5].tolist()
    if d["gamma"] < 1.0:  # the previous gamma on the path had too small a support
        with dask.config.set(scheduler="sync"):
            prev = mmfs(Matrix(X, standardize="zscore"), y, gamma=2 * d["gamma"], tol=1e-8)
        assert len(prev.support) < 12


def test_fixed_gamma_fills_the_rest_by_the_dual_gradient():
    X, y = _problem(5, n=120, d=50)
    sel = dufs.fit(X, y, method="mmfs", n_features=30, gamma=1.0, tol=1e-8)
    d = sel.diagnostics
    k = d["support"]
    assert k < 30 and d["filled_by_gradient"] == 30 - k
    F = _features(X, "zscore")
    _, aref, rho = _qp(F, y, 1.0, 1.0)
    G = F.T @ (F @ aref) + 1.0 * aref.sum() - rho
    rest = [j for j in np.argsort(G, kind="stable") if aref[j] <= 1e-9]
    assert sel.indices[k:].tolist() == rest[:30 - k]


@pytest.mark.parametrize(("multiclass", "width", "parts"), [(False, None, 1), (False, 9, 3), (True, 9, 2)])
def test_many_features_path_keeps_vectors_on_the_blocks_and_ranks_the_same(multiclass, width, parts):
    """Above dufs.engine.driver-features the per-feature geometry, margins and gradient stay where the blocks live
    and the ranking's head is merged from per-partition candidates: alpha and the ranking are those of the QP."""
    X, y = _problem(5, n=120, d=50)
    if multiclass:
        y = np.digitize(X[:, 3].toarray().ravel() + X[:, 4].toarray().ravel(), [0.3, 0.9])  # three classes
    with dask.config.set(scheduler="sync"):
        whole = mmfs(Matrix(X, standardize="zscore", block_width=width), y, n_features=30, gamma=1.0, tol=1e-8,
                     n_partitions=parts)
    with dask.config.set({"scheduler": "sync", "dufs.engine.driver-features": 0}):
        blocks = mmfs(Matrix(X, standardize="zscore", block_width=width), y, n_features=30, gamma=1.0, tol=1e-8,
                      n_partitions=parts)
    assert blocks.g is None and blocks.rho is None and blocks.r is None
    np.testing.assert_array_equal(blocks.alpha, whole.alpha)
    assert blocks.diagnostics["objective"] == whole.diagnostics["objective"]
    assert blocks.ranking().tolist() == whole.ranking()[:30].tolist()
    if not multiclass:  # the head against the generic QP: the support by alpha, then the rest by F^T F a + b - rho
        F = _features(X, "zscore")
        _, aref, rho = _qp(F, y, 1.0, 1.0)
        G = F.T @ (F @ aref) + aref.sum() - rho
        k = int((blocks.alpha > 0).sum())
        rest = [j for j in np.argsort(G, kind="stable") if aref[j] <= 1e-9]
        assert blocks.ranking()[k:].tolist() == rest[:30 - k]


@pytest.mark.parametrize("standardize", [None, "scale", "zscore"])
def test_a_blocks_state_in_one_sweep_is_the_margins_of_dense_formulas(standardize):
    """A block's geometry and two-class margins made in one sweep (mmfs_block_init, as mmfs makes the state where
    the blocks live) against dense NumPy formulas, and bit for bit block_margins's separate statistics and product;
    an empty column, a constant one in every row, one of a single value and zeros, negative values."""
    from dufs.engine.blocks import resolve
    from dufs.methods.mmfs import block_margins, margin_spec
    from dufs.methods.mmfs.partition import _block_state

    rng = np.random.default_rng(11)
    m, d, theta = 300, 40, 0.7
    X = np.where(rng.random((m, d)) < 0.2, rng.standard_normal((m, d)), 0.0).astype(np.float32)
    X[:, 0] = 0.0
    X[:, 1] = 2.5
    X[:, 2] = np.where(rng.random(m) < 0.3, -1.0, 0.0)
    X[:, 3] = -np.abs(X[:, 3])
    y = np.where(X[:, 5] + rng.standard_normal(m) > 0, 3, -2)
    M = Matrix(sp.csc_array(X), standardize=standardize, block_width=16)
    _, spec = margin_spec(M, y, theta, 1.0, "correlation")
    Xd = X.astype(np.float64)
    sd = Xd.std(axis=0)
    coef = np.ones(d) if standardize is None else 1.0 / (np.where(sd > 0, sd, 1.0) * np.sqrt(m))
    shift = Xd.mean(axis=0) if standardize == "zscore" else np.zeros(d)
    F = (Xd - shift) * coef
    yc = y - y.mean()
    rho = theta / (1 - theta) * np.abs(F.T @ (yc / np.linalg.norm(yc)))
    want = {"coef": coef, "shift": shift, "colsum": Xd.sum(axis=0), "qii": (F * F).sum(axis=0), "rho": rho}
    for src in M.executor.src:
        blk = resolve(src)
        cols = slice(blk.start, blk.start + blk.width)
        st, part = _block_state(blk, spec, None, None, 0)
        apart = block_margins(blk, spec)
        for k, v in want.items():
            np.testing.assert_allclose(st[k], v[cols], rtol=1e-9, atol=1e-12, err_msg=k)
            np.testing.assert_array_equal(st[k], apart[k], err_msg=k)
        assert not st["alpha"].any() and not st["g"].any()
        r = want["rho"][cols]
        np.testing.assert_allclose(part, [r.sum(), r @ r, r.max()], rtol=1e-12)


def test_bad_parameters_are_named():
    X, y = _problem(6)
    for kw, name in [({"C": 0}, "'C'"), ({"theta": 1.0}, "'theta'"), ({"gamma": "big"}, "'gamma'"),
                     ({"tol": -1}, "'tol'"), ({"relevance": "nope"}, "'relevance'"), ({"kernel": "cubic"}, "'kernel'"),
                     ({"rbf_gamma": 1.0}, "'rbf_gamma'")]:
        with pytest.raises(ParameterError, match=name):
            dufs.fit(X, y, method="mmfs", n_features=3, **kw)
    with pytest.raises(ParameterError, match="supervised"):
        dufs.fit(X, method="mmfs", n_features=3)


def test_driver_keeps_heavy_working_set_columns_between_rounds(cluster_client, monkeypatch):
    """Every working-set column kept on the driver (threshold 1 nonzero): the partitions leave them out of their
    payloads after the first round, and the solve still reaches the QP's objective."""
    from dufs.methods.mmfs import gram
    from dufs.methods.mmfs import solver as mod

    monkeypatch.setattr(gram, "_CACHE_MIN_NNZ", 1)
    # the epochs over the working sets' nonzeros, round after round (solved through their Gram matrix instead, from
    # the screened start, this problem takes two rounds)
    monkeypatch.setattr(gram, "GRAM_MAX", 0)
    monkeypatch.setattr(mod, "_SCREEN", 0)
    X, y = _problem(3, n=200, d=64)
    fref, _, _ = _qp(_features(X, "scale"), y, 1.0, 0.2)
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=8, persist=True)
        res = mmfs(M, y, gamma=0.2, tol=1e-6, max_epochs=3000, n_partitions=2)
        M.release()
    d = res.diagnostics
    assert d["converged"] and sum(t["reused_nnz"] for t in d["trace"]) > 0
    assert -1e-12 <= d["objective"] - fref <= d["duality_gap"] + 1e-12


def test_column_cache_puts_back_the_columns_it_holds_and_drops_the_oldest(monkeypatch):
    import dufs.methods.mmfs.gram as mod
    from dufs.methods.mmfs.gram import _ColumnCache
    from dufs.methods.mmfs.partition import _payload

    monkeypatch.setattr(mod, "_CACHE_MIN_NNZ", 1)

    rng = np.random.default_rng(0)
    B = sp.csc_array(sp.random(50, 12, density=0.4, random_state=1, format="csc"))
    blk = type("Blk", (), {"start": 24, "indptr": B.indptr.astype(np.int64), "indices": B.indices, "data": B.data})
    st = {k: rng.standard_normal(12) for k in ("coef", "shift", "colsum", "qii", "rho", "alpha", "g")}
    full = _payload(blk, st, np.array([1, 3, 4, 7, 9]))
    assert full["sent"].all()
    cache = _ColumnCache(limit=10**6)
    cache.complete(full)
    known = cache.known(np.array([0, 24, 36]))
    assert known[0].size == 0 and known[1].tolist() == [1, 3, 4, 7, 9]
    part = _payload(blk, st, np.array([0, 3, 5, 9]), known[1])
    assert part["sent"].tolist() == [True, False, True, False]
    got = cache.complete(part)
    ref = _payload(blk, st, np.array([0, 3, 5, 9]))  # every column sent
    np.testing.assert_array_equal(got["indices"], ref["indices"])
    np.testing.assert_array_equal(got["data"], ref["data"])
    assert cache.reused == int(ref["counts"][[1, 3]].sum())
    small = _ColumnCache(limit=int(full["counts"][-1]))  # room for one column: the last one kept
    small.complete(full)
    assert list(small.cols) == [(24, 9)] and small.nnz == full["counts"][-1]


def test_a_blocks_top_k_is_a_full_sort_of_its_ranking_key_cut_at_k():
    """A block's k best (the support by alpha, then g - rho, ties to the lower index) are the first k of a full
    lexicographic sort of (group, key, index), ties in the keys included (values on a coarse grid), keys in any
    order (sorted either way too)."""
    from dufs.methods.mmfs.partition import _block_top

    rng = np.random.default_rng(7)
    for _ in range(300):
        w, k = int(rng.integers(1, 60)), int(rng.integers(1, 80))
        a = np.where(rng.random(w) < rng.random(), np.round(rng.random(w) * 3) / 3, 0.0)
        g = np.round(rng.standard_normal(w) * 2) / 2
        if rng.random() < 0.3:  # keys in decreasing or increasing order: every coordinate enters, or none after k
            g = np.sort(g)[::-1] if rng.random() < 0.5 else np.sort(g)
        rho = np.round(rng.random(w) * 2) / 2
        grp = np.where(a > 0, 0.0, 1.0)
        key = np.where(a > 0, -a, g - rho)
        i = np.arange(w)
        o = np.lexsort((i, key, grp))[:k]
        got = _block_top(a, g, rho, k)
        np.testing.assert_array_equal(got[0], i[o])
        np.testing.assert_array_equal(got[1], grp[o])
        np.testing.assert_array_equal(got[2], key[o])


@pytest.mark.parametrize("shifted", [False, True])
def test_driver_solves_a_small_working_set_through_its_gram_matrix(shifted):
    """The driver's serial working-set solve (the bias moving) by its k x k matrix: the minimiser of the dual
    restricted to the working set (L-BFGS-B on the dense subproblem), w's change F d and the round's totals from
    it."""
    from dufs.kernels.dcd import add_columns, column_gram
    from dufs.methods.mmfs.gram import _driver_epoch, _GramCache
    from dufs.methods.mmfs.partition import _payload

    rng = np.random.default_rng(11)
    n, k, C, gamma = 400, 30, 1.0, 0.4
    heavy = sp.random(n, 3, density=0.7, random_state=3, format="csc")  # columns that share many rows
    A = sp.csc_array(sp.hstack([heavy, sp.random(n, k - 3, density=0.05, random_state=2)], format="csc"))
    A.sort_indices()
    Xd = A.toarray()
    coef = rng.uniform(0.5, 2.0, k)
    shift = rng.uniform(0.0, 0.3, k) if shifted else np.zeros(k)
    F = coef * (Xd - shift)
    alpha = rng.uniform(0.0, C, k) * (rng.random(k) < 0.5)
    alpha[[4, 5]] = C
    rho = rng.uniform(0.0, 2.0, k)
    ws, t, b = rng.normal(size=n), 0.3, 0.2  # w = ws + t 1: the rest of the features' share and the shift
    g = F.T @ (ws + t) + b
    st = {"coef": coef, "shift": shift, "colsum": Xd.sum(0), "qii": (F * F).sum(0), "rho": rho, "alpha": alpha,
          "g": g}
    blk = type("Blk", (), {"start": 0, "indptr": A.indptr.astype(np.int64), "indices": A.indices, "data": A.data})
    wt = np.array([t, ws.sum()])
    cols = [_payload(blk, st, np.arange(k))]
    dws, sc, dal = _driver_epoch(cols, ws, wt, b, n, C, gamma, True, 1.0, 5, 3)
    K = F.T @ F + gamma
    lin = g - rho - K @ alpha
    ref = minimize(lambda a: 0.5 * a @ K @ a + lin @ a, alpha, jac=lambda a: K @ a + lin, method="L-BFGS-B",
                   bounds=[(0.0, C)] * k, options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000}).x
    d = np.zeros(k)
    d[dal[0][1]] = dal[0][2]
    np.testing.assert_allclose(alpha + d, ref, atol=1e-6)
    np.testing.assert_allclose(dws + sc.dt, F @ d, atol=1e-10)  # w's change, ws and its constant part
    assert sc.dS == pytest.approx(dws.sum(), abs=1e-10)
    assert sc.ds == pytest.approx(d.sum(), abs=1e-12) and sc.slope == pytest.approx((g - rho) @ d, abs=1e-12)
    # a later working set within this one reads its Gram matrix from the one kept (the data does not change)
    held = _GramCache()
    _driver_epoch(cols, ws, wt, b, n, C, gamma, True, 1.0, 5, 3, held)
    S = np.arange(0, k, 2)
    _, _, dal3 = _driver_epoch([_payload(blk, st, S)], ws, wt, b, n, C, gamma, True, 1.0, 5, 3, held)
    assert held.hits == 1
    KS = K[np.ix_(S, S)]
    linS = (g - rho)[S] - KS @ alpha[S]
    refS = minimize(lambda a: 0.5 * a @ KS @ a + linS @ a, alpha[S], jac=lambda a: KS @ a + linS, method="L-BFGS-B",
                    bounds=[(0.0, C)] * S.size, options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 100000}).x
    dS_ = np.zeros(k)
    dS_[dal3[0][1]] = dal3[0][2]
    np.testing.assert_allclose((alpha + dS_)[S], refS, atol=1e-6)
    assert not dS_[1::2].any()
    # the Gram matrix itself, by row ranges (the tiles of one, cut anywhere), and its refusal past the work limit
    # (pairs of nonzeros sharing a row)
    ip = blk.indptr
    for cuts in ([0, n], [0, 7, 250, n], list(range(0, n + 1, 50))):
        G = np.zeros((k, k))
        assert all(column_gram(ip, A.indices, A.data, a, b, 10**9, G) for a, b in zip(cuts[:-1], cuts[1:], strict=True))
        np.testing.assert_allclose(np.triu(G), np.triu(Xd.T @ Xd), rtol=1e-12, atol=1e-12)
        out = np.zeros(n)
        scale = rng.normal(size=k) * (rng.random(k) < 0.6)
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            add_columns(ip, A.indices, A.data, scale, a, b, out[a:b])
        np.testing.assert_allclose(out, Xd @ scale, rtol=1e-12, atol=1e-12)
    pairs = int(sum(c * (c - 1) // 2 for c in np.diff(sp.csr_array(A).indptr)))
    assert column_gram(ip, A.indices, A.data, 0, n, pairs, np.zeros((k, k)))
    assert not column_gram(ip, A.indices, A.data, 0, n, pairs - 1, np.zeros((k, k)))


@pytest.mark.parametrize("n_partitions", [1, 3])
def test_cold_start_works_on_the_largest_margins_first(cluster_client, n_partitions):
    """From alpha = 0 the first round works on the _SCREEN features of the largest margins (split over the
    partitions), not on every feature; the rounds after take every violator, and the solve reaches the QP."""
    import dufs.methods.mmfs.solver as mod
    from dufs.methods.mmfs.partition import _screened

    X, y = _problem(5, n=300, d=120)
    F = _features(X, "scale")
    fref, _, rho = _qp(F, y, 1.0, 0.3)
    with cluster_client.as_current():
        M = as_matrix(X, standardize="scale", block_width=16, persist=True)
        res = mmfs(M, y, gamma=0.3, tol=1e-7, max_epochs=3000, n_partitions=n_partitions)
        M.release()
    d = res.diagnostics
    assert d["converged"] and d["objective"] == pytest.approx(fref, rel=1e-6)
    assert d["trace"][0]["active"] == -(-mod._SCREEN // n_partitions) * n_partitions
    # the cut itself: the k largest margins over the blocks' working sets (ties at the cut in block order)
    rng = np.random.default_rng(3)
    rhos = [np.round(rng.uniform(0, 1, w), 1) for w in (7, 12, 5)]
    states = [{"alpha": np.zeros(r.shape[0]), "g": np.zeros(r.shape[0]), "rho": r} for r in rhos]
    sets = [np.flatnonzero(r > 0.05) for r in rhos]
    for k in (1, 4, 9, 100):
        got = _screened(states, sets, k)
        flat = sorted((-rhos[q][j], q, j) for q in range(3) for j in sets[q])[:k]
        want = [sorted(j for _, q2, j in flat if q2 == q) for q in range(3)]
        assert [g.tolist() for g in got] == want
