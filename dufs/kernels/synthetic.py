"""Numba kernels of the synthetic kddb-like generator (:mod:`dufs.data.synthetic`).

The kernels take uniform random numbers drawn by the caller with NumPy (numba cannot take a
``Generator``) and turn them into CSR rows: power-law feature ranks by a closed-form inverse CDF,
ranks to feature ids by an affine bijection of ``[0, n_features)``, duplicates within a row
resampled, ids sorted ascending within each row.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def power_law_rank(u, n_features, one_minus_s, span, log_n1):
    """Rank in ``[0, n)`` of a continuous power law of density ``~ x**-s`` on ``[1, n + 1)``.

    ``u`` is uniform on ``[0, 1)``, ``n = n_features``; ``span = (n + 1)**(1 - s) - 1`` and
    ``log_n1 = log(n + 1)`` are precomputed. ``one_minus_s == 0`` is the ``s = 1`` case
    (log-uniform). The inverse CDF is ``x = (1 + u * span)**(1 / (1 - s))`` and the rank is
    ``floor(x) - 1``.
    """
    if one_minus_s == 0.0:
        x = np.exp(u * log_n1)
    else:
        x = np.exp(np.log1p(u * span) / one_minus_s)
    r = np.int64(x) - 1
    if r < 0:
        r = 0
    elif r >= n_features:
        r = n_features - 1
    return r


@njit(nogil=True, cache=True)
def fill_power_law_rows(counts, pool, row0, indptr, indices, n_features, one_minus_s, span, log_n1,
                        mult, offset, max_draws_factor, max_draws_extra):
    """Fill CSR rows ``row0, row0 + 1, ...`` with ``counts[i]`` distinct power-law feature ids each.

    Parameters
    ----------
    counts : int64 array (n_rows,)
        Wanted nonzeros of each row (each <= ``n_features``).
    pool : float64 array
        Uniforms on ``[0, 1)``, consumed one per draw, row after row.
    row0 : int
        First row to fill; ``indptr[row0]`` must be set already.
    indptr : int64 array (n_rows + 1,), indices : int32 array (>= counts.sum(),)
        Output CSR buffers, written in place.
    n_features, one_minus_s, span, log_n1
        The power law (see :func:`power_law_rank`).
    mult, offset : int
        The rank -> feature id bijection ``(mult * rank + offset) % n_features``
        (``gcd(mult, n_features) == 1``).
    max_draws_factor, max_draws_extra : int
        A row stops after ``max_draws_factor * counts[i] + max_draws_extra`` draws, shorter than
        asked when most draws hit features already in the row (only when ``counts[i]`` is near
        ``n_features``, or the power law is very steep).

    Returns
    -------
    int
        The number of rows completed: ``counts.shape[0]`` when the pool sufficed, else the row that
        ran out of uniforms (its entries are not valid; call again from it with a fresh pool).
    """
    n_rows = counts.shape[0]
    pos = 0
    n_pool = pool.shape[0]
    for i in range(row0, n_rows):
        start = indptr[i]
        k = counts[i]
        max_draws = max_draws_factor * k + max_draws_extra
        filled = 0
        draws = 0
        while filled < k and draws < max_draws:
            if pos >= n_pool:
                return i
            rank = power_law_rank(pool[pos], n_features, one_minus_s, span, log_n1)
            pos += 1
            draws += 1
            fid = (mult * rank + offset) % n_features
            # binary search in the sorted prefix indices[start:start + filled]
            lo = 0
            hi = filled
            while lo < hi:
                mid = (lo + hi) >> 1
                if indices[start + mid] < fid:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < filled and indices[start + lo] == fid:
                continue  # duplicate: draw again
            for j in range(filled, lo, -1):
                indices[start + j] = indices[start + j - 1]
            indices[start + lo] = fid
            filled += 1
        indptr[i + 1] = start + filled
    return n_rows


@njit(nogil=True, cache=True)
def row_dot_sparse_weights(indptr, indices, ids_sorted, weights):
    """``out[i] = sum_j w[indices[j]]`` over row ``i`` of a binary CSR matrix, ``w`` given sparsely.

    ``ids_sorted`` (ascending) and ``weights`` are the nonzero entries of ``w``.
    """
    n_rows = indptr.shape[0] - 1
    n_w = ids_sorted.shape[0]
    out = np.zeros(n_rows, dtype=np.float64)
    for i in range(n_rows):
        acc = 0.0
        for j in range(indptr[i], indptr[i + 1]):
            f = indices[j]
            lo = 0
            hi = n_w
            while lo < hi:
                mid = (lo + hi) >> 1
                if ids_sorted[mid] < f:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < n_w and ids_sorted[lo] == f:
                acc += weights[lo]
        out[i] = acc
    return out
