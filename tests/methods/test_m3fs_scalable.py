"""M3FS, the alternating variant: the sigma step, the v-step against CVXPY, monotone descent, agreement with the
faithful solver on iris + noise and digits1v7, and a 2-process cluster run."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.methods.m3fs import alternating as ms
from dufs.methods.m3fs import m3fs_faithful, m3fs_laplacian, resident, sigma_step, vstep
from tests._threads import task_threads_used

cp = pytest.importorskip("cvxpy")


def _data(n=40, d=12, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X[: n // 2, :3] += 2.0
    if sparse:
        X[rng.random((n, d)) < 0.5] = 0.0
        return sp.csc_array(X)
    return X


def _iris_noise():
    from sklearn.datasets import load_iris
    from sklearn.preprocessing import StandardScaler

    X = StandardScaler().fit_transform(load_iris().data)
    return np.hstack([X, np.random.default_rng(0).standard_normal((150, 10))])


def _digits1v7():
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    dg = load_digits()
    keep = np.isin(dg.target, [1, 7])
    return StandardScaler().fit_transform(dg.data[keep])


# ---------------------------------------------------------------------------------------------------- (a) sigma
@pytest.mark.parametrize("shape", [(30,), (3, 30)])
@pytest.mark.parametrize("m", [1, 4, 7.5])
def test_sigma_step_kkt(shape, m):
    rng = np.random.default_rng(1)
    V = rng.standard_normal(shape) * rng.exponential(size=shape[-1]) ** 3
    s = sigma_step(V, m)
    g = np.abs(V) if V.ndim == 1 else np.sqrt((V * V).sum(axis=0))
    assert s.sum() == pytest.approx(m) and s.min() >= 0 and s.max() <= 1 + 1e-12
    # KKT of min sum g^2 / sigma, sum sigma = m, 0 <= sigma <= 1: g_k^2 / sigma_k^2 = theta on 0 < sigma < 1,
    # >= theta where sigma = 1
    free = (s > 1e-12) & (s < 1 - 1e-12)
    theta = (g[free] / s[free]) ** 2
    assert np.allclose(theta, theta[0], rtol=1e-9)
    assert np.all((g[s >= 1 - 1e-12] / s[s >= 1 - 1e-12]) ** 2 >= theta[0] * (1 - 1e-9))
    # brute force: no feasible random perturbation does better
    f = lambda t: np.sum(g * g / t)  # noqa: E731
    for _ in range(200):
        dlt = rng.standard_normal(s.shape) * 1e-3
        dlt -= dlt.mean()
        t = s + dlt
        if t.min() > 0 and t.max() <= 1:
            assert f(t) >= f(s) - 1e-9
    # the module uses the faithful module's sigma_step (one implementation)
    assert ms.sigma_step is sigma_step


# ---------------------------------------------------------------------------------------------------- (b) v-step
def _cvx_vstep(Z, sigma, y, L, C, lam, l, mu, k):
    n, d = Z.shape
    on = sigma > 0
    p = 1 if k == 2 else k
    V = cp.Variable((d, p))
    b = cp.Variable() if k == 2 else 0.0
    F = Z @ V + (b if k == 2 else 0)
    Lh = np.linalg.cholesky(L + 1e-12 * np.eye(n)).T
    reg = 0.5 * cp.sum(cp.multiply(1.0 / sigma[on][:, None], cp.square(V[on])))
    cons = [V[~on] == 0] if (~on).any() else []
    s = Z.sum(axis=0)
    if k == 2:
        a = 1 - cp.multiply(y, F[:, 0])
        t = cp.Variable(n, nonneg=True)  # hinge_mu(a) = min_{t >= 0} t + (a - t)_+^2 / (2 mu)
        loss = cp.sum(t + cp.square(cp.pos(a - t)) / (2 * mu))
        cons += [cp.abs(s @ V[:, 0] + n * b) <= l]
    else:
        rows = np.arange(n)
        Fy = cp.sum(cp.multiply(np.eye(k)[y], F), axis=1)
        A = 1 - cp.reshape(Fy, (n, 1), order="F") @ np.ones((1, k)) + F
        mask = 1.0 - np.eye(k)[y]
        t = cp.Variable(n, nonneg=True)
        T = cp.reshape(t, (n, 1), order="F") @ np.ones((1, k))
        loss = cp.sum(t + cp.sum(cp.multiply(mask, cp.square(cp.pos(A - T))), axis=1) / (2 * mu))
        del rows
    man = cp.sum_squares(Lh @ F)
    prob = cp.Problem(cp.Minimize(reg + C / n * loss + lam * man), cons)
    prob.solve(solver="CLARABEL")
    return np.asarray(V.value), (float(b.value) if k == 2 else 0.0), prob.value


@pytest.mark.parametrize("pre", [False, True], ids=["L-F", "LZ"])
@pytest.mark.parametrize("k", [2, 3])
def test_v_step_matches_cvxpy(k, pre):
    """Both forms of the manifold term: L F each evaluation, and L F = (L Z) S^1/2 U + b L 1 from L Z formed once."""
    X = _data(40, 12, seed=2)
    M = Matrix(X, standardize="zscore")
    Z = (X - X.mean(0)) / X.std(0)
    L = m3fs_laplacian(Z)
    rng = np.random.default_rng(3)
    sigma = sigma_step(rng.standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0) if k == 2 else np.arange(40) % 3
    C, lam, l, mu = 5.0, 0.05, 2.0, 0.05
    kw = {"LZ": L @ Z, "L1": L @ np.ones(40)} if pre else {}
    out = vstep.v_step(M, sigma, y, L, C=C, lambda_=lam, l=l, smoothing=mu, n_clusters=k, tol=1e-7, max_iter=4000,
                    **kw)
    Vc, bc, val = _cvx_vstep(Z, sigma, y, L, C, lam, l, mu, k)
    assert out["value"] == pytest.approx(val, rel=1e-5)
    np.testing.assert_allclose(out["V"], Vc, atol=2e-3)
    assert out["b"] == pytest.approx(bc, abs=2e-3)
    # the balance constraint holds (zscore: |n b| <= l)
    if k == 2:
        assert abs(40 * out["b"]) <= l + 1e-9


def test_a_v_step_started_at_its_optimum_stops_there():
    """Warm at the optimum (CVXPY's), the v-step returns that point within 25 iterations: its first gradient
    mapping is already tiny, and a tolerance relative to it alone is out of floating point's reach (such a start
    ran all max_iter iterations, and label polishing made eight of them)."""
    X = _data(40, 12, seed=2)
    M = Matrix(X, standardize="zscore")
    Z = (X - X.mean(0)) / X.std(0)
    L = m3fs_laplacian(Z)
    sigma = sigma_step(np.random.default_rng(3).standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    C, lam, l, mu = 5.0, 0.05, 2.0, 0.05
    Vc, bc, val = _cvx_vstep(Z, sigma, y, L, C, lam, l, mu, 2)
    out = vstep.v_step(M, sigma, y, L, C=C, lambda_=lam, l=l, smoothing=mu, V0=Vc, b0=bc, tol=1e-7, max_iter=500)
    assert out["iterations"] <= 25, out["iterations"]
    assert out["value"] == pytest.approx(val, rel=1e-6)
    np.testing.assert_allclose(out["V"], Vc.reshape(-1, 1), atol=2e-3)


# ---------------------------------------------------------------------------------------------------- (c) descent
@pytest.mark.parametrize("k", [2, 3])
def test_objective_never_increases(k):
    X = _data(60, 15, seed=4)
    M = Matrix(X, standardize="zscore", block_width=8)
    r = ms.m3fs_alternating(M, n_features=4, n_clusters=k, C=10.0, lambda_=0.01, n_neighbors=6, max_iter=4,
                            alternations=3, inner_max_iter=200, init="random", polish=2)
    obj = r.objective
    assert obj.size >= 2
    assert np.all(np.diff(obj) <= 1e-9 * np.abs(obj[:-1]))
    # J_mu <= J <= J_mu + C mu / 2
    assert np.all(r.objective_exact >= obj - 1e-9)
    assert np.all(r.objective_exact <= obj + 10.0 * r.diagnostics["smoothing"] / 2 + 1e-9)
    assert r.selected.shape == (4,) and r.sigma.sum() == pytest.approx(4.0)
    assert np.array_equal(r.selected, np.lexsort((np.arange(15), -r.sigma))[:4])


def test_bad_parameters():
    M = Matrix(_data(), standardize="zscore")
    with pytest.raises(ParameterError, match="'n_features' parameter"):
        ms.m3fs_alternating(M, n_features=0)
    with pytest.raises(ParameterError, match="'C' parameter"):
        ms.m3fs_alternating(M, n_features=2, C=0.0)
    with pytest.raises(ParameterError, match="'init' parameter"):
        ms.m3fs_alternating(M, n_features=2, init="pca")
    with pytest.raises(ParameterError, match="'polish' parameter"):
        ms.m3fs_alternating(M, n_features=2, polish=-1)
    with pytest.raises(ParameterError, match="'max_passes' parameter"):
        ms.m3fs_alternating(M, n_features=2, max_passes=0)


def test_max_passes_cuts_the_same_run_short():
    """With a budget of passes the run is the unbudgeted one stopped early: the same first iteration, then the
    v-step under way returns its best point, the sigma-step runs (sigma is the closed form at the returned v) and
    the diagnostics say it stopped on the budget."""
    X = _data(60, 15, seed=4)
    kw = dict(n_features=4, n_clusters=2, C=10.0, n_neighbors=6, init="random", polish=0)
    full = ms.m3fs_alternating(Matrix(X, standardize="zscore"), **kw)
    assert full.diagnostics["stopped"] == "converged" and full.diagnostics["lambda_"] == 1e-2  # min(1e-2, 20/n)
    first = full.diagnostics["passes_per_iteration"][0]
    assert len(full.diagnostics["passes_per_iteration"]) >= 2
    budget = first + 6
    cut = ms.m3fs_alternating(Matrix(X, standardize="zscore"), max_passes=budget, **kw)
    d = cut.diagnostics
    assert d["stopped"] == "max_passes" and not d["converged"]
    assert budget <= sum(d["passes_per_iteration"]) <= budget + 6  # the FISTA iteration under way finishes
    assert cut.objective[0] == pytest.approx(full.objective[0], rel=1e-12)
    np.testing.assert_allclose(cut.sigma, sigma_step(cut.v, 4), rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------------------------------- (d) faithful
def _agree(X, m):
    """The faithful solver at a tight epsilon (its default 1e-2 stops at a point whose exact J is ~1% high, which
    moves the flat tail of sigma) against the alternating variant with its default label polishing."""
    L = m3fs_laplacian(X)
    f = m3fs_faithful(X, n_features=m, n_clusters=2, C=10.0, lambda_=0.01, L=L, epsilon=1e-4)
    r = ms.m3fs_alternating(Matrix(X, standardize="zscore"), n_features=m, n_clusters=2, C=10.0, lambda_=0.01,
                            L=L)
    assert sorted(r.selected.tolist()) == sorted(f.selected.tolist())
    assert r.objective_exact[-1] == pytest.approx(f.objective, rel=2e-3)
    assert np.all(np.diff(r.objective) <= 1e-12 * abs(r.objective[0]))  # polishing keeps J_mu monotone
    return r, f


def test_agrees_with_faithful_iris_noise():
    r, f = _agree(_iris_noise(), 4)
    assert sorted(f.selected.tolist()) == [1, 2, 3, 10] or set(f.selected.tolist()) >= {1, 2, 3}
    assert np.array_equal(r.labels, f.labels) or np.array_equal(r.labels, 1 - f.labels)


@pytest.mark.slow
def test_digits1v7_against_faithful():
    r, f = _agree(_digits1v7(), 10)
    # without polishing the alternation stops one label away (sample 311, margin 0.04) with 7 of 10 in common
    assert any(p["accepted"] for p in r.diagnostics["polish"])
    assert max(np.mean(r.labels == f.labels), np.mean(r.labels != f.labels)) >= 0.99


# ---------------------------------------------------------------------------------------------------- (e) cluster
@pytest.mark.slow
@pytest.mark.parametrize("standardize", ["zscore", "scale"])
def test_v_step_on_the_workers_matches_cvxpy(cluster_client, standardize):
    """Two clusters over blocks persisted on a cluster: the vectors over the features stay on the workers
    (m3fs.resident, one sweep an iteration); the same optimum as CVXPY's on the transformed data made by NumPy, the
    centring (zscore) and the balance constraint's vector (scale: Z's column sums are not 0) included."""
    X = _data(40, 12, seed=2, sparse=True)
    D = X.toarray()
    Z = (D - D.mean(0)) / D.std(0) if standardize == "zscore" else D / D.std(0)
    L = m3fs_laplacian(Z)
    sigma = sigma_step(np.random.default_rng(3).standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    C, lam, l, mu = 5.0, 0.05, 2.0, 0.05
    with cluster_client.as_current():
        M = Matrix(X, standardize=standardize, block_width=4).persist()  # 3 blocks in 2 partitions
        assert len(resident.resident_partitions(M)) == 2
        kw = dict(C=C, lambda_=lam, l=l, smoothing=mu, colsum=Z.sum(axis=0), tol=1e-7, max_iter=4000)
        out = vstep.v_step(M, sigma, y, L, **kw)
        here = vstep.v_step(M, sigma, y, L, resident=False, **kw)
    assert out["resident"] and not here["resident"]
    Vc, bc, val = _cvx_vstep(Z, sigma, y, L, C, lam, l, mu, 2)
    assert out["value"] == pytest.approx(val, rel=1e-5)
    np.testing.assert_allclose(out["V"], Vc, atol=2e-3)
    assert out["b"] == pytest.approx(bc, abs=2e-3)
    np.testing.assert_allclose(out["F"][:, 0], Z @ out["V"][:, 0] + out["b"], atol=1e-9)
    assert out["value"] == pytest.approx(here["value"], rel=1e-9)
    assert abs(Z.sum(axis=0) @ out["V"][:, 0] + 40 * out["b"]) <= l + 1e-9


@pytest.mark.slow
def test_a_worker_of_two_threads_sweeps_its_partitions_groups_side_by_side():
    """A worker process of two threads holds one partition of the v-step's blocks, cut into a run a thread that its
    threads sweep side by side, each into its own sum (a machine of one process of many threads: a few tasks a
    FISTA iteration, not a few a thread): CVXPY's optimum, and the driver's v-step's value."""
    import distributed

    X = _data(40, 12, seed=2, sparse=True)
    D = X.toarray()
    Z = (D - D.mean(0)) / D.std(0)
    L = m3fs_laplacian(Z)
    sigma = sigma_step(np.random.default_rng(3).standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    C, lam, l, mu = 5.0, 0.05, 2.0, 0.05
    kw = dict(C=C, lambda_=lam, l=l, smoothing=mu, colsum=Z.sum(axis=0), tol=1e-7, max_iter=4000)
    with (distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=None)
          as cluster, distributed.Client(cluster, set_as_default=False) as client, client.as_current()):
        M = Matrix(X, standardize="zscore", block_width=4).persist()  # 3 blocks: one partition, two runs
        assert resident.resident_partitions(M) == [[0, 1, 2]]
        out = vstep.v_step(M, sigma, y, L, **kw)
        here = vstep.v_step(M, sigma, y, L, resident=False, **kw)
        ran = client.run(task_threads_used)
    assert out["resident"] and not here["resident"]
    assert max(ran.values()) == 2  # the groups ran on both threads
    Vc, bc, val = _cvx_vstep(Z, sigma, y, L, C, lam, l, mu, 2)
    assert out["value"] == pytest.approx(val, rel=1e-5)
    np.testing.assert_allclose(out["V"], Vc, atol=2e-3)
    np.testing.assert_allclose(out["F"][:, 0], Z @ out["V"][:, 0] + out["b"], atol=1e-9)
    assert out["value"] == pytest.approx(here["value"], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("block_width", [4, 12])
def test_v_step_results_through_shared_memory_are_the_messages_numbers(cluster_client, block_width):
    """The workers write each step's partial scores and the final v = S^1/2 u into files in /dev/shm that the driver
    made (every worker on this machine; forced here for this small problem): the same numbers, bit for bit, as
    the results sent back as messages, whether the blocks make two partitions or one (whose row of the file is
    copied out: the file goes back to the pool and the next step writes it again); and the optimum of the v-step
    with its vectors on the driver."""
    import dask

    X = _data(40, 12, seed=2, sparse=True)
    D = X.toarray()
    Z = D / D.std(0)
    L = m3fs_laplacian(Z)
    sigma = sigma_step(np.random.default_rng(3).standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    kw = dict(C=5.0, lambda_=0.05, l=2.0, smoothing=0.05, colsum=Z.sum(axis=0), tol=1e-7, max_iter=400)
    with cluster_client.as_current():
        M = Matrix(X, standardize="scale", block_width=block_width).persist()
        assert len(resident.resident_partitions(M)) == (2 if block_width == 4 else 1)
        with dask.config.set({"dufs.engine.shared-memory-bytes": 1}):
            files = vstep.v_step(M, sigma, y, L, **kw)
        with dask.config.set({"dufs.engine.shared-memory": "off"}):
            messages = vstep.v_step(M, sigma, y, L, **kw)
        here = vstep.v_step(M, sigma, y, L, resident=False, **kw)
    assert files["resident"] and messages["resident"] and not here["resident"]
    assert files["iterations"] > 5 and files["iterations"] == messages["iterations"]
    assert files["value"] == messages["value"]
    np.testing.assert_array_equal(files["V"], messages["V"])
    np.testing.assert_array_equal(files["F"], messages["F"])
    assert files["value"] == pytest.approx(here["value"], rel=1e-9)
    np.testing.assert_allclose(files["V"], here["V"], atol=1e-6)
    np.testing.assert_allclose(files["F"][:, 0], Z @ files["V"][:, 0] + files["b"], atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("standardize", ["zscore", "scale"])
def test_a_v_step_from_the_state_the_last_one_kept_is_one_from_its_v(cluster_client, standardize):
    """The alternation's next v-step starts from the state the last one left on the workers (its u made there from
    V0 = s_old u and the new sigma, the transform's weights and the balance's vector made again): the same numbers,
    bit for bit, as a v-step that ships its start afresh; a V0 that is not the kept state's starts afresh."""
    from dufs.engine import direct

    X = _data(40, 12, seed=2, sparse=True)
    D = X.toarray()
    Z = (D - D.mean(0)) / D.std(0) if standardize == "zscore" else D / D.std(0)
    L = m3fs_laplacian(Z)
    rng = np.random.default_rng(3)
    sigma1 = sigma_step(rng.standard_normal(12) * np.arange(12), 4.0)
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    kw = dict(C=5.0, lambda_=0.05, l=2.0, smoothing=0.05, colsum=Z.sum(axis=0), tol=1e-7, max_iter=60)
    with cluster_client.as_current():
        M = Matrix(X, standardize=standardize, block_width=4).persist()
        before = _resident_tokens(cluster_client)  # other tests' state may still wait for its drop
        keep: dict = {}
        first = vstep.v_step(M, sigma1, y, L, keep=keep, **kw)
        assert keep["rd"].V is first["V"]
        sigma2 = sigma_step(first["V"][:, 0], 4.0)
        sigma2[3] = 0.0  # a feature whose weight goes: its u starts at 0
        kept = vstep.v_step(M, sigma2, y, L, V0=first["V"], b0=first["b"], F0=first["F"], keep=keep, **kw)
        fresh = vstep.v_step(M, sigma2, y, L, V0=first["V"], b0=first["b"], F0=first["F"], **kw)
        other = vstep.v_step(M, sigma2, y, L, V0=first["V"].copy(), b0=first["b"], F0=first["F"], keep=keep, **kw)
        keep.pop("rd").release()
        direct.flush_drops(cluster_client)
        assert _resident_tokens(cluster_client) <= before  # the states this test made are gone
    assert kept["resident"] and fresh["resident"]
    for got in (kept, other):
        assert got["value"] == fresh["value"] and got["iterations"] == fresh["iterations"]
        np.testing.assert_array_equal(got["V"], fresh["V"])
        np.testing.assert_array_equal(got["F"], fresh["F"])


@pytest.mark.slow
@pytest.mark.parametrize("shared", ["auto", "off"])
def test_a_lost_resident_state_is_said_lost(cluster_client, shared):
    """The v-step runs again with its vectors on the driver when the workers lose what they kept: the error the
    next call meets is one that says so (dufs.engine.cluster.is_lost), whether the state was kept by direct calls
    (workers on this machine) or by one task a partition (``shared`` off: the path of workers elsewhere)."""
    import dask

    from dufs.engine.cluster import is_lost
    from dufs.methods.m3fs.resident import ResidentU, resident_partitions

    X = _data(40, 12, seed=2, sparse=True)
    with cluster_client.as_current(), dask.config.set({"dufs.engine.shared-memory": shared}):
        M = Matrix(X, standardize="scale", block_width=4).persist()
        parts = resident_partitions(M)
        assert parts is not None and len(parts) == 2
        rd = ResidentU(M, np.ones(12), np.full(12, 0.5), None, parts)
        rd.step(np.ones(40), 0.0, 0.0, 0.1)
        if rd.state.resident:  # kept by direct calls or by one task a partition: the workers forget it
            cluster_client.run(_forget_resident)
        else:  # a direct pass that fell back to tasks (its blocks moved meanwhile) keeps it as futures: cancelled
            cluster_client.cancel(list(rd.state.items))
        with pytest.raises(Exception) as err:
            rd.step(np.ones(40), 0.0, 0.0, 0.1)
        assert is_lost(err.value)


def _resident_tokens(client) -> set:
    """The tokens of the state items that direct calls left on the workers (each worker's)."""
    from dufs.engine import direct

    return {(a, t) for a, ts in client.run(lambda: list(direct._RESIDENT)).items() for t in ts}


def _forget_resident():
    from dufs.engine import direct

    direct._RESIDENT.clear()


@pytest.mark.slow
def test_a_v_step_with_no_step_that_lowers_it_says_so(cluster_client):
    """Values of 1e140, not standardised, leave no step short enough within a Lipschitz estimate of 1e150 (values of
    1e200, refused by the input checks since, made every trial value NaN): the v-step raises a
    FloatingPointError that says what to do, on the driver and on the workers (whose state it lets go), where the
    backtracking doubled its Lipschitz estimate for ever."""
    from dufs.engine import direct

    X = _data(40, 12, seed=2, sparse=True) * 1e140
    y = np.where(np.arange(40) < 20, 1.0, -1.0)
    kw = dict(C=1.0, lambda_=0.0, l=40.0, smoothing=0.1, max_iter=50)
    with pytest.raises(FloatingPointError, match="backtracking found no step.*standardize='scale'"):
        vstep.v_step(Matrix(X), np.full(12, 0.5), y, None, **kw)
    with cluster_client.as_current():
        M = Matrix(X, block_width=4).persist()
        assert resident.resident_partitions(M) is not None
        before = _resident_tokens(cluster_client)  # other tests' state may still wait for its drop
        with pytest.raises(FloatingPointError, match="backtracking found no step") as err:
            vstep.v_step(M, np.full(12, 0.5), y, None, **kw)
    # let go even while the traceback (its frames) lives on, as a notebook's last one does
    direct.flush_drops(cluster_client)  # released state goes at the next call to its worker, or now
    assert _resident_tokens(cluster_client) <= before
    assert err.tb is not None


@pytest.mark.slow
def test_cluster_matches_in_process(cluster_client, store_path):
    from dufs.data import write_store

    X = _data(80, 30, seed=5, sparse=True)
    path = store_path()
    write_store(X, path, y=np.zeros(80), feature_block=7)
    kw = dict(n_features=5, n_clusters=2, C=10.0, lambda_=0.01, n_neighbors=6, max_iter=2, alternations=2,
              inner_max_iter=20, polish=1)
    local = ms.m3fs_alternating(Matrix(path, standardize="zscore"), **kw)
    with cluster_client.as_current():
        M = Matrix(path, standardize="zscore").persist()
        dist = ms.m3fs_alternating(M, **kw)
        assert M.residency["mode"] == "persisted"  # the blocks (and so every pass) are on the workers
    assert dist.diagnostics["passes"] >= 20 and len(dist.diagnostics["polish"]) == 1
    np.testing.assert_array_equal(dist.selected, local.selected)
    np.testing.assert_array_equal(dist.labels, local.labels)
    np.testing.assert_allclose(dist.sigma, local.sigma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dist.objective, local.objective, rtol=1e-9)


@pytest.mark.parametrize("case", range(12))
def test_best_bias_is_the_minimum_over_a_fine_grid(case):
    """The two-cluster v-step eliminates the bias: _best_bias against the minimum of the same function (hinge_mu
    loss plus the manifold term, from the dense Laplacian) over 20,001 points of the interval."""
    rng = np.random.default_rng(case)
    n = 300
    Fu = rng.standard_normal(n) * rng.uniform(0.1, 3.0)
    y = np.where(rng.random(n) < rng.uniform(0.2, 0.8), 1.0, -1.0)
    A = rng.random((n, n)) < 0.02
    W = (A | A.T).astype(float)
    deg = W.sum(axis=1) + 1e-9
    L = np.eye(n) - W / np.sqrt(np.outer(deg, deg))
    lam, mu = [(0.0, 1e-2), (1e-3, 1e-2), (1e-1, 0.5), (1e-3, 0.0)][case % 4]
    c = 10.0 / n
    lo, hi = sorted(rng.uniform(-1.5, 1.5, size=2))
    b = vstep._best_bias(Fu, y, L @ Fu if lam else None, L @ np.ones(n) if lam else None, lam, c, mu, lo, hi,
                      rng.uniform(lo, hi))
    assert lo <= b <= hi

    def J(bb):
        f = Fu + bb
        t = 1.0 - y * f
        h = np.where(t >= mu, t - mu / 2, np.where(t > 0, t * t / (2 * mu) if mu > 0 else 0.0, 0.0))
        return c * h.sum() + lam * float(f @ L @ f)

    assert J(b) <= min(J(g) for g in np.linspace(lo, hi, 20001)) + 1e-12


@pytest.mark.parametrize("lam", [1e-12, 1e-5, 1e-2])
@pytest.mark.parametrize("start", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(4))
def test_best_bias_of_a_flat_function_stays_where_it_started(lam, start, seed):
    """Balanced labels and scores all 0 (a first v-step) with L 1 = 0, as for an anchor graph's normalised
    Laplacian: the function is constant in b, so every b of the interval is a minimum and the bias is left where
    it started, as with lambda = 0. L 1 computed through the graph's factor is 0 but for rounding (about 1e-17 an
    entry, here random), which alone used to walk b to the balance bound: every score, and so every label, on one
    side (a 100,000-row store with 2 planted clusters fell in one cluster at lambda_ = 1e-12, in the two at 0)."""
    n = 1000
    y = np.repeat([1.0, -1.0], n // 2)
    Fu = np.zeros(n)
    L1 = np.random.default_rng(seed).standard_normal(n) * 1e-17
    c, mu, lo, hi = 1.0 / n, 1e-2, -0.1, 0.1
    b0 = vstep._best_bias(Fu, y, None, None, 0.0, c, mu, lo, hi, start)
    b = vstep._best_bias(Fu, y, np.zeros(n), L1, lam, c, mu, lo, hi, start)
    assert b0 == start and b == start


@pytest.mark.parametrize("k", [2, 3])
def test_spectral_start_on_a_kNN_graph_in_pieces(k):
    """Above dense_below, the spectral start on a kNN graph that falls apart (repeated rows make cliques of their
    own) is that of the regularised graph W + (tau / n) 1 1^T, tau the mean degree: the same labels as its dense
    eigenvectors (NumPy's eigh), split the same way, where Lanczos on the graph's own L has 0 as an eigenvalue
    once a piece."""
    from scipy.sparse.csgraph import connected_components

    from dufs.engine.graphs import knn_graph, laplacian_operator

    rng = np.random.default_rng(3)
    blobs = [rng.standard_normal((120, 4)) + 4.0 * np.eye(4)[c] for c in range(k)]
    dups = [np.repeat(rng.standard_normal((1, 4)) * 8.0, 7, axis=0) for _ in range(8)]  # 8 cliques of 7 copies
    X = np.vstack(blobs + dups)
    n = X.shape[0]
    W = knn_graph(X, 5)
    assert connected_components(W)[0] >= 8
    M = Matrix(sp.csc_array(X))
    L = laplacian_operator(W, normed=True)
    E = ms._lanczos_embedding(L, W, k, 0)
    # the reference: the dense regularised normalised Laplacian's k smallest eigenvectors (the same subspace)
    Wd = W.toarray()
    tau = Wd.sum(axis=1).mean()
    Wt = Wd + tau / n
    s = 1.0 / np.sqrt(Wt.sum(axis=1))
    vals, U = np.linalg.eigh(np.eye(n) - s[:, None] * Wt * s[None, :])
    assert vals[k] - vals[k - 1] > 1e-3  # the reference subspace is well defined
    np.testing.assert_allclose(E @ E.T, U[:, :k] @ U[:, :k].T, atol=1e-6)
    # the labels of the start: every cluster holds a fair share (the cliques do not make a cluster each)
    got = ms._init_labels(M, L, "spectral", k, 0, 0, W)
    assert min(np.bincount(got, minlength=k)) > n // (4 * k)


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["knn", "anchor"])
def test_scores_kept_on_a_worker_solve_as_the_driver_does(both_paths, kept_calls, graph):
    """With the v-step's vectors over the samples kept on a worker (dufs.engine.kept, the path of workers on several
    machines: the momentum point, the gradient, the backtracking made there, the pass's sum read there), the
    alternation is the one the driver makes with them here, iteration for iteration and bit for bit, on a kNN graph
    and on an anchor graph (its Laplacian made on the worker from Zh)."""
    from dufs.methods.m3fs import kept_scores

    calls = kept_calls(kept_scores)
    got = both_paths(lambda: Matrix(_data(120, 30, seed=1, sparse=True), standardize="scale", block_width=10),
                     lambda M: ms.m3fs_alternating(M, n_features=5, graph=graph, n_anchors=16, n_neighbors=5,
                                                   lambda_=0.01, max_iter=2, polish=0))
    a, b = got["off"], got["on"]
    assert b.diagnostics["inner_iterations"] == a.diagnostics["inner_iterations"]
    assert sum(a.diagnostics["inner_iterations"]) > 10
    np.testing.assert_array_equal(b.objective, a.objective)
    np.testing.assert_array_equal(b.sigma, a.sigma)
    np.testing.assert_array_equal(b.f, a.f)
    np.testing.assert_array_equal(b.labels, a.labels)
    assert {"_make", "_momentum", "_trial", "_final"} <= set(calls)


@pytest.mark.slow
def test_scores_lost_with_their_worker_run_the_v_step_again(both_paths, forget_kept, caplog):
    """A worker that loses the scores it keeps (it left or restarted) makes the next call say so, and the v-step
    runs again from its start with its vectors on the driver: the same selection, the objective as the driver's."""
    from dufs.methods.m3fs import kept_scores

    calls: list = []
    caplog.set_level("WARNING", logger="dufs.methods.m3fs.vstep")
    got = both_paths(lambda: Matrix(_data(120, 30, seed=1, sparse=True), standardize="scale", block_width=10),
                     lambda M: ms.m3fs_alternating(M, n_features=5, graph="knn", lambda_=0.01, max_iter=1, polish=0),
                     lambda: calls.append(forget_kept(kept_scores.KeptScores, "trial", 3)))  # the third trial
    assert len(calls[0]) >= 3
    assert "was lost" in caplog.text and "again from its start, its vectors on the driver" in caplog.text
    np.testing.assert_array_equal(got["on"].selected, got["off"].selected)
    assert got["on"].objective[-1] == pytest.approx(got["off"].objective[-1], rel=1e-6)
