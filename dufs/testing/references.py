"""Dense NumPy references the tests compare the engine and the methods against (small matrices only).

They follow the definitions directly (explicit standardization, explicit MMFS columns), never dufs' own code.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def tame(X):
    """Bounded, few-digit values (so float64 references agree to 1e-10 even for nearly constant columns)."""
    A = sp.csr_array(X, copy=True)
    A.data = np.round(np.clip(A.data, -10, 10), 1).astype(A.dtype)
    A.eliminate_zeros()
    return A


def dense_z(D, mode):
    """The explicitly transformed dense matrix: ``"zscore"``, ``"scale"`` or None; population std, a zero std (or a
    constant column) taken as 1."""
    D = D.toarray() if sp.issparse(D) else np.asarray(D, dtype=np.float64)
    if mode is None:
        return D
    sd = D.std(0)
    sd[(D.max(0) == D.min(0)) | (sd == 0)] = 1.0
    if mode == "scale":
        return D / sd
    return (D - D.mean(0)) / sd


def mmfs_features(X, mode):
    """The MMFS feature columns, explicitly: the standardized dense matrix divided by sqrt(m) (None: raw)."""
    Z = dense_z(X, mode)
    return Z if mode is None else Z / np.sqrt(Z.shape[0])


def label_relevance(F, y):
    """|f_i^T y~| with y~ the labels centred and scaled to unit norm."""
    y = np.asarray(y, dtype=np.float64)
    yc = y - y.mean()
    return np.abs(F.T @ (yc / np.linalg.norm(yc)))


def check_column_stats(st, D, y=None, tol=None):
    """Assert that column statistics ``st`` are those of the dense matrix ``D`` (per class too when ``y``)."""
    tol = {"rtol": 1e-10, "atol": 1e-10} if tol is None else tol
    n = D.shape[0]
    assert st.n_rows == n
    np.testing.assert_allclose(st.sum, D.sum(0), **tol)
    np.testing.assert_allclose(st.sumsq, (D * D).sum(0), **tol)
    np.testing.assert_array_equal(st.nnz, (D != 0).sum(0))
    np.testing.assert_array_equal(st.min, D.min(0))
    np.testing.assert_array_equal(st.max, D.max(0))
    np.testing.assert_allclose(st.mean(), D.mean(0), **tol)
    var = D.var(0)
    var[D.max(0) == D.min(0)] = 0.0
    np.testing.assert_allclose(st.var(), var, **tol)
    np.testing.assert_allclose(st.std(), np.sqrt(var), **tol)
    if y is not None:
        classes = np.unique(y)
        np.testing.assert_array_equal(st.classes, classes)
        for i, c in enumerate(classes):
            assert st.class_count[i] == (y == c).sum()
            np.testing.assert_allclose(st.class_sum[i], D[y == c].sum(0), **tol)
            np.testing.assert_allclose(st.class_sumsq[i], (D[y == c] ** 2).sum(0), **tol)
            np.testing.assert_allclose(st.class_mean()[i], D[y == c].mean(0), **tol)


def labelled_problem(seed=0, n=90, d=40):
    """A small sparse problem whose labels depend on its first three features (MMFS and QPFS tests)."""
    rng = np.random.default_rng(seed)
    X = sp.random_array((n, d), density=0.3, rng=rng, format="csr")
    y = np.where(rng.standard_normal(n) + 2 * X[:, :3].toarray().sum(1) > 0.6, 1.0, -1.0)
    return X, y


def planted_clusters(n: int, d: int, seed: int = 0) -> tuple[sp.csr_array, np.ndarray, np.ndarray]:
    """kddb-like binary rows with 2 planted clusters, by NumPy alone: ``(X, z, cluster_features)``. Each row holds
    up to 25 background features drawn by a power law (Zipf over the first d - 40) and 5 of the 20 features that
    belong to its cluster z (the last 40: 20 a cluster)."""
    rng = np.random.default_rng(seed)
    z = rng.integers(0, 2, n)
    own = np.arange(d - 40, d).reshape(2, 20)
    p = 1.0 / np.arange(1, d - 40 + 1)
    p /= p.sum()
    rows = [np.concatenate([np.unique(rng.choice(d - 40, 25, p=p)), rng.choice(own[z[i]], 5, replace=False)])
            for i in range(n)]
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])])
    X = sp.csr_array((np.ones(indptr[-1]), np.concatenate(rows), indptr), shape=(n, d))
    return X, z, own.ravel()
