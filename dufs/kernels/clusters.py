"""Dense per-cluster reductions of an n x p array ``Y`` with integer ``labels`` (UFCM's U step judges every k-means
candidate by them): one sweep over the rows each, no n x p temporary. Accumulation in float64.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["cluster_means", "kmeans_term", "nearest"]


@numba.njit(nogil=True, cache=True)
def cluster_means(Y, labels, c):
    """(C, counts): the mean of the rows of each cluster (c x p; NaN rows for an empty cluster) and the cluster
    sizes (float64). ``labels`` must lie in [0, c)."""
    n, p = Y.shape
    S = np.zeros((c, p), dtype=np.float64)
    counts = np.zeros(c, dtype=np.float64)
    for i in range(n):
        k = labels[i]
        counts[k] += 1.0
        for j in range(p):
            S[k, j] += Y[i, j]
    for k in range(c):
        for j in range(p):
            S[k, j] = S[k, j] / counts[k] if counts[k] > 0.0 else np.nan
    return S, counts


@numba.njit(nogil=True, cache=True)
def kmeans_term(Y, labels, C):
    """sum_i ||y_i - C[labels_i]||^2 (the k-means term ||Y - U G^T||_F^2 with G^T = C)."""
    n, p = Y.shape
    acc = 0.0
    for i in range(n):
        k = labels[i]
        for j in range(p):
            r = Y[i, j] - C[k, j]
            acc += r * r
    return acc


@numba.njit(nogil=True, cache=True)
def nearest(Y, C):
    """The index of the nearest row of ``C`` (c x p) to each row of ``Y`` (squared Euclidean distance; ties keep
    the lower index): k-means' assignment step."""
    n, p = Y.shape
    c = C.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        best = np.inf
        arg = 0
        for k in range(c):
            acc = 0.0
            for j in range(p):
                r = Y[i, j] - C[k, j]
                acc += r * r
            if acc < best:
                best = acc
                arg = k
        out[i] = arg
    return out
