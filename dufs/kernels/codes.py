"""Class codes of labels: each label's index among the sorted distinct labels."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["class_codes"]


# up to this many classes a label's code is counted class by class (a comparison per class and label, in sweeps
# the compiler vectorizes), beyond it found by a binary search (docs/measurements.md, "Labels")
_LINEAR_CLASSES = 8


@numba.njit(nogil=True, cache=True, boundscheck=False)
def class_codes(y, classes):
    """``np.searchsorted(classes, y)`` (int64) for ``classes`` sorted and free of NaN: with few classes the number of
    classes below each label, one sweep a class; with more a branch-free binary search of each label among them
    (faster than NumPy's search of float64 labels, then the copy to int64: docs/measurements.md, "Labels")."""
    k = classes.shape[0]
    out = np.zeros(y.shape[0], dtype=np.int64)
    if k <= _LINEAR_CLASSES:
        for j in range(k):
            c = classes[j]
            for i in range(y.shape[0]):
                out[i] += np.int64(c < y[i])
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
