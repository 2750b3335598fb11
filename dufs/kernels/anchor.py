"""Products with an anchor graph's normalised Laplacian, Zh (n x n_anchors, CSR) read row by row."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["laplacian_anchor_sums", "laplacian_rows", "normed_laplacian_vec"]


@numba.njit(nogil=True, cache=True)
def laplacian_anchor_sums(indptr, indices, data, s, v, acc, r0, r1):
    """``acc += Zh[r0:r1]^T (s * v)[r0:r1]`` (``acc`` n_anchors float64): the first half of
    :func:`normed_laplacian_vec` over a range of rows."""
    for i in range(r0, r1):
        w = s[i] * v[i]
        # unsigned positions: no wraparound test of a negative index at each nonzero (docs/measurements.md,
        # "Anchor Laplacian")
        for k in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            acc[np.uint64(indices[k])] += np.float64(data[k]) * w


@numba.njit(nogil=True, cache=True)
def laplacian_rows(indptr, indices, data, s, p, v, out, r0, r1):
    """``out[r0:r1] = v - s * (Zh p)`` over a range of rows (``p`` = Lambda^-1 Zh^T (s * v), n_anchors): the second
    half of :func:`normed_laplacian_vec`."""
    for i in range(r0, r1):
        t = 0.0
        for k in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            t += np.float64(data[k]) * p[np.uint64(indices[k])]
        out[i] = t * -s[i] + v[i]


@numba.njit(nogil=True, cache=True)
def normed_laplacian_vec(indptr, indices, data, s, li, v, acc, out):
    """``out = v - s * (Zh (li * (Zh^T (s * v))))``: L v for L = I - D^-1/2 W D^-1/2, W = Zh Lambda^-1 Zh^T,
    ``s`` = D^-1/2 (n), ``li`` = Lambda^-1 (n_anchors); ``acc`` is an n_anchors scratch. Two sweeps over Zh's
    nonzeros and none over an n-vector of temporaries; each sum made in the order of the separate products
    (Zh^T w as the engine's ``csc_matvec`` of Zh^T, Zh p as its ``csc_rmatvec``), so the same numbers. On one
    thread; the rows in ranges on several: :func:`laplacian_anchor_sums` and :func:`laplacian_rows`."""
    n = indptr.shape[0] - 1
    acc[:] = 0.0
    laplacian_anchor_sums(indptr, indices, data, s, v, acc, 0, n)
    for a in range(acc.shape[0]):
        acc[a] = li[a] * acc[a]
    laplacian_rows(indptr, indices, data, s, acc, v, out, 0, n)
    return out
