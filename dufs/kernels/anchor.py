"""Products with an anchor graph's normalised Laplacian, Zh (n x n_anchors, CSR) read row by row."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["normed_laplacian_vec"]


@numba.njit(nogil=True, cache=True)
def normed_laplacian_vec(indptr, indices, data, s, li, v, acc, out):
    """``out = v - s * (Zh (li * (Zh^T (s * v))))``: L v for L = I - D^-1/2 W D^-1/2, W = Zh Lambda^-1 Zh^T,
    ``s`` = D^-1/2 (n), ``li`` = Lambda^-1 (n_anchors); ``acc`` is an n_anchors scratch. Two sweeps over Zh's
    nonzeros and none over an n-vector of temporaries; each sum made in the order of the separate products
    (Zh^T w as the engine's ``csc_matvec`` of Zh^T, Zh p as its ``csc_rmatvec``), so the same numbers."""
    n = indptr.shape[0] - 1
    acc[:] = 0.0
    for i in range(n):
        w = s[i] * v[i]
        for k in range(indptr[i], indptr[i + 1]):
            acc[indices[k]] += np.float64(data[k]) * w
    for a in range(acc.shape[0]):
        acc[a] = li[a] * acc[a]
    for i in range(n):
        t = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            t += np.float64(data[k]) * acc[indices[k]]
        out[i] = t * -s[i] + v[i]
    return out
