"""Class codes of labels: each label's index among the sorted distinct labels."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["class_codes"]


@numba.njit(nogil=True, cache=True, boundscheck=False)
def class_codes(y, classes):
    """``np.searchsorted(classes, y)`` (int64) for ``classes`` sorted and free of NaN: a binary search of each label
    among the few classes, with no temporaries and no branch on the labels (NumPy's search of float64 labels, then
    the copy to int64: 25 ms for 2M labels of two classes)."""
    k = classes.shape[0]
    out = np.empty(y.shape[0], dtype=np.int64)
    if k == 0:
        out[:] = 0
        return out
    for i in range(y.shape[0]):
        v = y[i]
        base = 0
        n = k
        while n > 1:  # branch-free: the steps depend on k alone, the labels' order costs no mispredictions
            half = n >> 1
            base += half * np.int64(classes[base + half - 1] < v)
            n -= half
        out[i] = base + np.int64(classes[base] < v)
    return out
