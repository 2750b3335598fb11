"""The k smallest of a sweep's keys, ties to the lower index, in a bounded heap (numba): O(n log k) whatever the
keys' order (a sorted k-list shifts up to k entries for each key that enters: docs/measurements.md, "MMFS's
kernels"). Used where a sweep needs only the head of a ranking: MMFS's ranking head
(:func:`dufs.kernels.dcd.smallest_outside`) and M3FS's sigma step (:func:`dufs.kernels.vstep.top_positive`)."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["offer", "in_order"]


@numba.njit(nogil=True, cache=True, inline="always")
def _after(ka, ia, kb, ib):
    """Whether (key ka, index ia) ranks after (kb, ib): the larger key, or the same key and the larger index."""
    return ka > kb or (ka == kb and ia > ib)


@numba.njit(nogil=True, cache=True, inline="always")
def offer(val, idx, cnt, x, j):
    """Offer key ``x`` of index ``j`` (larger than every index offered before) to the heap ``val``, ``idx`` that
    holds the best ``cnt`` keys so far of at most ``val.shape[0]``, its root the last of them; returns the new
    count. While it fills, every key enters; then a key enters only ahead of the root (an equal key has a later
    index: it stays out), which it replaces."""
    k = val.shape[0]
    if cnt < k:  # up from the new leaf while it ranks after its parent
        p = cnt
        while p > 0:
            q = (p - 1) >> 1
            if not _after(x, j, val[q], idx[q]):
                break
            val[p] = val[q]
            idx[p] = idx[q]
            p = q
        val[p] = x
        idx[p] = j
        return cnt + 1
    if not x < val[0]:
        return cnt
    p = 0  # the root's place, down while a child ranks after it
    while True:
        c = 2 * p + 1
        if c >= k:
            break
        if c + 1 < k and _after(val[c + 1], idx[c + 1], val[c], idx[c]):
            c += 1
        if not _after(val[c], idx[c], x, j):
            break
        val[p] = val[c]
        idx[p] = idx[c]
        p = c
    val[p] = x
    idx[p] = j
    return cnt


@numba.njit(nogil=True, cache=True)
def in_order(val, idx, cnt):
    """(indices, keys) of the heap's ``cnt`` entries by key ascending, then index ascending (new arrays)."""
    val, idx = val[:cnt], idx[:cnt]
    by_index = np.argsort(idx)
    val, idx = val[by_index], idx[by_index]
    order = np.argsort(val, kind="mergesort")  # stable: equal keys stay in index order
    return idx[order].copy(), val[order].copy()
