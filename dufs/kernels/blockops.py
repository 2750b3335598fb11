"""Kernels on one CSC feature block (raw ``indptr, indices, data`` buffers): column statistics and mat-vecs.

A CSC feature block holds whole columns: ``indptr`` (int64, n_cols + 1), ``indices`` (row numbers) and ``data``
(any float dtype). Every accumulation is in float64. No dask or SciPy objects here (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import numba
import numpy as np

from dufs.kernels._prefetch import DISTANCE, prefetch_row  # noqa: F401 (read by the generated kernels)

__all__ = ["col_sums", "column_groups", "csc_class_stats", "csc_column_stats", "csc_label_sums", "csc_matvec",
           "csc_rmatvec"]


@numba.njit(nogil=True, cache=True)
def csc_column_stats(indptr, indices, data, n_rows):
    """Per-column sum, sum of squares, centred sum of squares, nonzero count, min and max of a CSC block.

    Statistics are over all ``n_rows`` entries of each column, implicit zeros included. The centred sum of
    squares ``m2 = sum_i (x_i - mean)^2`` is computed in two passes (exactly 0 for a constant column).
    min and max are NaN for ``n_rows == 0``. Returns ``(sum, sumsq, m2, nnz, min, max)``: float64 arrays and an
    int64 ``nnz`` (stored entries that are nonzero).
    """
    n_cols = indptr.shape[0] - 1
    s = np.zeros(n_cols, dtype=np.float64)
    ss = np.zeros(n_cols, dtype=np.float64)
    m2 = np.zeros(n_cols, dtype=np.float64)
    nnz = np.zeros(n_cols, dtype=np.int64)
    mn = np.full(n_cols, np.nan, dtype=np.float64)
    mx = np.full(n_cols, np.nan, dtype=np.float64)
    for j in range(n_cols):
        a = np.int64(indptr[j])
        b = np.int64(indptr[j + 1])
        acc = 0.0
        acc2 = 0.0
        cnt = np.int64(0)
        lo = np.inf
        hi = -np.inf
        for k in range(a, b):
            v = np.float64(data[k])
            acc += v
            acc2 += v * v
            if v != 0.0:
                cnt += 1
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        if b - a < n_rows:  # some implicit zeros
            if lo > 0.0:
                lo = 0.0
            if hi < 0.0:
                hi = 0.0
        s[j] = acc
        ss[j] = acc2
        nnz[j] = cnt
        if n_rows > 0:
            mn[j] = lo
            mx[j] = hi
            if lo == hi:
                m2[j] = 0.0
            else:
                mean = acc / n_rows
                c = 0.0
                for k in range(a, b):
                    d = np.float64(data[k]) - mean
                    c += d * d
                c += (n_rows - (b - a)) * mean * mean
                m2[j] = c
    return s, ss, m2, nnz, mn, mx


@numba.njit(nogil=True, cache=True)
def csc_class_stats(indptr, indices, data, codes, n_classes):
    """Per-class, per-column sums and sums of squares: ``(sum, sumsq)``, each float64 ``(n_classes, n_cols)``.

    ``codes[i]`` is the class (0 .. n_classes - 1) of row ``i``.
    """
    n_cols = indptr.shape[0] - 1
    s = np.zeros((n_classes, n_cols), dtype=np.float64)
    ss = np.zeros((n_classes, n_cols), dtype=np.float64)
    for j in range(n_cols):
        for k in range(np.int64(indptr[j]), np.int64(indptr[j + 1])):
            c = np.int64(codes[np.int64(indices[k])])
            v = np.float64(data[k])
            s[c, j] += v
            ss[c, j] += v * v
    return s, ss


# ---------------------------------------------------------------------------------------------------- products
# A product with p columns sweeps the nonzeros once: the p numbers of a row of V (or U) are read (or written)
# together, and the p sums live in scalar accumulators the compiler keeps in registers. Numba cannot unroll a loop
# over a run-time p into registers (an accumulator array of length p stays in memory, and its loads and stores cost
# as much as the random read of V), so the kernels for each p up to _UNROLL are generated from one template,
# compiled lazily and cached like hand-written ones; wider products run in groups of _UNROLL columns.
_UNROLL = 16

_RMATVEC_TEMPLATE = """
def {name}(indptr, indices, data, V, out, q0):
    nnz = np.uint64(indices.shape[0])
    for j in range(indptr.shape[0] - 1):
{init}
        # unsigned positions: no negative-index wraparound checks in the inner loop (docs/architecture.md)
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            if k + np.uint64(DISTANCE) < nnz:  # V's row of a nonzero ahead (a hint: the sums are unchanged)
                prefetch_row(V, indices[k + np.uint64(DISTANCE)])
            r = np.uint64(indices[k])
            v = np.float64(data[k])
{body}
{store}
    return out
"""

_MATVEC_TEMPLATE = """
def {name}(indptr, indices, data, U, out, q0):
    nnz = np.uint64(indices.shape[0])
    for j in range(indptr.shape[0] - 1):
{init}
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            if k + np.uint64(DISTANCE) < nnz:  # out's row of a nonzero ahead
                prefetch_row(out, indices[k + np.uint64(DISTANCE)])
            r = np.uint64(indices[k])
            v = np.float64(data[k])
{body}
    return out
"""


def _generate(template: str, name: str, p: int, init: str, body: str, store: str = ""):
    """Compile ``template`` for ``p`` columns: ``init``, ``body`` and ``store`` are per-column lines (``{q}`` the
    column), joined into the template's slots. The source is compiled under this file's name, so numba caches it
    on disk like the hand-written kernels."""
    lines = {key: "\n".join(part.format(q=q) for q in range(p)) for key, part in
             (("init", init), ("body", body), ("store", store))}
    src = template.format(name=name, **lines)
    namespace: dict = {}
    exec(compile(src, __file__, "exec"), globals(), namespace)  # noqa: S102 (our own template, no input)
    fn = namespace[name]
    fn.__module__ = __name__
    fn.__qualname__ = name
    fn.__doc__ = f"The p = {p} columns ``q0 .. q0 + {p - 1}`` of a product (generated; see ``_generate``)."
    return numba.njit(nogil=True, cache=True, boundscheck=False)(fn)


_RMATVEC = [None] + [_generate(_RMATVEC_TEMPLATE, f"_csc_rmatvec_{p}", p,
                               "        a{q} = 0.0",
                               "            a{q} += v * np.float64(V[r, q0 + {q}])",
                               "        out[j, q0 + {q}] = a{q}") for p in range(1, _UNROLL + 1)]
_MATVEC = [None] + [_generate(_MATVEC_TEMPLATE, f"_csc_matvec_{p}", p,
                              "        u{q} = np.float64(U[j, q0 + {q}])",
                              "            out[r, q0 + {q}] += v * u{q}") for p in range(1, _UNROLL + 1)]
# the same with each row of U scaled by ``scale[j]`` as it is read (``scale`` passed in the ``q0`` tuple's place:
# the template's signature stays one): the product of a block with U diag-scaled, no scaled copy of U made
_MATVEC_SCALED = [None] + [_generate(_MATVEC_TEMPLATE.replace("(indptr, indices, data, U, out, q0)",
                                                              "(indptr, indices, data, U, out, q0, scale)"),
                                     f"_csc_matvec_scaled_{p}", p,
                                     "        u{q} = np.float64(U[j, q0 + {q}]) * scale[j]",
                                     "            out[r, q0 + {q}] += v * u{q}") for p in range(1, _UNROLL + 1)]


# A wide product's randomly accessed rows (V's in Z^T V, the result's in Z U: n_rows x p) thrash the cache once
# they pass about 16 MB: groups of columns that fit it are faster than one sweep. Where even a group of
# _MIN_GROUP is far past the cache, every group misses again: one sweep is best there (docs/measurements.md,
# "Wide products")
_GROUP_BYTES = 8 << 20
_MIN_GROUP = 4


def column_groups(n_rows: int, p: int, itemsize: int = 8) -> list[tuple[int, int]]:
    """(first column, width) of each group of columns a ``p``-column product over ``n_rows`` rows sweeps at once:
    all of them, unless a group of at least ``_MIN_GROUP`` columns keeps its n_rows x width rows within
    ``_GROUP_BYTES`` while all p do not (then groups of equal width within that)."""
    g = _GROUP_BYTES // max(1, n_rows * itemsize)
    if g >= p or g < _MIN_GROUP:
        return [(0, p)]
    k = -(-p // g)
    w = -(-p // k)
    return [(q0, min(w, p - q0)) for q0 in range(0, p, w)]


def _groups(p: int):
    """Column groups (first column, width) of a p-column product: _UNROLL wide, then the rest."""
    return [(q0, min(_UNROLL, p - q0)) for q0 in range(0, p, _UNROLL)]


def csc_rmatvec(indptr, indices, data, V, out):
    """``out[:] = X_block^T V``: V ``(n_rows, p)`` float64 (or float32, half the memory traffic for the randomly
    read vector; products and sums are float64 either way), out float64 ``(n_cols_block, p)`` (overwritten).

    One sweep over the nonzeros for up to 16 columns (one more per further 16). Row indices must be in
    ``[0, n_rows)`` (they are not bounds-checked)."""
    for q0, w in _groups(V.shape[1]):
        _RMATVEC[w](indptr, indices, data, V, out, q0)
    return out


@numba.njit(nogil=True, cache=True, boundscheck=False)
def csc_label_sums(indptr, indices, data, labels, out):
    """``out[:] = X_block^T U`` for U the n_rows x c indicator of ``labels`` (U[i, labels[i]] = 1, c =
    ``out.shape[1]``): each column's sum of the values in the rows of each label, float64 ``(n_cols_block, c)``
    (overwritten). The same sums, added in the same order, as :func:`csc_rmatvec` with U itself (its other
    columns' terms are v * 0 = 0), from the labels (4 bytes a row, read at random from the cache) instead of U
    (8 c bytes a row: 16 MB at 200K rows and c = 10, past the cache: docs/measurements.md, "Wide products").
    Labels must lie in ``[0, c)`` and row indices in ``[0, n_rows)`` (neither is checked here)."""
    c = out.shape[1]
    for j in range(indptr.shape[0] - 1):
        for q in range(c):
            out[j, q] = 0.0
        for k in range(np.uint64(indptr[j]), np.uint64(indptr[j + 1])):
            out[j, np.uint64(labels[np.uint64(indices[k])])] += np.float64(data[k])
    return out


def csc_matvec(indptr, indices, data, U, out, scale=None):
    """``out += X_block U``: U float64 ``(n_cols_block, p)``, out float64 ``(n_rows, p)`` (accumulated into); with
    ``scale`` (float64 ``(n_cols_block,)``), ``out += X_block diag(scale) U``, each row of U scaled as it is read
    (the same numbers as the product with the scaled copy, without making it).

    One sweep over the nonzeros for up to 16 columns (one more per further 16). Row indices must be in
    ``[0, n_rows)`` (they are not bounds-checked)."""
    for q0, w in _groups(U.shape[1]):
        if scale is None:
            _MATVEC[w](indptr, indices, data, U, out, q0)
        else:
            _MATVEC_SCALED[w](indptr, indices, data, U, out, q0, scale)
    return out


@numba.njit(nogil=True, cache=True)
def tall_gram(T):
    """T^T T (p x p) of a tall C-ordered float64 (n, p) array, the rows summed in order in one sweep: the same
    numbers in any process (a BLAS product's rounding depends on how the library blocks it there)."""
    n, p = T.shape
    G = np.zeros((p, p))
    for i in range(n):
        for j in range(p):
            a = T[i, j]
            for k in range(j, p):
                G[j, k] += a * T[i, k]
    for j in range(p):
        for k in range(j):
            G[j, k] = G[k, j]
    return G


def col_sums(V: np.ndarray) -> np.ndarray:
    """Column sums of a tall (n, p) array as float64, one strided pairwise sum per column: faster than NumPy's
    ``V.sum(axis=0)`` on a C-ordered array (docs/measurements.md, "Wide products")."""
    V = np.asarray(V)
    if V.ndim == 1:
        return np.asarray(V.sum(dtype=np.float64))
    return np.array([V[:, j].sum(dtype=np.float64) for j in range(V.shape[1])], dtype=np.float64)
