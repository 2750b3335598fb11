"""The exact kNN graph's selection (dufs.engine.graphs.knn_graph): the k nearest samples of each row of a Gram
block, made from the block's Gram products and the squared row norms in one sweep, ties at the k-th distance to
the lower sample index.

The distance matrix of a block and its argpartition (plus a tie rule for the one-hot data that tie at nearly every
row) took seconds a block and two more block-sized arrays; the sweep keeps a k-long sorted list a row
(docs/measurements.md, "Exact kNN graphs").
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["knn_select"]


@numba.njit(nogil=True, cache=True)
def knn_select(G, sq, a, k):
    """Column indices and squared distances (m x k each, ascending by (distance, index)) of the k nearest samples
    of rows a .. a + m - 1, sample i itself left out, from G (n x m: G[j, i] = <z_j, z_{a+i}>) and the squared
    norms ``sq`` of all n rows: d = max(sq[a + i] + sq[j] - 2 G[j, i], 0), NumPy's order of operations. Among
    equal distances the lower index comes first (a later one enters only below the k-th distance so far)."""
    n, m = G.shape
    idx = np.full((m, k), -1, np.int64)
    dist = np.full((m, k), np.inf)
    for j in range(n):  # row by row of G: contiguous; the m lists of k stay in cache
        sj = sq[j]
        for i in range(m):
            d = sq[a + i] + sj - 2.0 * G[j, i]
            if d < 0.0:
                d = 0.0
            if d < dist[i, k - 1] and j != a + i:
                p = k - 1
                while p > 0 and dist[i, p - 1] > d:
                    dist[i, p] = dist[i, p - 1]
                    idx[i, p] = idx[i, p - 1]
                    p -= 1
                dist[i, p] = d
                idx[i, p] = j
    return idx, dist
