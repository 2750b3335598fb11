"""The implicit standardisation applied in place to a block's product (docs/architecture.md, "Implicit
standardisation"): Z_b^T V = diag(inv) (X_b^T V - mu (1^T V)), row by row of the (width, p) result, with no
temporary arrays (a temporary the size of the result is a fresh allocation every pass)."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["standardize_rows"]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _centre_scale(out, mu, vsum, inv):
    w, p = out.shape
    for j in range(w):
        m = mu[j]
        s = inv[j]
        for q in range(p):
            out[j, q] = (out[j, q] - m * vsum[q]) * s


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _centre(out, mu, vsum):
    w, p = out.shape
    for j in range(w):
        m = mu[j]
        for q in range(p):
            out[j, q] -= m * vsum[q]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _scale(out, inv):
    w, p = out.shape
    for j in range(w):
        s = inv[j]
        for q in range(p):
            out[j, q] *= s


def standardize_rows(out: np.ndarray, mu: np.ndarray | None, vsum: np.ndarray | None,
                     inv: np.ndarray | None) -> np.ndarray:
    """``out[j, :] = (out[j, :] - mu[j] * vsum) * inv[j]`` in place for a float64 (width, p) ``out`` (X_b^T V of
    a block), ``mu`` and ``inv`` over the block's features (None: no centring, no scaling) and ``vsum`` = 1^T V
    (p). Returns ``out``."""
    if mu is not None and inv is not None:
        _centre_scale(out, mu, vsum, inv)
    elif mu is not None:
        _centre(out, mu, vsum)
    elif inv is not None:
        _scale(out, inv)
    return out
