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
