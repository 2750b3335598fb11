"""Dense per-cluster reductions of an n x p array ``Y`` with integer ``labels`` (UFCM's U step judges every k-means
candidate by them), and per-bin moments of the rows of a d x c array (UFCM's W step, :func:`bin_moments`): one
sweep over the rows each, no temporary over them. Accumulation in float64.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["bin_moments", "cluster_means", "cluster_sums", "kmeans_term", "nearest"]


@numba.njit(nogil=True, cache=True)
def cluster_sums(Y, labels, c):
    """(S, counts): the sum of the rows of each cluster (c x p) and the cluster sizes (float64), in row order:
    pieces of the rows add theirs. ``labels`` must lie in [0, c)."""
    n, p = Y.shape
    S = np.zeros((c, p), dtype=np.float64)
    counts = np.zeros(c, dtype=np.float64)
    for i in range(n):
        k = labels[i]
        counts[k] += 1.0
        for j in range(p):
            S[k, j] += Y[i, j]
    return S, counts


@numba.njit(nogil=True, cache=True)
def cluster_means(Y, labels, c):
    """(C, counts): the mean of the rows of each cluster (c x p; NaN rows for an empty cluster) and the cluster
    sizes (float64). ``labels`` must lie in [0, c)."""
    S, counts = cluster_sums(Y, labels, c)
    for k in range(c):
        for j in range(S.shape[1]):
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


@numba.njit(nogil=True, cache=True, fastmath=True, boundscheck=False)
def bin_moments(Q, D, d_k, floor, log_ratio, centre, n_terms):
    """Rows i of Q with D_i - ``d_k`` > ``floor`` binned geometrically: bin b = floor(log((D_i - d_k) / floor) /
    ``log_ratio``), for each bin and j < ``n_terms`` the sum of q_i q_i^T (D_i - ``centre``[b])^j, the upper triangle
    of each c x c term packed row by row (c (c + 1) / 2 numbers), and the rows each bin took. One sweep over Q in
    storage order, no temporary over the rows: ((len(centre), n_terms, c (c + 1) / 2), (len(centre),))."""
    m, c = Q.shape
    n_bins = centre.shape[0]
    npair = c * (c + 1) // 2
    acc = np.zeros((n_bins, n_terms, npair))
    count = np.zeros(n_bins, dtype=np.int64)
    xx = np.empty(npair)
    for i in range(m):
        dist = D[i] - d_k
        if not dist > floor:
            continue
        b = min(int(np.floor(np.log(dist / floor) / log_ratio)), n_bins - 1)
        count[b] += 1
        t = 0
        for a in range(c):
            qa = Q[i, a]
            for e in range(a, c):
                xx[t] = qa * Q[i, e]
                t += 1
        delta = D[i] - centre[b]
        p = 1.0
        for j in range(n_terms):
            for t in range(npair):
                acc[b, j, t] += p * xx[t]
            p *= delta
    return acc, count
