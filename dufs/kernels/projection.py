"""The random projection R (n_features x p) of the anchor graph, generated from a counter-based hash.

Entry R[j, c] depends only on (seed, j, c): ``word = mix(j * K1 ^ mix(seed + (c // 4) * K2))`` and the 16-bit lane
``u = (word >> 16 (c % 4)) & 0xFFFF`` give +s when u < T, -s when T <= u < 2T and 0 otherwise, with
T = 10923 (probability 0.16667 each sign, Achlioptas' sparse signs) and s = sqrt(65536 / (2 T p)), so every entry
has mean 0 and variance 1 / p exactly. A row block embeds its own rows, E_i = x_i R, generating only the rows of R
its nonzeros touch: R (30M x 64 at kddb size) never exists.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["THRESHOLD", "csr_embed", "projection_scale", "projection_table"]

THRESHOLD = 10923
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xD1B54A32D192ED03)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def projection_scale(p: int) -> float:
    """The magnitude s of R's nonzero entries for ``p`` columns (variance 1 / p)."""
    return math.sqrt(65536.0 / (2.0 * THRESHOLD * int(p)))


@numba.njit(inline="always")
def _mix(x):
    """splitmix64's finaliser (uint64 in, uint64 out)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@numba.njit(cache=True)
def _seeds(seed, p):
    words = (p + 3) // 4
    out = np.empty(words, dtype=np.uint64)
    for w in range(words):
        out[w] = _mix(np.uint64(seed) + np.uint64(w) * _K2)
    return out


@numba.njit(inline="always")
def _sign(h, lane):
    """+1, -1 or 0 from the 16-bit lane ``lane`` of the hash word ``h``."""
    u = (h >> np.uint64(16 * lane)) & np.uint64(0xFFFF)
    if u < np.uint64(THRESHOLD):
        return 1.0
    if u < np.uint64(2 * THRESHOLD):
        return -1.0
    return 0.0


@numba.njit(inline="always")
def _add_row(j, sw, p, value, out_row):
    """out_row[c] += value * sign(j, c) for every column c (R's row j, from its hash words)."""
    for w in range(sw.shape[0]):
        h = _mix(j * _K1 ^ sw[w])
        for lane in range(4):
            c = 4 * w + lane
            if c >= p:
                break
            out_row[c] += value * _sign(h, lane)


@numba.njit(nogil=True, cache=True)
def _table(features, p, seed, scale, out):
    sw = _seeds(seed, p)
    for r in range(features.shape[0]):
        out[r, :] = 0.0
        _add_row(np.uint64(features[r]), sw, p, scale, out[r])


def projection_table(features: np.ndarray, p: int, seed: int) -> np.ndarray:
    """Rows ``features`` (global feature ids) of R, as a dense float64 (len(features) x p) array."""
    f = np.ascontiguousarray(features, dtype=np.int64)
    out = np.empty((f.shape[0], int(p)), dtype=np.float64)
    _table(f, int(p), np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF), projection_scale(p), out)
    return out


@numba.njit(nogil=True, cache=True)
def _csr_embed(indptr, indices, data, scale_j, has_scale, p, sw, s, out):
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            jj = indices[k]
            x = np.float64(data[k])
            if has_scale:
                x *= scale_j[jj]
            if x != 0.0:
                _add_row(np.uint64(jj), sw, p, x * s, out[i])


def csr_embed(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, p: int, seed: int,
              scale: np.ndarray | None = None) -> np.ndarray:
    """E = X diag(scale) R for the CSR rows ``(indptr, indices, data)`` (global feature ids in ``indices``):
    rows x ``p`` float64, R's rows generated per nonzero (:func:`projection_table`'s entries)."""
    rows = indptr.shape[0] - 1
    out = np.zeros((rows, int(p)), dtype=np.float64)
    sc = np.zeros(1) if scale is None else np.ascontiguousarray(scale, dtype=np.float64)
    sw = _seeds(np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF), int(p))
    _csr_embed(np.ascontiguousarray(indptr, dtype=np.int64), indices, data, sc, scale is not None, int(p), sw,
               projection_scale(p), out)
    return out
