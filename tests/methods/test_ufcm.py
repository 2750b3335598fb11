"""UFCM (dufs.methods.ufcm, paper 003): the objective (6) never decreases (Proposition 1), the matrix-free W step is
the dense eigendecomposition, the recorded objective is eq. (6) recomputed independently, bad parameters are
refused by name."""

from __future__ import annotations

import functools

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.linalg import subspace_angles
from threadpoolctl import threadpool_limits

from dufs.engine import Matrix
from dufs.errors import ParameterError
from dufs.methods import lowrank as LR
from dufs.methods.ufcm import clusters as UC
from dufs.methods.ufcm import method as UM
from dufs.methods.ufcm import scatter as US
from dufs.methods.ufcm import ufcm
from tests._planted import near_pole_problem, three_groups_sparse

RISE_TOL = 1e-10  # relative: rounding only


@functools.cache
def _data(name):
    rng = np.random.default_rng(0)
    if name == "dense":
        # three shifted Gaussian groups, 150 x 40
        X = rng.standard_normal((150, 40)) + np.repeat(rng.standard_normal((3, 40)) * 2, 50, axis=0)
        return X
    if name == "sparse":
        X = sp.random(200, 120, density=0.08, random_state=1, format="csc") * 5.0
        X = X.toarray()
        X[:, 7] = 0.0  # an all-zero feature: its row of W is held at zero
        return sp.csc_array(X)
    if name == "coil20":
        from dufs.data.datasets import load

        X, y = load("coil20")
        keep = y < 4  # 4 objects, 288 images; every 4th pixel: 256 features
        return X[keep][:, ::4]
    raise KeyError(name)


def _dense(X):
    return X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)


def _centred(X, standardize=None):
    Xd = _dense(X)
    Xc = Xd - Xd.mean(axis=0)
    if standardize == "zscore":
        sd = Xd.std(axis=0)
        Xc = Xc / np.where(sd > 0, sd, 1.0)
    return Xc


def _objective_direct(Xc, W, labels, G, alpha, beta, p):
    """Eq. (6) in plain NumPy: Tr(W^T S_t W) - alpha ||W^T X - G U^T||_F^2 - beta ||W||_{2,p}^p (X centred)."""
    St = Xc.T @ Xc
    Uo = np.zeros((Xc.shape[0], G.shape[1]))
    Uo[np.arange(Xc.shape[0]), labels] = 1.0
    R = W.T @ Xc.T - G @ Uo.T
    rows = np.linalg.norm(W, axis=1)
    return np.trace(W.T @ St @ W) - alpha * np.sum(R * R) - beta * np.sum(rows ** p)


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(limits=1):
        yield


# ---------------------------------------------------------------------------------------------------- (a) monotone
@pytest.mark.parametrize("name, params, dense_below", [
    ("dense", {"alpha": 1.0, "beta": 1.0, "p": 1.0}, 2000),
    ("dense", {"alpha": 10.0, "beta": 0.1, "p": 0.5}, 2000),
    ("dense", {"alpha": 0.1, "beta": 10.0, "p": 1.5}, 0),
    ("sparse", {"alpha": 1.0, "beta": 1.0, "p": 1.0}, 2000),
    ("sparse", {"alpha": 2.0, "beta": 1.0, "p": 0.5}, 0),
    ("sparse", {"alpha": 1.0, "beta": 1.0, "p": 1.0}, 0),  # the defaults matrix-free: the secular W step
    ("coil20", {"alpha": 1.0, "beta": 1.0, "p": 1.0}, 2000),
    ("coil20", {"alpha": 1e-1, "beta": 10.0, "p": 0.5}, 2000),
])
def test_objective_never_decreases(name, params, dense_below):
    X = _data(name)
    c = 4 if name == "coil20" else 3
    # matrix-free: a few hundred two-pass products per W step, so fewer iterations and one block
    mf = dense_below == 0
    res = ufcm(Matrix(X, block_width=None if mf else 37), n_clusters=c, n_components=5, max_iter=4 if mf else 12,
               n_init=3, tol=0.0, dense_below=dense_below, **params)
    f = res.objective
    assert f.shape[0] == res.diagnostics["iterations"] + 1 >= 2
    rises = np.diff(f)
    assert np.all(rises >= -RISE_TOL * np.maximum(1.0, np.abs(f[1:]))), rises
    W = res.W
    np.testing.assert_allclose(W.T @ W, np.eye(5), atol=1e-8)
    np.testing.assert_allclose(res.scores, np.linalg.norm(W, axis=1))
    if name == "sparse":
        assert res.scores[7] == 0.0


# ---------------------------------------------------------------------------------------------------- (b) W step
@pytest.mark.parametrize("standardize", [None, "zscore"])
@pytest.mark.parametrize("alpha, beta", [(0.5, 1.0), (3.0, 0.2)])  # (3, 0.2): (1 - alpha) S_t, indefinite
def test_matrix_free_w_step_is_dense_eigh(standardize, alpha, beta):
    X = _data("sparse")
    M = Matrix(X, standardize=standardize, block_width=25)
    Xc = _centred(X, standardize)
    n, d = Xc.shape
    c, k = 3, 4
    rng = np.random.default_rng(3)
    labels = np.arange(n) % c
    rng.shuffle(labels)
    Dd = rng.uniform(0.5, 2.0, size=d)
    active = np.ones(d, dtype=bool)
    active[7] = False  # the all-zero feature, held out as ufcm does
    # the explicit dense reference: S_t - alpha S_w - beta D on the explicitly standardised, centred matrix
    Uo = np.zeros((n, c))
    Uo[np.arange(n), labels] = 1.0
    St = Xc.T @ Xc
    P = Uo @ np.linalg.inv(Uo.T @ Uo) @ Uo.T
    Sw = Xc.T @ (np.eye(n) - P) @ Xc
    A = St - alpha * Sw - beta * np.diag(Dd)
    idx = np.flatnonzero(active)
    ref_vals, ref_vecs = np.linalg.eigh(A[np.ix_(idx, idx)])
    ref_vals, ref_vecs = ref_vals[::-1][:k], ref_vecs[:, ::-1][:, :k]

    Zc = US._Centred(M)
    Q = Zc.rmatvec(Uo)
    counts = Uo.sum(axis=0)
    vals_mf, W_mf, nprod = US._w_step(Zc, None, Q, counts, Dd, active, k, alpha, beta, v0=np.ones(idx.size))
    vals_d, W_d, _ = US._w_step(Zc, Zc.scatter(), Q, counts, Dd, active, k, alpha, beta)
    assert nprod > 0
    scale = max(1.0, np.abs(ref_vals).max())
    for vals, W in ((vals_mf, W_mf), (vals_d, W_d)):
        np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-8 * scale)
        assert np.all(W[~active] == 0.0)
        assert np.max(subspace_angles(W[idx], ref_vecs)) < 1e-6
    if standardize is None:
        np.testing.assert_allclose(Zc.scatter(), St, atol=1e-9 * np.abs(St).max())


def _alpha_one_problem(standardize, beta, c=3):
    """A W step's problem with alpha = 1 on the sparse test data: (M, Zc, Q = Zc^T U, U, D, the active features,
    the explicit dense S_b - beta D on them, S_b = S_t - S_w formed from the centred matrix)."""
    X = _data("sparse")
    M = Matrix(X, standardize=standardize, block_width=25)
    Xc = _centred(X, standardize)
    n, d = Xc.shape
    rng = np.random.default_rng(5)
    labels = rng.integers(0, c, size=n)
    Dd = rng.uniform(0.2, 3.0, size=d)
    active = np.ones(d, dtype=bool)
    active[7] = False
    idx = np.flatnonzero(active)
    Uo = np.zeros((n, c))
    Uo[np.arange(n), labels] = 1.0
    Sb = Xc.T @ Uo @ np.linalg.inv(Uo.T @ Uo) @ Uo.T @ Xc  # S_t - S_w, formed explicitly
    Zc = US._Centred(M)
    return M, Zc, Zc.rmatvec(Uo), Uo, Dd, active, (Sb - beta * np.diag(Dd))[np.ix_(idx, idx)]


@pytest.mark.parametrize("standardize", [None, "zscore"])
@pytest.mark.parametrize("beta, k", [(1.0, 3), (0.05, 3), (0.0, 2)])  # beta = 0, k = 3: a null space, no unique 3rd
def test_alpha_one_w_step_needs_no_pass(standardize, beta, k):
    """With alpha = 1 (the default) S_t - S_w = S_b is rank c: the W step is a diagonal plus a rank-c matrix, solved
    by its secular equation without touching the data, and equals the dense eigh of S_b - beta D."""
    M, Zc, Q, Uo, Dd, active, A = _alpha_one_problem(standardize, beta)
    d, idx = Dd.shape[0], np.flatnonzero(active)
    ref_vals, ref_vecs = np.linalg.eigh(A)
    ref_vals, ref_vecs = ref_vals[::-1][:k], ref_vecs[:, ::-1][:, :k]
    passes = M.passes
    vals, W, nprod = US._w_step(Zc, None, Q, Uo.sum(axis=0), Dd, active, k, 1.0, beta, X0=np.eye(d)[idx][:, :k])
    assert nprod == 0 and M.passes == passes  # the secular solve, not LOBPCG
    scale = max(1.0, np.abs(ref_vals).max())
    np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-9 * scale)
    assert np.all(W[~active] == 0.0)
    np.testing.assert_allclose(W.T @ W, np.eye(k), atol=1e-10)
    assert np.max(subspace_angles(W[idx], ref_vecs)) < 1e-7


@pytest.mark.parametrize("case", ["below", "above", "zero_rows", "repeated"])
def test_secular_eigenpairs_are_eigh(case):
    """The secular solve against numpy's eigh of the dense diagonal-plus-rank-c matrix: eigenvalues above and
    among the diagonal's values, rows of Q that are exactly zero, and a repeated diagonal value."""
    rng = np.random.default_rng(1)
    m, c, k = 60, 3, 4
    Qa = rng.standard_normal((m, c)) * (1e-2 if case == "below" else 10.0)
    Da = rng.uniform(1.0, 2.0, size=m)
    if case == "zero_rows":
        Qa[[3, 8]] = 0.0
        Da[3] = 0.5  # an exact eigenvector e_3 with eigenvalue -0.5, the largest of the diagonal's
    if case == "repeated":
        Da[[4, 9]] = Da.min() - 0.5
    got = LR._top_lowrank(Qa, Da, k)
    assert got is not None
    vals, V = got
    A = Qa @ Qa.T - np.diag(Da)
    ref_vals, ref_vecs = np.linalg.eigh(A)
    ref_vals, ref_vecs = ref_vals[::-1][:k], ref_vecs[:, ::-1][:, :k]
    np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-10 * max(1.0, np.abs(ref_vals).max()))
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-10)
    np.testing.assert_allclose(A @ V, V * vals, atol=1e-8 * max(1.0, np.abs(ref_vals).max()))


@pytest.mark.parametrize("standardize", [None, "zscore"])
def test_matrix_free_pca_start_is_dense_eigh(standardize):
    """The PCA start above ``dense_below`` (block subspace iteration, two passes an iteration) gives the top
    eigenvectors of the explicitly centred S_t."""
    X = _data("sparse")
    M = Matrix(X, standardize=standardize, block_width=25)
    Xc = _centred(X, standardize)
    k = 4
    ref_vals, ref_vecs = np.linalg.eigh(Xc.T @ Xc)
    ref_vals, ref_vecs = ref_vals[::-1][:k], ref_vecs[:, ::-1][:, :k]
    vals, W, nprod, converged = US._top_scatter(US._Centred(M), k, np.random.default_rng(0), tol=1e-10,
                                               max_iter=2000)
    assert converged and nprod > 0
    np.testing.assert_allclose(vals, ref_vals, rtol=1e-9)
    assert np.max(subspace_angles(W, ref_vecs)) < 1e-6


@pytest.mark.parametrize("d", [7, (1 << 14) * 3 + 5])
def test_pca_residual_norms_are_numpys(d, monkeypatch):
    """The PCA start's residuals ||S v_j - theta_j v_j|| by row slabs in threads: NumPy's column norms, across
    slab and thread boundaries (a small slab size makes several on the small case too)."""
    if d == 7:
        monkeypatch.setattr(LR, "_SECULAR_CHUNK", 2)
    rng = np.random.default_rng(d)
    S, V = rng.standard_normal((d, 6)), rng.standard_normal((d, 6))
    theta = rng.uniform(-2.0, 50.0, 6)
    ref = np.linalg.norm(S[:, :4] - theta[None, :4] * V[:, :4], axis=0)
    np.testing.assert_allclose(LR._residual_norms(S, V, theta, 4), ref, rtol=1e-13)


def test_sampled_pca_start_above_the_row_bound(monkeypatch):
    """Above ``_PCA_SAMPLE_ABOVE`` samples the PCA start comes from a sample of rows, refined on all rows: W is
    orthonormal, every feature with data has a row (none is frozen at zero by the sample missing it), and its span
    is the top principal subspace of the whole data (a clear eigengap here)."""
    rng = np.random.default_rng(7)
    n, d, k = 4000, 300, 2
    X = sp.random(n, d, density=0.02, random_state=3, format="csr") * 1.0
    X = sp.lil_array(X)
    grp = rng.integers(0, 3, size=n)
    for g in range(3):  # three clusters, each raising its own 10 features
        rows = np.flatnonzero(grp == g)
        for j in range(10 * g, 10 * g + 10):
            X[rows, j] = 3.0 + rng.random(rows.size)
    X = sp.csr_array(X)
    M = Matrix(X.tocsc(), block_width=64)
    Xc = _centred(X)
    ref_vals, ref_vecs = np.linalg.eigh(Xc.T @ Xc)
    ref_vecs = ref_vecs[:, ::-1][:, :k]
    monkeypatch.setattr(UM, "_PCA_SAMPLE_ABOVE", 1000)
    monkeypatch.setattr(US, "_PCA_SAMPLE", 500)
    Zc = US._Centred(M)
    assert Zc.m.shape == (d,)  # the column statistics: one pass, made when first asked
    passes = M.passes
    vals, W, nprod, _ = US._sample_pca_start(M, Zc, k, 0, np.random.default_rng(0))
    assert nprod == k * US._PCA_REFINE and M.passes - passes == 2 * US._PCA_REFINE  # k columns, two passes each
    np.testing.assert_allclose(W.T @ W, np.eye(k), atol=1e-10)
    has_data = np.asarray((X != 0).sum(axis=0)).ravel() > 0
    assert np.all(np.linalg.norm(W, axis=1)[has_data] > 0)
    assert np.max(subspace_angles(W, ref_vecs)) < 0.05
    res = ufcm(M, n_clusters=3, n_components=k, max_iter=3, n_init=2, tol=0.0, dense_below=0)
    assert np.all(np.diff(res.objective) >= -RISE_TOL * np.abs(res.objective[1:]))
    np.testing.assert_allclose(res.W.T @ res.W, np.eye(k), atol=1e-8)
    assert set(np.argsort(-res.scores)[:20]) <= set(range(30))  # the clusters' features rank first


# ---------------------------------------------------------------------------------------------------- (c) eq. (6)
@pytest.mark.parametrize("name, standardize, dense_below", [("dense", None, 2000), ("sparse", "zscore", 0),
                                                             ("sparse", None, 2000)])
def test_recorded_objective_is_eq6(name, standardize, dense_below):
    X = _data(name)
    alpha, beta, p = 0.7, 2.0, 0.8
    res = ufcm(Matrix(X, standardize=standardize), n_clusters=3, n_components=4, alpha=alpha, beta=beta, p=p,
               max_iter=5, n_init=2, dense_below=dense_below)
    # what UFCM read (values="auto"): the presence of each stored value of the sparse counts taken unstandardized
    read = res.diagnostics["values"]
    assert read == ("presence" if name == "sparse" and standardize is None else "raw")
    if read == "presence":
        X = sp.csc_array(X, copy=True)
        X.data = np.ones_like(X.data)
    Xc = _centred(X, standardize)
    direct = _objective_direct(Xc, res.W, res.labels, res.G, alpha, beta, p)
    np.testing.assert_allclose(res.objective[-1], direct, rtol=1e-9)
    # G is eq. (10) for the returned W and U: the cluster means of W^T x_i
    for j in range(3):
        np.testing.assert_allclose(res.G[:, j], (Xc[res.labels == j] @ res.W).mean(axis=0), atol=1e-9)
    assert res.labels.shape == (Xc.shape[0],)
    assert set(res.diagnostics) >= {"iterations", "timings", "converged"}


# ---------------------------------------------------------------------------------------------------- (d) parameters
@pytest.mark.parametrize("param, value", [
    ("n_clusters", 0), ("n_clusters", 150), ("n_clusters", 2.5), ("n_components", 0), ("n_components", 40),
    ("alpha", -1.0), ("beta", float("nan")), ("beta", "1"), ("p", 0.0), ("p", 2.5), ("max_iter", 0),
    ("n_init", -1), ("tol", -1e-3), ("random_state", -1), ("dense_below", 1.5),
])
def test_bad_parameters(param, value):
    kw = {"n_clusters": 3, "n_components": 2}
    kw[param] = value
    with pytest.raises(ParameterError, match=f"'{param}' parameter of ufcm"):
        ufcm(Matrix(_data("dense")), **kw)


def test_not_a_matrix():
    with pytest.raises(ParameterError, match="Matrix"):
        ufcm(_data("dense"), n_clusters=3, n_components=2)


def test_u_step_on_many_rows_is_as_good_as_scikit_learns_kmeans(monkeypatch):
    """Above _KMEANS_SAMPLE_ABOVE rows a random start is fitted on a sample, judged after one assignment of all
    rows, and the winner refined by Lloyd on all rows: the term chosen is no worse than the current partition's,
    is within 1% of scikit-learn's best of 10 full k-means runs, and (a random start having won) its labels are
    a Lloyd fixed point (every row at its nearest centroid)."""
    from sklearn.cluster import KMeans

    monkeypatch.setattr(UC, "_KMEANS_SAMPLE_ABOVE", 1000)
    monkeypatch.setattr(UC, "_KMEANS_SAMPLE", 400)
    rng = np.random.default_rng(3)
    n, p, c = 6000, 4, 5
    Y = rng.standard_normal((n, p)) + np.repeat(rng.standard_normal((c, p)) * 3.0, n // c, axis=0)
    current = rng.integers(0, c, size=n)  # a poor current partition: a random start wins
    labels, km, chosen = UC._choose(Y, c, [current], [11, 12, 13, 14], seed=5)
    assert chosen >= 1
    Cc = np.array([Y[current == k].mean(axis=0) for k in range(c)])
    assert km < np.sum((Y - Cc[current]) ** 2)
    C = np.array([Y[labels == k].mean(axis=0) for k in range(c)])
    assert km == pytest.approx(np.sum((Y - C[labels]) ** 2), rel=1e-12)
    with threadpool_limits(limits=1):
        ref = KMeans(n_clusters=c, n_init=10, random_state=0).fit(Y).inertia_
    assert km <= 1.01 * ref
    dist = ((Y[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)
    assert np.all(dist[np.arange(n), labels] <= dist.min(axis=1) + 1e-9)


@pytest.mark.parametrize("seed", [12, 138, 204])
def test_secular_eigenpairs_among_clustered_poles_are_eigh(seed):
    """Rank-deficient Q (its columns sum to zero, as Zc^T U's do) of large scale, with a third of the diagonal's
    values packed within 1e-3 of each other: the eigenpairs among those poles are found to eigh's accuracy (a root
    known only to the global tolerance gave eigenvectors off by 1e-5, and a fallback to LOBPCG)."""
    rng = np.random.default_rng(seed)
    m, c = int(rng.integers(20, 200)), int(rng.integers(2, 8))
    k = int(rng.integers(1, min(c + 4, m - 1)))
    Qa = rng.standard_normal((m, c)) * rng.choice([1e-2, 1.0, 10.0, 100.0])
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)
    Da = rng.uniform(0.5, 3.0, size=m)
    Da[: m // 3] = 0.5 + rng.uniform(0, 1e-3, size=m // 3)
    _assert_top_eigenpairs_are_eigh(Qa, Da, k)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_secular_root_below_a_weak_pole_among_strong_ones_is_eigh_in_few_sweeps(seed, monkeypatch):
    """The bench's W step in small: Q of rank c - 1 (its columns sum to zero), so the k = c-th eigenvalue lies among
    the diagonal's values, its c smallest packed within 2e-3 with large rows of Q and the smallest one's row weak
    (the root sits just below it, bent by all of them). Eigenpairs as eigh's, in at most 26 sweeps over Q (the
    one-pole step took 25-36 on these, converging linearly next to the weak pole)."""
    rng = np.random.default_rng(seed)
    m, c = 1500, 6
    Qa = rng.standard_normal((m, c)) * 30.0
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)
    Da = rng.uniform(10.0, 3e4, m)
    near = rng.choice(m, c, replace=False)
    Da[near] = 0.5 + np.sort(rng.uniform(0, 2e-3, c))
    Da[near[0]] = 0.5
    Qa[near] *= 5.0
    Qa[near[0]] *= 0.01
    sweeps = []
    sweep = LR._secular_m_and_slope
    monkeypatch.setattr(LR, "_secular_m_and_slope", lambda Q, D, t: sweeps.append(t) or sweep(Q, D, t))
    got = LR._top_lowrank(Qa, Da, c)
    assert got is not None
    vals, V = got
    A = Qa @ Qa.T - np.diag(Da)
    ref = np.linalg.eigvalsh(A)[::-1][:c]
    scale = np.abs(ref).max()
    assert ref[-1] < -0.5 < ref[-2]  # the last one among the poles, as built
    np.testing.assert_allclose(vals, ref, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(V.T @ V, np.eye(c), atol=1e-10)
    np.testing.assert_allclose(A @ V, V * vals, atol=1e-10 * scale)
    assert len(sweeps) <= 26, len(sweeps)


@pytest.mark.parametrize("seed", [0, 3])
def test_secular_moments_are_the_dense_sums_at_every_t_the_roots_are_searched_at(seed):
    """M(t) = B^T Q^T (t I + D)^-1 Q B and P(t) (its minus derivative) from the binned moments against the dense
    sums, for t from just below -D_(k) (the lowest a root search goes) to far above every pole; diagonal values
    spread over six decades, a cluster of equal ones and a few within the exact rows' floor."""
    rng = np.random.default_rng(seed)
    m, c, k = 4000, 5, 6
    Q = rng.standard_normal((m, c)) * 20.0
    D = 10.0 ** rng.uniform(-1, 5, m)
    D[:50] = 7.0  # equal values
    asc = np.sort(D)
    d_k = float(asc[k - 1])
    D[50:53] = d_k + np.array([0.0, 1e-12, 3e-10])  # within and next to the floor
    asc = np.sort(D)
    d_k = float(asc[k - 1])
    B = np.linalg.qr(rng.standard_normal((c, c - 1)))[0]
    scale = max(np.linalg.norm(Q, 2) ** 2, D.max())
    mom = LR._SecularMoments(Q, D, B, d_k, 1e-9 * scale)
    for t in [-d_k - 1e-12 * scale, -d_k + 1e-8, -asc[0] + 1.0, 0.0, 3.0, 1e3, 1e6]:
        s = 1.0 / (t + D)
        M = B.T @ (Q.T * s) @ Q @ B
        P = B.T @ (Q.T * s * s) @ Q @ B
        got = mom.at(t)
        assert got is not None, t
        np.testing.assert_allclose(got[0], M, rtol=0, atol=1e-13 * np.abs(M).max())
        np.testing.assert_allclose(got[1], P, rtol=0, atol=1e-13 * np.abs(P).max())
    assert mom.at(-d_k - 1.0) is None  # below the range the series hold in: the caller sweeps


def test_top_eigenpairs_from_moments_are_those_from_sweeps_and_eigh():
    """The secular solve with M(t) from the moments and from sweeps over Q give eigh's eigenpairs (a Q of rank c - 1
    whose top roots sit far above every pole and whose last one is among them)."""
    rng = np.random.default_rng(11)
    m, c, k = 2500, 6, 6
    Qa = rng.standard_normal((m, c)) * 30.0
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)
    Da = 10.0 ** rng.uniform(-0.3, 4.5, m)
    A = Qa @ Qa.T - np.diag(Da)
    ref = np.linalg.eigvalsh(A)[::-1][:k]
    scale = np.abs(ref).max()
    for use in (True, False):
        vals, V = LR._top_lowrank(Qa, Da, k, use_moments=use)
        np.testing.assert_allclose(vals, ref, rtol=0, atol=1e-12 * scale)
        np.testing.assert_allclose(A @ V, V * vals, atol=1e-10 * scale)


@pytest.mark.parametrize("c", [2, 4])
def test_secular_eigenpairs_with_duplicated_rows_at_the_smallest_diagonal_values_are_eigh(c):
    """Duplicated features: groups of equal rows of Q at equal diagonal values, among them the smallest (a pole of
    multiplicity above its rank, as in a kddb-size W step, whose eigenvalue the secular equation does not have):
    eigenpairs as eigh's, and Q given back as it was."""
    rng = np.random.default_rng(c)
    m, k = 300, c + 2
    Qa = rng.standard_normal((m, c)) * 10.0
    Qa[:, -1] = -Qa[:, :-1].sum(axis=1)  # rank c - 1, as Zc^T U
    Da = rng.uniform(2.0, 50.0, m)
    Da[:6], Qa[:6] = 1.25, Qa[0]  # six identical rows at the smallest value
    Da[6:11], Qa[6:11] = 1.5, Qa[6]
    Da[11:15] = 1.75  # equal values, rows of rank min(4, c - 1)
    _assert_top_eigenpairs_are_eigh(Qa, Da, k)


def test_secular_root_closer_to_a_pole_than_eps_is_eigh():
    Qa, Da = near_pole_problem()
    _assert_top_eigenpairs_are_eigh(Qa, Da, 2, scale=Da.max())  # residuals at the rounding of ||A||


def _assert_top_eigenpairs_are_eigh(Qa, Da, k, scale=None):
    """The secular solve's k largest eigenpairs of Qa Qa^T - diag(Da) against numpy's eigh, orthonormal, with
    residuals at rounding level (of ``scale``, by default the largest eigenvalue); ``Qa`` given back unchanged."""
    Q0 = Qa.copy()
    got = LR._top_lowrank(Qa, Da, k)
    assert got is not None
    np.testing.assert_array_equal(Qa, Q0)
    vals, V = got
    A = Q0 @ Q0.T - np.diag(Da)
    ref = np.linalg.eigvalsh(A)[::-1][:k]
    np.testing.assert_allclose(vals, ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))
    scale = max(1.0, np.abs(ref).max()) if scale is None else scale
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-10)
    np.testing.assert_allclose(A @ V, V * vals, atol=1e-8 * scale)


def test_alpha_one_w_step_falls_back_to_lobpcg_without_passes(monkeypatch):
    """Where the secular solve gives up (None), the alpha = 1 W step runs LOBPCG on S_b - beta D, applied from Q
    alone (no pass over the data, no array over all features): its eigenvalues are the dense eigh's."""
    k, beta = 3, 1.0
    M, Zc, Q, Uo, Dd, active, A = _alpha_one_problem(None, beta)
    d, idx = Dd.shape[0], np.flatnonzero(active)
    ref_vals = np.linalg.eigvalsh(A)[::-1][:k]
    monkeypatch.setattr(US, "_top_lowrank", lambda *a, **kw: None)
    passes = M.passes
    vals, W, nprod = US._w_step(Zc, None, Q, Uo.sum(axis=0), Dd, active, k, 1.0, beta, X0=np.eye(d)[idx][:, :k])
    assert nprod > 0 and M.passes == passes
    np.testing.assert_allclose(vals, ref_vals, rtol=0, atol=1e-5 * max(1.0, np.abs(ref_vals).max()))
    assert np.all(W[~active] == 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("standardize", ["scale", "zscore"])
def test_y_and_labels_kept_on_a_worker_run_as_the_driver_does(both_paths, kept_calls, standardize):
    """With Y = Zc W (and the PCA start's T) and the labels kept on a worker (dufs.engine.kept, the path of workers on
    several machines: the pass Zc W left where it is summed, the centring and the U step's k-means run there, the
    labels sent to the pass Zc^T U as a future), UFCM is the driver's run, iteration for iteration and bit for
    bit."""
    from dufs.methods.ufcm import kept

    calls = kept_calls(kept)
    with dask.config.set({"dufs.engine.side-pieces": "off"}):  # W on the driver (in pieces: test_ufcm_features)
        got = both_paths(lambda: Matrix(three_groups_sparse(), standardize=standardize, block_width=200),
                         lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100))
    a, b = got["off"], got["on"]
    assert b.diagnostics["iterations"] == a.diagnostics["iterations"] >= 2
    np.testing.assert_array_equal(b.objective, a.objective)
    np.testing.assert_array_equal(b.W, a.W)
    np.testing.assert_array_equal(b.labels, a.labels)
    assert {"_gram", "_times", "_new_y", "_start", "_u_step"} <= set(calls)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["times", "u_step"])
def test_y_and_labels_lost_with_their_worker_are_made_again(both_paths, forget_kept, caplog, when):
    """A worker that loses Y (or the PCA start's T) and the labels it keeps (it left or restarted) makes the next
    call say so; T or Y is made again from V or W (one pass) and the labels from the last centroids, which do not
    raise the k-means term: the run goes on, its objective never falls, and it selects what the driver's run
    selects."""
    from dufs.methods.ufcm import kept as ukept

    calls: list = []
    caplog.set_level("WARNING", logger="dufs.methods.ufcm.kept")
    with dask.config.set({"dufs.engine.side-pieces": "off"}):  # W on the driver (in pieces: test_ufcm_features)
        got = both_paths(lambda: Matrix(three_groups_sparse(), standardize="scale", block_width=200),
                         lambda M: ufcm(M, n_clusters=3, n_components=2, max_iter=4, dense_below=100),
                         lambda: calls.append(forget_kept(ukept.KeptY, when, 2)))  # the second call
    assert len(calls[0]) >= 2 and "made again on another worker" in caplog.text
    b = got["on"]
    assert np.all(np.diff(b.objective) >= -1e-9 * np.abs(b.objective[1:]))
    top = lambda r: set(np.argsort(-r.scores)[:5])  # noqa: E731
    assert top(b) == top(got["off"])
