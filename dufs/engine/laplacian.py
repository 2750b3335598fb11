"""Graph Laplacians L = D - W and I - D^-1/2 W D^-1/2 of a sparse affinity, and their products for a
low-rank-plus-diagonal anchor graph (never an n x n matrix)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from dufs.kernels.anchor import laplacian_anchor_sums, laplacian_rows, normed_laplacian_vec
from dufs.scheduling import driver_threads, in_threads


# ---------------------------------------------------------------------------------------------------- Laplacians
def laplacian(W: sp.sparray, *, normed: bool = False) -> tuple[sp.csr_array, np.ndarray]:
    """``L = D - W`` (or the normalised ``I - D^-1/2 W D^-1/2``) and the degree vector ``d``."""
    d = np.asarray(W.sum(axis=1), dtype=np.float64).ravel()
    if not normed:
        return sp.csr_array(sp.diags_array(d) - W), d
    Dm = sp.diags_array(_inv_sqrt(d))
    return sp.csr_array(sp.eye_array(W.shape[0]) - Dm @ W @ Dm), d


def _inv_sqrt(d: np.ndarray) -> np.ndarray:
    inv = np.zeros_like(d, dtype=np.float64)
    nz = d > 0
    inv[nz] = 1.0 / np.sqrt(d[nz])
    return inv


_THREADED_ROWS = 1 << 16  # an anchor Laplacian's product with one vector on the driver's threads from this many rows


def _anchor_laplacian_vec(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, s: np.ndarray, li: np.ndarray,
                          v: np.ndarray, threads: int) -> np.ndarray:
    """L v for the anchor graph's normalised Laplacian (:func:`~dufs.kernels.anchor.normed_laplacian_vec`), its rows
    in ``threads`` ranges at once: each range's Zh^T (s v) into an n_anchors row of its own, added in range order,
    then each range's rows of the result (docs/measurements.md, "Anchor Laplacian")."""
    n, m = indptr.shape[0] - 1, li.shape[0]
    out = np.empty(n)
    if threads <= 1:
        return normed_laplacian_vec(indptr, indices, data, s, li, v, np.empty(m), out)
    cut = [n * i // threads for i in range(threads + 1)]
    accs = np.zeros((threads, m))
    in_threads(lambda a, b: [laplacian_anchor_sums(indptr, indices, data, s, v, accs[t], cut[t], cut[t + 1])
                             for t in range(a, b)], threads, threads)
    p = accs[0]
    for t in range(1, threads):
        p += accs[t]
    p *= li
    in_threads(lambda a, b: laplacian_rows(indptr, indices, data, s, p, v, out, a, b), n, threads)
    return out


def _laplacian_op(n: int, matvec_W: Any, d: np.ndarray, normed: bool, Zh: Any = None, li: Any = None
                  ) -> LinearOperator:
    """L = D - W, or I - D^-1/2 W D^-1/2 (a zero degree gives a zero row of D^-1/2), from a product with W; with
    an anchor graph's ``Zh`` here (CSR) and ``li`` = Lambda^-1, the normalised one's products with one vector in
    two sweeps of Zh (:func:`~dufs.kernels.anchor.normed_laplacian_vec`; docs/measurements.md, "Anchor Laplacian"),
    their rows in ranges on the driver's threads from :data:`_THREADED_ROWS` samples (M3FS makes one or two a
    v-solver iteration while the workers wait)."""
    if normed:
        s = _inv_sqrt(d)
        if Zh is not None:
            zd = np.asarray(Zh.data, dtype=np.float64)
            threads = driver_threads() if n >= _THREADED_ROWS else 1

        def mm(V: np.ndarray) -> np.ndarray:
            V = np.asarray(V, dtype=np.float64)
            if Zh is not None and V.size == n:
                # the n_anchors scratch a call's own: the operator may be applied from several threads
                return _anchor_laplacian_vec(Zh.indptr, Zh.indices, zd, s, li, np.ascontiguousarray(V.ravel()),
                                             threads).reshape(V.shape)
            V2 = V.reshape(n, -1)
            out = np.asarray(matvec_W(s[:, None] * V2), dtype=np.float64).reshape(V2.shape)
            if not out.flags.writeable:
                out = out.copy()
            out *= -s[:, None]  # in place: at kddb size each n x p temporary is 154 MB a column
            out += V2
            return out.reshape(V.shape)
    else:
        def mm(V: np.ndarray) -> np.ndarray:
            V = np.asarray(V, dtype=np.float64)
            V2 = V.reshape(n, -1)
            return (d[:, None] * V2 - matvec_W(V2)).reshape(V.shape)

    return LinearOperator((n, n), matvec=mm, rmatvec=mm, matmat=mm, rmatmat=mm, dtype=np.float64)
