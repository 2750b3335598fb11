"""The selected columns on the driver (Z_S, by rows and as a bit mask where they are binary) and the products the
greedy steps make with them."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from dufs.kernels.blockops import col_sums
from dufs.kernels.greedy import (
    bits_apply,
    bits_eligible,
    bits_row_sums,
    bits_set,
    bits_slot_sums,
    bits_tables,
    cols_apply,
    cols_tapply,
    tile_cuts,
)
from dufs.scheduling import driver_threads, in_threads

_INT32_ARRAY = numba.types.int32[::1]
_INT64_ARRAY = numba.types.int64[::1]
_VALUE_ARRAY = {np.dtype(np.float32): numba.types.float32[::1], np.dtype(np.float64): numba.types.float64[::1]}
_DRIVER_THREADS = driver_threads()


def _in_threads(fn: Any, count: int, bounds: Any = None) -> None:
    """``fn(a, b)`` over [0, count) in up to :data:`_DRIVER_THREADS` ranges at once (:func:`dufs.scheduling.in_threads`:
    the driver's products with the selected columns, numba kernels that release the GIL)."""
    in_threads(fn, count, _DRIVER_THREADS, bounds)


def _row_shares(count: int) -> list[int]:
    """Bounds cutting ``count`` rows of a sparse column into a share a driver thread (one share below 64K rows:
    a thread's partial result and its start cost more than it saves), for products that sum partial results."""
    parts = max(1, min(_DRIVER_THREADS, count >> 15))
    return [count * i // parts for i in range(parts + 1)]


# ---------------------------------------------------------------------------------------------------- the driver
class SelectedColumns:
    """The selected columns on the driver (raw, sparse, one array pair a column, kept as they arrived: adding one
    copies nothing, where growing one buffer reallocated and copied all of them) with their transform, and
    H = G_SS (k x k). Products with them run through the engine's numba kernels, by row tiles. A column of one value
    with at least n / 32 rows (kddb's heavy binary columns, which a LapAOFS selection takes first) is also kept as
    one bit of a row-major mask (:func:`~dufs.kernels.greedy.bits_eligible`): the products over every row (Z_S c)
    and over a sparse vector's rows (Z_S^T y, :meth:`tapply_rows`) read it instead of the columns' row numbers, a
    fraction of their bytes (docs/measurements.md, "Greedy steps")."""

    def __init__(self, n: int, lam2: float, dtype: Any = np.float64):
        self.n = n
        self.lam2 = lam2
        self.ids: list[int] = []
        # (indptr [0, nnz], rows int32, values) a column; the values in the data's own dtype (float32 data stay
        # float32, exactly: a kddb hub column has ~10M rows)
        self.cols: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.dtype = np.dtype(dtype)
        self.coef = np.zeros(0)
        self.shift = np.zeros(0)
        self.H = np.zeros((0, 0))
        self._nb: tuple | None = None  # :meth:`_numba_lists`
        # the bit mask (n x W uint64, None until a column goes there), each column's slot (-1: none) and the slots'
        # columns; ``_own_words`` False where the mask is the one of the set this one is a head of (read only)
        self._words: np.ndarray | None = None
        self._slot: list[int] = []
        self._slot_cols: list[int] = []
        self._own_words = True

    @property
    def k(self) -> int:
        return len(self.ids)

    def col(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        return self.cols[t][1], self.cols[t][2]

    def head(self, t: int) -> SelectedColumns:
        """The first ``t`` selected columns (sharing this one's arrays)."""
        part = SelectedColumns(self.n, self.lam2, self.dtype)
        part.ids, part.cols = self.ids[:t], self.cols[:t]
        part.coef, part.shift, part.H = self.coef[:t], self.shift[:t], self.H[:t, :t]
        # the mask shared: the head's slots are a prefix of these (slots go in column order), later slots weigh 0
        part._slot = self._slot[:t]
        part._slot_cols = [c for c in self._slot_cols if c < t]
        part._words, part._own_words = self._words, self._words is None
        return part

    def X(self) -> sp.csc_array:
        ptr = np.zeros(self.k + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(c[1]) for c in self.cols])
        ind = np.concatenate([c[1] for c in self.cols]) if self.cols else np.zeros(0, np.int32)
        dat = np.concatenate([c[2] for c in self.cols]) if self.cols else np.zeros(0, self.dtype)
        return sp.csc_array((dat, ind, ptr), shape=(self.n, self.k))

    def _numba_lists(self) -> tuple:
        """The columns as numba typed lists (rows, values, tile cuts), extended as columns are added; a column of one
        value (binary data) gives that value alone (the kernels then read its rows only)."""
        from numba.typed import List

        if self._nb is None:
            self._nb = (List.empty_list(_INT32_ARRAY), List.empty_list(_VALUE_ARRAY[self.dtype]),
                        List.empty_list(_INT64_ARRAY))
        inds, dats, cuts = self._nb
        for _, rows, vals in self.cols[len(inds):]:
            inds.append(rows)
            dats.append(vals[:1].copy() if vals.shape[0] and (vals == vals[0]).all() else vals)  # one value: alone
            cuts.append(tile_cuts(rows, self.n))
        return self._nb

    @property
    def slots(self) -> int:
        return len(self._slot_cols)

    def _slot_values(self) -> np.ndarray:
        """The value of each slot's column (its one value), in slot order."""
        return np.array([float(self.cols[t][2][0]) for t in self._slot_cols])

    def _skip(self) -> np.ndarray:
        """1 for the columns in the bit mask (the index kernels leave them out), 0 for the others."""
        return (np.asarray(self._slot, dtype=np.int64) >= 0).astype(np.uint8)

    def mask_bytes(self) -> np.ndarray:
        """The bit mask as bytes, n x 8W (n x 0 without one)."""
        if self._words is None:
            return np.zeros((self.n, 0), dtype=np.uint8)
        return self._words.view(np.uint8).reshape(self.n, -1)

    def apply_parts(self, c: np.ndarray, out: np.ndarray | None = None) -> tuple:
        """Z_S c (``c`` k x p) in parts: (Y, T, offset) with Z_S c = Y + (the rows' sums in the byte tables T) -
        offset, Y the columns outside the bit mask (n x p, into ``out`` when given; of no rows where every column
        is in the mask), T (:func:`~dufs.kernels.greedy.bits_tables`, of no bytes without a mask) and offset the
        shift's part (p)."""
        w = np.ascontiguousarray(self.coef[:, None] * c)
        p = w.shape[1]
        T = np.zeros((0, 256, p))
        if self.slots:
            T = bits_tables(np.ascontiguousarray(self._slot_values()[:, None] * w[self._slot_cols]))
        if self.slots == self.k and self.k:
            Y = np.zeros((0, p))
        else:
            Y = np.empty((self.n, p)) if out is None else out
            if not self.k:
                Y[:] = 0.0
            else:
                inds, dats, cuts = self._numba_lists()
                skip = self._skip()
                _in_threads(lambda a, b: cols_apply(inds, dats, cuts, w, skip, Y, a, b), len(cuts[0]) - 1)
        offset = self.shift @ w if self.shift.any() else np.zeros(p)
        return Y, T, offset

    def apply(self, c: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Z_S c (an n-vector, or n x p for a k x p ``c``; into ``out``, n x p float64, when given)."""
        one = c.ndim == 1
        c2 = c[:, None] if one else c
        Y, T, offset = self.apply_parts(c2, out)
        if Y.shape[0] == 0:  # every column in the mask
            Y = np.empty((self.n, c2.shape[1])) if out is None else out
        if self.slots:
            w8 = self.mask_bytes()
            acc = self.slots < self.k
            _in_threads(lambda a, b: bits_apply(w8, T, Y, acc, a, b), self.n)
        if offset.any():
            Y -= offset[None, :]
        return Y[:, 0] if one else Y

    def gram(self) -> np.ndarray:
        """Z_S^T Z_S (k x k) from the sparse columns: coef_i coef_j (x_i^T x_j - mu_j 1^T x_i - mu_i 1^T x_j +
        n mu_i mu_j)."""
        X = self.X()
        X = sp.csc_array((X.data.astype(np.float64), X.indices, X.indptr), shape=X.shape)  # float64 products
        G = np.asarray((X.T @ X).toarray(), dtype=np.float64)
        cs = np.asarray(X.sum(axis=0)).ravel()
        mu = self.shift
        G = G - np.outer(cs, mu) - np.outer(mu, cs) + self.n * np.outer(mu, mu)
        return self.coef[:, None] * G * self.coef[None, :]

    def tapply(self, V: np.ndarray) -> np.ndarray:
        """Z_S^T V (k, or k x p)."""
        one = V.ndim == 1
        V2 = np.ascontiguousarray(V[:, None] if one else V, dtype=np.float64)
        out = np.zeros((self.k, V2.shape[1]))
        if self.k:
            inds, dats, cuts = self._numba_lists()
            skip = np.zeros(self.k, dtype=np.uint8)  # every column by its rows: V is dense
            _in_threads(lambda a, b: cols_tapply(inds, dats, cuts, V2, skip, out, a, b), self.k,
                        lambda parts: self._nnz_bounds(parts, skip))
            if self.shift.any():  # else out - 0 * sums = out: V's column sums (a sweep over n x p) not needed
                out = out - self.shift[:, None] * col_sums(V2)[None, :]
            out = self.coef[:, None] * out
        return out[:, 0] if one else out

    def tapply_rows(self, rows: np.ndarray, y: np.ndarray, dense: np.ndarray) -> np.ndarray:
        """Z_S^T y (k) for a y nonzero only at ``rows`` (sorted), with its values there ``y`` and the whole of it
        ``dense`` (an n-vector, read by the columns outside the bit mask only): the mask's columns from y's rows of
        the mask (:func:`~dufs.kernels.greedy.bits_row_sums`), the rest by their rows."""
        out = np.zeros((self.k, 1))
        if not self.k:
            return out[:, 0]
        skip = self._skip()
        if self.slots < self.k:
            inds, dats, cuts = self._numba_lists()
            V2 = dense.reshape(-1, 1)
            _in_threads(lambda a, b: cols_tapply(inds, dats, cuts, V2, skip, out, a, b), self.k,
                        lambda parts: self._nnz_bounds(parts, skip))
        if self.slots:
            w8 = self.mask_bytes()
            G = (self.slots + 7) // 8
            cut = _row_shares(rows.shape[0])  # a table each
            Hs = np.zeros((len(cut) - 1, G, 256))
            _in_threads(lambda a, b: [bits_row_sums(w8, rows, y, Hs[i], cut[i], cut[i + 1]) for i in range(a, b)],
                        len(cut) - 1)
            sums = np.empty(self.slots)
            bits_slot_sums(Hs.sum(axis=0), self.slots, sums)
            out[self._slot_cols, 0] = self._slot_values() * sums
        if self.shift.any():
            out[:, 0] -= self.shift * float(np.sum(y, dtype=np.float64))
        return self.coef * out[:, 0]

    def _nnz_bounds(self, parts: int, skip: np.ndarray) -> list[int]:
        """Column bounds splitting the nonzeros of the selected columns not skipped into ``parts`` near-equal
        shares."""
        nnz = np.cumsum([0 if skip[t] else len(c[1]) for t, c in enumerate(self.cols)])
        return [0, *np.searchsorted(nnz, nnz[-1] * np.arange(1, parts) / parts, side="right").tolist(), self.k]

    def solve(self, b: np.ndarray) -> np.ndarray:
        if self.k == 0:
            return np.zeros_like(b)
        return sla.cho_solve(sla.cho_factor(self.H, lower=True), b)

    def append(self, p: int, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float) -> None:
        """Add column ``p`` (its raw rows and values, kept as they are where their dtypes are already int32 and the
        data's) with its transform; H is the caller's."""
        rows = np.ascontiguousarray(col[0], dtype=np.int32)
        vals = np.ascontiguousarray(col[1], dtype=self.dtype)
        slot = -1
        # a head's columns past its own go by their rows: the mask is the full set's (a head is a replay's, for
        # one step)
        if self._own_words and bits_eligible(rows, vals, self.n):
            slot = self.slots
            word, bit = divmod(slot, 64)
            if self._words is None or word >= self._words.shape[1]:
                words = np.zeros((self.n, word + 1), dtype=np.uint64)
                if self._words is not None:
                    words[:, :self._words.shape[1]] = self._words
                self._words = words
            bits_set(self._words, rows, word, bit)
            self._slot_cols.append(self.k)
        self._slot.append(slot)
        self.cols.append((np.array([0, rows.shape[0]], dtype=np.int64), rows, vals))
        self.ids.append(int(p))
        self.coef = np.append(self.coef, coef)
        self.shift = np.append(self.shift, shift)

    def add(self, p: int, col: tuple[np.ndarray, np.ndarray], coef: float, shift: float, u: np.ndarray,
            gpp: float) -> None:
        k = self.k
        H = np.empty((k + 1, k + 1))
        H[:k, :k] = self.H
        H[:k, k] = u
        H[k, :k] = u
        H[k, k] = gpp
        self.H = H
        self.append(p, col, coef, shift)
